"""A drift the whole fleet shares, taken out of every comparison of a changed host with its own past (issue 42):
the end-of-soak gate, the canary's last run against its first, probe_after and the rollback's probe, each judged
again less the control cohort's movement between its two moments, from a Prometheus's answers; a fault only the
canary shows still fails each of them."""

from __future__ import annotations

import copy
import dataclasses
import random
from datetime import datetime, timedelta, timezone

import pytest

from orchestrator import probe
from orchestrator.campaign import steps
from orchestrator.history.timefmt import stamp
from tests.helpers.soak import observe, slower, soaking_after, tensor


class Drifting:
    """What a Prometheus answers: every host's tensor activity (0.45, its own offset, 1% noise) x DURING at every
    point from the time DRIFT on (canary and control alike: a drift the fleet shares), x CANARY on 'a' once it came
    back (BACK, set by helpers.soak.with_metrics)."""

    def __init__(self, during=0.94, drift=None, canary=1.0):
        self.during, self.canary, self.queries = during, canary, []
        self.drift = drift if drift is not None else ago(minutes=5)

    def range(self, query, start, end, step, host_label="Hostname"):
        self.queries.append((query, start, end))
        rng = random.Random(len(self.queries))
        times = [start + k * step for k in range(int((end - start) / step) + 1)]
        out = {}
        for i, host in enumerate("abcd"):  # soak.canary_metrics keeps the hosts it asked for
            out[host] = [(t, 0.45 * (1 + 0.01 * i) * (self.during if t >= self.drift else 1)
                          * (self.canary if host == "a" and t >= self.back else 1) * (1 + 0.01 * rng.gauss(0, 1)))
                         for t in times]
        return out


def ago(**delta) -> float:
    return (datetime.now(timezone.utc) - timedelta(**delta)).timestamp()


def drifting(store, tmp_path, **kw):
    """A canary 'a' soaking after its wave (drained and back 20 minutes ago), controls b, c and d, and the fleet at
    x0.94 since 5 minutes ago."""
    ctx = tensor(soaking_after(store, ["b", "c", "d"]), tmp_path, Drifting(**kw))
    ctx.options = dataclasses.replace(ctx.options, canary="/opt/canary")
    return ctx


def canary_runs(ctx, monkeypatch, first: float, last: float) -> None:
    """Two soak checks whose canary command ran at FIRST x the probe's throughput 10 minutes ago (before the
    drift) and at LAST x now."""
    for factor in (first, last):
        run = slower(factor)
        run["throughput"]["engine"] = "command"
        observe(ctx, monkeypatch, run)
        if factor is first:
            ctx.journal.db.execute("UPDATE campaign_soak SET at=? WHERE campaign_id=?",
                                   (stamp(datetime.now(timezone.utc) - timedelta(minutes=10)), ctx.campaign))


def test_a_drift_that_begins_after_the_canarys_first_run_excuses_its_last_run_against_its_first(store, tmp_path,
                                                                                               monkeypatch):
    """The fleet 6% slower from the middle of the soak, after the canary command's first run: its last run against
    its first fails alone, as the end-of-soak probe against probe_before does; the control cohort moved as much
    between those moments and every canary metric passed: less that drift both pass, the host passes."""
    ctx = drifting(store, tmp_path)
    canary_runs(ctx, monkeypatch, 1.0, 0.94)
    o = observe(ctx, monkeypatch, slower(0.94), final=True)
    assert o.status == "ok", (o.reason, o.detail["seen"])
    assert o.detail["canary_gate"]["status"] == "fail" and o.detail["gate"]["status"] == "fail"  # against itself
    for key in ("canary_gate_less_drift", "gate_less_drift"):
        assert o.detail[key]["status"] == "pass" and o.detail[key]["metric"] == "tensor_active"
        assert o.detail[key]["moved"] == pytest.approx(-0.06, abs=0.01)
    said = next(n for n in o.detail["seen"] if n.startswith("the canary command's last run against its first"))
    assert "canary command: 2 of 2 series below 0.95x" in said and "control cohort moved -6" in said
    assert said.endswith("less that fleet-wide drift, pass")


def test_a_canary_run_slower_than_the_drift_still_fails(store, tmp_path, monkeypatch):
    """The fleet 6% slower, the canary's last run 20% below its first: less the drift it is still 15% down."""
    ctx = drifting(store, tmp_path)
    canary_runs(ctx, monkeypatch, 1.0, 0.80)
    o = observe(ctx, monkeypatch, slower(0.94), final=True)
    assert o.status == "fail" and o.reason.startswith("end of the soak: canary command: 2 of 2 series below 0.95x")
    assert o.detail["canary_gate_less_drift"]["status"] == "fail" and o.detail["gate_less_drift"]["status"] == "pass"


def probed(monkeypatch, result) -> None:
    """The gate's probe (steps._probe) answers RESULT for every host."""
    monkeypatch.setattr(probe, "collect", lambda playbooks, opts, fleet, base, markers=None: {
        h.name: {"reachable": True, "error": None, "probe": copy.deepcopy(result)} for h in fleet.hosts})


def test_probe_after_and_the_rollbacks_probe_take_the_control_cohorts_movement_out(store, tmp_path, monkeypatch):
    """The fleet 6% slower since the canary's probe_before: its probe_after, and after a rollback (the later waves
    cancelled, their hosts the control cohort still) the rollback's probe, each 6% below probe_before: against
    itself each fails; less the control cohort's movement since its drain each passes, and the record says so."""
    ctx = drifting(store, tmp_path, drift=ago(minutes=10))
    probed(monkeypatch, slower(0.94))
    [after] = steps.probe_after(ctx, ["a"]).values()
    assert after.outcome == "ok", after.reason
    assert after.detail["less_drift"]["status"] == "pass" and after.detail["less_drift"]["control_hosts"] == ["b", "c",
                                                                                                              "d"]
    assert after.detail["less_drift"]["moved"] == pytest.approx(-0.06, abs=0.01)
    assert any(r.startswith("the gate against itself: throughput: 2 of 2 series below 0.95x") and
               "control cohort moved -6" in r for r in after.detail["reasons"])
    ctx.journal.transition(ctx.campaign, "soak_failed", moves={"roll_back": ["a"], "cancel": ["b", "c", "d"]},
                           wave=1, reason="the canary failed its soak")
    assert {r["host"]: r["state"] for r in ctx.journal.hosts(ctx.campaign)} == {
        "a": "rollback_drain", "b": "not_started", "c": "not_started", "d": "not_started"}
    [back] = steps.rollback_probe(ctx, ["a"]).values()
    assert back.outcome == "ok", back.reason
    assert back.detail["less_drift"]["moved"] == pytest.approx(-0.06, abs=0.01)


def test_a_drift_excuses_no_more_than_itself_at_the_gate_nor_anything_without_a_control_cohort(store, tmp_path,
                                                                                              monkeypatch):
    """The canary 20% slower while the fleet moved 6%: probe_after and the rollback's probe still fail. Without
    Prometheus nothing says the fleet moved: a 6% drift fails the gate (docs/canary.md)."""
    ctx = drifting(store, tmp_path, drift=ago(minutes=10))
    probed(monkeypatch, slower(0.80))
    for step in (steps.probe_after, steps.rollback_probe):
        [o] = step(ctx, ["a"]).values()
        assert o.outcome == "fail" and o.reason.startswith("gate fail: throughput: 2 of 2 series below 0.95x")
        assert o.detail["less_drift"]["status"] == "fail"
    ctx.prometheus = None
    probed(monkeypatch, slower(0.94))
    [o] = steps.probe_after(ctx, ["a"]).values()
    assert o.outcome == "fail" and "less_drift" not in o.detail
