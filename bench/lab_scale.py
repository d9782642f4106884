#!/usr/bin/env python3
"""Lab scale on this machine: `fleetctl lab up` / `down` time, memory, and `fleetctl audit` over the lab (root).

Usage: sudo .venv/bin/python bench/lab_scale.py [HOSTS] [DRIVER]
Prints: up wall time, memory the lab holds once up (MemAvailable before vs after, and the hosts' processes' RSS),
audit wall time and CPU of the controller's process tree (2 runs), down wall time.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ssh_masters  # bench/ssh_masters.py, beside this script

REPO = Path(__file__).resolve().parents[1]


def mem_available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def rss_kb_of_netns(prefix: str) -> int:
    total = 0
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for ns in [n for n in names if n.startswith(prefix)]:
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                pass
    return total


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def main() -> None:
    hosts = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    driver = sys.argv[2] if len(sys.argv) > 2 else "570.86.15"
    fleetctl = [sys.executable, "-m", "orchestrator.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, FLEETCTL_LAB_DIR=f"{tmp}/lab", FLEETCTL_HOME=f"{tmp}/home",
                   ANSIBLE_SSH_CONTROL_PATH_DIR=f"{tmp}/cp")
        mem0 = mem_available_kb()
        try:
            wall, cpu, proc = timed(fleetctl + ["lab", "up", "--spec", f"{hosts}xh100-sxm@{driver}"], env)
            assert proc.returncode == 0, proc.stderr
            print(f"lab up {hosts} hosts (driver {driver}): {wall:.1f} s wall, {cpu:.1f} s CPU (tree)")
            time.sleep(2)
            print(f"memory held by the lab: MemAvailable -{(mem0 - mem_available_kb()) / 1024:.0f} MiB; "
                  f"RSS of the hosts' processes {rss_kb_of_netns('fl-') / 1024:.0f} MiB")
            inventory = subprocess.run(fleetctl + ["lab", "inventory"], capture_output=True, text=True, env=env,
                                       cwd=REPO).stdout.strip()
            for run in (1, 2):
                wall, cpu, proc = timed(fleetctl + ["audit", "-i", inventory, "--format", "json"], env)
                report = json.loads(proc.stdout)
                collect = sorted(h["facts"]["collect_seconds"] for h in report["hosts"] if h["facts"])
                print(f"audit {hosts} lab hosts, run {run}: {wall:.1f} s wall, {cpu:.1f} s CPU (controller tree), "
                      f"exit {proc.returncode}, module median {collect[len(collect) // 2]:.3f} s per host")
        finally:
            wall, _, proc = timed(fleetctl + ["lab", "down"], env)
            print(f"lab down: {wall:.1f} s wall (exit {proc.returncode})")
            ssh_masters.close(f"{tmp}/cp")


if __name__ == "__main__":
    main()
