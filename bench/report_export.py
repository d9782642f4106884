#!/usr/bin/env python3
"""How long `fleetctl report` takes in each format, and `report verify`, on a history of real-sized audits.

    python bench/report_export.py [AUDITS] [HOSTS]

Fills a fresh history (a temporary $FLEETCTL_HOME) with AUDITS audit runs of HOSTS hosts through the Store calls
fleetctl uses; every host entry is the real H100 capture's (tests/testdata/h100-580.159.04-audit, 27 findings)
under its own name, one host in ten on an older driver. Then runs the real CLI for each export format and for
verify, and prints wall time and output size of each (medians of 3)."""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.history.store import Store  # noqa: E402

CAPTURE = ROOT / "tests/testdata/h100-580.159.04-audit/audit-nvml.json"


def fill(home: Path, audits: int, hosts: int) -> None:
    template = json.loads(CAPTURE.read_text())["hosts"][0]
    entries = []
    for h in range(hosts):
        entry = copy.deepcopy(template)
        entry["name"] = f"gpu-{h:04d}"
        if h % 10 == 0:
            entry["facts"]["driver"]["module_version"] = "570.86.15"
        entries.append(entry)
    with Store(home / "history.sqlite3") as store:
        for _ in range(audits):
            run_id, _ = store.begin_run("audit", ["fleetctl", "audit"], "bench", None, None)
            store.finish_run(run_id, 1, {"hosts": hosts}, entries)


def timed(home: Path, *args: str) -> tuple[float, int]:
    env = dict(os.environ, FLEETCTL_HOME=str(home))
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT, env=env,
                              capture_output=True)
        runs.append(time.perf_counter() - started)
        if proc.returncode != 0:
            raise SystemExit(f"fleetctl {' '.join(args)}: exit {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return statistics.median(runs), len(proc.stdout)


def main() -> None:
    audits = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    hosts = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        started = time.perf_counter()
        fill(home, audits, hosts)
        print(f"history: {audits} audits x {hosts} hosts x 27 findings, written and sealed in "
              f"{time.perf_counter() - started:.1f}s, {(home / 'history.sqlite3').stat().st_size / 2**20:.1f} MiB")
        for args in (("report", "verify"), *(("report", "--format", f) for f in ("json", "csv", "html", "oscal"))):
            wall, size = timed(home, *args)
            print(f"fleetctl {' '.join(args):<26} {wall:6.2f}s  {size / 1024:8.0f} KiB out")


if __name__ == "__main__":
    main()
