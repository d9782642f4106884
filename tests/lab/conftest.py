"""Lab fixtures: a lab in a temporary $LAB, always torn down (even when a test fails), and SSH/Ansible helpers."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetctl_lab import hosts
from fleetctl_lab.state import HostSpec, Lab
from tests.helpers.lab import ANSIBLE, kill_processes_mentioning
from tests.helpers.leftovers import lab_leftovers


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


# -- what must be gone after `down` ---------------------------------------------------------------------------

@pytest.fixture
def leftovers():
    """lab_leftovers, as a fixture (test modules do not import conftest)."""
    return lab_leftovers


@pytest.fixture
def stub_driver_repo():
    """make_stub_driver_repo, as a fixture."""
    return make_stub_driver_repo


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
