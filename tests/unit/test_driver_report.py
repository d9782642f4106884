"""`fleetctl report drivers` (orchestrator/drivers.py): incident rates per driver version and GPU model from the
ledger, and each version against the one it replaced, on a history of 500 hosts over 60 days written through the
Store at given times (the test clock), with rates planted from a seeded Poisson."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from orchestrator import drivers, schemas
from orchestrator.history import timefmt
from orchestrator.exitcodes import Exit
from orchestrator.history.store import Store
from tests.helpers.cli import fleetctl

START = datetime(2026, 3, 2, 8, 0, tzinfo=timezone.utc)
OLD, NEW = "570.86.15", "580.95.05"
MODEL = "NVIDIA H100 80GB HBM3"
HOSTS, DAYS, EVERY, GPUS = 500, 60, 2, 8  # an audit of every host every 2 days (the ledger's longest gap counted)
# Incidents per 1,000 GPU-days planted on each driver: Xid 79 three times as often on the new one, an Xid 48 only
# on the new one (none on the old: an unbounded ratio), uncorrectable ECC as often on both.
PLANTED = {"xid_79": (0.25, 0.75), "xid": (0.0, 0.25), "ecc_uncorrectable": (0.25, 0.25)}
XID = {"xid_79": (79, "GPU has fallen off the bus."), "xid": (48, "An uncorrectable double bit error (DBE).")}


def at(days: float) -> str:
    return timefmt.stamp(START + timedelta(days=days))


def moved(n: int) -> int:
    """The day host N moves to the new driver: half the fleet on day 20, the other half on day 40."""
    return 20 if n % 2 == 0 else 40


def entry(n: int, day: int, driver: str, draws: dict[str, int]) -> dict:
    """Host N's audit entry as the audit records it (the facts the ledger reads): DRAWS incidents of each class in
    the 2 days that follow, seen by this audit (a new boot each audit: each Xid line is its own)."""
    events = [{"code": XID[cls][0], "pci_bus_id": "00000000:1b:00.0", "class": "hardware", "severity": "critical",
               "seq": i + 1, "raw": f"NVRM: Xid (PCI:0000:1b:00): {XID[cls][0]}, {XID[cls][1]} #{i}"}
              for cls in XID for i in range(draws.get(cls, 0))]
    gpus = [{"index": i, "uuid": f"GPU-{n:04d}-{i}", "pci_bus_id": f"00000000:{0x1b + i:02x}:00.0", "name": MODEL}
            for i in range(GPUS)]
    ecc = draws.get("ecc_uncorrectable", 0) > 0
    return {"name": f"gpu{n:03d}", "groups": ["h100"], "reachable": True, "error": None,
            "facts": {"host": {"boot_id": f"{n}-{day}"}, "driver": {"module_version": driver}, "gpus": gpus,
                      "xid": {"events": events}},
            "findings": [{"control": "gpu.ecc_errors", "severity": "critical", "status": "fail" if ecc else "pass",
                          "message": "uncorrectable ECC errors" if ecc else "ok", "evidence": {}, "remediation": None}]}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The history: every host audited every 2 days for 60 days, on OLD until it moves, then on NEW; each audit sees
    a Poisson draw of each class for the GPU-days until the next one, at the planted rate of the driver it runs."""
    home = tmp_path_factory.mktemp("drivers")
    rng = np.random.default_rng(44)
    with pytest.MonkeyPatch.context() as mp, Store(home / "history.sqlite3") as store:
        for day in range(0, DAYS + 1, EVERY):
            mp.setenv(timefmt.TEST_CLOCK, at(day))
            hosts = []
            for n in range(HOSTS):
                new = day >= moved(n)
                lam = {c: rates[new] / 1000 * GPUS * EVERY for c, rates in PLANTED.items()}
                draws = {c: int(rng.poisson(v)) for c, v in lam.items()} if day < DAYS else {}
                hosts.append(entry(n, day, NEW if new else OLD, draws))
            run_id, _ = store.begin_run("audit", ["audit"], "inventory", None, None)
            store.finish_run(run_id, 0, {}, hosts)
    return home


def report(fleet, *args):
    return fleetctl("report", "drivers", *args, home=fleet, env={timefmt.TEST_CLOCK: at(DAYS + 1)})


def test_the_planted_rate_ratios_are_within_their_intervals(fleet):
    proc = report(fleet, "--format", "json")
    assert proc.returncode == Exit.OK, proc.stderr
    doc = json.loads(proc.stdout)
    assert schemas.first_error("drivers-report", doc) is None
    rows = {(r["driver"], r["model"]): r for r in doc["drivers"]}
    assert set(rows) == {(OLD, MODEL), (NEW, MODEL)}
    half = HOSTS // 2 * GPUS * (20 + 40)  # GPU-days on each driver: half the fleet 20 days, the other 40
    assert rows[OLD, MODEL]["gpu_days"] == pytest.approx(half) and rows[NEW, MODEL]["gpu_days"] == pytest.approx(half)
    assert rows[OLD, MODEL]["hosts"] == rows[NEW, MODEL]["hosts"] == HOSTS
    assert rows[NEW, MODEL]["replaced"] == OLD and rows[NEW, MODEL]["replaced_how"] == "moves"
    assert rows[OLD, MODEL]["replaced"] is None
    for cls, (old, new) in PLANTED.items():
        for driver, rate in ((OLD, old), (NEW, new)):
            r = rows[driver, MODEL]["incidents"][cls]
            assert r["low"] <= rate <= r["high"], (driver, cls, r)
            assert r["rate"] == pytest.approx(1000 * r["count"] / rows[driver, MODEL]["gpu_days"], abs=1e-4)
    comparisons = {c["class"]: c for c in doc["comparisons"]}
    assert set(comparisons) == set(PLANTED)  # no incidents of any other class on either: nothing to compare
    x79 = comparisons["xid_79"]
    assert (x79["driver"], x79["replaced"], x79["model"]) == (NEW, OLD, MODEL)
    assert x79["low"] <= 3 <= x79["high"] and x79["p"] < 0.001 and x79["low"] > 1
    ecc = comparisons["ecc_uncorrectable"]
    assert ecc["low"] <= 1 <= ecc["high"] and ecc["p"] > 0.05
    xid = comparisons["xid"]  # none on the old driver: the ratio and its upper bound unbounded (null in JSON)
    assert xid["replaced_count"] == 0 and xid["ratio"] is None and xid["high"] is None and xid["low"] > 1
    assert xid["line"].startswith(f"{NEW} vs {OLD}, xid: xinf (95% CI ") and xid["line"].endswith("-inf), p<0.001")
    zero = rows[OLD, MODEL]["incidents"]["nvlink_down"]  # a class with no incidents: 0, and how high it may be
    assert zero["count"] == 0 and zero["rate"] == zero["low"] == 0
    assert zero["high"] == pytest.approx(1000 * 3.6889 / half, rel=1e-4)


def test_the_table_gives_one_line_per_comparison(fleet):
    proc = report(fleet)
    assert proc.returncode == Exit.OK, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith(f"{NEW} vs {OLD}, xid_79:"))
    assert re.fullmatch(rf"{NEW} vs {OLD}, xid_79: x[0-9.]+ \(95% CI [0-9.]+-[0-9.]+\), p[<=]0\.[0-9]+", line), line
    assert MODEL in proc.stdout and "GPU-days" in proc.stdout


def test_csv_has_a_row_per_driver_model_and_class(fleet):
    proc = report(fleet, "--format", "csv")
    assert proc.returncode == Exit.OK, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout.split("\n# ")[0])))
    assert list(rows[0]) == list(drivers.CSV_FIELDS)
    assert len(rows) == 2 * len(drivers.CLASSES)
    x79 = next(r for r in rows if r["driver"] == NEW and r["class"] == "xid_79")
    assert x79["replaced"] == OLD and 1 < float(x79["ratio_low"]) <= 3 <= float(x79["ratio_high"])
    xid = next(r for r in rows if r["driver"] == NEW and r["class"] == "xid")
    assert xid["ratio"] == xid["ratio_high"] == "inf"


def test_html_is_one_offline_page(fleet, tmp_path):
    proc = report(fleet, "--format", "html", "-o", str(tmp_path / "drivers.html"))
    assert proc.returncode == Exit.OK, proc.stderr
    page = (tmp_path / "drivers.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "default-src 'none'" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing fetched
    assert f"{NEW} vs {OLD}, xid_79: x" in page and MODEL in page


def test_a_window_counts_only_its_days(fleet):
    proc = report(fleet, "--within", "14d", "--format", "json")
    assert proc.returncode == Exit.OK, proc.stderr
    rows = json.loads(proc.stdout)["drivers"]
    assert [(r["driver"], r["hosts"]) for r in rows] == [(NEW, HOSTS)]  # all moved 21 days ago
    assert rows[0]["gpu_days"] == pytest.approx(HOSTS * GPUS * 12)  # audits on days 48..60: 6 gaps of 2 days
    since = json.loads(report(fleet, "--since", at(30), "--format", "json").stdout)
    assert {r["driver"] for r in since["drivers"]} == {OLD, NEW} and since["generated"]["since"] == at(30)


def test_an_empty_history_says_so(tmp_path):
    proc = fleetctl("report", "drivers", home=tmp_path)
    assert proc.returncode == Exit.OK, proc.stderr
    assert proc.stdout.strip() == "no observations of any host on a driver in the window"


@pytest.mark.parametrize("args,message", [
    (("--within", "-3d"), "'-3d' is not a duration"),
    (("--within", "0"), "'0' is not above 0"),
    (("--since", "yesterday"), "--since 'yesterday': not a date"),
    (("--since", "2026-03-01", "--within", "7d"), "--since and --within: give one of them"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = fleetctl("report", "drivers", *args, home=tmp_path)
    assert proc.returncode == Exit.USAGE
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3, proc.stderr  # click: usage + line
    assert proc.stdout == ""


# (the intervals checked against the Clopper-Pearson interval's F-distribution form, the p-values against the sum
# of the binomial terms no likelier than the count seen)
@pytest.mark.parametrize("k1,t1,k2,t2,shown", [
    (31, 1000.0, 10, 1000.0, "x3.1 (95% CI 1.5-7.1), p=0.0015"),
    (0, 1000.0, 12, 1000.0, "x0 (95% CI 0-0.36), p<0.001"),
    (5, 1000.0, 0, 1000.0, "xinf (95% CI 0.92-inf), p=0.062"),
    (4, 1000.0, 4, 1000.0, "x1.0 (95% CI 0.19-5.4), p=1"),
    (3, 2000.0, 3, 1000.0, "x0.50 (95% CI 0.067-3.7), p=0.41"),
])
def test_rate_ratios_and_zero_counts(k1, t1, k2, t2, shown):
    c = drivers.rate_ratio(k1, t1, k2, t2)
    assert drivers.ratio_text(c) == shown
    if k2 and k1:
        assert c["low"] < (k1 / t1) / (k2 / t2) < c["high"]
    assert all(v is None or math.isfinite(v) for v in (c["ratio"], c["low"], c["high"], c["p"]))



def test_the_version_each_replaced():
    """The older version most of its hosts moved from; a rollback (a move to an older version) is no replacement;
    where none moved, the one before it in version order (numeric: 580.105 after 580.95)."""
    rows = [{"driver": v} for v in ("580.105.08", "570.86.15", "580.95.05", "575.57.08")]
    moves = [{"from": "570.86.15", "to": "580.95.05", "hosts": 40}, {"from": "575.57.08", "to": "580.95.05", "hosts": 3},
             {"from": "580.95.05", "to": "570.86.15", "hosts": 2}]
    assert drivers.replaced(rows, moves) == {"575.57.08": ("570.86.15", "version order"),
                                             "580.95.05": ("570.86.15", "moves"),
                                             "580.105.08": ("580.95.05", "version order")}
