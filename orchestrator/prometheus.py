"""Prometheus metrics: `audit --format prometheus`, `probe --format prometheus` and `fleetctl metrics`.

Pure functions from a report (or the history) to metric families, rendered by prometheus_client's own exposition
code (a CollectorRegistry holding one custom collector, then generate_latest): never hand-written text.

The audit and probe outputs use disjoint metric names (every probe series is `fleetctl_probe_*`), so one textfile
of each can sit side by side in node_exporter's textfile directory; `fleetctl metrics` is the union of the audit
output of each host's latest audit, the probe output of its latest probe, the campaigns and the history's chain.
One set of alert rules (monitoring/prometheus/fleetctl-alerts.yml) therefore works whichever way the files are made.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from .campaign import capacity
from .campaign.journal import Journal
from .campaign.transitions import TERMINAL, CampaignState
from .report import selected
from .history.store import Store
from .history import timefmt

# name (as exposed) -> (help, labels). The one list of what fleetctl exports: the docs' metrics page, the dashboard test
# and the alert-rule tests read it.
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    # audit (also a plan's or a campaign's planning audit): each host's latest
    "fleetctl_host_reachable": ("1 when the host answered its latest audit, 0 when it was unreachable.", ("host",)),
    "fleetctl_last_audit_timestamp_seconds": ("Start of the host's latest audit (Unix time).", ("host",)),
    "fleetctl_control_status": ("1 for each control's status at the host's latest audit (pass, warn, fail, error, "
                                "not_applicable).", ("host", "control", "severity", "status")),
    "fleetctl_driver_info": ("The NVIDIA driver the host's latest audit found (version: the loaded kernel module's; "
                             "empty when none is loaded).", ("host", "version", "userspace_version", "flavor",
                                                             "branch", "state")),
    "fleetctl_gpus": ("GPUs answering NVML (or nvidia-smi) at the host's latest audit.", ("host",)),
    "fleetctl_xid_events": ("Xid events in the host's kernel log since boot at its latest audit, by code and class "
                            "(critical, application, informational, recovery, unknown).", ("host", "code", "class")),
    # probe: each host's latest
    "fleetctl_last_probe_timestamp_seconds": ("Start of the host's latest probe (Unix time).", ("host",)),
    "fleetctl_probe_status": ("1 for the health verdict of the host's latest probe (pass, fail, inconclusive, "
                              "error).", ("host", "status")),
    "fleetctl_probe_gpus": ("GPUs answering NVML at the host's latest probe.", ("host",)),
    "fleetctl_probe_xid_events": ("Xid events the host's latest probe found in the kernel log after the previous "
                                  "probe, by code and class.", ("host", "code", "class")),
    "fleetctl_probe_median": ("Median of the latest probe's throughput samples per GPU and metric, in the unit "
                              "label's unit (gpu empty: host-wide; peer: the GPU a p2p sample copied to).",
                              ("host", "gpu", "peer", "metric", "unit")),
    # campaigns: each host's latest
    "fleetctl_campaign_host_state": ("1 for the host's state in its latest upgrade campaign "
                                     f"({', '.join(TERMINAL)}, or the step it is at).",
                                     ("campaign", "host", "state")),
    "fleetctl_campaign_state": ("1 for the state of each campaign that is some host's latest "
                                f"({', '.join(CampaignState)}).", ("campaign", "target", "state")),
    "fleetctl_campaign_soak_remaining_seconds": ("Time left of the soak a campaign is in (soaking campaigns that are "
                                                 "some host's latest).", ("campaign",)),
    "fleetctl_campaign_soak_host_status": ("1 for the status of the host's latest soak observation in its latest "
                                           "campaign (kind: check or gate; status: ok, fail, unreachable).",
                                           ("campaign", "host", "kind", "status")),
    "fleetctl_campaign_capacity_node_seconds": ("What each campaign that is some host's latest cost in capacity so "
                                                "far, in node-seconds (a host is one node; / 3600: node-hours), by "
                                                "kind: busy (drained while its own jobs still ran), idle (drained and "
                                                "idle: the waste), change (install to back in service).",
                                                ("campaign", "kind")),
    "fleetctl_campaign_capacity_budget_node_seconds": ("The capacity budget of each such campaign that has one "
                                                       "(--capacity-budget; it counts idle and change), in "
                                                       "node-seconds.", ("campaign",)),
    "fleetctl_campaign_soak_canary_failed_runs": ("Failed canary runs of the host during the soaks of its latest "
                                                  "campaign.", ("campaign", "host")),
    # the history
    "fleetctl_history_chain_records": ("Records in the history's hash chain.", ()),
    "fleetctl_history_chain_head_timestamp_seconds": ("When the newest record of the history's hash chain was sealed "
                                                      "(Unix time).", ()),
    "fleetctl_history_chain_head_age_seconds": ("Age of the newest record of the history's hash chain when these "
                                                "metrics were made.", ()),
}


def unix(stamp: str) -> float:
    """The history's UTC timestamps ('2026-11-23T05:52:06.955Z') as Unix time."""
    return timefmt.parse(stamp).timestamp()


class Families:
    """The metric families of one exposition, created on first use in METRICS order."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def _family(self, name: str) -> Metric:
        if name not in self.families:
            doc, labels = METRICS[name]
            if name.endswith("_info"):
                self.families[name] = InfoMetricFamily(name[:-len("_info")], doc, labels=())
            else:
                self.families[name] = GaugeMetricFamily(name, doc, labels=labels)
        return self.families[name]

    def gauge(self, name: str, value: float, **labels: Any) -> None:
        self._family(name).add_metric([str(labels[k]) for k in METRICS[name][1]], value)

    def info(self, name: str, **labels: Any) -> None:
        self._family(name).add_metric([], {k: "" if labels[k] is None else str(labels[k]) for k in METRICS[name][1]})

    def ordered(self) -> list[Metric]:
        return [self.families[n] for n in METRICS if n in self.families]


class _Collector:
    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def render(families: Families) -> str:
    """The Prometheus text exposition (format 0.0.4) of FAMILIES."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families.ordered()))
    return generate_latest(registry).decode()


# -- audit ------------------------------------------------------------------------------------------------------

def add_audit_host(out: Families, host: dict[str, Any], started_at: str) -> None:
    """One host of an audit report (name, reachable, facts, findings) audited in the run started at STARTED_AT."""
    name = host["name"]
    out.gauge("fleetctl_host_reachable", 1 if host["reachable"] else 0, host=name)
    out.gauge("fleetctl_last_audit_timestamp_seconds", unix(started_at), host=name)
    for f in host["findings"]:
        out.gauge("fleetctl_control_status", 1, host=name, control=f["control"], severity=f["severity"],
                  status=f["status"])
    facts = host.get("facts")
    if not facts:
        return
    driver = facts["driver"]
    out.info("fleetctl_driver_info", host=name, version=driver["module_version"],
             userspace_version=driver["userspace_version"], flavor=driver["module_flavor"], branch=driver["branch"],
             state=driver["state"])
    out.gauge("fleetctl_gpus", sum(1 for g in facts["gpus"] if not g.get("lost")), host=name)
    for (code, cls), n in sorted(Counter((e["code"], e["class"]) for e in facts["xid"]["events"]).items()):
        out.gauge("fleetctl_xid_events", n, host=name, code=code, **{"class": cls})


# -- probe ------------------------------------------------------------------------------------------------------

def medians(throughput: dict[str, Any] | None) -> list[tuple[str, str, str, str, float]]:
    """(gpu, peer, metric, unit, median) of a probe's throughput samples; failed trials (null) left out."""
    if not throughput:
        return []
    series: dict[tuple[str, str, str], list[float]] = {}
    for s in throughput["samples"]:
        if s["value"] is not None:
            key = ("" if s["gpu"] is None else str(s["gpu"]), "" if s.get("peer") is None else str(s["peer"]),
                   s["metric"])
            series.setdefault(key, []).append(s["value"])
    units = throughput.get("metrics", {})
    return [(gpu, peer, metric, units.get(metric, {}).get("unit", ""), statistics.median(values))
            for (gpu, peer, metric), values in sorted(series.items())]


def add_probe_host(out: Families, name: str, probe: dict[str, Any] | None, health: str, started_at: str) -> None:
    """One host's probe result (None when it gave none) and verdict, from the run started at STARTED_AT."""
    out.gauge("fleetctl_last_probe_timestamp_seconds", unix(started_at), host=name)
    out.gauge("fleetctl_probe_status", 1, host=name, status=health)
    if probe is None:
        return
    out.gauge("fleetctl_probe_gpus", probe["health"]["gpu_count"], host=name)
    for (code, cls), n in sorted(Counter((e["code"], e["class"]) for e in probe["health"]["xid"]["events"]).items()):
        out.gauge("fleetctl_probe_xid_events", n, host=name, code=code, **{"class": cls})
    for gpu, peer, metric, unit, value in medians(probe.get("throughput")):
        out.gauge("fleetctl_probe_median", value, host=name, gpu=gpu, peer=peer, metric=metric, unit=unit)


# -- what one run saw ---------------------------------------------------------------------------------------------

def report_families(report: dict[str, Any]) -> Families:
    """An audit or probe report (as --format json prints it)."""
    out = Families()
    started = report["run"]["started_at"]
    for h in report["hosts"]:
        if "health" in h:  # a probe report
            add_probe_host(out, h["name"], h["probe"], h["health"]["status"], started)
        else:
            add_audit_host(out, h, started)
    return out


def report_text(report: dict[str, Any]) -> str:
    return render(report_families(report))


# -- the history ------------------------------------------------------------------------------------------------

def history_families(store: Store, limit: str | None = None, now: float | None = None) -> Families:
    """The latest state of every host the history knows (no host is contacted). LIMIT: hosts or groups (shell
    patterns, comma separated), as `fleetctl report -l`; a host's groups are those of its latest audit."""
    journal, now = Journal(store, create=False), time.time() if now is None else now
    patterns = [p for p in (limit or "").replace(":", ",").split(",") if p]
    audits = store.latest_audits()
    groups = {r["host"]: json.loads(r["groups"] or "[]") for r in audits}

    def wanted(host: str) -> bool:
        return selected(host, groups.get(host, []), patterns)

    out = Families()
    findings = store.latest_findings()
    for r in audits:
        if wanted(r["host"]):
            add_audit_host(out, {"name": r["host"], "reachable": bool(r["reachable"]),
                                 "facts": json.loads(r["facts"]) if r["facts"] else None,
                                 "findings": findings.get(r["host"], [])}, r["started_at"])
    for r in store.latest_probes():
        if wanted(r["host"]):
            add_probe_host(out, r["host"], json.loads(r["result"]) if r["result"] else None, r["health"],
                           r["started_at"])
    campaigns: dict[int, tuple[str, str]] = {}
    for r in journal.latest_host_states():
        if wanted(r["host"]):
            out.gauge("fleetctl_campaign_host_state", 1, campaign=r["id"], host=r["host"], state=r["state"])
            campaigns[r["id"]] = (r["target"], r["campaign_state"])
    for cid, (target, state) in sorted(campaigns.items()):
        out.gauge("fleetctl_campaign_state", 1, campaign=cid, target=target, state=state)
    for cid in sorted(campaigns):
        figures = capacity.of_campaign(journal, cid, datetime.fromtimestamp(now, timezone.utc))
        for kind in capacity.KINDS:
            out.gauge("fleetctl_campaign_capacity_node_seconds",
                      round(sum(p[f"{kind}_s"] for p in figures["passes"]), 3), campaign=cid, kind=kind)
        if figures["budget"]:
            out.gauge("fleetctl_campaign_capacity_budget_node_seconds", figures["budget"]["node_hours"] * 3600,
                      campaign=cid)
    for r in journal.soak_states(sorted(campaigns)):
        if r["state"] == CampaignState.SOAKING and r["soak_until"]:
            out.gauge("fleetctl_campaign_soak_remaining_seconds", max(0.0, unix(r["soak_until"]) - now),
                      campaign=r["id"])
    latest_campaign = {r["host"]: r["id"] for r in journal.latest_host_states()}
    for r in journal.latest_soak_hosts():
        if latest_campaign.get(r["host"]) == r["campaign_id"] and wanted(r["host"]):
            out.gauge("fleetctl_campaign_soak_host_status", 1, campaign=r["campaign_id"], host=r["host"],
                      kind=r["kind"], status=r["status"])
            out.gauge("fleetctl_campaign_soak_canary_failed_runs", r["canary_failed"] or 0, campaign=r["campaign_id"],
                      host=r["host"])
    last = store.chain_last()
    out.gauge("fleetctl_history_chain_records", last[0] if last else 0)
    if last:
        sealed = unix(last[1])
        out.gauge("fleetctl_history_chain_head_timestamp_seconds", sealed)
        out.gauge("fleetctl_history_chain_head_age_seconds", max(0.0, now - sealed))
    return out


def history_text(store: Store, limit: str | None = None, now: float | None = None) -> str:
    return render(history_families(store, limit, now))
