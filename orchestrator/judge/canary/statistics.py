"""The canary judged against a control cohort measured at the same time (issue 35): pure functions, no I/O.

A level metric (throughput, activity, power: judge_level) and an event rate (Xids per GPU-hour: judge_rate) of the
canary cohort (hosts this campaign changed) against the control cohort (hosts of the same group and GPU model not yet
changed), over the same time range. Each returns one dict:

  {"verdict": "pass" | "fail" | "no_verdict", "canary": median or rate, "control": median or rate,
   "change": relative change (-0.06 for 6% lower), "ci": [low, high] (of the change) or None, "p_value": float or
   None, "samples": {"canary": n, "control": n}, "reason": one line, ...}

fail = significant (one-sided p < alpha, in the bad direction) AND the estimated change past max_change in the bad
direction. A change past max_change that is not significant, too few samples, no control host or no canary series
is no_verdict: never a pass.

Levels: why this statistic. The series are minute samples with (1) a level of their own per host (same-SKU hosts
differ), (2) autocorrelation (a job's phases last minutes) and (3) a drift every host shares (a warm afternoon, a
slow shared filesystem, the job mix). A rank test on the raw samples, canary against control, gets all three wrong:
(3) cancels only on average, (2) makes 120 minute samples look like 120 independent ones (a p-value far too small)
and (1) makes a canary that was always 3% lower look like a 3% regression. So:

  - Shared drift: at every timestamp the control cohort's own movement d(t) (the median over control hosts of
    value minus that host's median) is subtracted from every host's value (a control host's from its peers'
    median, leave-one-out, so both cohorts carry the same noise). What one host does alone is left.
  - Host levels: when the window before the change is given (canary_before / control_before: the same query over
    a window that ended before the wave was drained), each host's residual level then is subtracted from its
    residuals now: each host is compared with itself, the control cohort removes what changed for everybody in
    between (a difference in differences). Without it the cohorts' host-to-host spread counts as a change.
  - Autocorrelation: the lag-1 autocorrelation phi of the residuals (pooled over hosts) is estimated and the
    residuals averaged in blocks of 2 (1 + phi) / (1 - phi) samples, twice an AR(1)'s integrated autocorrelation
    time: adjacent block means then correlate at most 0.16, whatever phi. The blocks (per host) are the samples
    counted against min_samples and tested.
  - The test: one-sided Mann-Whitney U (scipy.stats.mannwhitneyu) of the canary's blocks against the control's; the
    effect: the Hodges-Lehmann shift (the median of every canary-minus-control block difference) with its
    distribution-free confidence interval (order statistics of those differences, Moses' rule), both divided by the
    control cohort's median: a relative change.

bench/canary_replay.py measures false rollbacks and detection of this against the before/after self-comparison
on synthetic series with all three (docs/canary.md has its figures).

Rates: the events each cohort counted over its GPU-hours. Conditional on the total count, the canary's count is
binomial with p0 = its share of the GPU-hours when the rates are equal: an exact one-sided binomial test
(scipy.stats.binomtest); the rate ratio's confidence interval comes from the Clopper-Pearson interval of that
proportion. No event on either side is a pass: nothing worse was seen (an Xid rate of zero is the healthy state,
and a verdict that waits for events would never come).
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..gate import median_text

if TYPE_CHECKING:  # numpy is imported where samples are judged (0.2 s), not on every command
    import numpy as np

ALPHA = 0.01  # one-sided
CONFIDENCE = 0.95  # of the intervals shown
MIN_SAMPLES = 10  # blocks per cohort before a level verdict
MOVED_POINTS = 5  # a control host's latest points, at the least, that say how far the fleet moved (control_moved)
DIRECT_DIFFERENCES = 1_000_000  # up to this many canary-minus-control differences are made (8 MB), beyond: counted
MAX_PHI = 0.99  # an autocorrelation estimated above this is taken as this (blocks of 398 samples)
GOOD = ("higher", "lower")

Series = Mapping[str, Sequence[tuple[float, float]]]  # host -> [(unix time, value)]


# ---- the pieces (bench/canary_replay.py uses them too) -------------------------------------------------------

def block_length(phi: float) -> int:
    """Samples per block for lag-1 autocorrelation PHI: twice an AR(1)'s integrated autocorrelation time."""
    phi = min(max(phi, 0.0), MAX_PHI)
    return max(1, math.ceil(round(2 * (1 + phi) / (1 - phi), 9)))  # round: 2 x 1.8 / 0.2 is 18.000000000000004


def lag1(residuals: np.ndarray) -> float:
    """The lag-1 autocorrelation of rows of RESIDUALS (hosts x time, NaN where missing), each row centred on its
    own mean, pooled over rows; 0 when there is nothing to estimate it from."""
    import numpy as np
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row
        e = residuals - np.nanmean(residuals, axis=1, keepdims=True)
    pairs = e[:, :-1] * e[:, 1:]
    ok = np.isfinite(pairs)
    if ok.sum() < 3:
        return 0.0
    var = np.nanmean(e[:, :-1][ok] ** 2)
    return float(np.mean(pairs[ok]) / var) if var > 0 else 0.0


def block_means(residuals: np.ndarray, block: int) -> np.ndarray:
    """Per row, the means of consecutive blocks of BLOCK columns holding at least half a block of values: flat."""
    import numpy as np
    hosts, n = residuals.shape
    padded = np.full((hosts, -(-n // block) * block), np.nan)
    padded[:, :n] = residuals
    blocks = padded.reshape(hosts, -1, block)
    counts = np.isfinite(blocks).sum(axis=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an empty block
        means = np.nanmean(blocks, axis=2)
    return means[counts * 2 >= block]


def _kth_difference(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """The K-th smallest (1-based) of every x_i - y_j, X and Y sorted, without making the n x m differences:
    bisection on the count of differences at or below a value."""
    import numpy as np
    lo, hi = float(x[0] - y[-1]), float(x[-1] - y[0])
    m = len(y)
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if int((m - np.searchsorted(y, x - mid, side="left")).sum()) >= k:
            hi = mid
        else:
            lo = mid
    return hi


def shift_test(x: Sequence[float], y: Sequence[float], good: str,
               confidence: float = CONFIDENCE) -> tuple[float, float, tuple[float, float] | None]:
    """(one-sided Mann-Whitney p that X is worse than Y, the Hodges-Lehmann shift of X from Y, its confidence
    interval or None when too few samples make it unbounded) for independent samples X and Y."""
    import numpy as np
    from scipy.stats import mannwhitneyu, norm  # 1.3 s to import: only where a metric is judged

    x, y = np.sort(np.asarray(x, dtype=float)), np.sort(np.asarray(y, dtype=float))
    p = float(mannwhitneyu(x, y, alternative="less" if good == "higher" else "greater").pvalue)
    n = len(x) * len(y)
    k = math.floor(n / 2 - norm.ppf(0.5 + confidence / 2) * math.sqrt(n * (len(x) + len(y) + 1) / 12))
    ranks = [(n + 1) // 2, n // 2 + 1] + ([k, n + 1 - k] if k >= 1 else [])
    if n <= DIRECT_DIFFERENCES:
        differences = np.partition((x[:, None] - y[None, :]).ravel(), [r - 1 for r in ranks])
        found = [float(differences[r - 1]) for r in ranks]
    else:
        found = [_kth_difference(x, y, r) for r in ranks]
    shift = (found[0] + found[1]) / 2
    ci = (found[2], found[3]) if k >= 1 else None
    return p, shift, ci


# ---- levels --------------------------------------------------------------------------------------------------

def _matrix(series: Series, times: np.ndarray) -> np.ndarray:
    """Hosts x TIMES, NaN where a host has no finite value."""
    import numpy as np
    out = np.full((len(series), len(times)), np.nan)
    for row, points in enumerate(series.values()):
        if points:
            t, v = np.asarray(points, dtype=float).T
            keep = np.isfinite(v)
            out[row, np.searchsorted(times, t[keep])] = v[keep]
    return out


def _hosts_with_values(series: Series | None) -> dict[str, Sequence[tuple[float, float]]]:
    return {h: pts for h, pts in (series or {}).items()
            if any(v is not None and math.isfinite(v) for _, v in pts)}


def _medians_of_others(values: np.ndarray) -> np.ndarray:
    """Per column of VALUES (NaN: missing), each row's value replaced by the median of the column's other finite
    values (NaN where there is none): one sort, not a median per row."""
    import numpy as np
    order = np.argsort(values, axis=0)  # NaN last
    ordered = np.take_along_axis(values, order, axis=0)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(len(values))[:, None], axis=0)
    others = np.isfinite(values).sum(axis=0, keepdims=True) - 1  # finite values left once a row's is taken out

    def at(i: np.ndarray) -> np.ndarray:  # the I-th smallest of the others
        index = np.clip(i + (i >= rank), 0, len(values) - 1)
        return np.take_along_axis(ordered, index, axis=0)

    low, high = (others - 1) // 2, others // 2
    return np.where(others >= 1, (at(np.broadcast_to(low, values.shape)) + at(np.broadcast_to(high, values.shape))) / 2,
                    np.nan)


def residuals(canary: Series, control: Series) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(canary residuals, control residuals, canary values, control values): hosts x timestamps (those with a
    control value), each value less the control cohort's shared movement at that timestamp."""
    import numpy as np
    times = np.unique(np.concatenate([np.asarray([t for t, _ in pts], dtype=float)
                                      for pts in (*canary.values(), *control.values())]))
    can, con = _matrix(canary, times), _matrix(control, times)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a timestamp no control host has
        centred = con - np.nanmedian(con, axis=1, keepdims=True)
        drift = np.nanmedian(centred, axis=0)
    others = np.where(np.isfinite(centred), _medians_of_others(centred), drift)
    others = np.where(np.isfinite(others), others, drift)  # no peer at that timestamp: the cohort's own
    keep = np.isfinite(drift)
    return (can - drift)[:, keep], (con - others)[:, keep], can[:, keep], con[:, keep]


def _result(verdict: str, reason: str, **figures: Any) -> dict[str, Any]:
    out = {"verdict": verdict, "canary": None, "control": None, "change": None, "ci": None, "p_value": None,
           "samples": {"canary": 0, "control": 0}, "reason": reason}
    out.update(figures)
    return out


def _p_text(p: float) -> str:
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def _tolerance(max_change: float) -> str:
    return f"{max_change * 100:g}%"


def _verdict(name: str, head: str, worse_by: float, p: float | None, max_change: float, alpha: float) -> tuple[str, str]:
    """(verdict, reason) from the change in the bad direction (WORSE_BY, positive = worse) and the p-value."""
    tolerated = _tolerance(max_change)
    if worse_by <= max_change:
        return "pass", f"{name}: {head}: " + (f"within the {tolerated} tolerated" if worse_by > 0 else "not worse")
    if p is not None and p < alpha:
        return "fail", f"{name}: {head}: past the {tolerated} tolerated"
    return "no_verdict", f"{name}: {head}: past the {tolerated} tolerated but not significant (p >= {alpha:g}): no verdict yet"


def judge_level(canary: Series, control: Series, good: str, max_change: float, *, name: str = "metric",
                canary_before: Series | None = None, control_before: Series | None = None,
                alpha: float = ALPHA, min_samples: int = MIN_SAMPLES,
                confidence: float = CONFIDENCE) -> dict[str, Any]:
    """A level metric of the canary cohort against the control cohort over the same time range (module doc).

    CANARY, CONTROL: host -> [(unix time, value)], one timestamp grid (a Prometheus range query's step); GOOD:
    higher | lower; MAX_CHANGE: the largest relative change tolerated in the bad direction (0.05). With
    CANARY_BEFORE and CONTROL_BEFORE (the same query over a window before the change), each host is calibrated
    against its own level then; a host without values in it is left out. Extra keys: block_s (seconds a block
    spans), calibrated (whether the before window was used)."""
    import numpy as np
    if good not in GOOD:
        raise ValueError(f"good must be one of {', '.join(GOOD)}, not {good!r}")
    can, con = _hosts_with_values(canary), _hosts_with_values(control)
    calibrated = canary_before is not None and control_before is not None
    note = ""
    if calibrated:
        can_b, con_b = _hosts_with_values(canary_before), _hosts_with_values(control_before)
        left = sorted(set(can) - set(can_b)) + sorted(set(con) - set(con_b))
        can, con = {h: v for h, v in can.items() if h in can_b}, {h: v for h, v in con.items() if h in con_b}
        note = f" ({len(left)} host(s) without values before the change left out: {', '.join(left[:3])}" \
               f"{', ...' if len(left) > 3 else ''})" if left else ""
    if not can:
        return _result("no_verdict", f"{name}: no canary series{note}: no verdict", calibrated=calibrated)
    if not con:
        return _result("no_verdict", f"{name}: no control host with values{note}: no verdict", calibrated=calibrated)
    r_can, r_con, v_can, v_con = residuals(can, con)
    if calibrated:
        b_can, b_con, _, _ = residuals({h: can_b[h] for h in can}, {h: con_b[h] for h in con})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a host with no value at a control's timestamp
            r_can = r_can - np.nanmedian(b_can, axis=1, keepdims=True)
            r_con = r_con - np.nanmedian(b_con, axis=1, keepdims=True)
    times = np.unique(np.concatenate([np.asarray([t for t, _ in pts], dtype=float) for pts in con.values()]))
    step = float(np.median(np.diff(times))) if len(times) > 1 else 0.0
    block = block_length(lag1(np.vstack([r_can, r_con])))
    x, y = block_means(r_can, block), block_means(r_con, block)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    figures: dict[str, Any] = {"samples": {"canary": int(len(x)), "control": int(len(y))},
                               "block_s": block * step, "calibrated": calibrated}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        figures.update(canary=_float(np.nanmedian(v_can)), control=_float(np.nanmedian(v_con)))
    if len(x) < min_samples or len(y) < min_samples:
        minutes = f"{block * step / 60:g}-minute blocks" if step else f"blocks of {block}"
        return _result("no_verdict", f"{name}: {len(x)} sample(s) on the canary and {len(y)} on the control "
                                     f"({minutes}), {min_samples} a side needed{note}: no verdict yet", **figures)
    level = figures["control"]
    if not level:
        return _result("no_verdict", f"{name}: the control's median is {level}: no relative change to judge{note}",
                       **figures)
    p, shift, ci = shift_test(x, y, good, confidence)
    change = shift / abs(level)
    rel_ci = [ci[0] / abs(level), ci[1] / abs(level)] if ci else None
    figures.update(change=change, ci=rel_ci, p_value=p)
    interval = f", {confidence:.0%} CI {rel_ci[0]:+.1%} .. {rel_ci[1]:+.1%}" if rel_ci else ""
    head = (f"canary {median_text(figures['canary'])} vs control {median_text(level)} "
            f"({change:+.1%}{interval}), p={_p_text(p)}")
    verdict, reason = _verdict(name, head, -change if good == "higher" else change, p, max_change, alpha)
    return _result(verdict, reason + note, **figures)


def control_moved(now: Series, before: Series) -> float | None:
    """How far the control cohort moved between the two moments a self-comparison holds against each other (every
    host alike: a drift the fleet shares; campaign/cohort.py): each control host's latest points NOW (a window
    that ends at the later moment) against its latest points BEFORE (one that ends at the earlier moment), less 1;
    the median over hosts. The latest points are the last quarter of a window, MOVED_POINTS at least: its
    earlier points may hold the time before a drift began, or a previous change's reboots. A host with fewer points
    in either window is left out; none left: None."""
    import numpy as np
    moved = []
    for host, points in now.items():
        end, was = _latest_median(points), _latest_median(before.get(host, ()))
        if end is not None and was:
            moved.append(end / was - 1)
    return float(np.median(moved)) if moved else None


def _latest_median(points: Sequence[tuple[float, float]]) -> float | None:
    """The median of the last quarter (MOVED_POINTS at least) of POINTS' finite values by time; too few: None."""
    import numpy as np
    values = [v for _, v in sorted(points, key=lambda p: p[0]) if v is not None and math.isfinite(v)]
    if len(values) < MOVED_POINTS:
        return None
    return float(np.median(values[-max(MOVED_POINTS, len(values) // 4):]))


def _float(v: Any) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


# ---- rates ---------------------------------------------------------------------------------------------------

def judge_rate(canary_counts: Mapping[str, float], canary_gpu_hours: Mapping[str, float],
               control_counts: Mapping[str, float], control_gpu_hours: Mapping[str, float], good: str,
               max_change: float, *, name: str = "metric", alpha: float = ALPHA,
               confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Events per GPU-hour of the canary cohort against the control cohort (module doc). COUNTS: host -> events
    counted over the window (a counter's increase); GPU_HOURS: host -> GPUs x hours of that window. A host in the
    counts without GPU-hours is left out. "samples" are the event counts; extra key: gpu_hours per cohort. "change"
    is the rate ratio less 1 (None when the control counted none and the canary some: unbounded)."""
    from scipy.stats import binomtest  # 1.3 s to import: only where a metric is judged

    if good not in GOOD:
        raise ValueError(f"good must be one of {', '.join(GOOD)}, not {good!r}")
    can_n = sum(max(0.0, float(canary_counts[h])) for h in canary_counts if canary_gpu_hours.get(h, 0) > 0)
    con_n = sum(max(0.0, float(control_counts[h])) for h in control_counts if control_gpu_hours.get(h, 0) > 0)
    can_t = sum(float(canary_gpu_hours[h]) for h in canary_counts if canary_gpu_hours.get(h, 0) > 0)
    con_t = sum(float(control_gpu_hours[h]) for h in control_counts if control_gpu_hours.get(h, 0) > 0)
    figures: dict[str, Any] = {"samples": {"canary": round(can_n), "control": round(con_n)},
                               "gpu_hours": {"canary": can_t, "control": con_t}}
    if not can_t:
        return _result("no_verdict", f"{name}: no canary series: no verdict", **figures)
    if not con_t:
        return _result("no_verdict", f"{name}: no control host with values: no verdict", **figures)
    rate_c, rate_k = can_n / can_t, con_n / con_t
    figures.update(canary=rate_c, control=rate_k)
    counted = f"{can_n:g} in {can_t:.3g} vs {con_n:g} in {con_t:.3g} GPU-hours"
    if can_n + con_n == 0:
        return _result("pass", f"{name}: no events on the canary nor the control ({counted}): not worse", **figures)
    share = can_t / (can_t + con_t)  # the canary's expected share of the events when the rates are equal
    k, n = round(can_n), round(can_n + con_n)
    test = binomtest(k, n, share, alternative="greater" if good == "lower" else "less")
    low, high = binomtest(k, n, share).proportion_ci(confidence_level=confidence)  # two-sided, as levels

    def ratio(q: float) -> float | None:  # the canary's share of the events -> its rate over the control's
        return None if q >= 1 else q / (1 - q) * (1 - share) / share

    rr = ratio(k / n)
    figures.update(change=None if rr is None else rr - 1, p_value=float(test.pvalue),
                   ci=[ratio(low) - 1, None if ratio(high) is None else ratio(high) - 1])
    shown = "x" + (f"{rr:.3g}" if rr is not None else "inf")
    bounds = [f"x{b + 1:.3g}" if b is not None else "xinf" for b in figures["ci"]]
    head = (f"canary {rate_c:.3g} vs control {rate_k:.3g} per GPU-hour ({counted}; {shown}, "
            f"{confidence:.0%} CI {bounds[0]} .. {bounds[1]}), p={_p_text(test.pvalue)}")
    worse_by = math.inf if rr is None else (rr - 1 if good == "lower" else 1 - rr)
    verdict, reason = _verdict(name, head, worse_by, float(test.pvalue), max_change, alpha)
    return _result(verdict, reason, **figures)
