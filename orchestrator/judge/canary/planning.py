"""The canary's planning: the cohorts a plan's hosts are judged within (group and GPU model), each wave's control
cohort, and the baseline's canary metrics checked against Prometheus before any host is touched (docs/canary.md).
`fleetctl plan` and `upgrade` put section() in the plan; the soak (campaign/cohort.py) finds a host's cohort here.
"""

from __future__ import annotations

import time
from typing import Any

from .. import promql
from ...errors import InputError
from ...fleet.inventory import primary_group

CANARY_LOOKBACK_S, CANARY_STEP_S = 600.0, 30.0  # plan looks for each canary metric's series over the last 10 min


def check_metrics(fleet: Any, base: Any, client: Any) -> list[dict[str, Any]]:
    """The baseline's canary metrics (docs/canary.md), checked before any host is touched when Prometheus is
    configured (CLIENT, promql.Client): each query parses (a syntax error is an InputError, one line), and returns a
    series for some host of its group over the last CANARY_LOOKBACK_S (none at all is an InputError too; the hosts
    without one are listed). Without a client the metrics are listed, unchecked."""
    by_group: dict[str, list[Any]] = {}
    for h in fleet.hosts:
        by_group.setdefault(primary_group(h.groups), []).append(h)
    out = []
    for group, hosts in by_group.items():
        for m in base.canary_for(list(hosts[0].groups)).metrics:
            entry = {"group": group, "metric": m.name, "kind": m.kind, "good": m.good, "max_change": m.max_change,
                     "checked": client is not None, "without_series": []}
            if client is not None:
                where = f"baseline canary metric {m.name} (group {group})"
                query = promql.render(m.query, hosts)
                try:
                    client.check(query)
                except InputError as e:
                    raise InputError(f"{where}: {e}") from None
                now = time.time()
                found = promql.by_host(client.range(query, now - CANARY_LOOKBACK_S, now, CANARY_STEP_S,
                                                    m.host_label), hosts)
                entry["without_series"] = [h.name for h in hosts if h.name not in found]
                if not found:
                    raise InputError(f"{where}: no series for any of its {len(hosts)} hosts over the last "
                                     f"{CANARY_LOOKBACK_S / 60:g} minutes (label {m.host_label}): {query[:120]}")
            out.append(entry)
    return out


def summary(report: dict[str, Any]) -> str | None:
    """The plan's canary metrics in one line: each checked against Prometheus or not, the hosts without a series."""
    canary = report.get("canary")
    if not canary:
        return None
    said = []
    for m in canary["metrics"]:
        state = ("no Prometheus configured: not checked" if not m["checked"] else
                 f"{len(m['without_series'])} host(s) without a series: {', '.join(m['without_series'][:3])}"
                 if m["without_series"] else "series for every host")
        said.append(f"{m['metric']} (group {m['group']}, {m['kind']}, {m['good']} is good, "
                    f"{m['max_change']:.0%} tolerated): {state}")
    return "canary metrics, judged by the soak against the control cohort: " + "; ".join(said)


def cohort(host: dict[str, Any]) -> str:
    """The cohort a plan's host is judged within by the canary metrics: its group and GPU model ("gpu (NVIDIA
    H100 80GB HBM3)"; the group alone where the model is unknown)."""
    model = host.get("gpu_model")
    return primary_group(host["groups"]) + (f" ({model})" if model else "")


def control_cohorts(made: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Per wave, per cohort (its group and GPU model): the hosts the canary metrics compare that wave's hosts with
    (the cohort's hosts of later waves, not changed yet while it soaks)."""
    out = {}
    for w in made["waves"]:
        later = [h for x in made["waves"] if x["index"] > w["index"] for h in x["hosts"]]
        cohorts = dict.fromkeys(cohort(h) for h in w["hosts"])
        out[str(w["index"])] = {c: [h["name"] for h in later if cohort(h) == c] for c in cohorts}
    return out


def section(metrics: list[dict[str, Any]], made: dict[str, Any]) -> dict[str, Any]:
    """The plan's `canary`: METRICS (check_metrics) and each wave's control cohorts in plan MADE."""
    return {"metrics": metrics, "control": control_cohorts(made), "judged_by_soak": True}
