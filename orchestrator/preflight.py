"""A fast SSH pre-flight with paramiko: is the host up, and is its host key the one known_hosts has?

It stops at the key exchange (no login), runs for all hosts at once, and answers in a fraction of Ansible's
connection timeout, so dead hosts and changed host keys are reported clearly and kept out of the playbook run.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .inventory import Host

if TYPE_CHECKING:
    import paramiko  # imported where a pre-flight runs (0.1 s): not for every command

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")
_SSH_ARG_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")


@dataclass(frozen=True)
class Verdict:
    host: str
    ok: bool
    reason: str = ""


def known_hosts_files(host: Host) -> list[Path]:
    """UserKnownHostsFile from the host's SSH arguments, else OpenSSH's defaults."""
    files: list[str] = []
    for var in _SSH_ARG_VARS:
        args = str(host.vars.get(var, "") or "")
        if "{{" in args:
            continue
        tokens = shlex.split(args)
        for i, token in enumerate(tokens):
            option = token[2:] if token.startswith("-o") and len(token) > 2 else (tokens[i + 1] if token == "-o" and i + 1 < len(tokens) else "")
            m = re.match(r"(?i)^UserKnownHostsFile[= ](.+)$", option)
            if m:
                files += m.group(1).split()
    return [Path(os.path.expanduser(f)) for f in (files or DEFAULT_KNOWN_HOSTS)]


def load_known_hosts(files: list[Path]) -> paramiko.HostKeys:
    import paramiko
    keys = paramiko.HostKeys()
    for path in files:
        if path.is_file():
            try:
                keys.load(str(path))
            except (OSError, paramiko.SSHException):
                continue
    return keys


def _key_types(known: paramiko.hostkeys.SubDict | None) -> list[str]:
    """Host key algorithms to ask for: those known_hosts has a key of (an RSA key is offered as rsa-sha2-*)."""
    types: list[str] = []
    for name in (known.keys() if known else []):
        types += ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if name == "ssh-rsa" else [name]
    return types


def check(host: Host, timeout: float = 5.0) -> Verdict:
    import paramiko
    address, port = host.address, host.port
    lookup = address if port == 22 else f"[{address}]:{port}"
    files = known_hosts_files(host)
    known = load_known_hosts(files).lookup(lookup)  # checking is never off: inventory.check_host sees to it
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except OSError as e:
        return Verdict(host.name, False, f"cannot connect to {address}:{port}: {e.strerror or e}")
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        wanted = [t for t in _key_types(known) if t in transport.get_security_options().key_types]
        if wanted:
            transport.get_security_options().key_types = wanted
        # The banner's own timeout ends the wait first: paramiko's thread then says why (FLEETCTL_DEBUG shows it)
        # instead of racing the caller's wait and losing to transport.close().
        transport.start_client(timeout=timeout + 1)
        offered = transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as e:
        if not transport.remote_version:  # TCP accepted, no "SSH-2.0-..." line: a hung sshd, or not sshd at all
            return Verdict(host.name, False, f"no SSH banner from {address}:{port} within {timeout:g} s (a hung "
                                             f"sshd, or not an SSH server on that port)")
        return Verdict(host.name, False, f"SSH handshake with {address}:{port} failed: {e}")
    finally:
        transport.close()
    if not known:
        return Verdict(host.name, False, f"host key of {lookup} is not in {', '.join(map(str, files))} (host key checking is on)")
    expected = known.get(offered.get_name())
    if expected is None or expected != offered:
        return Verdict(host.name, False, f"HOST KEY CHANGED for {lookup}: the {offered.get_name()} key it offers "
                                          f"({offered.fingerprint}) does not match known_hosts")
    return Verdict(host.name, True)


def check_all(hosts: list[Host], timeout: float = 5.0) -> dict[str, Verdict]:
    """Verdicts for the SSH hosts among HOSTS; hosts with another connection type are not checked."""
    ssh_hosts = [h for h in hosts if h.connection in ("ssh", "paramiko", "smart") and h.plain_ssh]
    if not ssh_hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(ssh_hosts))) as pool:
        return {v.host: v for v in pool.map(lambda h: check(h, timeout), ssh_hosts)}
