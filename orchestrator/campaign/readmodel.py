"""The campaign's read model: what `fleetctl campaign show` and `campaign list` show, the exit code and the summary
the campaign commands (orchestrator/upgrade.py) end with, all read from the history (the journal, the runs and the
event log); nothing here changes a campaign."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ..errors import InputError
from ..exitcodes import Exit
from ..history.store import Store
from ..history.timefmt import parse as parse_time
from . import capacity, progress, soak, transitions
from .journal import Journal
from .transitions import CampaignState, HostState, Record


def campaign_row(journal: Journal, cid: int):
    try:
        return journal.campaign(cid)
    except LookupError:
        raise InputError(f"no campaign {cid} in the history") from None


def exit_code(journal: Journal, cid: int) -> Exit | None:
    """The campaign's exit code; None while it is running (or stopped by a crash mid-way). A host whose rollback
    failed needs a person whatever else happened (6); a campaign done with hosts off the target, failed and
    rolled back or left out at plan, is not a success (1)."""
    c = journal.campaign(cid)
    code = transitions.CAMPAIGN_EXIT.get(c["state"])
    hosts = journal.hosts(cid)
    if code is not None and any(r["state"] == HostState.ROLLBACK_FAILED for r in hosts):
        return Exit.NEEDS_PERSON
    if c["state"] == CampaignState.DONE and (any(r["state"] in transitions.FAILED for r in hosts)
                                 or json.loads(c["plan"])["excluded"]):
        return Exit.FINDINGS
    return code



def document(store: Store, cid: int) -> dict[str, Any]:
    """Everything the history holds about a campaign, as one JSON document."""
    journal = Journal(store)
    c = campaign_row(journal, cid)
    run = store.run(c["run_id"])
    hosts = []
    domain = {h["name"]: h.get("domain") for w in json.loads(c["plan"])["waves"] for h in w["hosts"]}
    for r in journal.hosts(cid):
        steps = []
        for s in journal.steps(cid, r["host"]):
            seconds = None
            if s["finished_at"]:
                seconds = round((parse_time(s["finished_at"]) - parse_time(s["started_at"])).total_seconds(), 3)
            detail = json.loads(s["detail"]) if s["detail"] else None
            if detail and "probe" in detail:  # the samples stay in the history; the document keeps the verdict
                detail = {k: v for k, v in detail.items() if k != "probe"}
            steps.append({"step": s["step"], "status": s["status"], "attempts": s["attempts"],
                          "started_at": s["started_at"], "finished_at": s["finished_at"], "seconds": seconds,
                          "reason": s["reason"], "detail": detail})
        before = json.loads(r["before"]) if r["before"] else None
        hosts.append({"name": r["host"], "wave": r["wave"], "domain": domain.get(r["host"]),
                      "state": r["state"], "changed": bool(r["changed"]),
                      "reason": r["reason"], "from_version": before["version"] if before else None,
                      "before_packages": before["packages"] if before else None, "steps": steps})
    return {"schema_version": 1, "campaign": {
        "id": cid, "target": c["target"], "state": c["state"], "wave": c["wave"], "reason": c["reason"],
        "created_at": c["created_at"], "updated_at": c["updated_at"], "operator": run["operator"],
        "control_node": run["control_node"], "inventory": run["inventory"], "baseline_digest": run["baseline_digest"],
        "options": json.loads(c["options"]), "exit_code": exit_code(journal, cid)},
        "plan": json.loads(c["plan"]), "hosts": hosts, "soak": soak_document(journal, c),
        "events": len(journal.events(cid)),
        "time": time_split(journal.events(cid)),
        "capacity": capacity.of_campaign(journal, cid),
        "event_log": str(progress.log_path(cid))}


def soak_document(journal: Journal, c) -> dict[str, Any]:
    """The watched soaks: the one under way (time left) and, per host, what its checks saw."""
    options = json.loads(c["options"])
    records = journal.soak_records(c["id"])
    remaining = None
    if c["state"] == CampaignState.SOAKING and c["soak_until"]:
        until = parse_time(c["soak_until"])
        remaining = round(max(0.0, (until - datetime.now(until.tzinfo)).total_seconds()), 1)
    hosts: dict[str, dict[str, Any]] = {}
    for r in records:
        h = hosts.setdefault(r["host"], {"checks": 0, "gates": 0, "failed_canary_runs": 0, "last": None,
                                         "gate_verdicts": []})
        h["checks" if r["kind"] == "check" else "gates"] += 1
        if r["kind"] == "gate":  # the end-of-soak gate's verdicts in full (campaign show --verbose)
            h["gate_verdicts"].append({"gap": r["gap"], "at": r["at"], "status": r["status"],
                                       **{k: r["detail"][k] for k in soak.GATE_VERDICTS if k in r["detail"]}})
        h["failed_canary_runs"] += not r["detail"].get("canary", {}).get("ok", True)
        h["last"] = {"at": r["at"], "gap": r["gap"], "kind": r["kind"], "status": r["status"], "reason": r["reason"],
                     "seen": r["detail"].get("seen", [])}
    last = records[-1] if records else None
    soaking = c["state"] == CampaignState.SOAKING
    return {"soaking": soaking, "after_wave": c["wave"] - 1 if soaking else None,
            "until": c["soak_until"] if soaking else None, "remaining_s": remaining,
            "lengths_s": options.get("soak_s"), "interval_s": options.get("soak_interval_s"),
            "grace_s": options.get("soak_grace_s"), "canary": options.get("canary"),
            "canary_max_failures": options.get("canary_max_failures"),
            "last_check_at": last["at"] if last else None, "hosts": hosts,
            # the latest verdict of each canary metric (docs/canary.md), as the soak recorded it
            "canary_metrics": journal.canary_metrics(c["id"])}


def time_split(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the campaign's time went, from its events: per step the wall time of its batches and the part inside
    ansible-playbook. fleetctl's own time is the campaign's span less the time inside ansible-playbook, hooks and
    soaks (planning before the first event is not in the span)."""
    steps: dict[str, dict[str, float]] = {}
    for e in events:
        if e["event"] == Record.BATCH_FINISHED:
            t = steps.setdefault(e["step"], {"batch_s": 0.0, "ansible_s": 0.0, "batches": 0})
            t["batch_s"] += e["batch_s"]
            t["ansible_s"] += e["ansible_s"]
            t["batches"] += 1
    stamp = lambda e: parse_time(e["at"]).timestamp()  # noqa: E731
    soak, soak_from = 0.0, None
    for e in events:
        if e["event"] == Record.WAVE_PASSED:
            soak_from = stamp(e)
        elif soak_from is not None and e["event"] in (Record.SOAKED, Record.SOAK_FAILED, Record.WINDOW_CLOSED,
                                                      Record.ABORT_REQUESTED):
            soak, soak_from = soak + stamp(e) - soak_from, None
    worked = [e for e in events if e["event"] != Record.NOTIFICATION_FAILED]  # recorded after the last delivery try
    span = stamp(worked[-1]) - stamp(worked[0]) if worked else 0.0
    hooks_s = sum(t["batch_s"] for k, t in steps.items() if k in HOOK_STEPS)
    in_ansible = sum(t["ansible_s"] for t in steps.values())
    own = span - in_ansible - hooks_s - soak
    return {"span_s": round(span, 3), "ansible_s": round(in_ansible, 3), "hooks_s": round(hooks_s, 3),
            "soak_s": round(soak, 3), "fleetctl_s": round(own, 3),
            "fleetctl_share": round(own / span, 4) if span else None,
            "steps": {k: {n: round(v, 3) for n, v in t.items()} for k, t in steps.items()}}


HOOK_STEPS = transitions.HOOK_STEPS


def summary_text(journal: Journal, cid: int) -> str:
    c = journal.campaign(cid)
    counts = journal.tally(cid)
    states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    code = exit_code(journal, cid)
    text = f"campaign {cid} to {c['target']}: {c['state']} ({states}); exit {code}"
    if c["reason"] and c["state"] != CampaignState.DONE:
        text += f"\nreason: {c['reason']}"
    excluded = json.loads(c["plan"])["excluded"]
    if excluded:
        text += "\nleft out at plan, not on the target: " + "; ".join(f"{h['name']}: {h['reason']}" for h in excluded)
    broken = [r["host"] for r in journal.hosts(cid) if r["state"] == HostState.ROLLBACK_FAILED]
    if broken:
        text += (f"\nNEEDS A PERSON: the rollback failed on {', '.join(broken)}: neither on the recorded packages nor "
                 f"known good (fleetctl campaign show {cid})")
    return text + f"\nevent log: {progress.log_path(cid)}\n"


def listing(store: Store) -> list[dict[str, Any]]:
    """Every campaign, newest last: what `fleetctl campaign list` shows."""
    journal = Journal(store)
    rows = []
    for c in journal.campaigns():
        rows.append({"id": c["id"], "target": c["target"], "state": c["state"], "wave": c["wave"],
                     "waves": len(json.loads(c["plan"])["waves"]), "hosts": journal.tally(c["id"]),
                     "created_at": c["created_at"], "operator": store.run(c["run_id"])["operator"],
                     "reason": c["reason"]})
    return rows
