"""The lab's Slurm cluster (`fleetctl lab up --slurm`; docs/lab.md "A Slurm cluster"): Debian's slurmctld, slurmd and
munge, real daemons, run as root in the foreground.

    controller (root netns)                       every lab host (its own netns, root and /run)
    munged  --socket RUN/munge.socket             munged --socket RUN/munge.socket (the host's own /run)
    slurmctld -D -f $LAB/slurm/slurm.conf         slurmd -D -N <name> -f /etc/slurm/slurm.conf
      on 10.<213+n>.0.1:SlurmctldPort(n)            on <host address>:SLURMD_PORT

RUN is /run/fleetctl-lab/slurm-<n> (slot n): on the controller the machine's /run, inside a host the host's own fresh
/run, so one slurm.conf (AuthInfo=socket=RUN/munge.socket) serves both and the machine's own /run/munge and
/etc/munge are never touched. $LAB/slurm holds the key (munge.key, 0400), slurm.conf and gres.conf (copied into each
host's /etc/slurm at every boot: identical text), slurmctld's state, the controller daemons' logs and pid files, and
the job completion log. A host keeps its daemons' pid files and slurmd's spool in its RUN.

Lab GPUs have no /dev nodes and Slurm 22.05 drops a GPU without a File ("Removing file-less GPU"), so each host
makes character devices with the NVIDIA driver's numbers (major 195, minor = index) in its /run at boot, and
gres.conf names those.

Standard library only: the host's supervisor uses it too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")  # Debian's (scripts/setup --test installs them)
PROGRAMS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun")
SLURMCTLD_PORT_BASE = 16817    # slot n: 16817 + n (never a machine's own Slurm on 6817); bound in the root netns
SLURMD_PORT = 6818             # in each host's own netns: the same in every lab
PARTITION = "gpu"
NODE_CPUS = 1                  # modest, so a node never claims more than a small machine has
NODE_MEMORY_MB = 1024
SLURMD_TIMEOUT_S = 30          # a node silent this long is DOWN (ReturnToService=2 brings it back on registration)
MIN_JOB_AGE_S = 900            # finished jobs stay visible to squeue/scontrol this long
NVIDIA_MAJOR = 195             # /dev/nvidia<i> is char 195:<i> on a real host
DEVICE_DIR = "/run/nvidia-lab/dev"   # inside a host: its GPUs' device nodes (gres.conf File=)
HOST_CONF_DIR = "/etc/slurm"         # inside a host: slurm.conf and gres.conf
HOST_KEY = "/etc/munge/munge.key"    # inside a host: the lab's munge key
HEALTH_CHECK = "/etc/slurm/health-check"  # inside a host: slurmd's HealthCheckProgram (a no-op until replaced)
HEALTH_CHECK_INTERVAL_S = 10         # how often slurmd runs it on every node
REBOOT_PROGRAM = "/usr/sbin/reboot"  # inside a host: what slurmd runs for `scontrol reboot`
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
CONTROLLER_DAEMONS = ("slurmctld", "munged")


class SlurmError(RuntimeError):
    """The lab's Slurm controller could not be started."""


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    gpus: int


@dataclass(frozen=True)
class Cluster:
    """The lab's cluster: CONF_DIR ($LAB/slurm), RUN_DIR (/run/fleetctl-lab/slurm-<n>), the slot, the controller's
    address (the bridge's) and the nodes."""
    conf_dir: Path
    run_dir: Path
    slot: int
    controller_address: str
    nodes: tuple[Node, ...]

    @property
    def port(self) -> int:
        return SLURMCTLD_PORT_BASE + self.slot

    @property
    def conf(self) -> Path:
        return self.conf_dir / "slurm.conf"

    @property
    def key(self) -> Path:
        return self.conf_dir / "munge.key"

    @property
    def socket(self) -> Path:
        return self.run_dir / "munge.socket"

    @property
    def jobcomp(self) -> Path:
        return self.conf_dir / "jobcomp.log"

    def env(self) -> dict[str, str]:
        """What a shell on the controller needs for srun, sbatch, scontrol and sinfo."""
        return {"SLURM_CONF": str(self.conf)}

    # -- configuration (identical on the controller and in every host) ------------------------------------------
    def slurm_conf(self) -> str:
        run = self.run_dir
        lines = [
            f"# The fleetctl lab's Slurm cluster (slot {self.slot}), written by `fleetctl lab up --slurm`.",
            f"# Controller: {self.conf}; in every lab host: {HOST_CONF_DIR}/slurm.conf (the same text).",
            f"ClusterName=lab{self.slot}",
            # slurmctld accepts "localhost" as its own name wherever it runs; slurmd reaches it at the address
            f"SlurmctldHost=localhost({self.controller_address})",
            f"SlurmctldPort={self.port}",
            f"SlurmdPort={SLURMD_PORT}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={run}/munge.socket",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.conf_dir}/state",
            f"SlurmctldPidFile={self.conf_dir}/slurmctld.pid",
            f"SlurmdPidFile={run}/slurmd.pid",
            f"SlurmdSpoolDir={run}/slurmd",
            "MailProg=/bin/true",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp}",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "GresTypes=gpu",
            "ReturnToService=2",
            # `scontrol reboot`: slurmd runs the host's reboot (a lab host's shim asks its supervisor)
            f"RebootProgram={REBOOT_PROGRAM}",
            f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
            f"MinJobAge={MIN_JOB_AGE_S}",
            # every node runs its own health check (an admin's, or `fleetctl check --slurm`), as on a real cluster
            f"HealthCheckProgram={HEALTH_CHECK}",
            f"HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}",
            "HealthCheckNodeState=ANY",
            "",
        ]
        for node in self.nodes:
            gres = f" Gres=gpu:{node.gpus}" if node.gpus else ""
            lines.append(f"NodeName={node.name} NodeAddr={node.address} CPUs={NODE_CPUS} "
                         f"RealMemory={NODE_MEMORY_MB}{gres} State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(n.name for n in self.nodes)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def gres_conf(self) -> str:
        lines = ["# The lab GPUs: character devices each lab host makes at boot (fleetctl_lab/slurm.py)."]
        lines += [f"NodeName={n.name} Name=gpu Count={n.gpus} File={DEVICE_DIR}/nvidia[0-{n.gpus - 1}]"
                  for n in self.nodes if n.gpus]
        return "\n".join(lines) + "\n"

    def write_files(self) -> None:
        """$LAB/slurm: a new munge key (0400), slurm.conf, gres.conf and slurmctld's state directory."""
        (self.conf_dir / "state").mkdir(parents=True, exist_ok=True)
        self.conf_dir.chmod(0o700)
        self.key.unlink(missing_ok=True)
        fd = os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(128))
        self.conf.write_text(self.slurm_conf())
        (self.conf_dir / "gres.conf").write_text(self.gres_conf())

    # -- the controller's daemons -------------------------------------------------------------------------------
    def start_controller(self) -> None:
        """munged, then slurmctld, detached (like the hosts' supervisors); returns once slurmctld listens."""
        self.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.run_dir.chmod(0o755)
        detach(munged_argv(self.run_dir, self.key, self.conf_dir), self.conf_dir / "munged.log")
        wait_for(self.socket.exists, f"munged's socket {self.socket}", self.conf_dir / "munged.log")
        detach(["/usr/sbin/slurmctld", "-D", "-f", str(self.conf)], self.conf_dir / "slurmctld.log",
               env={"SLURM_CONF": str(self.conf)})
        wait_for(lambda: listening(self.controller_address, self.port),
                 f"slurmctld on {self.controller_address}:{self.port}", self.conf_dir / "slurmctld.log")


def munged_argv(run_dir: Path | str, key: Path | str, state_dir: Path | str) -> list[str]:
    """munged with its socket in RUN_DIR, its pid and seed files in STATE_DIR."""
    return ["/usr/sbin/munged", "-F", f"--socket={run_dir}/munge.socket", f"--key-file={key}",
            f"--pid-file={state_dir}/munged.pid", f"--seed-file={state_dir}/munged.seed"]


def slurmd_argv(node: str) -> list[str]:
    return ["/usr/sbin/slurmd", "-D", "-N", node, "-f", f"{HOST_CONF_DIR}/slurm.conf"]


def detach(argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """ARGV in a session of its own, reparented away from the caller (setsid --fork), output to LOG."""
    with open(log, "ab") as out:
        subprocess.run(["setsid", "--fork", *argv], env={**os.environ, **(env or {})}, cwd="/",
                       stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=30)


def listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def wait_for(ready, what: str, log: Path, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SlurmError(f"{what} not up within {timeout:.0f} s (log: {log})")
        time.sleep(0.1)


# -- stopping: `lab down`, and the remains of a dead lab in a slot --------------------------------------------

def controller_pids(conf_dir: Path) -> list[int]:
    """The lab's slurmctld and munged on the controller: the pids in CONF_DIR's ($LAB/slurm) pid files, and any
    process of those programs whose command line names CONF_DIR (a pid file not written yet, or lost)."""
    found = {pid for name in CONTROLLER_DAEMONS
             if (pid := read_pid(conf_dir / f"{name}.pid")) is not None and program_of(pid) == name}
    needle = str(conf_dir).encode() + b"/"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and program_of(int(entry.name)) in CONTROLLER_DAEMONS:
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return sorted(found)


def stop_controller(conf_dir: Path | None, run_dir: Path | None) -> None:
    """SIGTERM, then SIGKILL, the controller daemons of the lab whose files are in CONF_DIR (None: unknown); remove
    the slot's RUN_DIR (None: the slot is another lab's now). Safe to repeat."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = controller_pids(conf_dir) if conf_dir is not None else []
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if program_of(p) in CONTROLLER_DAEMONS]
            time.sleep(0.05)
        if not pids:
            break
    if run_dir is not None:
        shutil.rmtree(run_dir, ignore_errors=True)


def program_of(pid: int) -> str | None:
    """The program PID runs (its comm), None once it is gone (a zombie counts as gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:]
    return None if rest.startswith("Z") else comm


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# -- inside a host, at every boot (fleetctl_lab.host.daemons) --------------------------------------------------

def prepare_node(root: Path, conf_dir: Path, run_dir: str, gpus: int) -> None:
    """The host's Slurm files in its root ROOT: the key and both configuration files from CONF_DIR, its fresh
    /run's directories, and a device node per GPU."""
    etc = root / HOST_CONF_DIR.lstrip("/")
    etc.mkdir(parents=True, exist_ok=True)
    for name in ("slurm.conf", "gres.conf"):
        copy(conf_dir / name, etc / name, 0o644)
    key = root / HOST_KEY.lstrip("/")
    key.parent.mkdir(parents=True, exist_ok=True)
    os.chown(key.parent, 0, 0)  # munged refuses a key in a directory another user owns (Debian's: munge)
    key.parent.chmod(0o700)
    copy(conf_dir / "munge.key", key, 0o400)
    check = root / HEALTH_CHECK.lstrip("/")
    if not check.exists():  # the node's own program, kept across boots once someone installed one
        fd = os.open(check, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
        with os.fdopen(fd, "w") as f:
            f.write("#!/bin/sh\n# slurmd's HealthCheckProgram on this lab node: replace it with your own.\nexit 0\n")
    (root / run_dir.lstrip("/") / "slurmd").mkdir(mode=0o755, parents=True, exist_ok=True)
    devices = root / DEVICE_DIR.lstrip("/")
    devices.mkdir(parents=True, exist_ok=True)
    for i in range(gpus):
        os.mknod(devices / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))


def copy(source: Path, target: Path, mode: int) -> None:
    """SOURCE's bytes as a new regular file TARGET (never through a symlink into the machine's files)."""
    if target.is_symlink() or target.exists():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(source.read_bytes())
