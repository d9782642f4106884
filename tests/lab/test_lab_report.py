"""fleetctl report on a history made by real runs against the lab: audit drift, a successful campaign and a
rolled-back one; every format, the chain verified, and a tampered history refused."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator import schemas
from orchestrator.exitcodes import Exit
from tests.lab.conftest import fleetctl_lab

pytestmark = pytest.mark.lab

FAST = ("--yes", "--soak", "0", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--waves", "1,100%")


def test_reports_from_lab_history(tmp_path):
    with fleetctl_lab(tmp_path, ("2xh100-sxm/2@550.163.01", "1xh100-sxm/2@550.163.01+nouveau")) as lab:
        assert lab.audit()[0] == 1  # drift: nouveau on one host
        up = lab.fleetctl("upgrade", "--to", "570.86.15", "-i", lab.inventory, "-l", "h100-01,h100-02", *FAST,
                          timeout=900)
        assert up.returncode == 0, up.stdout[-2000:]
        for host in ("h100-01", "h100-02"):
            lab.inject(host, "throughput", "0.9", "--driver", "570.124.06")
        down = lab.fleetctl("upgrade", "--to", "570.124.06", "-i", lab.inventory, "-l", "h100-01,h100-02", *FAST,
                            timeout=900)
        assert down.returncode == 4, down.stdout[-2000:]
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
