#!/usr/bin/env python3
"""`fleetctl check` wall time on this machine: what Slurm's HealthCheckProgram or a job prolog would wait for.

Usage: .venv/bin/python bench/check_latency.py [--runs 20] [-- extra check arguments]

Runs `python -m orchestrator.cli check ARGS` RUNS times (a fresh process each, as Slurm starts it: interpreter
start, imports, collection, evaluation, output) after one warm-up run, and prints the median and p95 wall time and
the modules check must not import (numpy, paramiko, ansible, ansible_runner, rich) if any got imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLEETCTL = [sys.executable, "-m", "orchestrator.cli", "check"]
NOT_IMPORTED = ("numpy", "paramiko", "ansible", "ansible_runner", "rich")
PROBE = ("import runpy, sys, json\nsys.argv = ['fleetctl', 'check'] + sys.argv[1:]\n"
         "try:\n    runpy.run_module('orchestrator.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         f"print(json.dumps([m for m in {NOT_IMPORTED!r} if m in sys.modules]), file=sys.stderr)\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("args", nargs="*", help="arguments for fleetctl check (after --)")
    opts = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run(FLEETCTL + opts.args, cwd=REPO, env=env, capture_output=True)  # warm the page cache
    times = []
    for _ in range(opts.runs):
        started = time.perf_counter()
        proc = subprocess.run(FLEETCTL + opts.args, cwd=REPO, env=env, capture_output=True)
        times.append(time.perf_counter() - started)
        if proc.returncode not in (0, 1):
            sys.exit(f"fleetctl check exited {proc.returncode}: {proc.stderr.decode().strip()}")
    probe = subprocess.run([sys.executable, "-c", PROBE, *opts.args], cwd=REPO, env=env, capture_output=True)
    imported = json.loads(probe.stderr.decode().strip().splitlines()[-1])
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    print(f"fleetctl check {' '.join(opts.args)}: {opts.runs} runs, median {statistics.median(times):.3f}s, "
          f"p95 {p95:.3f}s, min {times[0]:.3f}s, max {times[-1]:.3f}s; load average {os.getloadavg()[0]:.2f}")
    if imported:
        sys.exit(f"check imported {', '.join(imported)}")


if __name__ == "__main__":
    main()
