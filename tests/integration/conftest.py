"""Fixtures for the SSH integration tests: a real sshd on 127.0.0.1, inventories that reach it, and fleetctl run
as a subprocess with its history and Ansible's ControlPersist sockets in temporary directories."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from sshd_helper import SSHD, SshServer, kill_control_masters, start_sshd, stop_sshd

RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> SshServer:
    """An sshd of our own on a free port of 127.0.0.1, stopped at the end of the module whatever happened."""
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} not found: install openssh-server to run the SSH integration tests")
    server, proc = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        stop_sshd(proc)


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str

    @property
    def report(self) -> dict:
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as e:
            raise AssertionError(f"fleetctl did not print JSON ({e}); rc={self.rc}\n"
                                 f"stdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}") from None

    def host(self, name: str) -> dict:
        hosts = {h["name"]: h for h in self.report["hosts"]}
        assert name in hosts, f"{name} not in the report: {sorted(hosts)}"
        return hosts[name]


class Fleetctl:
    """fleetctl as an operator runs it, isolated: its own FLEETCTL_HOME and Ansible ControlPath directory."""

    def __init__(self, sshd: SshServer, workdir: Path):
        self.sshd = sshd
        self.workdir = workdir
        self.home = workdir / "fleetctl-home"
        self.control_path_dir = workdir / "cp"
        self.control_path_dir.mkdir(parents=True)
        self.home.mkdir()

    def host_line(self, name: str, known_hosts: Path, port: int | None = None) -> str:
        ssh_args = f"-o UserKnownHostsFile={known_hosts} -o IdentitiesOnly=yes"
        return " ".join([
            name,
            "ansible_host=127.0.0.1",
            f"ansible_port={port or self.sshd.port}",
            f"ansible_user={self.sshd.user}",
            f"ansible_ssh_private_key_file={self.sshd.client_key}",
            f"ansible_ssh_common_args={shlex.quote(ssh_args)}",
            f"ansible_python_interpreter={sys.executable}",
        ])

    def known_hosts(self, content: str | None = None, name: str = "known_hosts") -> Path:
        """A known_hosts file; by default with the test sshd's real host key."""
        path = self.workdir / name
        path.write_text(self.sshd.known_hosts_entry if content is None else content)
        return path

    def inventory(self, *lines: str, name: str = "inventory.ini") -> Path:
        path = self.workdir / name
        path.write_text("\n".join(lines) + "\n")
        return path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        env.update(FLEETCTL_HOME=str(self.home),
                   ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.control_path_dir),
                   ANSIBLE_LOCAL_TEMP=str(self.workdir / "ansible-tmp"))
        return env

    def run(self, *args: str) -> Result:
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=self.env(), cwd=self.workdir,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def cleanup(self) -> None:
        kill_control_masters(self.control_path_dir)


@pytest.fixture
def fleetctl(sshd, tmp_path) -> Fleetctl:
    """A fresh fleetctl environment per test; Ansible's ControlPersist masters are killed at teardown, pass or fail
    (and so no test can reuse another's authenticated master connection)."""
    f = Fleetctl(sshd, tmp_path)
    try:
        yield f
    finally:
        f.cleanup()
