"""fleetctl report on a history made by real runs against the lab: audit drift, a successful campaign and a
rolled-back one, each with readers of the history coming and going beside it; every format, the chain verified, and
a tampered history refused."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator import schemas
from orchestrator.exitcodes import Exit
from tests.helpers.lab import REPO_ROOT, fleetctl_lab

pytestmark = pytest.mark.lab

FAST = ("--yes", "--soak", "0", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--waves", "1,100%")


@contextmanager
def readers(lab, cid: int):
    """For the block: `campaign show CID`, `report`, `metrics` and the sqlite3 command-line tool, one after the
    other in a loop, each a process that reads the history and goes (issue 42's scenario polled `campaign show`
    every 0.5 s). Yields the list of what went wrong in any of them: an exit other than success (a signal: SIGBUS),
    anything on its standard error (a disk I/O error); `campaign show` before the campaign is recorded aside."""
    db = Path(lab.env["FLEETCTL_HOME"]) / "history.sqlite3"
    fleetctl = [sys.executable, "-m", "orchestrator.cli"]
    commands = [[*fleetctl, "campaign", "show", str(cid), "--format", "json"], [*fleetctl, "report"],
                [*fleetctl, "metrics"], ["sqlite3", "-cmd", ".timeout 30000", str(db), "SELECT COUNT(*) FROM runs"]]
    stop, wrong = threading.Event(), []

    def loop() -> None:
        while not stop.is_set():
            for command in commands:
                proc = subprocess.run(command, capture_output=True, text=True, env=lab.env, cwd=REPO_ROOT,
                                      stdin=subprocess.DEVNULL, timeout=300)
                if (proc.returncode or proc.stderr) and proc.stderr != f"fleetctl: error: no campaign {cid} in " \
                                                                        "the history\n":
                    wrong.append((command[-1], proc.returncode, proc.stderr[-500:]))
                stop.wait(0.5)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield wrong
    finally:
        stop.set()
        thread.join()


def recorded_whole(lab, cid: int) -> None:
    """Every event campaign CID logged (its JSONL log, written beside the history) is in the history, and nothing
    else."""
    log = [json.loads(line) for line in (Path(lab.env["FLEETCTL_HOME"]) / "campaigns" / f"{cid}.jsonl")
           .read_text().splitlines()]
    with sqlite3.connect(Path(lab.env["FLEETCTL_HOME"]) / "history.sqlite3") as db:
        events = db.execute("SELECT seq, event FROM campaign_events WHERE campaign_id=? ORDER BY seq",
                            (cid,)).fetchall()
    db.close()
    assert events and events == [(e["seq"], e["event"]) for e in log], (cid, events, log[-3:])


def test_reports_from_lab_history(tmp_path):
    with fleetctl_lab(tmp_path, ("2xh100-sxm/2@550.163.01", "1xh100-sxm/2@550.163.01+nouveau")) as lab:
        assert lab.audit()[0] == 1  # drift: nouveau on one host
        with readers(lab, 1) as wrong:
            up = lab.fleetctl("upgrade", "--to", "570.86.15", "-i", lab.inventory, "-l", "h100-01,h100-02", *FAST,
                              timeout=900)
        assert up.returncode == 0, up.stdout[-2000:]
        assert wrong == []
        recorded_whole(lab, 1)
        for host in ("h100-01", "h100-02"):
            lab.inject(host, "throughput", "0.9", "--driver", "570.124.06")
        with readers(lab, 2) as wrong:
            down = lab.fleetctl("upgrade", "--to", "570.124.06", "-i", lab.inventory, "-l", "h100-01,h100-02",
                                *FAST, timeout=900)
        assert down.returncode == 4, down.stdout[-2000:]
        assert wrong == []
        recorded_whole(lab, 2)
        assert lab.audit()[0] == 1
        proc = lab.fleetctl("report", "--format", "json")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert schemas.first_error("compliance-report", doc) is None
        hosts = {h["name"]: h for h in doc["hosts"]}
        assert {n: h["driver_version"] for n, h in hosts.items()} == {
            "h100-01": "570.86.15", "h100-02": "570.86.15", "h100-03": "550.163.01"}
        assert not hosts["h100-03"]["compliant"] and hosts["h100-01"]["compliant"]
        assert [(c["state"], c["target"]) for c in doc["campaigns"]] == [("done", "570.86.15"),
                                                                          ("rolled_back", "570.124.06")]
        assert doc["campaigns"][1]["rolled_back"] == ["h100-01"] and "canary" in doc["campaigns"][1]["reason"]
        nouveau = next(c for c in doc["controls"] if c["control"] == "nouveau.blacklisted")
        assert nouveau["fail"] == 1 and nouveau["pass"] == 2
        rows = list(csv.DictReader(io.StringIO("\n".join(lab.fleetctl("report", "--format", "csv").stdout
                                                         .splitlines()[:-1]))))
        assert {r["host"] for r in rows} == set(hosts)
        oscal = json.loads(lab.fleetctl("report", "--format", "oscal").stdout)["assessment-results"]
        from trestle.oscal.assessment_results import Model
        Model.model_validate({"assessment-results": oscal})
        states = {f["target"]["target-id"]: f["target"]["status"]["state"] for f in oscal["results"][0]["findings"]}
        assert states["nouveau.blacklisted"] == "not-satisfied"
        html = lab.fleetctl("report", "--format", "html").stdout
        assert "rolled_back" in html and "h100-03" in html and doc["chain"]["digest"] in html
        verify = lab.fleetctl("report", "verify", "--head", doc["chain"]["digest"])
        assert verify.returncode == 0, verify.stdout
        with sqlite3.connect(Path(lab.env["FLEETCTL_HOME"]) / "history.sqlite3") as db:
            db.execute("UPDATE campaign_steps SET status='ok' WHERE step='probe_after' AND status='fail'")
        broken = lab.fleetctl("report", "verify")
        assert broken.returncode == 1 and "content changed" in broken.stdout
        assert lab.fleetctl("report").returncode == Exit.HISTORY  # no export from a broken history
