#!/usr/bin/env python3
"""Driver activation by reboot vs by module reload, on a lab fleet (root).

Usage: sudo .venv/bin/python bench/activation.py [--hosts 4] [--runs 3]

Brings up HOSTS H100 hosts on 550.163.01 and runs one-wave campaigns back and forth between 550.163.01 and
570.86.15, alternating the baseline's campaign.activation between reboot and reload (RUNS campaigns each). Prints,
per campaign, the activate step's wall time (its batch: every host at once), the campaign span and how each host
was activated, from `fleetctl campaign show ID --format json`. The lab is down for ~0.7 s per reboot: on real hosts
a reboot costs minutes more, a reload the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import ssh_masters  # bench/ssh_masters.py, beside this script

REPO = Path(__file__).resolve().parents[1]
FLEETCTL = [sys.executable, "-m", "orchestrator.cli"]
VERSIONS = ("550.163.01", "570.86.15")
FAST = ["--yes", "--soak", "0", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--waves", "100%"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-") as tmp:
        env = dict(os.environ, FLEETCTL_LAB_DIR=f"{tmp}/lab", FLEETCTL_HOME=f"{tmp}/home",
                   ANSIBLE_SSH_CONTROL_PATH_DIR=f"{tmp}/cp")

        def fleetctl(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(FLEETCTL + list(argv), env=env, cwd=REPO, capture_output=True, text=True)
        up = fleetctl("lab", "up", "--spec", f"{args.hosts}xh100-sxm/2@{VERSIONS[0]}")
        try:
            if up.returncode != 0:
                raise SystemExit(f"lab up failed: {up.stderr.strip()}")
            inventory = fleetctl("lab", "inventory").stdout.strip()
            figures: dict[str, list[float]] = {"reboot": [], "reload": []}
            for n in range(1, 2 * args.runs + 1):
                mode, target = ("reboot", "reload")[n % 2 == 0], VERSIONS[n % 2]
                base = Path(tmp) / f"{mode}.yml"
                base.write_text("schema_version: 1\nname: bench\ngroups:\n  all:\n"
                                f"    driver: {{branches: ['550', '570'], held: true}}\n"
                                f"    campaign: {{activation: {mode}}}\n")
                proc = fleetctl("upgrade", "--to", target, "-i", inventory, "-b", str(base), *FAST)
                if proc.returncode != 0:
                    raise SystemExit(f"campaign {n} exited {proc.returncode}: {proc.stdout[-1000:]}{proc.stderr}")
                doc = json.loads(fleetctl("campaign", "show", str(n), "--format", "json").stdout)
                activate = doc["time"]["steps"]["activate"]["batch_s"]
                how = sorted({json.dumps(next(s["detail"] for s in h["steps"] if s["step"] == "activate"))
                              for h in doc["hosts"]})
                figures[mode].append(activate)
                print(f"campaign {n}: {mode:6} to {target:10}  activate {activate:5.1f}s  "
                      f"span {doc['time']['span_s']:5.1f}s  {' '.join(how)}", flush=True)
            for mode, values in figures.items():
                print(f"{mode}: activate median {statistics.median(values):.1f}s over {len(values)} campaigns "
                      f"of {args.hosts} hosts")
        finally:
            fleetctl("lab", "down")
            ssh_masters.close(f"{tmp}/cp")


if __name__ == "__main__":
    main()
