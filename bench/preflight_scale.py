#!/usr/bin/env python3
"""The SSH pre-flight against N hosts that accept TCP and never speak (a hung sshd, a site-wide outage).

Usage: .venv/bin/python bench/preflight_scale.py [--sizes 500,2000,5000] [--timeout 5]

For each N, a listener process holds loopback ports that never accept (the kernel completes the TCP handshake into
their backlog, PER_PORT hosts a port), and a fresh process runs `preflight.check_all` on N hosts spread over them.
Prints the wall time of the pre-flight, how many hosts it judged "no SSH banner", and that process's peaks,
sampled every few milliseconds from /proc: threads, open file descriptors, RSS (ru_maxrss), with RLIMIT_NOFILE.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PER_PORT = 100  # connections queued on one listening port: under any kernel's somaxconn (128 at least)


def listen(n: int) -> None:
    """Hold ports for N silent hosts until stdin closes; print them first."""
    listeners = []
    for _ in range(-(-n // PER_PORT)):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(PER_PORT)
        listeners.append(sock)
    print(json.dumps([s.getsockname()[1] for s in listeners]), flush=True)
    sys.stdin.read()


def preflight(n: int, timeout: float, ports: list[int]) -> None:
    """Run the pre-flight on N hosts over PORTS; print its wall time, the banner verdicts and the peak RSS."""
    sys.path.insert(0, str(REPO))
    from orchestrator.fleet import preflight
    from orchestrator.fleet.inventory import Host
    hosts = [Host(f"silent-{i}", ("all",), {"ansible_host": "127.0.0.1", "ansible_port": ports[i % len(ports)]})
             for i in range(n)]
    started = time.perf_counter()
    verdicts = preflight.check_all(hosts, timeout)
    wall = time.perf_counter() - started
    no_banner = sum(not v.ok and v.reason.startswith("no SSH banner") for v in verdicts.values())
    print(json.dumps({"wall": wall, "no_banner": no_banner,
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def sample(pid: int) -> tuple[int, int]:
    """Threads and open file descriptors of process PID now (0, 0 once it has gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
        return threads, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return 0, 0


def measure(n: int, timeout: float) -> dict:
    with subprocess.Popen([sys.executable, __file__, "--listen", str(n)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as listener:
        ports = json.loads(listener.stdout.readline())
        proc = subprocess.Popen([sys.executable, __file__, "--preflight", str(n), "--timeout", str(timeout),
                                 "--ports", ",".join(map(str, ports))], stdout=subprocess.PIPE, text=True)
        threads = fds = 0
        while proc.poll() is None:
            now = sample(proc.pid)
            threads, fds = max(threads, now[0]), max(fds, now[1])
            time.sleep(0.005)
        result = json.loads(proc.stdout.read())
        listener.stdin.close()
    return {**result, "threads": threads, "fds": fds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500,2000,5000")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--listen", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--preflight", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.listen:
        return listen(opts.listen)
    if opts.preflight:
        return preflight(opts.preflight, opts.timeout, [int(p) for p in opts.ports.split(",")])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"pre-flight of silent hosts, timeout {opts.timeout:g} s, RLIMIT_NOFILE {soft}/{hard} (soft/hard), "
          f"{os.cpu_count()} CPUs")
    print(f"{'hosts':>6} {'wall':>8} {'no banner':>10} {'threads':>8} {'open fds':>9} {'peak RSS':>9}")
    for n in (int(s) for s in opts.sizes.split(",")):
        r = measure(n, opts.timeout)
        print(f"{n:>6} {r['wall']:>7.2f}s {r['no_banner']:>10} {r['threads']:>8} {r['fds']:>9} "
              f"{r['rss_mib']:>5.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
