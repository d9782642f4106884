#!/usr/bin/env python3
"""`fleetctl check` wall time on this machine: what Slurm's HealthCheckProgram or a job prolog would wait for.

Usage: .venv/bin/python bench/check_latency.py [--runs 21] [--no-bytecode] [--profile] [-- extra check arguments]

Runs `python -m orchestrator.cli check ARGS` RUNS times (a fresh process each, as Slurm starts it: interpreter
start, imports, collection, evaluation, output) after one first run, and prints the first run's wall time, the
median and p95 of the others, and the modules check must not import if any got imported (jsonschema included: the
first run has validated the baseline, the others find it in the cache).

Each run is as on a node where fleetctl is installed: every module's bytecode cached (pip compiles it at install;
here the first run writes it to a temporary PYTHONPYCACHEPREFIX, whatever PYTHONDONTWRITEBYTECODE says), and
fleetctl's cache in a temporary XDG_CACHE_HOME, empty before the first run. --no-bytecode: Python writes no
bytecode (PYTHONDONTWRITEBYTECODE=1), so a module with none beside it (fleetctl's own, in a checkout) is compiled
from its source on every run.

--profile: also where the time of a run goes, median of RUNS fresh processes, each part in ms: start (the
process's wall time less the parts below: the interpreter's start and exit), imports (fleetctl's, click's, the
collection's modules), baseline (load, cached validation), NVML (the collector's NVML session: GPUs and
interconnect), kernel log (Xid and SXid records), other facts (packages, commands, sysfs), evaluation (the controls) and output; JSON on the last line, to compare with a real GPU node's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLEETCTL = [sys.executable, "-m", "orchestrator.cli", "check"]
NOT_IMPORTED = ("numpy", "paramiko", "ansible", "ansible_runner", "rich", "jsonschema", "jsonschema_rs",
                "orchestrator.history.ledger", "orchestrator.schedulers.slurmctl", "orchestrator.judge.gate")
PROBE = ("import runpy, sys, json\nsys.argv = ['fleetctl', 'check'] + sys.argv[1:]\n"
         "try:\n    runpy.run_module('orchestrator.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         f"print(json.dumps([m for m in {NOT_IMPORTED!r} if m in sys.modules]), file=sys.stderr)\n")
# One run of `fleetctl check` timed by part: each part's function wrapped (monotonic clock; nested parts subtracted
# from their caller's), the run's own start and end taken here; JSON of {part: seconds} on stderr's last line.
PROFILE = """
import json, runpy, sys, time
start = time.perf_counter()
spent = {}
stack = []

def timed(owner, name, part):
    fn = getattr(owner, name)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        stack.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            took = time.perf_counter() - t
            inner = stack.pop()
            spent[part] = spent.get(part, 0.0) + took - inner
            if stack:
                stack[-1] += took
    setattr(owner, name, wrapper)

from orchestrator import audit, baseline, check, resources
load_module = resources.module
def module(name):
    loaded = load_module(name)
    c = loaded.Collector
    timed(c, "nvml", "nvml")
    timed(c, "xid", "kernel_log")
    timed(c, "sxid", "kernel_log")
    return loaded
resources.module = module
timed(resources, "module", "imports_collector")
timed(baseline, "load", "baseline")
timed(check, "collect_facts", "other_facts")
timed(audit, "evaluate_facts", "evaluation")
run = check.run
marks = {}
def run_marked(opts):
    marks["run"] = time.perf_counter()
    try:
        return run(opts)
    finally:
        marks["output"] = time.perf_counter()
check.run = run_marked
sys.argv = ["fleetctl", "check"] + sys.argv[1:]
try:
    runpy.run_module("orchestrator.cli", run_name="__main__")
except SystemExit:
    pass
end = time.perf_counter()
spent["imports"] = marks["run"] - start + spent.pop("imports_collector", 0.0)
spent["output"] = end - marks["output"]
print(json.dumps(spent), file=sys.stderr)
"""
PARTS = ("start", "imports", "baseline", "nvml", "kernel_log", "other_facts", "evaluation", "output")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--no-bytecode", action="store_true", help="compile every module from source on every run")
    parser.add_argument("--profile", action="store_true", help="also time each part of a run (median ms)")
    parser.add_argument("args", nargs="*", help="arguments for fleetctl check (after --)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="check-latency-") as scratch:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "XDG_CACHE_HOME": os.path.join(scratch, "cache")}
        if opts.no_bytecode:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = os.path.join(scratch, "bytecode")
        measure(opts, env)


def measure(opts: argparse.Namespace, env: dict[str, str]) -> None:
    started = time.perf_counter()
    subprocess.run(FLEETCTL + opts.args, cwd=REPO, env=env, capture_output=True)  # also warms the page cache
    first = time.perf_counter() - started
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
    print(f"fleetctl check {' '.join(opts.args)}{' (no bytecode)' if opts.no_bytecode else ''}: first run "
          f"{first:.3f}s, then {opts.runs} runs, median {statistics.median(times):.3f}s, p95 {p95:.3f}s, min "
          f"{times[0]:.3f}s, max {times[-1]:.3f}s; load average {os.getloadavg()[0]:.2f}")
    if imported:
        sys.exit(f"check imported {', '.join(imported)}")
    if opts.profile:
        profile(opts, env)


def profile(opts: argparse.Namespace, env: dict[str, str]) -> None:
    """Each part's median over RUNS fresh processes, in ms; start: the process's wall time less what it timed."""
    runs: dict[str, list[float]] = {part: [] for part in PARTS}
    for _ in range(opts.runs):
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", PROFILE, *opts.args], cwd=REPO, env=env, capture_output=True)
        wall = time.perf_counter() - started
        spent = json.loads(proc.stderr.decode().strip().splitlines()[-1])
        spent["start"] = wall - sum(spent.values())
        for part in PARTS:
            runs[part].append(spent.get(part, 0.0) * 1000)
    medians = {part: round(statistics.median(values), 1) for part, values in runs.items()}
    print("median ms by part: " + ", ".join(f"{part} {ms:.1f}" for part, ms in medians.items())
          + f"; sum {sum(medians.values()):.1f}")
    print(json.dumps({"runs": opts.runs, "bytecode": not opts.no_bytecode, "median_ms": medians}))


if __name__ == "__main__":
    main()
