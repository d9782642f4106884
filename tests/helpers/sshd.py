"""A throwaway OpenSSH server on 127.0.0.1 for the integration tests, process clean-up, and fleetctl run against it.

The server runs as the current user (root in CI) from a config of its own in a temporary directory: its own
ed25519 host key, an authorized_keys file holding one generated client key, no PAM, no strict modes.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
START_TIMEOUT_S = 10.0
RUN_TIMEOUT_S = 120  # one fleetctl run


@dataclass(frozen=True)
class SshServer:
    port: int
    user: str
    workdir: Path
    host_key_line: str       # "ssh-ed25519 AAAA..." (no comment)
    client_key: Path         # private key whose public half is in authorized_keys
    log: Path                # sshd -E log
    pid: int

    @property
    def known_hosts_entry(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key_line}\n"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str) -> str:
    """Generate an ed25519 key at PATH; return its public key as "type base64"."""
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode} at start: {_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-"):  # the banner: it is sshd, and it is serving
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sshd did not accept connections on 127.0.0.1:{port} within {START_TIMEOUT_S:.0f} s: {_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:]) or "(empty log)"
    except OSError:
        return "(no log)"


def start_sshd(workdir: Path) -> tuple[SshServer, subprocess.Popen]:
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = workdir / "ssh_host_ed25519_key"
    host_key_line = keygen(host_key, "fleetctl-test-host")
    client_key = workdir / "client_ed25519"
    client_pub = keygen(client_key, "fleetctl-test-client")
    authorized = workdir / "authorized_keys"
    authorized.write_text(client_pub + "\n")
    authorized.chmod(0o600)
    log = workdir / "sshd.log"
    if os.geteuid() == 0:
        # sshd run as root wants its privilege-separation directory (systemd's tmpfiles makes it on a real host).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    port = free_port()
    config = workdir / "sshd_config"
    config.write_text("\n".join([
        "ListenAddress 127.0.0.1",
        f"Port {port}",
        f"HostKey {host_key}",
        f"PidFile {workdir / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}",
        "StrictModes no",
        "UsePAM no",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "LogLevel VERBOSE",
        "",
    ]))
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-E", str(log), "-f", str(config)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port, proc, log)
    except BaseException:
        stop_sshd(proc)
        raise
    return SshServer(port, getpass.getuser(), workdir, host_key_line, client_key, log, proc.pid), proc


def _children(pid: int) -> list[int]:
    """Every descendant of PID (sshd's per-connection processes)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _terminate(pids: list[int], timeout: float = 5.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and not _zombie(p)]
        if alive:
            time.sleep(0.05)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _live(pids: list[int]) -> list[int]:
    return [p for p in pids if not _zombie(p)]


def _zombie(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except OSError:
        return True


def stop_sshd(proc: subprocess.Popen) -> None:
    """Stop the listening sshd and its per-connection children."""
    # Connections first, while the listener is there to reap them (else they end as zombies under PID 1): give
    # those whose client has gone a moment to end on their own, then terminate the rest.
    deadline = time.monotonic() + 3
    while _live(_children(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    _terminate(_live(_children(proc.pid)))
    _terminate([proc.pid])
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def processes_mentioning(text: str) -> list[int]:
    """PIDs (not this one) whose command line contains TEXT."""
    needle = text.encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def kill_control_masters(control_path_dir: Path) -> list[int]:
    """End the ssh ControlPersist masters that Ansible left with sockets in CONTROL_PATH_DIR."""
    pids = processes_mentioning(str(control_path_dir))
    _terminate(pids)
    return pids


# fleetctl as a subprocess against the server

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
