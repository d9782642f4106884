"""The canary metrics' kinds, each declared here once: what the baseline's `kind` means, how the measured series
become a verdict. A new kind is one `register(Kind(...))` in this module (or a plugin's): the baseline accepts its
name, the plan lists it and the soak judges it, none of them naming a kind.

A kind's judge takes data (a Window: the series Prometheus gave, read by the caller) and never reads any:
the soak (campaign/soak.py) asks Prometheus, the judge answers from what it was handed, as Kayenta's judges do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

Points = Sequence[tuple[float, float]]  # [(unix time, value)], in time order
Series = Mapping[str, Points]  # host -> points


class Metric(Protocol):
    """What a kind's judge reads of a baseline canary metric (baseline.CanaryMetric)."""
    name: str
    good: str
    max_change: float


@dataclass(frozen=True)
class Window:
    """One metric's series over the soak (START to END, Unix times: since the canary hosts came back) and over as
    long a time before the canary hosts were drained (BEFORE_*): host -> points, a canary and a control cohort;
    GPUS: host -> its GPUs (rates count GPU-hours)."""
    canary: Series
    control: Series
    start: float
    end: float
    canary_before: Series = field(default_factory=dict)
    control_before: Series = field(default_factory=dict)
    gpus: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Kind:
    """NAME (the baseline's `kind`), SAYS (one line: what such a metric is), JUDGE(window, metric, min_samples) ->
    a verdict dict as the statistics return it; DRIFT: whether its control cohort's movement says how far the
    fleet drifted (cohort.moved, for a metric where higher is good). The statistics:
    orchestrator/judge/canary/statistics.py."""
    name: str
    says: str
    judge: Callable[[Window, Metric, int | None], dict[str, Any]]
    drift: bool = False


KINDS: dict[str, Kind] = {}
DEFAULT = "level"


def register(kind: Kind) -> Kind:
    """Make KIND known by its name (a second kind of one name is a mistake: ValueError)."""
    if kind.name in KINDS:
        raise ValueError(f"canary metric kind {kind.name!r} is registered already")
    KINDS[kind.name] = kind
    return kind


def of(name: str) -> Kind:
    """The kind named NAME; an unknown one: LookupError naming the known ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise LookupError(f"{name!r} is not one of {sorted(KINDS)}") from None


def judge(metric: Any, window: Window, min_samples: int | None = None) -> dict[str, Any]:
    """METRIC's verdict (a baseline.CanaryMetric: its kind decides how) from WINDOW's series: no I/O."""
    return of(getattr(metric, "kind", DEFAULT)).judge(window, metric, min_samples)


def drift_kinds() -> set[str]:
    """The kinds whose control cohort's movement is the fleet's drift."""
    return {k.name for k in KINDS.values() if k.drift}


# ---- the kinds fleetctl ships ----------------------------------------------------------------------------------
# Their statistics (and the gate's helpers they use: 25 ms) are imported when a kind judges, not with the registry:
# `fleetctl check` reads the baseline, which asks the registry its kind names (bench/check_latency.py).

def _level(w: Window, m: Metric, min_samples: int | None) -> dict[str, Any]:
    from . import statistics
    kwargs = {"min_samples": min_samples} if min_samples else {}
    return statistics.judge_level(w.canary, w.control, m.good, m.max_change, name=m.name,
                                  canary_before={h: w.canary_before.get(h, []) for h in w.canary},
                                  control_before={h: w.control_before.get(h, []) for h in w.control}, **kwargs)


def increase(points: Points) -> float:
    """A counter's increase over POINTS, resets included (a host that rebooted starts again from zero)."""
    total, last = 0.0, None
    for _, v in points:
        if last is not None:
            total += v - last if v >= last else v
        last = v
    return total


def _rate(w: Window, m: Metric, min_samples: int | None) -> dict[str, Any]:
    hours = (w.end - w.start) / 3600
    counts = {h: increase(p) for h, p in (*w.canary.items(), *w.control.items())}
    gpu_hours = {h: (w.gpus.get(h) or 1) * hours for h in counts}
    from . import statistics
    return statistics.judge_rate({h: counts[h] for h in w.canary}, {h: gpu_hours[h] for h in w.canary},
                                 {h: counts[h] for h in w.control}, {h: gpu_hours[h] for h in w.control},
                                 m.good, m.max_change, name=m.name)


register(Kind("level", "a value sampled over time (throughput, activity, power), each host against its own level "
                       "before the change, less the control cohort's", _level, drift=True))
register(Kind("rate", "events (Xid errors): the query gives a counter or a count per host, judged per GPU-hour",
              _rate))
