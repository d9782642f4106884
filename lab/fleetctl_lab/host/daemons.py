"""A lab host's init: its processes (the supervisor is PID 1 and reaps them), the driver's daemons started at boot
when installed and enabled, munged and slurmd in a Slurm lab, sshd, and the host's systemctl for the driver's
units."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .. import slurm
from ..conf import read_conf
from .base import HOST_ENV, log, mount

SSHD_START_TIMEOUT_S = 20.0
PERSISTENCED = "usr/bin/nvidia-persistenced"
PERSISTENCED_UNIT = "nvidia-persistenced.service"
FABRICMANAGER = "usr/bin/nv-fabricmanager"
FABRICMANAGER_UNIT = "nvidia-fabricmanager.service"
IMEX = "usr/bin/nvidia-imex"
IMEX_UNIT = "nvidia-imex.service"
UNITS = {PERSISTENCED_UNIT: PERSISTENCED, FABRICMANAGER_UNIT: FABRICMANAGER, IMEX_UNIT: IMEX}  # the systemctl shim's
ARGS = {PERSISTENCED: ("--verbose",), IMEX: ("-c", "/etc/nvidia-imex/config.cfg")}  # each unit's ExecStart arguments


class InitSystem:
    """Uses set_every_gpu (HostBase), reset_driver_state (the supervisor's Host) and booted_module (KernelModules)."""

    # -- processes ----------------------------------------------------------------------------------------------
    def spawn(self, *argv: str, name: str, fresh_uptime: bool = False) -> int:
        """ARGV in the host's root. FRESH_UPTIME: in a time namespace of its own whose boot clock starts now, so
        its uptime (sysinfo, /proc/uptime) is this boot's, not the machine's."""
        since_boot = ["unshare", "--time", f"--boottime=-{int(time.clock_gettime(time.CLOCK_BOOTTIME))}",
                      "--fork"] if fresh_uptime else []
        logfile = open(self.dir / f"{name}.log", "ab")
        proc = subprocess.Popen([*since_boot, "chroot", str(self.root), *argv], env=HOST_ENV, stdin=subprocess.DEVNULL,
                                stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
        logfile.close()
        return proc.pid

    def reap(self) -> None:
        """Collect every exited child (the supervisor is PID 1: orphans of the host end up here)."""
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.sshd_pid:
                self.sshd_pid = None

    def host_pids(self) -> list[int]:
        """Every process of the host (this PID namespace) but the supervisor."""
        proc = self.root / "proc"
        if not (proc / "self").exists():  # not mounted yet
            return []
        return [int(p.name) for p in proc.iterdir() if p.name.isdigit() and p.name != "1"]

    def kill_all(self) -> None:
        for sig, wait in ((signal.SIGTERM, 0.5), (signal.SIGKILL, 5.0)):
            for pid in self.host_pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.reap()
                if not self.host_pids():
                    return
                time.sleep(0.02)

    # -- the driver's daemons and sshd, at boot -----------------------------------------------------------------
    def unit_state(self, unit: str) -> str | None:
        """enabled (a wants link: an absolute symlink into the host's root, so only its presence is checked),
        disabled, or None without a unit file."""
        if not any(os.path.lexists(self.root / d / unit)
                   for d in ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system")):
            return None
        wants = (self.root / "etc/systemd/system").glob("*.wants")
        return "enabled" if any(os.path.lexists(w / unit) for w in wants) else "disabled"

    def start_daemon(self, program: str, unit: str, *args: str) -> bool:
        """Start a daemon at boot when installed and enabled, or installed without a unit file."""
        if not (self.root / program).exists():
            return False
        if self.unit_state(unit) == "disabled":
            log(f"{program} installed but not enabled: not started")
            return False
        pid = self.spawn("/" + program, *args, name=os.path.basename(program))
        log(f"{program} started (pid {pid})")
        return True

    def start_daemons(self) -> None:
        persistent = self.booted_module is not None and self.start_daemon(PERSISTENCED, PERSISTENCED_UNIT,
                                                                          *ARGS[PERSISTENCED])
        self.reset_driver_state(persistent)
        if self.booted_module is not None and self.config.get("nvswitch"):
            self.start_daemon(FABRICMANAGER, FABRICMANAGER_UNIT)
        self.start_daemon(IMEX, IMEX_UNIT, *ARGS[IMEX])  # it checks the driver itself (and refuses another version)
        if self.config.get("slurm"):
            self.start_slurmd(**self.config["slurm"])
        if self.config.get("exporter"):
            self.start_exporter()

    def start_exporter(self) -> None:
        """A `lab up --prometheus` host's DCGM exporter (fleetctl_lab/exporter.py): the supervisor's Python (it
        needs prometheus_client, which the host's python3 has not), in the host's namespaces, not in its root."""
        with open(self.dir / "exporter.log", "ab") as logfile:
            pid = subprocess.Popen([sys.executable, "-m", "fleetctl_lab.exporter", str(self.dir)], cwd="/",
                                   stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT,
                                   start_new_session=True).pid
        log(f"DCGM exporter started (pid {pid})")

    def start_slurmd(self, conf_dir: str, run_dir: str) -> None:
        """A Slurm lab's node (fleetctl_lab/slurm.py): its files from the controller's CONF_DIR, munged, and once
        munged's socket is there, slurmd."""
        gpus = int(read_conf(self.hw / "gpus.conf").get("count", "0"))
        slurm.prepare_node(self.root, Path(conf_dir), run_dir, gpus)
        self.spawn(*slurm.munged_argv(run_dir, slurm.HOST_KEY, run_dir), name="munged")
        socket_inside = self.root / run_dir.lstrip("/") / "munge.socket"
        deadline = time.monotonic() + slurm.START_TIMEOUT_S
        while not socket_inside.exists() and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)
        if not socket_inside.exists():
            raise RuntimeError(f"munged did not start (see {self.dir / 'munged.log'})")
        self.mount_cgroup_for_slurmd()
        # slurmd reports its boot time from its uptime: this boot's, so slurmctld sees a `scontrol reboot` complete
        pid = self.spawn(*slurm.slurmd_argv(self.name), name="slurmd", fresh_uptime=True)
        log(f"munged and slurmd started (slurmd pid {pid})")

    def mount_cgroup_for_slurmd(self) -> None:
        """slurmd 22.05 starts only where its cgroup plugin loads, even with cgroups unused (proctrack/linuxproc,
        task/none): cgroup/v1 wants a cgroup filesystem at /sys/fs/cgroup/systemd, and the host's /sys (its network
        namespace's sysfs) has none. A tmpfs there, with the named systemd hierarchy mounted read-only: slurmd
        changes no cgroup. Once per supervisor: the mounts outlive reboots, as /sys does."""
        cgroup = self.root / "sys/fs/cgroup"
        if os.path.ismount(cgroup / "systemd"):
            return
        mount("-t", "tmpfs", "-o", "mode=0755", "fl-cgroup", str(cgroup))
        (cgroup / "systemd").mkdir()
        mount("-t", "cgroup", "-o", "ro,none,name=systemd", "cgroup", str(cgroup / "systemd"))

    def start_sshd(self) -> None:
        self.sshd_pid = self.spawn("/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config", name="sshd")

    def wait_sshd(self) -> None:
        deadline = time.monotonic() + SSHD_START_TIMEOUT_S
        while time.monotonic() < deadline:
            self.reap()
            if self.sshd_pid is None:
                raise RuntimeError(f"sshd exited at start (see {self.dir / 'sshd.log'})")
            try:
                with socket.create_connection((self.address, 22), timeout=1) as s:
                    s.settimeout(2)
                    if s.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not answer on {self.address}:22 within {SSHD_START_TIMEOUT_S:.0f} s")

    # -- the host's systemctl (REQUEST_SHIM) --------------------------------------------------------------------
    def daemon_pids(self, program: str) -> list[int]:
        pids = []
        for pid in self.host_pids():
            try:
                argv0 = (self.root / "proc" / str(pid) / "cmdline").read_bytes().split(b"\0", 1)[0]
            except OSError:
                continue
            if argv0.decode(errors="replace") == "/" + program:
                pids.append(pid)
        return pids

    def systemctl(self, args: list[str]) -> tuple[int, str, str]:
        """is-active, start, stop and restart of the driver's daemons; anything else as without systemd."""
        words = [a for a in args if not a.startswith("-")]
        quiet = "--quiet" in args or "-q" in args
        unit = words[1] if len(words) == 2 and "." in words[1] else (words[1] + ".service" if len(words) == 2 else "")
        if not words or words[0] not in ("is-active", "is-enabled", "start", "stop", "restart") or unit not in UNITS:
            return 1, "", "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
        program, verb = UNITS[unit], words[0]
        if verb == "is-active":
            active = bool(self.daemon_pids(program))
            return (0 if active else 3), ("" if quiet else ("active\n" if active else "inactive\n")), ""
        if verb == "is-enabled":
            state = self.unit_state(unit)
            if state is None:
                return 1, "", f"Failed to get unit file state for {unit}: No such file or directory\n"
            return (0 if state == "enabled" else 1), ("" if quiet else state + "\n"), ""
        if verb in ("stop", "restart"):
            self.stop_daemon(program)
        if verb in ("start", "restart"):
            return self.start_unit(unit, program)
        return 0, "", ""

    def stop_daemon(self, program: str) -> None:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            for pid in self.daemon_pids(program):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.daemon_pids(program) and time.monotonic() < deadline:
                self.reap()
                time.sleep(0.02)
        if program == PERSISTENCED:
            self.set_every_gpu(persistence="0")

    def start_unit(self, unit: str, program: str) -> tuple[int, str, str]:
        if not (self.root / program).exists():
            return 5, "", f"Failed to start {unit}: Unit {unit} not found.\n"
        if not self.daemon_pids(program):
            proc = subprocess.run(["chroot", str(self.root), "/" + program, *ARGS.get(program, ())], env=HOST_ENV,
                                  capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                log(f"{program}: exit {proc.returncode} {proc.stderr.strip()[-200:]}")
                return 1, "", (f"Job for {unit} failed because the control process exited with error code.\n"
                               f"See \"systemctl status {unit}\" and \"journalctl -xeu {unit}\" for details.\n")
        if program == PERSISTENCED:
            self.set_every_gpu(persistence="1")
        return 0, "", ""
