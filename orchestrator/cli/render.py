"""Human output: one rich table per run (audit, probe, plan), hosts grouped, problems first, and a one-line
summary."""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from .. import plan as plan_mod
from ..exitcodes import Exit
from ..judge.canary import planning as canary_planning
from ..sanitize import clean, clean_line

def safe(value: object, style: str = "") -> Text:
    """VALUE for a rich table cell or title: Text (never parsed as markup), clean() (hidden characters escaped)."""
    return Text(clean(value), style=style)


STATUS_STYLE = {"fail": "bold red", "error": "bold magenta", "warn": "yellow", "pass": "green", "not_applicable": "dim"}
SEVERITY_STYLE = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "info": "dim"}
STATUS_LABEL = {"not_applicable": "n/a"}
STATUS_ORDER = {"error": 0, "fail": 1, "warn": 2, "pass": 3, "not_applicable": 4}
SEVERITY_ORDER = {"critical": 0, "high": 1, "medium": 2, "low": 3, "info": 4}


def audit_table(report: dict[str, Any], show_all: bool = False) -> Table:
    table = Table(title=safe(f"fleetctl audit - baseline {report['run']['baseline']['name']}", "table.title"),
                  title_justify="left", show_lines=False, expand=False)
    for name, kw in (("Host", {"style": "bold"}), ("Control", {"no_wrap": True}), ("Severity", {}), ("Status", {}),
                     ("Finding", {"overflow": "fold"})):
        table.add_column(name, **kw)
    hosts = sorted(report["hosts"], key=lambda h: (tuple(h["groups"][-1:]), h["name"]))
    for i, host in enumerate(hosts):
        shown = [f for f in host["findings"] if show_all or f["status"] not in ("pass", "not_applicable")]
        shown.sort(key=lambda f: (STATUS_ORDER[f["status"]], SEVERITY_ORDER[f["severity"]]))
        passed = sum(1 for f in host["findings"] if f["status"] == "pass")
        groups = [g for g in host["groups"] if g != "ungrouped"]
        label = safe(host["name"]) + safe(f"\n{', '.join(groups)}" if groups else "", style="dim")
        if i:
            table.add_section()
        if not shown:
            table.add_row(label, "", "", Text("pass", style="green"), f"all {passed} applicable controls pass")
            continue
        for j, f in enumerate(shown):
            table.add_row(label if j == 0 else "", safe(f["control"]),
                          safe(f["severity"], SEVERITY_STYLE[f["severity"]]),
                          safe(STATUS_LABEL.get(f["status"], f["status"]), STATUS_STYLE[f["status"]]),
                          safe(f["message"]))
        if not show_all and passed:
            table.add_row("", "", "", Text("pass", style="green"), Text(f"{passed} other controls pass", style="dim"))
    return table


def summary_line(report: dict[str, Any]) -> Text:
    s = report["summary"]
    parts = [f"{s['hosts']} host{'s' if s['hosts'] != 1 else ''}: {s['compliant']} compliant"]
    if s["noncompliant"]:
        parts.append(f"{s['noncompliant']} not compliant")
    if s["unreachable"]:
        parts.append(f"{s['unreachable']} unreachable")
    counts = s["findings"]
    detail = ", ".join(f"{counts[k]} {k}" for k in ("fail", "error", "warn") if counts[k])
    style = {Exit.OK: "bold green", Exit.FINDINGS: "bold red"}.get(s["exit_code"], "bold magenta")
    return Text(" - ".join(parts) + (f" ({detail})" if detail else "")
                + f"; fail-on {s['fail_on']}; exit {s['exit_code']}; {s['duration_s']:.1f}s; run #{report['run']['id']}",
                style=style)


def print_audit(report: dict[str, Any], console: Console, show_all: bool = False) -> None:
    console.print(Group(audit_table(report, show_all), summary_line(report)))


def probe_table(report: dict[str, Any]) -> Table:
    """One row per host: health verdict, GPUs, new Xids, and the throughput medians when sampled."""
    table = Table(title="fleetctl probe", title_justify="left")
    sampled = {s["metric"] for h in report["hosts"] for s in ((h["probe"] or {}).get("throughput") or {}).get("samples", [])}
    metrics = ["gemm_tflops", "bandwidth_gbs"]
    # Host -> device copies (the link a downgrade halves) and, on hosts with 2+ GPUs, the interconnect's headline.
    metrics += [m for m in ("h2d_gbs", "allreduce_busbw_gbs") if m in sampled]
    heads = {"gemm_tflops": "GEMM TFLOP/s", "bandwidth_gbs": "Copy GB/s", "h2d_gbs": "H2D GB/s",
             "allreduce_busbw_gbs": "All-reduce busbw GB/s"}
    for name in ("Host", "Health", "GPUs", "Xid", *(f"{heads[m]} (median, CV)" for m in metrics), "Why"):
        table.add_column(name, overflow="fold")
    for host in sorted(report["hosts"], key=lambda h: h["name"]):
        p = host["probe"]
        status = host["health"]["status"] if host["reachable"] else "unreachable"
        style = {"pass": "green", "fail": "bold red", "inconclusive": "yellow"}.get(status, "bold magenta")
        gpus = f"{p['health']['gpu_count']}/{len(p['health']['gpus'])}" if p else "-"
        xids = ", ".join(str(e["code"]) for e in p["health"]["xid"]["events"]) if p else "-"
        table.add_row(safe(host["name"]), safe(status, style), safe(gpus), safe(xids or "none"),
                      *(_spread(p, m) for m in metrics), safe("; ".join(host["health"]["reasons"])))
    return table


def _spread(probe: dict[str, Any] | None, metric: str) -> str:
    values = [s["value"] for s in ((probe or {}).get("throughput") or {}).get("samples", [])
              if s["metric"] == metric and s["value"] is not None]
    if len(values) < 2:
        return "-"
    mean = statistics.fmean(values)
    return f"{statistics.median(values):.1f} ({statistics.stdev(values) / mean * 100:.2f}%)"


def print_probe(report: dict[str, Any], console: Console) -> None:
    s = report["summary"]
    line = Text(f"{s['hosts']} hosts: {s['healthy']} healthy, {s['unhealthy']} unhealthy, {s['unreachable']} unreachable;"
                f" exit {s['exit_code']}; {s['duration_s']:.1f}s; run #{report['run']['id']}",
                style="bold green" if s["exit_code"] == Exit.OK else "bold red")
    console.print(Group(probe_table(report), line))


# ---- fleetctl plan ---------------------------------------------------------------------------------------

def plan_table(report: dict[str, Any]) -> Table:
    t = Table(title=safe(f"fleetctl plan to {report['target']}", "table.title"), title_justify="left")
    for name, kw in (("Wave", {"no_wrap": True}), ("Hosts", {"justify": "right"}), ("Total", {"justify": "right"}),
                     ("Fails at", {"justify": "right"}), ("Hosts (from version)", {"overflow": "fold"})):
        t.add_column(name, **kw)
    for w in report["waves"]:
        label = Text(f"{w['index']}") + (Text(" canary", style="bold") if w["budget"]["canary"] else Text(""))
        by_version: dict[tuple[str | None, str], list[str]] = {}  # an NVLink domain's hosts together, named
        for h in w["hosts"]:
            by_version.setdefault((h.get("domain"), h["from_version"]), []).append(h["name"])
        names = "; ".join(f"{domain + ': ' if domain else ''}{', '.join(hosts)} (from {version})"
                          for (domain, version), hosts in by_version.items())
        unit = w["budget"].get("unit", "host")
        fails_at = str(w["budget"]["fail_at"]) + (f" {unit}{'s' if w['budget']['fail_at'] != 1 else ''}"
                                                  if unit != "host" else "")
        t.add_row(label, str(w["size"]), str(w["cumulative"]), fails_at, safe(names))
    if not report["waves"]:
        t.add_row("-", "0", "0", "-", Text("no host to move", style="dim"))
    return t


def plan_left_out_table(report: dict[str, Any]) -> Table | None:
    rows = [("skipped", h) for h in report["skipped"]] + [("excluded", h) for h in report["excluded"]]
    if not rows:
        return None
    t = Table(title="not in the plan", title_justify="left")
    for name in ("Host", "Status", "Reason"):
        t.add_column(name, overflow="fold")
    for status, h in rows:
        style = "dim" if status == "skipped" else ("bold magenta" if h["code"] == "unreachable" else "yellow")
        t.add_row(safe(h["name"]), safe(f"{status} ({h['code']})", style), safe(h["reason"]))
    return t


def plan_summary_line(report: dict[str, Any]) -> Text:
    s = report["summary"]
    sizes = ", ".join(str(w["size"]) for w in report["waves"])
    text = (f"plan to {report['target']}: {s['hosts']} host{'s' if s['hosts'] != 1 else ''}: {s['eligible']} in "
            f"{s['waves']} wave{'s' if s['waves'] != 1 else ''}" + (f" ({sizes})" if sizes else "")
            + f", {s['skipped']} already on target, {s['excluded']} excluded"
            + (f" ({s['unreachable']} unreachable)" if s["unreachable"] else "")
            + "".join(f"; group {g['group']} cannot take {report['target']}"
                      for g in report["target_groups"] if not g["takes_target"])
            + f"; ramp {','.join(report['ramp'])}; baseline {report['run']['baseline']['name']}"
            + f"; exit {s['exit_code']}; {s['duration_s']:.1f}s; run #{report['run']['id']}")
    return Text(clean_line(text), style="bold green" if s["exit_code"] == Exit.OK else "bold magenta")


def plan_canary_line(report: dict[str, Any]) -> Text | None:
    line = canary_planning.summary(report)
    return Text(clean_line(line), style="yellow") if line else None


def plan_breaker_line(report: dict[str, Any]) -> Text | None:
    line = plan_mod.breaker_summary(report)
    return Text(clean_line(line)) if line else None


def print_plan(report: dict[str, Any], console: Console) -> None:
    parts = [plan_table(report), plan_left_out_table(report), plan_canary_line(report), plan_breaker_line(report),
             plan_summary_line(report)]
    console.print(Group(*[p for p in parts if p is not None]))


