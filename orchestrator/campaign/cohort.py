"""The control cohort of a changed host, and a drift the whole fleet shares taken out of every comparison of that
host with its own past (docs/canary.md).

The control cohort: the campaign's hosts of the host's group and GPU model (planning.cohort) that it has not changed
nor begun to change (later waves; those a rollback cancelled). The soak judges the canary metrics against it
(soak.canary_metrics); and a gate that holds a host against itself at an earlier moment (the end-of-soak gate
and the canary's last run against its first, soak.py; probe_after and the rollback's probe, steps.py) fails under
a drift every host shares (a warm afternoon, a slow shared filesystem) though the driver did nothing. What the
control cohort did between the same two moments is that drift: judged_less_drift judges such a comparison again
with it taken out, and that verdict decides. A change only the changed host shows is left whole.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable

from ..judge import gate
from ..judge.canary import kinds, planning
from ..history.timefmt import parse, stamp
from .context import Context
from .transitions import HostState

UNTOUCHED = (HostState.PRECHECK, HostState.NOT_STARTED)  # a control host's states: not drained, not changed
WINDOW_S, STEP_S = 60.0, 5.0  # where a control host was at a moment: its points over the minute before, every 5 s


def planned(ctx: Context) -> dict[str, dict[str, Any]]:
    """The campaign plan's entry of each host in its waves (groups, GPUs, GPU model): host -> entry."""
    made = json.loads(ctx.journal.campaign(ctx.campaign)["plan"])
    return {h["name"]: h for w in made["waves"] for h in w["hosts"]}


def names(ctx: Context, hosts: list[str] | None = None) -> dict[str, str]:
    """The cohort of each of HOSTS (default: the plan's): its group and GPU model (planning.cohort), else its group."""
    entries = planned(ctx)
    return {h: planning.cohort(entries[h]) if h in entries else ctx.fleet.host(h).group
            for h in (hosts if hosts is not None else entries)}


def untouched(ctx: Context) -> list[str]:
    """The campaign's hosts it has not changed nor drained: every control cohort's hosts."""
    return [r["host"] for r in ctx.journal.hosts(ctx.campaign) if not r["changed"] and r["state"] in UNTOUCHED]


def step_time(ctx: Context, host: str, step: HostState, key: str) -> float | None:
    """When HOST's STEP started or finished (KEY: started_at | finished_at), as a Unix time; None if it did not."""
    row = next((r for r in ctx.journal.steps(ctx.campaign, host) if r["step"] == step and r[key]), None)
    return parse(row[key]).timestamp() if row else None


def drained(ctx: Context, host: str) -> float | None:
    """The moment HOST's probe_before measured: its drain's start, just after."""
    return step_time(ctx, host, HostState.DRAIN, "started_at")


def now() -> float:
    return datetime.now(timezone.utc).timestamp()


def moved(ctx: Context, host: str, since: float, until: float) -> dict[str, Any] | None:
    """How far HOST's control cohort moved from the moment SINCE to UNTIL (Unix times), by the baseline's canary
    metrics of a drift kind (kinds.Kind.drift: level) where higher is good: per metric, each control host's latest
    points over the WINDOW_S before UNTIL against those before SINCE (canary.control_moved); the least movement of
    those metrics, so a drift is never over-counted: {"metric", "moved" (-0.06: 6% down), "control_hosts",
    "between": the two moments}. None when nothing says the fleet moved down: no Prometheus, no such metric, no
    control host, a metric Prometheus could not answer or without enough points, or a movement that is not down."""
    from ..judge.canary import statistics as canary
    from ..judge import promql
    levels = [m for m in ctx.base.canary_for(list(ctx.fleet.host(host).groups)).metrics
              if m.kind in kinds.drift_kinds() and m.good == "higher"]
    cohorts = names(ctx)
    mine = cohorts.get(host) or ctx.fleet.host(host).group
    control = [h for h in untouched(ctx) if cohorts.get(h) == mine]
    if ctx.prometheus is None or not levels or not control:
        return None
    fleet = [ctx.fleet.host(h) for h in control]
    moves = []
    for m in levels:
        query = promql.render(m.query, fleet)
        try:
            then, later = (promql.by_host(ctx.prometheus.range(query, t - WINDOW_S, t, STEP_S, m.host_label), fleet)
                           for t in (since, until))
        except (promql.PrometheusError, ValueError):
            return None
        shift = canary.control_moved(later, then)
        if shift is None:
            return None
        moves.append((shift, m.name))
    shift, metric = max(moves)
    if shift >= 0:
        return None
    return {"metric": metric, "moved": shift, "control_hosts": control,
            "between": [stamp(datetime.fromtimestamp(t, timezone.utc)) for t in (since, until)]}


def less_drift(throughput: dict[str, Any], shift: float) -> dict[str, Any]:
    """A probe's throughput with the fleet's relative movement SHIFT taken out of every sample: a higher-is-better
    metric's values divided by 1 + SHIFT, a lower-is-better one's multiplied."""
    better_high = {name: spec.get("higher_is_better", True) for name, spec in throughput.get("metrics", {}).items()}
    return {**throughput, "samples": [
        {**x, "value": x["value"] / (1 + shift) if better_high.get(x["metric"], True) else x["value"] * (1 + shift)}
        for x in throughput["samples"]]}


def judged_less_drift(ctx: Context, host: str, verdict: gate.Verdict, what: str, since: float | None, until: float,
                      again: Callable[[float], gate.Verdict], record: dict[str, Any], key: str,
                      notes: list[str]) -> gate.Verdict:
    """The verdict that decides a comparison of HOST with its own past (WHAT says which; VERDICT: the later probe,
    measured at UNTIL, against the one at the moment SINCE). One whose throughput series did not all pass is judged
    AGAIN(shift) with the control cohort's movement over that time (moved) taken out of the later probe, and that
    verdict decides; it goes to RECORD[KEY] with the movement, a line saying so to NOTES. Else VERDICT."""
    if since is None or not any(f.get("status") not in (None, "pass") and f.get("gated", True)
                                for f in verdict.figures.values()):
        return verdict
    drift = moved(ctx, host, since, until)
    if drift is None:
        return verdict
    second = again(drift["moved"])
    record[key] = {**drift, **second.as_dict()}
    notes.append(f"{what}: {verdict.summary()}; but the control cohort moved {drift['moved']:+.1%} "
                 f"({drift['metric']}) over the same time: less that fleet-wide drift, {second.status}"
                 + (f": {second.summary()}" if second.status != "pass" else ""))
    return second
