"""A fast SSH pre-flight: is the host up, and is its host key the one known_hosts has?

It stops at the key exchange (no login) and answers in a fraction of Ansible's connection timeout, so dead hosts and
changed host keys are reported clearly and kept out of the playbook run. Every host is connected at once, with
non-blocking sockets in one asyncio loop, and has TIMEOUT to accept the connection and send its first bytes (sshd's
`SSH-2.0-...` line); one that does is handed, on that same connection, to paramiko in a pool of KEY_CHECKS threads,
which checks the host key it offers. A host whose key this process has already found right is judged by its banner
alone in later pre-flights (a campaign's next step): ssh checks its key again anyway. Open sockets are capped at half of RLIMIT_NOFILE (its soft limit raised to the
hard one for the while): thousands of hosts that accept TCP and never speak cost one TIMEOUT, not one per 64 hosts.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shlex
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from .inventory import Host

if TYPE_CHECKING:
    import paramiko  # imported where a pre-flight runs (0.1 s): not for every command

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")
_SSH_ARG_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")
KEY_CHECKS = 64  # paramiko key exchanges at once (each runs a transport thread of its own besides)
_keys_found_right: set[tuple[str, int, tuple[Path, ...]]] = set()  # (address, port, known_hosts files)


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


def load_known_hosts(files: Sequence[Path]) -> paramiko.HostKeys:
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


def _no_banner(host: Host, timeout: float) -> Verdict:
    return Verdict(host.name, False, f"no SSH banner from {host.address}:{host.port} within {timeout:g} s (a hung "
                                     f"sshd, or not an SSH server on that port)")


def _cannot_connect(host: Host, error: OSError) -> Verdict:
    return Verdict(host.name, False, f"cannot connect to {host.address}:{host.port}: {error.strerror or error}")


def _key_check(host: Host, sock: socket.socket, timeout: float,
               known_hosts: Callable[[tuple[Path, ...]], paramiko.HostKeys]) -> Verdict:
    """The key exchange on SOCK, a connection to HOST that has started to speak: its host key against known_hosts."""
    import paramiko
    lookup = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
    files = tuple(known_hosts_files(host))
    known = known_hosts(files).lookup(lookup)  # checking is never off: inventory.check_host sees to it
    sock.setblocking(True)
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
        if not transport.remote_version:  # it spoke, but no "SSH-2.0-..." line: not an SSH server on that port
            return _no_banner(host, timeout)
        return Verdict(host.name, False, f"SSH handshake with {host.address}:{host.port} failed: {e}")
    finally:
        transport.close()
        sock.close()
    if not known:
        return Verdict(host.name, False, f"host key of {lookup} is not in {', '.join(map(str, files))} (host key checking is on)")
    expected = known.get(offered.get_name())
    if expected is None or expected != offered:
        return Verdict(host.name, False, f"HOST KEY CHANGED for {lookup}: the {offered.get_name()} key it offers "
                                          f"({offered.fingerprint}) does not match known_hosts")
    return Verdict(host.name, True)


async def _connect(addresses: list[tuple], deadline: float) -> socket.socket:
    """A non-blocking socket connected by DEADLINE (loop time), getaddrinfo's ADDRESSES tried in turn."""
    loop = asyncio.get_running_loop()
    error = OSError("no address")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            async with asyncio.timeout_at(deadline):
                await loop.sock_connect(sock, address)
            return sock
        except BaseException as e:
            sock.close()
            if not isinstance(e, OSError):
                raise
            error = OSError(e.errno, os.strerror(e.errno)) if e.errno else OSError("timed out")
    raise error


async def _readable(sock: socket.socket, deadline: float) -> None:
    """Wait until SOCK has something to read (the server's first line, or its end) by DEADLINE; read nothing."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(sock, lambda: ready.done() or ready.set_result(None))
    try:
        async with asyncio.timeout_at(deadline):
            await ready
    finally:
        loop.remove_reader(sock)


async def _check(host: Host, timeout: float, sockets: asyncio.Semaphore, pool: ThreadPoolExecutor,
                 known_hosts: Callable[[tuple[Path, ...]], paramiko.HostKeys]) -> Verdict:
    loop = asyncio.get_running_loop()
    try:  # before the clock starts: the time is the host's, not that of the resolver's queue
        addresses = await loop.getaddrinfo(host.address, host.port, type=socket.SOCK_STREAM)
    except OSError as e:
        return _cannot_connect(host, e)
    async with sockets:
        deadline = loop.time() + timeout
        try:
            sock = await _connect(addresses, deadline)
        except OSError as e:
            return _cannot_connect(host, e)
        try:
            await _readable(sock, deadline)
        except BaseException as e:
            sock.close()
            if isinstance(e, TimeoutError):
                return _no_banner(host, timeout)
            raise
        checked = (host.address, host.port, tuple(known_hosts_files(host)))
        if checked in _keys_found_right:
            sock.close()
            return Verdict(host.name, True)
        verdict = await loop.run_in_executor(pool, _key_check, host, sock, timeout, known_hosts)
        if verdict.ok:
            _keys_found_right.add(checked)
        return verdict


@contextmanager
def _open_files_limit() -> Iterator[int]:
    """RLIMIT_NOFILE's soft limit raised to the hard one where allowed, put back after; yields the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        limit = hard
    except (ValueError, OSError):  # an unlimited hard limit, above what the kernel allows
        limit = soft
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def check_all(hosts: list[Host], timeout: float = 5.0) -> dict[str, Verdict]:
    """Verdicts for the SSH hosts among HOSTS; hosts with another connection type are not checked."""
    ssh_hosts = [h for h in hosts if h.connection in ("ssh", "paramiko", "smart") and h.plain_ssh]
    if not ssh_hosts:
        return {}

    async def all_hosts() -> list[Verdict]:
        sockets = asyncio.Semaphore(min(len(ssh_hosts), limit // 2))
        known_hosts = cache(load_known_hosts)  # each known_hosts file read once per pre-flight, not once per host
        return await asyncio.gather(*(_check(h, timeout, sockets, pool, known_hosts) for h in ssh_hosts))

    with _open_files_limit() as limit, ThreadPoolExecutor(max_workers=min(KEY_CHECKS, len(ssh_hosts))) as pool:
        return {v.host: v for v in asyncio.run(all_hosts())}
