"""The canary metrics' kinds (orchestrator/judge/canary/kinds.py): a new kind joins in one place, and a kind's judge
takes the series it is handed, without any Prometheus."""

from __future__ import annotations

import random
import sys

import pytest

from orchestrator.baseline import CanaryMetric
from orchestrator.judge.canary import kinds
from tests.helpers.soak import Prometheus, observe, slower, soaking_after, with_metrics

T0 = 1.7e9


def minutes(level: float, hosts: str, n: int = 60, seed: int = 1) -> dict[str, list[tuple[float, float]]]:
    rng = random.Random(seed)
    return {h: [(T0 + 60 * i, level * (1 + 0.01 * rng.gauss(0, 1))) for i in range(n)] for h in hosts}


@pytest.fixture
def spread(monkeypatch):
    """A kind the test registers: 'spread', the canary's largest value against the control's, judged in one line."""
    monkeypatch.setattr(kinds, "KINDS", dict(kinds.KINDS))
    seen = []

    def judge(w, m, min_samples):
        seen.append(w)
        top = max(v for pts in w.canary.values() for _, v in pts)
        ref = max(v for pts in w.control.values() for _, v in pts)
        bad = (ref - top if m.good == "higher" else top - ref) / ref > m.max_change
        return {"verdict": "fail" if bad else "pass", "canary": top, "control": ref, "change": top / ref - 1,
                "ci": None, "p_value": None, "samples": {"canary": len(w.canary), "control": len(w.control)},
                "reason": f"{m.name}: spread {top:.3g} vs {ref:.3g}"}

    kinds.register(kinds.Kind("spread", "the largest value of a cohort", judge))
    return seen


def test_a_kind_registered_in_one_place_is_taken_by_the_baseline_and_judged_by_the_soak(store, tmp_path,
                                                                                        monkeypatch, spread):
    """No other file names the kind: the baseline accepts it, the soak reads its series and hands them to it."""
    query = 'max by (Hostname) (DCGM_FI_DEV_POWER_USAGE{Hostname=~"{hosts}"})'
    ctx = with_metrics(soaking_after(store, ["b", "c", "d"]), tmp_path, Prometheus(canary=0.5),
                       f"{{name: power, query: '{query}', host_label: Hostname, good: higher, max_change: 10%, "
                       "kind: spread}")
    o = observe(ctx, monkeypatch, slower(1.0), final=True)
    [metric] = o.detail["canary_metrics"]
    assert metric["kind"] == "spread" and metric["verdict"] == "fail" and metric["reason"].startswith("power: spread")
    assert o.status == "fail" and "power: spread" in o.reason
    [window] = spread
    assert set(window.canary) == {"a"} and set(window.control) == {"b", "c", "d"} and window.end > window.start


def test_a_kind_nobody_registered_is_refused_naming_the_known_ones(tmp_path):
    from orchestrator import baseline
    from orchestrator.errors import InputError
    path = tmp_path / "b.yml"
    path.write_text("schema_version: 1\nname: t\ngroups:\n  all:\n    canary:\n      metrics:\n"
                    "        - {name: p, query: up, good: higher, max_change: 5%, kind: spread}\n")
    with pytest.raises(InputError, match=r"metrics\[0\]\.kind: 'spread' is not one of \['level', 'rate'\]"):
        baseline.load(str(path))


def test_a_second_kind_of_one_name_is_a_mistake(spread):
    with pytest.raises(ValueError, match="registered already"):
        kinds.register(kinds.Kind("level", "again", lambda w, m, n: {}))


def test_the_judge_takes_the_series_it_is_handed_and_reads_no_prometheus(monkeypatch):
    """A level 6% lower on the canary fails and an equal rate passes, with the PromQL client not importable."""
    monkeypatch.setitem(sys.modules, "orchestrator.judge.promql", None)  # any import of it now raises ImportError
    level = CanaryMetric(name="tensor", query="unused", good="higher", max_change=0.03)
    before = minutes(0.65, "ab") | minutes(0.65, "cdef", seed=2)
    now = minutes(0.65 * 0.94, "ab", seed=3) | minutes(0.65, "cdef", seed=4)
    window = kinds.Window(canary={h: now[h] for h in "ab"}, control={h: now[h] for h in "cdef"}, start=T0,
                          end=T0 + 3600, canary_before={h: before[h] for h in "ab"},
                          control_before={h: before[h] for h in "cdef"})
    verdict = kinds.judge(level, window, min_samples=4)
    assert verdict["verdict"] == "fail" and verdict["change"] == pytest.approx(-0.06, abs=0.01)
    assert verdict["calibrated"] is True

    rate = CanaryMetric(name="xid", query="unused", good="lower", max_change=0.5, kind="rate")
    counter = {h: [(T0, 0.0), (T0 + 1800, 1.0), (T0 + 3600, 2.0)] for h in "abcd"}
    window = kinds.Window(canary={"a": counter["a"]}, control={h: counter[h] for h in "bcd"}, start=T0,
                          end=T0 + 3600, gpus={h: 8 for h in "abcd"})
    verdict = kinds.judge(rate, window)
    assert verdict["verdict"] == "pass" and verdict["gpu_hours"] == {"canary": 8.0, "control": 24.0}
    assert verdict["samples"] == {"canary": 2, "control": 6}
