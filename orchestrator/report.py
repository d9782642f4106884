"""fleetctl report: what the history says about compliance, for auditors, as JSON and CSV.

The report covers the audits in a period (--since/--until) of the hosts selected (-l: host or group names, shell
patterns): each host's latest audit in the period with its findings and evidence, per-control pass rates, the
driver versions seen, compliance per day, and the campaigns started in the period with their outcomes. Every export
states the chain head it was made from (`fleetctl report verify --head DIGEST` checks a history against it).
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import json
import uuid
from datetime import datetime, timezone
from html import escape
from typing import Any

import jinja2

from . import __version__, schemas
from .history import chain, timefmt
from .errors import InputError
from .sanitize import clean_data, one_line, visible
from .campaign import capacity
from .campaign.journal import Journal
from .campaign.transitions import CampaignState, HostState
from .judge.gate import metric_figures
from .history.store import HistoryError, Store, now, operator

CSV_FIELDS = ("host", "groups", "audit_run", "audited_at", "control", "severity", "status", "message",
              "baseline_digest", "evidence")


def parse_day(text: str | None, flag: str, end: bool = False) -> str | None:
    """'2026-11-21' or an ISO timestamp -> a UTC timestamp string comparable with the history's."""
    if text is None:
        return None
    try:
        if len(text) == 10:
            stamp = datetime.fromisoformat(text + ("T23:59:59.999" if end else "T00:00:00")).replace(tzinfo=timezone.utc)
        else:
            stamp = timefmt.parse(text)
            stamp = stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)
        stamp = stamp.astimezone(timezone.utc)
    except ValueError:
        raise InputError(f"{flag} {text!r}: not a date (YYYY-MM-DD) or ISO timestamp") from None
    except OverflowError:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
        raise InputError(f"{flag} {text!r}: out of the range of dates") from None
    return timefmt.stamp(stamp)


def selected(name: str, groups: list[str], patterns: list[str]) -> bool:
    return not patterns or any(fnmatch.fnmatch(n, p) for p in patterns for n in [name, *groups])


def build(store: Store, since: str | None = None, until: str | None = None, limit: str | None = None) -> dict[str, Any]:
    since_ts, until_ts = parse_day(since, "--since"), parse_day(until, "--until", end=True)
    if since_ts and until_ts and since_ts > until_ts:
        raise InputError(f"--since {since} is after --until {until}")
    patterns = [p for p in (limit or "").replace(":", ",").split(",") if p]
    db = store.db
    verdict = chain.verify(db)
    if not verdict.ok:  # an export vouches for the history it was made from: never from a broken one
        raise HistoryError(verdict.line() + " (fleetctl report verify)")
    audits = store.audits_between(since_ts, until_ts)
    latest: dict[str, dict[str, Any]] = {}
    daily: dict[str, dict[str, bool]] = {}
    for run in audits:
        for hr in store.run_hosts(run["id"]):
            groups = json.loads(hr["groups"] or "[]")
            if not selected(hr["host"], groups, patterns):
                continue
            findings = [dict(f) for f in store.host_findings(run["id"], hr["host"])]
            compliant = bool(hr["reachable"]) and not any(f["status"] in ("fail", "error") for f in findings)
            daily.setdefault(run["started_at"][:10], {})[hr["host"]] = compliant
            latest[hr["host"]] = {"run": run, "row": hr, "groups": groups, "findings": findings,
                                  "compliant": compliant}
    hosts, rates, drivers = [], {}, {}
    for name in sorted(latest):
        e = latest[name]
        facts = json.loads(e["row"]["facts"]) if e["row"]["facts"] else None
        version = (facts or {}).get("driver", {}).get("module_version") or "none"
        drivers[version] = drivers.get(version, 0) + 1
        for f in e["findings"]:
            r = rates.setdefault(f["control"], {"control": f["control"], "severity": f["severity"], "pass": 0,
                                                "fail": 0, "error": 0, "warn": 0, "other": 0})
            r[f["status"] if f["status"] in ("pass", "fail", "error", "warn") else "other"] += 1
        hosts.append({
            "name": name, "groups": e["groups"], "compliant": e["compliant"], "reachable": bool(e["row"]["reachable"]),
            "driver_version": version, "audit": {"run": e["run"]["id"], "uuid": e["run"]["uuid"],
                                                 "at": e["run"]["started_at"], "operator": e["run"]["operator"],
                                                 "control_node": e["run"]["control_node"],
                                                 "tool_version": e["run"]["tool_version"],
                                                 "baseline": {"name": e["run"]["baseline_name"],
                                                              "digest": e["run"]["baseline_digest"]}},
            "findings": [{"control": f["control"], "severity": f["severity"], "status": f["status"],
                          "message": f["message"], "evidence": json.loads(f["evidence"])} for f in e["findings"]]})
    for r in rates.values():
        judged = r["pass"] + r["fail"] + r["error"] + r["warn"]
        r["pass_rate"] = round(r["pass"] / judged, 4) if judged else None
    report = {
        "schema_version": 1,
        "tool": {"name": "fleetctl", "version": __version__},
        "generated": {"at": now(), "operator": operator(), "since": since_ts, "until": until_ts, "limit": limit},
        "chain": chain.head(db),
        "summary": {"hosts": len(hosts), "compliant": sum(1 for h in hosts if h["compliant"]),
                    "audits": len(audits), "campaigns": 0},
        "controls": sorted(rates.values(), key=lambda r: r["control"]),
        "driver_versions": [{"version": v, "hosts": n} for v, n in sorted(drivers.items())],
        "compliance_over_time": [{"day": d, "hosts": len(h), "compliant": sum(h.values())}
                                 for d, h in sorted(daily.items())],
        "campaigns": campaigns(store, since_ts, until_ts),
        "hosts": hosts,
    }
    report["summary"]["campaigns"] = len(report["campaigns"])
    schemas.check("compliance-report", report, "fleetctl's own compliance report (a bug: please report it)")
    return report


def campaigns(store: Store, since_ts: str | None, until_ts: str | None) -> list[dict[str, Any]]:
    """Who moved what from which version to which, in how many waves, what was rolled back and why, on which hosts
    the rollback failed (a person is needed), the latest judgement of its canary metrics, and what it cost in
    capacity (node-hours, per wave and in all)."""
    journal = Journal(store, create=False)
    try:
        rows = journal.campaigns_between(since_ts, until_ts)
    except Exception:  # a history that never ran a campaign has no campaign tables
        return []
    out = []
    for c in rows:
        hosts = journal.hosts(c["id"])
        plan = json.loads(c["plan"])
        out.append({"id": c["id"], "target": c["target"], "state": c["state"], "operator": c["operator"],
                    "control_node": c["control_node"], "started_at": c["created_at"], "updated_at": c["updated_at"],
                    "from_versions": sorted({json.loads(h["before"])["version"] for h in hosts if h["before"]}),
                    "waves": len(plan["waves"]), "reason": c["reason"],
                    "hosts": [{"name": h["host"], "state": h["state"], "reason": h["reason"]} for h in hosts],
                    "rolled_back": [h["host"] for h in hosts if h["state"] == HostState.ROLLED_BACK],
                    "rollback_failed": [h["host"] for h in hosts if h["state"] == HostState.ROLLBACK_FAILED],
                    "canary_metrics": journal.canary_metrics(c["id"]),
                    "capacity": capacity.summary(capacity.of_campaign(journal, c["id"]))})
    return out


FORMULA_START = ("=", "+", "-", "@")  # what a spreadsheet may read as a formula (OWASP: CSV injection)


def cell(value: Any) -> Any:
    """A CSV cell from a host, an inventory or a baseline: visible() (a tab, a carriage return or a newline shown
    as \\t, \\r, \\n: one row a line), never a live formula: one starting with = + - @ gets a leading single quote
    (OWASP's guidance)."""
    if not isinstance(value, str):
        return value
    value = visible(value)
    return "'" + value if value.startswith(FORMULA_START) else value


def to_csv(report: dict[str, Any]) -> str:
    """One row per host x control, for spreadsheets (every text cell through cell())."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for h in report["hosts"]:
        for f in h["findings"]:
            row = {"host": h["name"], "groups": " ".join(h["groups"]), "audit_run": h["audit"]["run"],
                   "audited_at": h["audit"]["at"], "control": f["control"], "severity": f["severity"],
                   "status": f["status"], "message": f["message"], "baseline_digest": h["audit"]["baseline"]["digest"],
                   "evidence": json.dumps(f["evidence"], sort_keys=True)}
            writer.writerow({k: cell(v) for k, v in row.items()})
    buf.write(f"# chain head {report['chain']['digest']} ({report['chain']['records']} records)\n")
    return buf.getvalue()


# ---- HTML: one self-contained file, charts drawn as inline SVG (no script, no network) -------------------

# The charts' text is 12 px monospace, whose every character is 0.6 em wide (7.2 px; DejaVu Sans Mono, Liberation
# Mono, Courier): CHAR_PX is its room with a margin. BAR_PX: the longest bar.
FONT, CHAR_PX, BAR_PX = 'font-family="monospace" font-size="12"', 8, 480


def _bars(rows: list[tuple[str, float, str]], maximum: float, unit: str = "") -> str:
    """Horizontal bars: (label, value, colour). The labels' column and the room after the longest bar are as wide
    as their longest text: no label overlaps a bar or is cut off at the edge."""
    values = [f"{value:g}{unit}" for _, value, _ in rows]
    left = CHAR_PX * max(len(label) for label, _, _ in rows) + 12
    height, width = 22 * len(rows) + 10, left + BAR_PX + 12 + CHAR_PX * max(map(len, values))
    parts = [f'<svg class="chart" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'{FONT} xmlns="http://www.w3.org/2000/svg">']
    for i, ((label, value, colour), text) in enumerate(zip(rows, values)):
        y = 5 + 22 * i
        length = 0 if maximum <= 0 else BAR_PX * value / maximum
        parts.append(f'<text x="0" y="{y + 15}">{escape(label)}</text>'
                     f'<rect x="{left}" y="{y + 3}" width="{length:.1f}" height="16" fill="{colour}"/>'
                     f'<text x="{left + 6 + length:.1f}" y="{y + 15}">{text}</text>')
    return "".join(parts) + "</svg>"


def charts(report: dict[str, Any]) -> dict[str, str]:
    controls = [(c["control"], round(100 * c["pass_rate"], 1), "#2e7d32" if c["pass_rate"] == 1 else "#c62828")
                for c in report["controls"] if c["pass_rate"] is not None]
    drivers = [(d["version"], d["hosts"], "#1565c0") for d in report["driver_versions"]]
    days = [row for d in report["compliance_over_time"]
            for row in ((f"{d['day']} audited", d["hosts"], "#90a4ae"), (f"{d['day']} on the baseline",
                                                                         d["compliant"], "#6a1b9a"))]
    outcomes: dict[str, int] = {}
    for c in report["campaigns"]:  # a failed rollback outweighs the state: a person is needed
        outcome = HostState.ROLLBACK_FAILED if c["rollback_failed"] else c["state"]
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    colours = {CampaignState.DONE: "#2e7d32", CampaignState.ROLLED_BACK: "#c62828", CampaignState.HALTED: "#ef6c00",
               CampaignState.ABORTED: "#757575", HostState.ROLLBACK_FAILED: "#7b1fa2"}
    empty = '<p class="muted">Nothing in the period.</p>'
    return {"controls": _bars(controls, 100, "%") if controls else empty,
            "drivers": _bars(drivers, max(n for _, n, _ in drivers)) if drivers else empty,
            "timeline": _bars(days, max(n for _, n, _ in days), " hosts") if days else empty,
            "campaigns": _bars([(s, n, colours.get(s, "#1565c0")) for s, n in sorted(outcomes.items())],
                               max(outcomes.values())) if outcomes else empty}


SUMMARY_CHARS = 200  # a reason longer than this (one recorded before 0.2) shows folded, its start as the summary


def environment() -> jinja2.Environment:
    """The HTML exports' templates (orchestrator/templates), autoescaped."""
    return jinja2.Environment(loader=jinja2.PackageLoader("orchestrator", "templates"),
                              autoescape=jinja2.select_autoescape(["html", "j2"]))


def to_html(report: dict[str, Any]) -> str:
    env = environment()
    env.filters["summary"] = lambda text: one_line(text or "", SUMMARY_CHARS)
    env.filters["figures"] = metric_figures
    env.filters["capacity"] = capacity.text
    report = clean_data(report)  # text from hosts and files visible(): autoescape leaves U+202E or a BEL raw
    return env.get_template("report.html.j2").render(r=report, charts=charts(report))


# ---- OSCAL assessment-results ----------------------------------------------------------------------------

OSCAL_VERSION = "1.1.2"
FLEETCTL_NS = "https://fleetctl.dev/ns/oscal"
_UUID_NS = uuid.UUID("6f1c3a52-2d1e-4f0b-9a51-6c1f0e7f3a10")  # fleetctl's namespace for stable subject ids


def _stable(kind: str, name: str) -> str:
    return str(uuid.uuid5(_UUID_NS, f"{kind}:{name}"))


def _oscal_time(stamp: str) -> str:
    return stamp if stamp.endswith("Z") else stamp + "Z"


def to_oscal(report: dict[str, Any]) -> dict[str, Any]:
    """NIST OSCAL assessment-results: one observation per host and control (collected at the audit, fleetctl as
    the tool origin, the evidence's digest in back-matter), one finding per control, satisfied only when every
    host satisfies it. A new document UUID each export; subjects keep stable UUIDs across exports."""
    tool_uuid = _stable("tool", "fleetctl")
    observations, resources, by_control = [], [], {}
    for h in report["hosts"]:
        for f in h["findings"]:
            obs_uuid, res_uuid = str(uuid.uuid4()), str(uuid.uuid4())
            evidence = canonical_json(f["evidence"])
            resources.append({
                "uuid": res_uuid, "title": f"{h['name']} {f['control']}: evidence",
                "description": f"Evidence collected by fleetctl audit run {h['audit']['run']} "
                               f"({h['audit']['uuid']}) on {h['audit']['control_node']}.",
                "props": [{"name": "evidence-sha256", "ns": FLEETCTL_NS,
                           "value": hashlib.sha256(evidence).hexdigest()}],
                "rlinks": [{"href": f"fleetctl:history/runs/{h['audit']['run']}/hosts/{h['name']}/{f['control']}",
                            "hashes": [{"algorithm": "SHA-256", "value": hashlib.sha256(evidence).hexdigest()}]}]})
            observations.append({
                "uuid": obs_uuid, "title": f"{f['control']} on {h['name']}",
                "description": f"{f['status']}: {f['message']}", "methods": ["TEST"],
                "props": [{"name": "status", "ns": FLEETCTL_NS, "value": f["status"]},
                          {"name": "severity", "ns": FLEETCTL_NS, "value": f["severity"]}],
                "origins": [{"actors": [{"type": "tool", "actor-uuid": tool_uuid}]}],
                "subjects": [{"subject-uuid": _stable("host", h["name"]), "type": "inventory-item",
                              "title": h["name"]}],
                "relevant-evidence": [{"href": f"#{res_uuid}", "description": "Evidence digest (SHA-256)"}],
                "collected": _oscal_time(h["audit"]["at"])})
            by_control.setdefault(f["control"], []).append((f, obs_uuid))
    findings = []
    for control, items in sorted(by_control.items()):
        bad = [f for f, _ in items if f["status"] in ("fail", "error")]
        findings.append({
            "uuid": str(uuid.uuid4()), "title": control,
            "description": f"{len(items) - len(bad)} of {len(items)} hosts satisfy {control}.",
            "target": {"type": "objective-id", "target-id": control,
                       "status": {"state": "not-satisfied" if bad else "satisfied"}},
            "related-observations": [{"observation-uuid": o} for _, o in items]})
    now_ = _oscal_time(report["generated"]["at"])
    first = min((h["audit"]["at"] for h in report["hosts"]), default=report["generated"]["at"])
    result = {
        "uuid": str(uuid.uuid4()), "title": "fleetctl audit results",
        "description": f"Latest fleetctl audit of each selected host, {report['generated']['since'] or 'all time'} "
                       f"to {report['generated']['until'] or 'now'}.",
        "start": _oscal_time(report["generated"]["since"] or first), "end": now_,
        "props": [{"name": "chain-head", "ns": FLEETCTL_NS, "value": report["chain"]["digest"]}],
        "reviewed-controls": {"control-selections": [{"include-controls": [{"control-id": c}
                                                                           for c in sorted(by_control)]}]
                              if by_control else [{"include-all": {}}]},
    }
    if observations:
        result["observations"] = observations
    if findings:
        result["findings"] = findings
    doc = {"uuid": str(uuid.uuid4()),
           "metadata": {"title": "GPU fleet compliance: fleetctl assessment results", "last-modified": now_,
                        "version": report["tool"]["version"], "oscal-version": OSCAL_VERSION,
                        "props": [{"name": "chain-head", "ns": FLEETCTL_NS, "value": report["chain"]["digest"]},
                                  {"name": "chain-records", "ns": FLEETCTL_NS,
                                   "value": str(report["chain"]["records"])}]},
           "import-ap": {"href": "#fleetctl-audit-plan"},
           "results": [result]}
    if resources:
        doc["back-matter"] = {"resources": resources}
    return {"assessment-results": doc}


def canonical_json(obj: Any) -> bytes:
    return chain.canonical(obj)
