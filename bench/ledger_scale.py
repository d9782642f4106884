#!/usr/bin/env python3
"""How long the ledger (orchestrator/history/ledger.py), `fleetctl hosts` and `fleetctl report drivers` take on a large
history.

    python bench/ledger_scale.py [HOSTS] [AUDITS] [DIR]

Writes AUDITS daily audit runs of HOSTS hosts (HOSTS x AUDITS host records: 1000 x 1000 is a million) into a fresh
history (in DIR, default a temporary directory), through the Store calls fleetctl uses, each run at its own time by
the test clock ($FLEETCTL_TEST_CLOCK). Each host record has the facts the ledger reads (8 GPUs with UUIDs, the
driver, the boot id, Xid events) and the findings of the controls it reads; about 1 host in 200 logs an Xid 79 at
each audit (a new boot); the odd-numbered hosts move from OLD to NEW halfway. Then times the ledger's first build
(every record read once), `fleetctl hosts` and `fleetctl hosts show` as a user runs them (a subprocess) after one
more audit (the catch-up of one record), again with nothing new, and after a write by something other than fleetctl
(the history's integrity check due), and `fleetctl report drivers` (its ledger queries and statistics in process,
and the command). Prints the figures."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator import drivers
from orchestrator.history import ledger as ledger_mod, timefmt  # noqa: E402
from orchestrator.history.store import Store  # noqa: E402

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
XID_79 = "NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
OLD, NEW = "570.86.15", "580.95.05"
CONTROLS = ("gpu.count", "gpu.ecc_errors", "gpu.remapped_rows", "gpu.nvlink", "gpu.xid", "driver.loaded")


def host_record(n: int, audit: int, rng: random.Random, driver: str = NEW) -> dict:
    xid = rng.random() < 0.005
    gpus = [{"index": i, "uuid": f"GPU-{n:06d}-{i}", "pci_bus_id": f"00000000:{0x1b + i:02x}:00.0",
             "name": "NVIDIA H100 80GB HBM3"} for i in range(8)]
    events = [{"code": 79, "pci_bus_id": "00000000:1b:00.0", "class": "hardware", "severity": "critical",
               "source": "NVIDIA Xid catalog", "seq": 900, "raw": XID_79}] if xid else []
    facts = {"host": {"boot_id": f"b{n}-{audit if xid else 0}"}, "driver": {"module_version": driver},
             "gpus": gpus, "xid": {"events": events}}
    findings = [{"control": c, "severity": "high", "status": "fail" if xid and c == "gpu.xid" else "pass",
                 "message": "ok", "evidence": {}, "remediation": None} for c in CONTROLS]
    return {"name": f"gpu-{n:05d}", "groups": ["h100"], "reachable": True, "error": None, "facts": facts,
            "findings": findings}


def audit(store: Store, hosts: int, day: int, rng: random.Random, audits: int) -> None:
    os.environ[timefmt.TEST_CLOCK] = timefmt.stamp(START + timedelta(days=day))
    run_id, _ = store.begin_run("audit", ["audit"], "bench", None, None)
    store.finish_run(run_id, 0, {}, [host_record(n, day, rng, NEW if n % 2 and day >= audits // 2 else OLD)
                                     for n in range(hosts)])


def timed(*args: str, home: Path) -> float:
    env = dict(os.environ, FLEETCTL_HOME=str(home), FLEETCTL_CONFIG=os.devnull, COLUMNS="200")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, capture_output=True, text=True,
                          cwd=REPO)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr
    return elapsed


def main() -> None:
    hosts = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    audits = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    if len(sys.argv) > 3:  # kept there, to look at after
        Path(sys.argv[3]).mkdir(parents=True)
        run(Path(sys.argv[3]), hosts, audits)
        return
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp), hosts, audits)


def run(home: Path, hosts: int, audits: int) -> None:
    rng = random.Random(44)
    with Store(home / "history.sqlite3") as store:
        started = time.perf_counter()
        for day in range(audits):
            audit(store, hosts, day, rng, audits)
        write_s = time.perf_counter() - started
        started = time.perf_counter()
        with ledger_mod.Ledger(store) as ledger:
            incidents = len(ledger.incidents())
        build_s = time.perf_counter() - started
        audit(store, hosts, audits, rng, audits)  # one more: `fleetctl hosts` catches up one record
    size = (home / "history.sqlite3").stat().st_size
    after_write = timed("hosts", "--within", "14d", "--format", "json", home=home)
    again = timed("hosts", "--within", "14d", home=home)
    show = timed("hosts", "show", "gpu-00001", home=home)
    # as after a write by something other than fleetctl (a restore, sqlite3): the next command checks the whole file
    Path(f"{home / 'history.sqlite3'}.checked").unlink()
    check_due = timed("hosts", "--within", "14d", home=home)
    report_cmd = timed("report", "drivers", "--format", "json", home=home)
    with Store(home / "history.sqlite3", readonly=True, check=False) as store:
        audit_at = timefmt.stamp(START + timedelta(days=audits + 1))
        started = time.perf_counter()
        with ledger_mod.Ledger(store) as ledger:
            ledger_mod.hosts_summary(ledger, 14 * 86400, audit_at)
        query_s = time.perf_counter() - started
        started = time.perf_counter()
        with ledger_mod.Ledger(store) as ledger:
            comparisons = len(drivers.build(ledger)["comparisons"])
        report_s = time.perf_counter() - started
        started = time.perf_counter()
        store.damage()
        check_s = time.perf_counter() - started
    records = hosts * (audits + 1)
    print(f"{hosts} hosts x {audits + 1} audits ({records} host records, {size / 2**20:.0f} MiB, {incidents} "
          f"incidents): write {write_s:.0f}s; ledger first build {build_s:.1f}s ({1e6 * build_s / records:.0f} us "
          f"per record); fleetctl hosts after one more audit {after_write:.2f}s, again {again:.2f}s; "
          f"hosts show {show:.2f}s; after a write by something else (the check due) {check_due:.2f}s; of which the "
          f"ledger's catch-up and query {query_s * 1000:.0f} ms and the history's integrity check (every command's, "
          f"once per write by something else) "
          f"{check_s:.2f}s; report drivers ({comparisons} comparisons) {report_s:.2f}s in process, the command "
          f"{report_cmd:.2f}s")


if __name__ == "__main__":
    main()
