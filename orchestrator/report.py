"""fleetctl report: what the history says about compliance, for auditors, as JSON and CSV.

The report covers the audits in a period (--since/--until) of the hosts selected (-l: host or group names, shell
patterns): each host's latest audit in the period with its findings and evidence, per-control pass rates, the
driver versions seen, compliance per day, and the campaigns started in the period with their outcomes. Every export
states the chain head it was made from (`fleetctl report verify --head DIGEST` checks a history against it).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
from datetime import datetime, timezone
from typing import Any

from . import __version__, chain, schemas
from .errors import InputError, OperationError
from .store import Store, now, operator

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
            stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
            stamp = stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)
    except ValueError:
        raise InputError(f"{flag} {text!r}: not a date (YYYY-MM-DD) or ISO timestamp") from None
    return stamp.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
        raise OperationError(verdict.line() + " (fleetctl report verify)")
    audits = db.execute("SELECT * FROM runs WHERE kind='audit' AND status='done' AND (? IS NULL OR started_at >= ?)"
                        " AND (? IS NULL OR started_at <= ?) ORDER BY id", (since_ts, since_ts, until_ts, until_ts)).fetchall()
    latest: dict[str, dict[str, Any]] = {}
    daily: dict[str, dict[str, bool]] = {}
    for run in audits:
        for hr in db.execute("SELECT * FROM host_results WHERE run_id=?", (run["id"],)):
            groups = json.loads(hr["groups"] or "[]")
            if not selected(hr["host"], groups, patterns):
                continue
            findings = [dict(f) for f in db.execute("SELECT * FROM findings WHERE run_id=? AND host=? ORDER BY rowid",
                                                    (run["id"], hr["host"]))]
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
    """Who moved what from which version to which, in how many waves, and what was rolled back and why."""
    db = store.db
    try:
        rows = db.execute("SELECT c.*, r.operator, r.control_node FROM campaigns c JOIN runs r ON r.id = c.run_id"
                          " WHERE (? IS NULL OR c.created_at >= ?) AND (? IS NULL OR c.created_at <= ?) ORDER BY c.id",
                          (since_ts, since_ts, until_ts, until_ts)).fetchall()
    except Exception:  # a history that never ran a campaign has no campaign tables
        return []
    out = []
    for c in rows:
        hosts = db.execute("SELECT host, state, reason, before FROM campaign_hosts WHERE campaign_id=? ORDER BY position",
                           (c["id"],)).fetchall()
        plan = json.loads(c["plan"])
        out.append({"id": c["id"], "target": c["target"], "state": c["state"], "operator": c["operator"],
                    "control_node": c["control_node"], "started_at": c["created_at"], "updated_at": c["updated_at"],
                    "from_versions": sorted({json.loads(h["before"])["version"] for h in hosts if h["before"]}),
                    "waves": len(plan["waves"]), "reason": c["reason"],
                    "hosts": [{"name": h["host"], "state": h["state"], "reason": h["reason"]} for h in hosts],
                    "rolled_back": [h["host"] for h in hosts if h["state"] in ("rolled_back", "rollback_failed")]})
    return out


def to_csv(report: dict[str, Any]) -> str:
    """One row per host x control, for spreadsheets."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for h in report["hosts"]:
        for f in h["findings"]:
            writer.writerow({"host": h["name"], "groups": " ".join(h["groups"]), "audit_run": h["audit"]["run"],
                             "audited_at": h["audit"]["at"], "control": f["control"], "severity": f["severity"],
                             "status": f["status"], "message": f["message"],
                             "baseline_digest": h["audit"]["baseline"]["digest"],
                             "evidence": json.dumps(f["evidence"], sort_keys=True)})
    buf.write(f"# chain head {report['chain']['digest']} ({report['chain']['records']} records)\n")
    return buf.getvalue()
