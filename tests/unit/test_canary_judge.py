"""The canary judged against a concurrent control cohort (orchestrator/judge/canary/statistics.py, issue 35).

Series are one sample a minute, seeded: a level per host, AR(1) noise per host (phi 0.8: a job's phases), noise every
host shares, as bench/canary_replay.py draws them; the replay itself runs here with a few draws.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from orchestrator.judge.canary import statistics as canary

REPO = Path(__file__).resolve().parents[2]
T0 = 1.7e9
LEVEL = 0.65


def minutes_series(rng, hosts, minutes, *, prefix, factor=None, offsets=0.01, phi=0.8, sd=0.02, shared=None):
    """{host: [(t, v)]}: LEVEL x host offset x AR(1) x SHARED(t) x FACTOR(t), one sample a minute at MINUTES."""
    n = len(minutes)
    out = {}
    for i in range(hosts):
        own = np.empty(n)
        own[0] = rng.normal(0, sd)
        for t in range(1, n):
            own[t] = phi * own[t - 1] + rng.normal(0, sd * np.sqrt(1 - phi ** 2))
        v = LEVEL * (1 + rng.normal(0, offsets)) * (1 + own)
        v = v * (shared if shared is not None else 1) * (factor if factor is not None else 1)
        out[f"{prefix}{i}"] = list(zip((T0 + minutes * 60).tolist(), v.tolist()))
    return out


def cohorts(seed=0, canaries=4, controls=12, minutes=120, canary_factor=1.0, drift=None):
    rng = np.random.default_rng(seed)
    m = np.arange(minutes, dtype=float)
    shared = 1 + 0.02 * np.cumsum(rng.normal(0, 0.1, minutes))  # a wandering job mix, every host
    if drift is not None:
        shared = shared * drift(m)
    return (minutes_series(rng, canaries, m, prefix="canary", factor=canary_factor, shared=shared),
            minutes_series(rng, controls, m, prefix="control", shared=shared))


def judge(can, con, good="higher", max_change=0.05, **kw):
    result = canary.judge_level(can, con, good, max_change, name="tensor_active", **kw)
    json.dumps(result, allow_nan=False)  # what the journal and `campaign show --format json` will hold
    return result


# ---- levels ---------------------------------------------------------------------------------------------------

def test_equal_cohorts_pass_with_every_figure():
    r = judge(*cohorts(seed=1))
    assert r["verdict"] == "pass", r["reason"]
    assert abs(r["change"]) < 0.02 and r["ci"][0] < r["change"] < r["ci"][1]
    assert r["samples"]["canary"] >= canary.MIN_SAMPLES and r["samples"]["control"] > r["samples"]["canary"]
    assert r["canary"] == pytest.approx(LEVEL, rel=0.05) and r["control"] == pytest.approx(LEVEL, rel=0.05)
    assert r["reason"].startswith("tensor_active: canary 0.6") and "\n" not in r["reason"]


def test_a_6_percent_drop_of_a_higher_is_better_metric_fails_and_says_by_how_much():
    r = judge(*cohorts(seed=2, canary_factor=0.94))
    assert r["verdict"] == "fail"
    assert r["change"] == pytest.approx(-0.06, abs=0.015)
    assert r["ci"][0] < r["change"] < r["ci"][1] < -0.03
    assert r["p_value"] < canary.ALPHA
    assert "past the 5% tolerated" in r["reason"] and f"({r['change']:+.1%}, 95% CI" in r["reason"]


def test_a_6_percent_rise_passes_and_is_a_regression_where_lower_is_better():
    up = cohorts(seed=3, canary_factor=1.06)
    assert judge(*up)["verdict"] == "pass"
    assert "not worse" in judge(*up)["reason"]
    lower = judge(*up, good="lower")
    assert lower["verdict"] == "fail" and lower["change"] > 0.04


def test_a_drop_within_the_tolerated_change_passes_even_when_significant():
    r = judge(*cohorts(seed=4, controls=32, canary_factor=0.97))
    assert r["p_value"] < canary.ALPHA and r["verdict"] == "pass"
    assert "within the 5% tolerated" in r["reason"]


def test_too_few_samples_is_no_verdict_never_a_pass():
    can, con = cohorts(seed=5, minutes=15, canary_factor=0.80)  # a 20% drop, 15 minutes in
    r = judge(can, con)
    assert r["verdict"] == "no_verdict" and r["p_value"] is None
    assert "needed" in r["reason"] and "no verdict yet" in r["reason"]


@pytest.mark.parametrize("missing", ["control", "canary", "control series without values"])
def test_no_control_host_or_no_canary_series_is_no_verdict(missing):
    can, con = cohorts(seed=6)
    if missing == "control":
        con = {}
    elif missing == "canary":
        can = {}
    else:
        con = {host: [(t, float("nan")) for t, _ in points] for host, points in con.items()}
    r = judge(can, con)
    assert r["verdict"] == "no_verdict"
    assert r["reason"].startswith(f"tensor_active: no {missing.split()[0]}")


def test_a_drift_every_host_shares_is_no_failure_though_the_canary_against_itself_fails():
    """8% slower from minute 20 to the end, canary and control alike: the canary's own series, the 30 minutes
    before against the soak, drops 8% (what a before/after soak sees); against the control it did not change."""
    slow = lambda m: np.where(m >= 50, 0.92, 1.0)  # noqa: E731
    can, con = cohorts(seed=7, minutes=170, drift=slow)
    soak = {h: pts[50:] for h, pts in can.items()}
    r = judge(soak, {h: pts[50:] for h, pts in con.items()})
    assert r["verdict"] == "pass", r["reason"]
    before = np.array([[v for _, v in pts[20:50]] for pts in can.values()])
    after = np.array([[v for _, v in pts[50:]] for pts in can.values()])
    p, shift, _ = canary.shift_test(after.ravel(), before.ravel(), "higher")
    assert p < canary.ALPHA and shift / np.median(before) < -0.06


def test_the_fleets_movement_is_read_where_the_two_probes_were():
    """The window before the change opens on a previous change's hosts running 10% faster for most of it; the probe
    before the change saw them back at their level (the window's end), and at the end of the soak the fleet ran 8%
    slower: the control cohort moved -8%, where the two windows' medians would say -16%."""
    minutes = np.arange(40, dtype=float)
    rng = np.random.default_rng(3)
    before = minutes_series(rng, 6, minutes, prefix="control", offsets=0, sd=0.005,
                            shared=np.where(minutes < 25, 1.10, 1.0))
    now = minutes_series(rng, 6, minutes + 40, prefix="control", offsets=0, sd=0.005,
                         shared=np.where(minutes < 5, 1.0, 0.92))
    assert canary.control_moved(now, before) == pytest.approx(-0.08, abs=0.01)
    few = {h: pts[-canary.MOVED_POINTS + 1:] for h, pts in now.items()}
    assert canary.control_moved(few, before) is None  # too few points to say


def test_the_window_before_removes_a_canary_hosts_own_level():
    """A canary host 6% below the control hosts all along, not changed by the upgrade: against the control alone it
    looks like a regression; against its own level before the change (and the control's) it is none, and a real
    6% drop on top of it is still caught."""
    rng = np.random.default_rng(8)
    m = np.arange(300, dtype=float)
    shared = 1 + 0.02 * np.cumsum(rng.normal(0, 0.1, len(m)))
    low = minutes_series(rng, 2, m, prefix="canary", factor=0.94, offsets=0.0, shared=shared)
    con = minutes_series(rng, 8, m, prefix="control", offsets=0.0, shared=shared)
    before, after = (lambda d: {h: p[:120] for h, p in d.items()}), (lambda d: {h: p[180:] for h, p in d.items()})
    assert judge(after(low), after(con))["verdict"] == "fail"
    r = judge(after(low), after(con), canary_before=before(low), control_before=before(con))
    assert r["verdict"] == "pass" and r["calibrated"] and abs(r["change"]) < 0.02, r["reason"]
    dropped = {h: [(t, v * 0.94) for t, v in p] for h, p in after(low).items()}
    r = judge(dropped, after(con), canary_before=before(low), control_before=before(con))
    assert r["verdict"] == "fail" and r["change"] == pytest.approx(-0.06 * 0.94, abs=0.015)


def test_a_host_without_values_before_the_change_is_left_out_and_named():
    can, con = cohorts(seed=9, minutes=240)
    before, after = (lambda d: {h: p[:120] for h, p in d.items()}), (lambda d: {h: p[120:] for h, p in d.items()})
    can_before = before(can)
    del can_before["canary0"]
    r = judge(after(can), after(con), canary_before=can_before, control_before=before(con))
    assert r["verdict"] == "pass" and "1 host(s) without values before the change left out: canary0" in r["reason"]


def test_strong_autocorrelation_makes_bigger_blocks_not_a_smaller_p_value():
    """phi 0.95 a minute: the blocks grow to 2 (1 + phi) / (1 - phi) samples, so a 2-hour window of no change
    rarely reaches p < alpha (minute samples tested as independent would, most of the time)."""
    assert canary.block_length(0.0) == 2 and canary.block_length(0.8) == 18 and canary.block_length(0.95) == 78
    significant = raw = 0
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        m = np.arange(240, dtype=float)
        can = minutes_series(rng, 4, m, prefix="canary", phi=0.95, offsets=0.0)
        con = minutes_series(rng, 8, m, prefix="control", phi=0.95, offsets=0.0)
        r = canary.judge_level(can, con, "higher", 0.0, min_samples=4)
        significant += r["p_value"] is not None and r["p_value"] < canary.ALPHA
        x = np.array([v for pts in can.values() for _, v in pts])
        y = np.array([v for pts in con.values() for _, v in pts])
        raw += mannwhitneyu(x, y, alternative="less").pvalue < canary.ALPHA
    assert significant <= 3 and raw >= 10


def test_medians_of_the_other_control_hosts_match_numpy():
    rng = np.random.default_rng(10)
    for hosts in (1, 2, 3, 6):
        values = rng.normal(size=(hosts, 40))
        values[rng.random(values.shape) < 0.3] = np.nan
        got = canary._medians_of_others(values)
        for k in range(hosts):
            others = np.delete(values, k, axis=0)
            for t in range(40):
                rest = others[:, t][np.isfinite(others[:, t])]
                want = np.median(rest) if len(rest) else np.nan
                assert np.isnan(values[k, t]) or np.allclose(got[k, t], want, equal_nan=True)


def test_the_shift_is_the_same_counted_as_made():
    """Beyond DIRECT_DIFFERENCES the differences are counted, not made: the same shift and interval."""
    rng = np.random.default_rng(11)
    x, y = rng.normal(-0.5, 1, 60), rng.normal(0, 1, 300)
    made = canary.shift_test(x, y, "higher")
    limit, canary.DIRECT_DIFFERENCES = canary.DIRECT_DIFFERENCES, 0
    try:
        counted = canary.shift_test(x, y, "higher")
    finally:
        canary.DIRECT_DIFFERENCES = limit
    assert counted[0] == made[0]
    assert counted[1] == pytest.approx(made[1], abs=1e-12) and counted[2] == pytest.approx(made[2], abs=1e-12)


# ---- rates ----------------------------------------------------------------------------------------------------

def rate(can_counts, con_counts, can_hours=8.0, con_hours=8.0, good="lower", max_change=0.0):
    result = canary.judge_rate({h: c for h, c in can_counts.items()}, {h: can_hours for h in can_counts},
                               {h: c for h, c in con_counts.items()}, {h: con_hours for h in con_counts},
                               good, max_change, name="xid_errors")
    json.dumps(result, allow_nan=False)
    return result


def test_more_xids_per_gpu_hour_on_the_canary_fails():
    r = rate({"canary0": 5}, {"control0": 0, "control1": 1, "control2": 0})
    assert r["verdict"] == "fail" and r["p_value"] < canary.ALPHA
    assert r["canary"] == pytest.approx(5 / 8) and r["control"] == pytest.approx(1 / 24)
    assert r["change"] == pytest.approx(14.0) and r["ci"][0] > 0
    assert "xid_errors: canary 0.625 vs control 0.0417 per GPU-hour (5 in 8 vs 1 in 24 GPU-hours; x15" in r["reason"]


def test_xids_on_the_canary_only_fail_with_an_unbounded_ratio():
    r = rate({"canary0": 4}, {"control0": 0, "control1": 0, "control2": 0})
    assert r["verdict"] == "fail" and r["change"] is None and r["ci"][1] is None and r["ci"][0] > 0
    assert "xinf" in r["reason"]


def test_equal_rates_pass_and_a_few_more_events_are_not_significant():
    assert rate({"canary0": 3}, {"control0": 3, "control1": 4, "control2": 2})["verdict"] == "pass"
    r = rate({"canary0": 2}, {"control0": 1, "control1": 0, "control2": 1})
    assert r["verdict"] == "no_verdict" and "not significant" in r["reason"]


def test_no_events_at_all_is_a_pass():
    """An Xid rate of zero is the healthy state: a verdict that waited for events would never come."""
    r = rate({"canary0": 0}, {"control0": 0, "control1": 0})
    assert r["verdict"] == "pass" and r["p_value"] is None and "no events" in r["reason"]


def test_fewer_completions_where_higher_is_better_fail_and_no_control_is_no_verdict():
    r = rate({"canary0": 40}, {"control0": 100, "control1": 95}, good="higher", max_change=0.2)
    assert r["verdict"] == "fail" and r["change"] == pytest.approx(40 / 97.5 - 1)
    assert rate({"canary0": 5}, {})["verdict"] == "no_verdict"
    assert rate({"canary0": 5}, {"control0": 1}, con_hours=0.0)["verdict"] == "no_verdict"


# ---- the replay ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def replay():
    spec = importlib.util.spec_from_file_location("canary_replay", REPO / "bench/canary_replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("drift", [False, True])
def test_a_small_replay_holds_the_targets_loosely(replay, drift):
    """4 canary hosts against 16 controls, 25 draws: no false rollback, a 5% regression caught (the targets:
    <= 1% and >= 95% over 400 draws); under the shared drift the self-comparison rolls most healthy canaries back."""
    res = replay.row((4, 16, drift, 25, None, np.random.SeedSequence(35)))
    rates = res["rates"]
    assert rates["calibrated", 0.0] <= 0.04
    assert rates["calibrated", 0.05] >= 0.88 and rates["calibrated", 0.10] == 1.0
    if drift:
        assert rates["self", 0.0] >= 0.5
