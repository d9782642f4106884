"""fleetctl report --format json|csv on a history made by real runs (audits of localhost) and a campaign."""

from __future__ import annotations

import csv
import io
import json
import re

from orchestrator import schemas
from orchestrator.exitcodes import Exit
from tests.helpers.campaign import TENSOR, XID, Judged
from tests.helpers.cli import fleetctl
from tests.helpers.history import tamper


def report(home, *args):
    proc = fleetctl("report", *args, home=home)
    return proc.returncode, proc.stdout, proc.stderr


def test_json_report_is_valid_and_states_the_chain_head(history):  # noqa: F811
    code, out, err = report(history)
    assert code == 0, err
    doc = json.loads(out)
    assert schemas.first_error("compliance-report", doc) is None
    assert doc["summary"] == {"hosts": 1, "compliant": 0, "audits": 2, "campaigns": 1}
    host = doc["hosts"][0]
    assert host["name"] == "localhost" and host["audit"]["run"] == 2  # the latest audit
    assert host["audit"]["baseline"]["digest"].startswith("sha256:")
    assert {f["control"]: f["status"] for f in host["findings"]}["driver.installed"] == "fail"
    installed = next(c for c in doc["controls"] if c["control"] == "driver.installed")
    assert installed["fail"] == 1 and installed["pass_rate"] == 0
    assert doc["driver_versions"] == [{"version": "none", "hosts": 1}]
    assert doc["compliance_over_time"][0]["hosts"] == 1
    campaign = doc["campaigns"][0]
    assert campaign["state"] == "rolled_back" and sorted(campaign["rolled_back"]) == ["a", "b"]
    assert "wave 2 failed" in campaign["reason"]
    verify = fleetctl("report", "verify", "--head", doc["chain"]["digest"], home=history)
    assert verify.returncode == 0, verify.stdout


def test_csv_has_one_row_per_host_and_control(history):  # noqa: F811
    code, out, _ = report(history, "--format", "csv")
    assert code == 0
    lines = out.splitlines()
    assert lines[-1].startswith("# chain head sha256:")
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[:-1]))))
    assert len(rows) == len({(r["host"], r["control"]) for r in rows}) > 20
    assert all(r["host"] == "localhost" and r["audit_run"] == "2" for r in rows)


def test_period_and_limit_filters(history):  # noqa: F811
    doc = json.loads(report(history, "--since", "2000-01-01", "--until", "2000-01-02")[1])
    assert doc["summary"]["hosts"] == 0 and doc["campaigns"] == []
    doc = json.loads(report(history, "-l", "gpu*")[1])
    assert doc["hosts"] == [] and doc["summary"]["audits"] == 2
    code, _, err = report(history, "--since", "2026-02-30")
    assert code == 2 and "not a date" in err


def test_no_export_from_a_broken_history(history):  # noqa: F811
    """Refused as a history that cannot be read (74), never 1, which would say the export found something."""
    tamper(history, "UPDATE findings SET status='pass'")
    code, out, err = report(history)
    assert code == Exit.HISTORY and out == "" and "history chain broken at record 1 (run 1)" in err


def test_oscal_assessment_results_validate_against_the_oscal_model(history):  # noqa: F811
    import hashlib

    from trestle.oscal.assessment_results import Model  # compliance-trestle: NIST OSCAL 1.x models (test extra)

    first, second = (json.loads(report(history, "--format", "oscal")[1]) for _ in range(2))
    Model.model_validate(first)
    ar = first["assessment-results"]
    assert ar["uuid"] != second["assessment-results"]["uuid"]  # a new document each export
    result = ar["results"][0]
    observations = {o["uuid"]: o for o in result["observations"]}
    assert len(observations) == len(json.loads(report(history)[1])["hosts"][0]["findings"])
    assert all(o["origins"][0]["actors"][0]["type"] == "tool" and o["collected"].endswith("Z")
               for o in observations.values())
    states = {f["target"]["target-id"]: f["target"]["status"]["state"] for f in result["findings"]}
    assert states["driver.installed"] == "not-satisfied"
    assert "satisfied" in states.values()
    # every observation's evidence digest is in back-matter and matches the evidence in the JSON report
    plain = json.loads(report(history)[1])["hosts"][0]
    evidence = {f["control"]: f["evidence"] for f in plain["findings"]}
    resources = {r["uuid"]: r for r in ar["back-matter"]["resources"]}
    for o in observations.values():
        resource = resources[o["relevant-evidence"][0]["href"][1:]]
        control = o["title"].split(" on ")[0]
        expected = hashlib.sha256(json.dumps(evidence[control], sort_keys=True, separators=(",", ":"),
                                             ensure_ascii=False).encode()).hexdigest()
        assert resource["rlinks"][0]["hashes"][0]["value"] == expected
    head = {p["name"]: p["value"] for p in ar["metadata"]["props"]}["chain-head"]
    assert fleetctl("report", "verify", "--head", head, home=history).returncode == 0


def test_signed_exports_verify_and_a_changed_byte_or_another_key_does_not(history, tmp_path):  # noqa: F811
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    keys = {}
    for who in ("auditor", "mallory"):
        key = Ed25519PrivateKey.generate()
        (tmp_path / f"{who}.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                                serialization.NoEncryption()))
        (tmp_path / f"{who}.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                            serialization.PublicFormat.SubjectPublicKeyInfo))
        keys[who] = tmp_path / f"{who}.pub"
    for fmt in ("json", "csv", "html", "oscal"):
        out = tmp_path / f"report.{fmt}"
        proc = fleetctl("report", "--format", fmt, "-o", str(out), "--sign", str(tmp_path / "auditor.pem"), home=history)
        assert proc.returncode == 0, proc.stderr
        good = fleetctl("report", "verify", "--signature", f"{out}.sig", "--key", str(keys["auditor"]), home=history)
        assert good.returncode == 0 and "signature valid" in good.stdout, good.stdout + good.stderr
        other = fleetctl("report", "verify", "--signature", f"{out}.sig", "--key", str(keys["mallory"]), home=history)
        assert other.returncode == 1 and "another key" in other.stdout
        if fmt in ("json", "oscal"):  # canonical JSON: re-indenting keeps the signature
            out.write_text(json.dumps(json.loads(out.read_text())))
            assert fleetctl("report", "verify", "--signature", f"{out}.sig", home=history).returncode == 0
        data = bytearray(out.read_bytes())
        data[len(data) // 2] = ord("0") if data[len(data) // 2] != ord("0") else ord("1")
        out.write_bytes(bytes(data))
        bad = fleetctl("report", "verify", "--signature", f"{out}.sig", home=history)
        assert bad.returncode in (1, 2) and ("does not match" in bad.stdout or "not JSON" in bad.stderr), bad.stdout
    assert fleetctl("report", "--sign", str(tmp_path / "auditor.pem"), home=history).returncode == 2  # needs -o
    assert fleetctl("report", "-o", str(tmp_path / "x"), "--sign", str(keys["auditor"]), home=history).returncode == 2


# ---- the canary metrics (docs/canary.md) ------------------------------------------------------------------


def test_a_campaigns_canary_metric_verdicts_are_in_the_json_and_the_html_report(store):  # noqa: F811
    """The soak failed the canary on a metric: the report carries each metric's latest verdict with its figures,
    and the page shows them in a row each, the failing verdict in the failing colour."""
    from orchestrator import report as report_mod
    from tests.helpers.campaign import SOAKING, Script, start

    watch = Judged([TENSOR, XID], {("a", 1, "check"): TENSOR["reason"]})
    assert start(store, Script(), ["a"], ["b"], observe=watch, **SOAKING)[2].run() == "rolled_back"
    assert start(store, Script(), ["c"])[2].run() == "done"  # no soak, no metrics
    doc = report_mod.build(store)  # valid against the schema, or it raises
    judged, plain = (c["canary_metrics"] for c in doc["campaigns"])
    assert plain is None and (judged["gap"], judged["kind"]) == (1, "check") and judged["metrics"] == [TENSOR, XID]
    html = report_mod.to_html(doc)
    rows = {m.group(1): m.group(0) for m in re.finditer(r"<tr><td>(\w+)</td>.*?</tr>", html, re.S)}
    assert all(f"<td>{x}</td>" in rows["tensor_active"] for x in ("0.431", "0.453", "-8.6%", "-9.5% .. -3.3%",
                                                                  "6.4e-05")), rows["tensor_active"]
    assert '<td class="fail">fail</td>' in rows["tensor_active"]
    assert '<td class="missing">missing</td>' in rows["xid"] and "no series for any control host" in rows["xid"]
    assert html.count("<caption>Campaign") == 1
    assert re.search(r"<caption>Campaign 1 to \S+: soak check\s+after wave 1", html)


def test_a_campaigns_capacity_is_in_the_json_and_the_html_report(store, clock):  # noqa: F811
    """Each campaign's cost in node-hours, per wave and in all: a host drained, its job ending 40 minutes later,
    installed a minute after that and back 14 minutes later (tests/helpers/campaign.py)."""
    from orchestrator import report as report_mod
    from tests.helpers.campaign import start
    from tests.helpers.campaign import Clocked

    assert start(store, Clocked(clock), ["a"], ["b"], capacity_budget_node_hours=2)[2].run() == "done"
    doc = report_mod.build(store)  # valid against the schema, or it raises
    figures = doc["campaigns"][0]["capacity"]
    assert figures.pop("until") == doc["campaigns"][0]["updated_at"]  # a finished campaign: counted up to its end
    assert figures == {
        "unit": "node-hours (a host is one node)", "busy": 1.3333, "idle": 0.0333, "change": 0.4667, "hosts": 2,
        "waves": [{"wave": w, "busy": 0.6667, "idle": 0.0167, "change": 0.2333, "hosts": 1} for w in (1, 2)],
        "budget": {"node_hours": 2, "spent": 0.5, "left": 1.5, "counts": ["idle", "change"]}}
    html = report_mod.to_html(doc)
    cell = re.search(r'<td class="capacity">(.*?)</td>', html, re.S).group(1)
    assert " ".join(cell.split()) == "busy 1.33, idle 0.03, change 0.47 node-hours (2 hosts); budget 2: 0.50 spent"
