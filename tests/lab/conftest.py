"""Lab fixtures: a lab in a temporary $LAB, always torn down (even when a test fails), and SSH/Ansible helpers."""

from __future__ import annotations

import gzip
import re
import hashlib
import shlex
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import json
import time
from contextlib import contextmanager

import pytest

from orchestrator import schemas
from fleetctl_lab import hosts, network, slots, state
from fleetctl_lab.state import HostSpec, Lab

REPO_ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = Path(sys.executable).with_name("ansible")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="lab tests need root (network and mount namespaces)")
    for item in items:
        if item.get_closest_marker("lab") and os.geteuid() != 0:
            item.add_marker(skip)


@dataclass
class LabHandle:
    lab: Lab
    workdir: Path

    def ssh(self, name: str, command: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """COMMAND on host NAME over real ssh, host key checking strict."""
        host = self.lab.host(name)
        proc = subprocess.run(
            ["ssh", "-i", str(self.lab.client_key), "-o", f"UserKnownHostsFile={self.lab.known_hosts}",
             "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
             "-o", "ConnectTimeout=5", "-F", "/dev/null", f"root@{host.address}", command],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check:
            assert proc.returncode == 0, f"ssh {name} {command!r}: rc={proc.returncode}\n{proc.stderr}"
        return proc

    def ansible(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        env.update(ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.workdir / "cp"), ANSIBLE_LOCAL_TEMP=str(self.workdir / "tmp"),
                   ANSIBLE_HOST_KEY_CHECKING="True")
        return subprocess.run([str(ANSIBLE), "-i", str(self.lab.inventory), *args], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=self.workdir, stdin=subprocess.DEVNULL)


@pytest.fixture
def lab_dir(tmp_path, monkeypatch):
    directory = tmp_path / "lab"
    monkeypatch.setenv("FLEETCTL_LAB_DIR", str(directory))
    return directory


@pytest.fixture(scope="class")
def two_hosts(tmp_path_factory):
    """Two hosts without a driver (an empty apt repository), shared by a class's tests; down in any case."""
    workdir = tmp_path_factory.mktemp("lab2")
    directory = workdir / "lab"
    try:
        lab = hosts.up([HostSpec("gpu-a"), HostSpec("gpu-b", sku="l40s")], directory)
        yield LabHandle(lab, workdir)
    finally:
        hosts.down(directory)
        kill_processes_mentioning(str(workdir / "cp"))  # Ansible's ssh ControlPersist masters


def kill_processes_mentioning(text: str) -> None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), 9)
            except OSError:
                pass


# -- what must be gone after `down` ---------------------------------------------------------------------------

@pytest.fixture
def leftovers():
    """lab_leftovers, as a fixture (test modules do not import conftest)."""
    return lab_leftovers


@pytest.fixture
def stub_driver_repo():
    """make_stub_driver_repo, as a fixture."""
    return make_stub_driver_repo


def lab_leftovers(directory: Path, lab: Lab | int | None = None) -> list[str]:
    """Everything of the lab in DIRECTORY that is still on the machine, and nothing of another lab (several labs run
    at once, one per xdist worker and slot): its slot's namespaces, veths, bridge and Slurm runtime directory, mounts
    at or under DIRECTORY, processes mentioning DIRECTORY or whose root is under it (a Slurm lab's slurmctld and
    munged name $LAB/slurm), DIRECTORY itself. LAB: the lab as `up` returned it
    (or its slot), taken before `down` (which removes lab.json and frees the slot); without it, lab.json's or the
    slot claim's, when still there."""
    directory = Path(directory)
    found = slot_leftovers(directory, lab_slot(directory, lab))
    found += [f"mount {point}" for point in mount_points_under(directory, Path("/proc/mounts").read_text())]
    found += [f"process {pid}: {command}" for pid, command in processes_of(directory, machine_processes())]
    if directory.exists():
        found.append(f"directory {directory}")
    return found


def lab_slot(directory: Path, lab: Lab | int | None) -> int:
    if isinstance(lab, int):
        return lab
    if lab is None:
        lab = state.load(directory)
    slot = lab.slot if lab is not None else slots.slot_of(directory)
    if slot is None:
        raise AssertionError(f"lab_leftovers: which slot had the lab in {directory}? Pass the lab `up` returned")
    return slot


def slot_leftovers(directory: Path, slot: int) -> list[str]:
    """The namespaces, veths and bridge of SLOT, checked with the slot locked so that no other lab claims it
    meanwhile. A slot another lab holds (claimed since, or being built: its lock is taken) has that lab's names:
    not ours to report (its `up` removed any remains of ours when it claimed the slot)."""
    names = network.names(slot)
    handle = slots._open(slot)
    try:
        if not slots._try_lock(handle):
            return []
        if slots.read_owner(handle) not in (None, directory):
            return []
        found = [f"netns {n}" for n in names.namespaces()]
        found += [f"link {name}" for name in [names.bridge, *names.veths()] if network.link_exists(name)]
        if hosts.slurm_run_dir(slot).exists():  # the Slurm controller's socket and pid files
            found.append(f"directory {hosts.slurm_run_dir(slot)}")
        return found
    finally:
        handle.close()


def under(path: str, directory: Path) -> bool:
    return path == str(directory) or path.startswith(str(directory).rstrip("/") + "/")


def mount_points_under(directory: Path, mounts: str) -> list[str]:
    """Mount points (of /proc/mounts' text MOUNTS) at or under DIRECTORY: the lab's own tmpfs (fl-layers, fl-run,
    fl-tmp, fl-lab) and overlays are mounted under its host directories, so a leaked one shows there."""
    points = [line.split()[1].encode().decode("unicode_escape") for line in mounts.splitlines() if line.strip()]
    return [p for p in points if under(p, directory)]


def machine_processes():
    """(pid, command line (NUL-separated), root) of every process on the machine that can be read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            root = os.readlink(entry / "root")
        except OSError:
            continue
        yield int(entry.name), cmdline, root


def processes_of(directory: Path, processes) -> list[tuple[int, str]]:
    """(pid, command) of PROCESSES ((pid, cmdline, root)) of the lab in DIRECTORY: a command line naming DIRECTORY
    anywhere (supervisors, unshare, ip netns exec, ssh -o UserKnownHostsFile=..., overlay options...), or a root at
    or under it (whatever runs inside a host: sshd, daemons, sessions). Another lab's processes name their own
    directory: /x/lab is not named by /x/lab2/... (the name must end there)."""
    naming = re.compile(re.escape(str(directory).rstrip("/").encode()) + rb"(?=[/\0,:;=\s'\"]|$)")
    return [(pid, cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]) for pid, cmdline, root in processes
            if under(root, directory) or naming.search(cmdline)]


# -- a stub driver package (the real ones come from lab/fleetctl_lab/packages.py) ------------------------------

def make_stub_driver_repo(repo: Path, version: str) -> None:
    """A flat apt repository holding one nvidia-driver-<branch>-open package whose only file is the emulated
    kernel module (/usr/lib/nvidia-lab/modules/nvidia.version): enough to see the lab boot it."""
    branch = version.split(".")[0]
    name = f"nvidia-driver-{branch}-open"
    build = repo.parent / "stub-build"
    (build / "DEBIAN").mkdir(parents=True)
    (build / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: {version}-0lab1\nArchitecture: all\nMaintainer: fleetctl lab <lab@fleetctl>\n"
        f"Description: stub of the emulated driver (tests)\n")
    module = build / "usr/lib/nvidia-lab/modules/nvidia.version"
    module.parent.mkdir(parents=True)
    module.write_text(f"{version} open\n")
    repo.mkdir(parents=True, exist_ok=True)
    deb = repo / f"{name}_{version}-0lab1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(build), str(deb)], check=True, capture_output=True)
    data = deb.read_bytes()
    stanza = ((build / "DEBIAN/control").read_text() +
              f"Filename: ./{deb.name}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n\n")
    (repo / "Packages").write_text(stanza)
    (repo / "Packages.gz").write_bytes(gzip.compress(stanza.encode()))


# -- a lab driven through the fleetctl CLI, as an operator would ---------------------------------------------

def lab_env(text: str) -> dict[str, str]:
    """The variables of `fleetctl lab env`'s `export K=V` lines."""
    return dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in text.splitlines()
                if line.startswith("export "))


@dataclass
class Fleet:
    env: dict[str, str]
    inventory: str
    workdir: Path

    def fleetctl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, cwd=REPO_ROOT, stdin=subprocess.DEVNULL)

    def audit(self, *args: str) -> tuple[int, dict]:
        proc = self.fleetctl("audit", "-i", self.inventory, "--format", "json", *args)
        assert proc.returncode in (0, 1, 3), proc.stderr
        report = json.loads(proc.stdout)
        assert schemas.first_error("audit-report", report) is None
        return proc.returncode, report

    def drift(self, *args: str) -> dict[str, dict[str, str]]:
        _, report = self.audit(*args)
        return {h["name"]: {f["control"]: f["status"] for f in h["findings"] if f["status"] not in ("pass", "not_applicable")}
                for h in report["hosts"]}

    def facts(self, host: str) -> dict:
        _, report = self.audit("-l", host)
        return report["hosts"][0]["facts"]

    def inject(self, host: str, *fault: str) -> str:
        proc = self.fleetctl("lab", "inject", host, *fault, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def ssh(self, host: str, command: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        """COMMAND on HOST over SSH (STDIN: what it reads, else nothing)."""
        address = next(line.split("ansible_host=")[1].split()[0] for line in Path(self.inventory).read_text().splitlines()
                       if line.startswith(host + " "))
        lab = Path(self.env["FLEETCTL_LAB_DIR"])
        proc = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(lab / "ssh/id_ed25519"), "-o", "BatchMode=yes",
                               "-o", f"UserKnownHostsFile={lab / 'ssh/known_hosts'}", "-o", "StrictHostKeyChecking=yes",
                               "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5", f"root@{address}", command],
                              capture_output=True, text=True, timeout=120, input=stdin,
                              stdin=subprocess.DEVNULL if stdin is None else None)
        assert not check or proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def reboot(self, host: str) -> float:
        started = time.monotonic()
        proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "-i", self.inventory, host,
                               "-m", "ansible.builtin.reboot"], capture_output=True, text=True, env=self.env,
                              timeout=300, cwd=self.workdir, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stdout[-2000:]
        return time.monotonic() - started



@contextmanager
def fleetctl_lab(workdir: Path, specs: tuple[str, ...], slurm: bool = False, prometheus: bool = False):
    """`fleetctl lab up --spec ...` in WORKDIR (its own $LAB, history and SSH control dir); always torn down.
    SLURM: `--slurm`, and the handle's env carries what `fleetctl lab env` exports (SLURM_CONF), so srun, sbatch,
    sinfo and scontrol run with it talk to the lab's cluster. PROMETHEUS: `--prometheus` (the env carries
    FLEETCTL_LAB_PROMETHEUS, the server's URL)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "SLURM_"))}
    env.update(FLEETCTL_LAB_DIR=str(workdir / "lab"), FLEETCTL_HOME=str(workdir / "home"), FLEETCTL_CONFIG=os.devnull,
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(workdir / "cp"), ANSIBLE_LOCAL_TEMP=str(workdir / "tmp"))
    handle = Fleet(env, "", workdir)
    try:
        up = handle.fleetctl("lab", "up", *[a for s in specs for a in ("--spec", s)], *(["--slurm"] if slurm else []),
                             *(["--prometheus"] if prometheus else []), timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        handle.inventory = handle.fleetctl("lab", "inventory").stdout.strip()
        handle.env.update(lab_env(handle.fleetctl("lab", "env").stdout))
        yield handle
    finally:
        handle.fleetctl("lab", "down")
        kill_processes_mentioning(str(workdir / "cp"))
