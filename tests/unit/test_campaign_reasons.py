"""What a person reads of a rolled-back campaign: its canary failed the real gate (the real probe_after step on a
real H100 probe result, every sample 10% slower after), and `campaign list`, `campaign show` and `--verbose` say
why in one line, in full on request."""

from __future__ import annotations

import copy
import io

from rich.console import Console

from orchestrator import probe
from orchestrator.campaign import readmodel
from orchestrator.campaign import steps
from orchestrator.cli import campaign_view
from tests.helpers.campaign import WALL, OldGate, Script, start
from tests.helpers.soak import REAL, WithProbes

WHY = ("wave 1 failed (1 of 1 hosts, fails at 1): a: gate fail: throughput: 2 of 2 series below 0.95x their median "
       "before; worst GPU 0 bandwidth_gbs -10.0%")


class RealGate(WithProbes):
    """Every step ok, probe_before recording the real probe result; probe_after the real gate step."""

    def __getitem__(self, step):
        return steps.probe_after if step == "probe_after" else super().__getitem__(step)


def printed(printer, *args, width=300, **options) -> list[str]:
    buf = io.StringIO()
    printer(*args, Console(file=buf, width=width, force_terminal=False), **options)
    return buf.getvalue().splitlines()


def test_a_canary_rolled_back_by_the_gate_reads_in_one_line(store, monkeypatch):  # noqa: F811
    slower = copy.deepcopy(REAL)
    for s in slower["throughput"]["samples"]:
        s["value"] *= 0.9
    monkeypatch.setattr(probe, "collect", lambda playbooks, opts, fleet, base, markers=None: {
        h.name: {"reachable": True, "error": None, "probe": slower} for h in fleet.hosts})
    journal, cid, engine = start(store, RealGate(), ["a"], ["b"])
    assert engine.run() == "rolled_back"
    assert journal.campaign(cid)["reason"] == WHY

    listed = [line for line in printed(campaign_view.list_table, store) if "rolled_back" in line]
    assert len(listed) == 1 and WHY in listed[0]  # the row is one line, the reason whole

    doc = readmodel.document(store, cid)
    shown = printed(campaign_view.show_table, doc)
    assert f"reason: {WHY}" in shown
    gate = next(s for s in doc["hosts"][0]["steps"] if s["step"] == "probe_after")
    assert gate["reason"] == WHY.split("a: ", 1)[1]
    assert len(gate["detail"]["reasons"]) == 3  # --format json: health, and each series in full
    assert any(r.startswith("GPU 0 gemm_tflops: median ") and r.endswith("below the floor of 0.95x its own median "
                                                                          "before") for r in gate["detail"]["reasons"])
    verbose = printed(campaign_view.show_table, doc, verbose=True)
    assert not any("GPU 0 gemm_tflops: median" in line for line in shown)
    assert any(line.startswith("a probe_after: GPU 0 gemm_tflops: median ") for line in verbose)
    rows = [line for line in verbose if "probe_after" in line and "fail floor" in line]
    assert len(rows) == 2 and any("GPU 0 bandwidth_gbs" in r and "-10.0%" in r for r in rows)


def test_a_reason_recorded_by_an_earlier_fleetctl_still_shows(store):  # noqa: F811
    """An earlier fleetctl recorded a gate's every series in its reason: listed, its start on one line; shown, whole."""
    journal, cid, engine = start(store, OldGate(), ["a"], ["b"])
    assert engine.run() == "rolled_back"
    listed = [line for line in printed(campaign_view.list_table, store) if "rolled_back" in line]
    assert len(listed) == 1 and "a: gate fail: GPU health unchanged" in listed[0] and "GPU 7" not in listed[0]
    shown = printed(campaign_view.show_table, readmodel.document(store, cid), width=6000)
    assert any(line.endswith(WALL) for line in shown)


def test_a_wave_failing_on_several_hosts_names_the_first_and_counts_the_rest(store):  # noqa: F811
    script = Script({(h, "verify"): "fail" for h in ("b", "c", "d")})
    journal, cid, engine = start(store, script, ["a"], ["b", "c", "d", "e"], fail_at=[1, 2])
    assert engine.run() == "rolled_back"
    assert journal.campaign(cid)["reason"].endswith("): b: verify fail (+2 more hosts)")
    assert {r["host"]: r["reason"] for r in journal.hosts(cid) if r["reason"]} == {
        h: "verify fail" for h in ("b", "c", "d")}  # each host's own reason on its row


def test_campaign_show_lists_the_canary_metrics_latest_verdicts(store):  # noqa: F811
    """What the soak recorded of the canary metrics (soak.canary_metrics): per metric the canary and control figures,
    the change with its interval, p and the verdict, in the JSON and as a table."""
    from tests.helpers.campaign import SOAKING, Watch
    tensor = {"name": "tensor_active", "kind": "level", "verdict": "fail", "canary": 0.431, "control": 0.453,
              "change": -0.086, "ci": [-0.095, -0.033], "p_value": 6.4e-05,
              "reason": "tensor_active: canary 0.431 vs control 0.453 (-8.6%, 95% CI -9.5% .. -3.3%), p=6.4e-05: "
                        "past the 3% tolerated"}
    xid = {"name": "xid", "kind": "rate", "verdict": "no_verdict", "canary": None, "control": None, "change": None,
           "ci": None, "p_value": None, "reason": "xid: no control host"}

    class Judged(Watch):
        def __call__(self, ctx, hosts, final):
            out = super().__call__(ctx, hosts, final)
            for o in out.values():
                o.detail["canary_metrics"] = [tensor, xid]
            return out
    journal, cid, engine = start(store, Script(), ["a"], ["b"], observe=Judged(), **SOAKING)
    assert engine.run() == "done"
    doc = readmodel.document(store, cid)
    assert doc["soak"]["canary_metrics"]["metrics"] == [tensor, xid] and doc["soak"]["canary_metrics"]["gap"] == 1
    shown = printed(campaign_view.show_table, doc, width=160)
    row = next(line for line in shown if "tensor_active" in line)
    assert all(x in row for x in ("0.431", "0.453", "-8.6%", "-9.5% .. -3.3%", "6.4e-05", "fail")), row
    assert any("xid" in line and "no_verdict" in line for line in shown)
