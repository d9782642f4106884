"""The SSH pre-flight at scale: hundreds of hosts that accept TCP and never speak are judged in about one timeout,
while a real sshd among them still has its host key checked (the test's own sshd, see conftest.py)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from orchestrator.fleet import preflight
from orchestrator.fleet.inventory import Host

from tests.helpers.sshd import keygen

REPO = Path(__file__).resolve().parents[2]
SILENT, PER_PORT = 500, 50  # loopback ports that accept connections (the kernel's backlog) and never read or write


def host(name: str, port: int, known_hosts) -> Host:
    return Host(name, ("all",), {"ansible_host": "127.0.0.1", "ansible_port": port,
                                 "ansible_ssh_common_args": f"-o UserKnownHostsFile={known_hosts}"})


def test_500_silent_hosts_take_one_timeout_and_a_real_sshd_is_still_checked_by_key(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_entry)
    impostor = tmp_path / "impostor_known_hosts"
    impostor.write_text(f"[127.0.0.1]:{sshd.port} {keygen(tmp_path / 'impostor', 'impostor')}\n")
    timeout = 2.0
    with ExitStack() as stack:
        ports = []
        for _ in range(SILENT // PER_PORT):
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", 0))
            listener.listen(PER_PORT * 2)
            ports.append(listener.getsockname()[1])
        hosts = [host(f"silent-{i}", ports[i % len(ports)], known) for i in range(SILENT)]
        hosts += [host("real", sshd.port, known), host("impostor", sshd.port, impostor)]
        started = time.monotonic()
        verdicts = preflight.check_all(hosts, timeout=timeout)
        elapsed = time.monotonic() - started

    assert verdicts["real"].ok, verdicts["real"]
    assert "HOST KEY CHANGED" in verdicts["impostor"].reason, verdicts["impostor"]
    silent = [verdicts[f"silent-{i}"] for i in range(SILENT)]
    assert all(not v.ok and v.reason.startswith("no SSH banner from 127.0.0.1:") and "within 2 s" in v.reason
               for v in silent), {v.reason for v in silent}
    # All at once: about one timeout, where 64 hosts at a time took 8 timeouts (16 s).
    assert elapsed < 4 * timeout, f"{elapsed:.1f} s"


def test_under_a_low_open_files_limit_hosts_wait_for_a_socket_instead_of_failing(tmp_path):
    """Hard limit 256 (nothing to raise to): at most 128 sockets open, so 400 hosts are judged in turns."""
    script = ("import resource, sys\n"
              "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n"
              "from orchestrator.fleet import preflight\n"
              "from orchestrator.fleet.inventory import Host\n"
              "hosts = [Host(f'h{i}', ('all',), {'ansible_host': '127.0.0.1', 'ansible_port': int(sys.argv[1 + i % 4])})"
              " for i in range(400)]\n"
              "print(sorted({v.reason.split(' from ')[0] for v in preflight.check_all(hosts, timeout=0.5).values()}))\n")
    with ExitStack() as stack:
        ports = []
        for _ in range(4):
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", 0))
            listener.listen(PER_PORT * 3)
            ports.append(str(listener.getsockname()[1]))
        proc = subprocess.run([sys.executable, "-c", script, *ports], capture_output=True, text=True, timeout=60,
                              cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['no SSH banner']", proc.stdout  # never "cannot connect: Too many open files"


def forwarder(target_port: int) -> socket.socket:
    """A port of 127.0.0.1 forwarding to TARGET_PORT while its listener is open: closed, connections are refused."""
    listener = socket.create_server(("127.0.0.1", 0))

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                upstream = socket.create_connection(("127.0.0.1", target_port))
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_key_found_right_is_not_checked_again_but_the_host_still_is(sshd, tmp_path, monkeypatch):
    """A campaign's later steps: the key exchange once per process and host; a host that went away is still found."""
    exchanges = []
    key_check = preflight._key_check
    monkeypatch.setattr(preflight, "_key_check", lambda h, *a: exchanges.append(h.name) or key_check(h, *a))
    listener = forwarder(sshd.port)
    port = listener.getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_entry.replace(f"]:{sshd.port} ", f"]:{port} "))
    impostor = tmp_path / "impostor_known_hosts"
    impostor.write_text(f"[127.0.0.1]:{port} {keygen(tmp_path / 'impostor', 'impostor')}\n")

    assert preflight.check_all([host("gpu-a", port, known)])["gpu-a"].ok
    assert preflight.check_all([host("gpu-a", port, known)])["gpu-a"].ok
    assert exchanges == ["gpu-a"]
    # Another known_hosts file is another check.
    assert "HOST KEY CHANGED" in preflight.check_all([host("gpu-a", port, impostor)])["gpu-a"].reason
    listener.shutdown(socket.SHUT_RDWR)  # wakes its accept(): the port is closed
    listener.close()
    gone = preflight.check_all([host("gpu-a", port, known)], timeout=2.0)["gpu-a"]
    assert not gone.ok and gone.reason.startswith(f"cannot connect to 127.0.0.1:{port}"), gone
