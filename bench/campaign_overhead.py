#!/usr/bin/env python3
"""fleetctl's own time as a share of an upgrade campaign's wall time (target <= 5%), on a lab fleet (root).

Usage: sudo .venv/bin/python bench/campaign_overhead.py [--hosts 8] [--waves 1,50%,100%] [--runs 2]

Brings up HOSTS H100 hosts on 550.163.01 and runs `fleetctl upgrade --to 570.86.15` (then back to 550, and so
on: RUNS campaigns), each in a process that records on exit its wall time, the seconds it spent inside
ansible-playbook runs (the planning audit included) and its own CPU seconds (RUSAGE_SELF: fleetctl's Python,
ansible-runner's event handling, SQLite; not ansible-playbook). Prints per campaign:
  whole command   wall, inside ansible-playbook, fleetctl's own = the rest (start-up, pre-flight, planning,
                  journal commits, decisions, gate maths, hooks: none here, soak 0), its share, fleetctl CPU
  campaign span   the same split from the campaign's own events (`fleetctl campaign show ID --format json`)
  per step        wall seconds of each step summed over its batches
fleetctl's modules run from bytecode, as where pip installed them (compiled once first, into the checkout's
__pycache__ directories, whatever PYTHONDONTWRITEBYTECODE says).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ssh_masters  # bench/ssh_masters.py, beside this script

REPO = Path(__file__).resolve().parents[1]
FLEETCTL = [sys.executable, "-m", "orchestrator.cli"]
VERSIONS = ("550.163.01", "570.86.15")
INSTALLED = ("orchestrator.cli.campaign", "orchestrator.upgrade", "orchestrator.campaign.steps", "orchestrator.probe",
             "orchestrator.fleet.preflight", "orchestrator.judge.canary.statistics")  # and every module they import
FAST = ["--yes", "--soak", "0", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--idle-timeout", "20"]

# Runs the CLI in this process and writes, at exit, what only the process itself knows.
MEASURED_CLI = """
import atexit, json, os, resource, runpy, sys, time
started = time.monotonic()
def record():
    from orchestrator.fleet import runner
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["BENCH_RECORD"], "w") as out:
        json.dump({"wall_s": time.monotonic() - started, "ansible_s": runner.PLAYBOOK_TIME.total,
                   "cpu_self_s": usage.ru_utime + usage.ru_stime}, out)
atexit.register(record)
sys.argv = ["fleetctl"] + sys.argv[1:]
runpy.run_module("orchestrator.cli", run_name="__main__")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--waves", default="1,50%,100%")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-") as tmp:
        env = dict(os.environ, FLEETCTL_LAB_DIR=f"{tmp}/lab", FLEETCTL_HOME=f"{tmp}/home",
                   ANSIBLE_SSH_CONTROL_PATH_DIR=f"{tmp}/cp", BENCH_RECORD=f"{tmp}/record.json")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        Path(f"{tmp}/cp").mkdir()
        # As installed (pip compiles to bytecode): fleetctl's modules compiled once, not at every campaign's start.
        subprocess.run([sys.executable, "-c", f"import {', '.join(INSTALLED)}"], env=env, cwd=REPO, check=True)
        up = subprocess.run(FLEETCTL + ["lab", "up", "--spec", f"{args.hosts}xh100-sxm/2@{VERSIONS[0]}"], env=env,
                            cwd=REPO, capture_output=True, text=True)
        try:
            if up.returncode != 0:
                raise SystemExit(f"lab up failed: {up.stderr.strip()}")
            inventory = f"{tmp}/lab/inventory.ini"
            rows = []
            for n in range(args.runs):
                target = VERSIONS[(n + 1) % 2]
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, "-c", MEASURED_CLI, "upgrade", "--to", target, "-i",
                                       inventory, "--waves", args.waves, *FAST], env=env, cwd=REPO,
                                      capture_output=True, text=True)
                outer = time.perf_counter() - t0
                if proc.returncode != 0:
                    raise SystemExit(f"campaign {n + 1} exited {proc.returncode}: {proc.stdout[-800:]}{proc.stderr}")
                inner = json.loads(Path(f"{tmp}/record.json").read_text())
                show = subprocess.run(FLEETCTL + ["campaign", "show", str(n + 1), "--format", "json"], env=env,
                                      cwd=REPO, capture_output=True, text=True, check=True)
                rows.append((target, outer, inner, json.loads(show.stdout)["time"]))
            report(args, rows)
        finally:
            subprocess.run(FLEETCTL + ["lab", "down"], env=env, cwd=REPO, capture_output=True)
            ssh_masters.close(f"{tmp}/cp")


def report(args, rows) -> None:
    print(f"{args.hosts} lab hosts, waves {args.waves}, soak 0, no drain hook\n")
    print(f"{'campaign':<14} {'wall s':>7} {'ansible s':>9} {'fleetctl s':>10} {'share':>6} {'fleetctl CPU s':>14}"
          f"   | span s  ansible s  fleetctl s  share")
    for target, outer, inner, t in rows:
        own = outer - inner["ansible_s"]
        print(f"to {target:<11} {outer:>7.1f} {inner['ansible_s']:>9.1f} {own:>10.2f} {own / outer:>6.1%} "
              f"{inner['cpu_self_s']:>14.2f}   | {t['span_s']:>6.1f} {t['ansible_s']:>10.1f} {t['fleetctl_s']:>11.2f} "
              f"{t['fleetctl_share']:>6.1%}")
    steps = rows[-1][3]["steps"]
    print("\nlast campaign, wall seconds per step (summed over its batches): "
          + ", ".join(f"{k} {v['batch_s']:.1f}" for k, v in steps.items()))


if __name__ == "__main__":
    main()
