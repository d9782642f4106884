"""Which events fleetctl notifies, and what each says (schemas/notification.schema.json).

Campaigns: a listener beside the JSONL log and the display (upgrade.listener_for) maps the journal's records to
events (NOTES: which record, which event, its severities and when each applies; the docs' table is made from it);
it reads the history and writes no state (only its own `notification_failed` events), so the engine behaves the
same with or without it. Audit and probe: `findings` when the run did not pass.

A notification that fails is recorded as the campaign event `notification_failed` (target, notification, reason)
or in the run's summary (`notifications`).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from contextlib import contextmanager
from typing import Any, Iterator

from .. import __version__
from ..audit import blocking
from ..campaign import capacity, transitions
from ..campaign.transitions import HostState, Record
from ..campaign.journal import Journal
from ..exitcodes import Exit
from .send import Dispatch, Failure, Notifier, warn
from ..history.store import now

HOSTS_LISTED = 50  # hosts named in one audit/probe event
PROBLEMS_LISTED = 10  # problems named per host
# What an event carries of each canary metric's verdict (notification.schema.json#/$defs/canary_metric)
METRIC_KEYS = ("name", "verdict", "canary", "control", "change", "ci", "p_value", "reason")


@dataclass(frozen=True)
class Note:
    """A notification: the journal RECORDS it is made from (none: an audit or probe run), when it is sent, and its
    SEVERITIES, each with when it applies (the first as a rule)."""
    event: str
    records: tuple[str, ...]
    when: str
    severities: tuple[tuple[str, str], ...]


NOTES = (
    Note("started", (Record.CAMPAIGN_STARTED,), "a campaign was created", (("info", ""),)),
    Note("wave_passed", (Record.WAVE_PASSED,), "a wave passed and the next starts after the soak", (("info", ""),)),
    Note("host_failed", (Record.STEP_FINISHED,), "a host's step failed (once per host, and once more if its rollback "
         "fails), with the step's reason", (("warning", ""), ("critical", "a rollback step failed"))),
    Note("node_left", (Record.SLURM_NODE_LEFT,), "`--drain-preset slurm`: fleetctl did not resume a node it had "
         "drained, its Slurm state or reason no longer this campaign's; `action`: who resumes it", (("warning", ""),)),
    Note("wave_failed", (Record.WAVE_FAILED, Record.SOAK_FAILED), "a wave reached its failure budget (also by hosts "
         "failing the soak): the campaign rolls back on its own", (("warning", ""),)),
    Note("soak_failed", (Record.SOAK_CHECK_FAILED,), "a host on the new driver failed a soak check or the end-of-soak "
         "gate, with what was seen; no later wave starts, the campaign rolls it back", (("critical", ""),)),
    Note("rolled_back", (Record.ROLLBACK_FINISHED,), "the rollback finished",
         (("warning", ""), ("critical", "a host's rollback failed"))),
    Note("halted", (Record.HOST_HELD, Record.SOAK_HELD, Record.BREAKER_TRIPPED), "an inconclusive gate twice (hosts "
         "held for a person), canary metrics that could not be judged at the end of a soak (`canary.on_missing: "
         "hold`), or the campaign's failures within a window reached its circuit breaker (`campaign.breaker`), the "
         "hosts named; `action`: `fleetctl campaign resume N` (accept them, go on) or `fleetctl rollback N`",
         (("critical", ""),)),
    Note("window_closed", (Record.WINDOW_CLOSED, Record.CAPACITY_SPENT), "no wave starts after `--window`, or no "
         "host is drained past `--capacity-budget`; `action`: `fleetctl campaign resume N --window 2h` or `fleetctl "
         "rollback N`", (("warning", ""),)),
    Note("aborted", (Record.ABORT_REQUESTED,), "`fleetctl campaign abort` stopped it between waves",
         (("warning", ""),)),
    Note("done", (Record.LAST_WAVE_PASSED,), "the last wave passed", (("info", ""), ("warning", "hosts failed or were "
         "left out at plan"), ("critical", "a host's rollback failed"))),
    Note("findings", (), "`audit` or `probe` did not pass: controls failing at or above `--fail-on`, unhealthy or "
         "inconclusive hosts, unreachable hosts",
         (("warning", ""), ("critical", "a critical finding or a failed probe"))),
)
NOTE = {n.event: n for n in NOTES}
BY_RECORD = {record: n.event for n in NOTES for record in n.records}  # journal record -> the CampaignNotes method


def declared(event: str, level: str) -> str:
    """LEVEL, one of EVENT's declared severities (a bug otherwise: the listener records it, the campaign goes on)."""
    if level not in dict(NOTE[event].severities):
        raise ValueError(f"notification {event}: severity {level} is not declared in NOTES")
    return level


def envelope(event: str, severity: str, source: str, summary: str, action: str | None, **fields: Any) -> dict[str, Any]:
    return {"schema_version": 1, "event": event, "severity": declared(event, severity), "at": now(),
            "tool": {"name": "fleetctl", "version": __version__}, "control_node": socket.getfqdn(),
            "source": source, "summary": summary, "action": action, **fields}


def names(hosts: list[str], limit: int = 10) -> str:
    return ", ".join(hosts[:limit]) + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")


# ---- campaigns ----------------------------------------------------------------------------------------------

class CampaignNotes:
    """The journal's listener for notifications: events to the dispatch, failures back into the journal."""

    def __init__(self, notifier: Notifier, journal: Journal, cid: int):
        self.journal, self.cid = journal, cid
        self.dispatch: Dispatch = notifier.dispatch()
        self.reported: set[tuple[str, bool]] = set()  # (host, in rollback): one host_failed each
        history = journal.events(cid)
        if [e["event"] for e in history] == [Record.CAMPAIGN_STARTED]:  # created before this listener was added
            self(history[0])

    def __call__(self, record: dict[str, Any]) -> None:
        try:
            payload = self.payload(record)
        except Exception as e:  # a bug here never stops the campaign
            payload = None
            failure = Failure("fleetctl", record.get("event", "?"), f"campaign {self.cid}",
                              f"internal error building the event: {type(e).__name__}")
            warn(failure.line())
            self.dispatch.failures.put(failure)
        if payload is not None:
            self.dispatch.submit(payload)
        try:
            self.record(later=True)
        except Exception as e:  # the history is busy or gone: the campaign's own next write will say so
            warn(f"fleetctl: warning: notification failures not recorded: {type(e).__name__}")

    def record(self, later: bool) -> None:
        """Failures so far into the journal. From inside the listener (LATER) they are committed now and handed to
        the listeners with the next flush, so the JSONL log keeps the history's order."""
        for failure in self.dispatch.take_failures():
            if later:
                self.journal.note_later(self.cid, Record.NOTIFICATION_FAILED, **failure.record())
            else:
                self.journal.note(self.cid, Record.NOTIFICATION_FAILED, **failure.record())

    def finish(self) -> None:
        """The campaign stopped (done, rolled back, halted): every event sent or failed, failures recorded."""
        try:
            self.dispatch.close(wait=True)
        finally:  # also what a signal cut short
            self.record(later=False)
            self.journal.flush()

    def abandon(self) -> None:
        """fleetctl is being stopped (an interrupt, a crash): no waiting; what failed so far is recorded."""
        self.dispatch.close(wait=False)
        try:
            self.record(later=False)
        except Exception:  # noqa: BLE001 (the exception on its way out matters, not this)
            pass

    # ---- journal record -> event ----------------------------------------------------------------------------
    def payload(self, r: dict[str, Any]) -> dict[str, Any] | None:
        """The event of journal record R (BY_RECORD), worded by the method of its name, or None."""
        event = BY_RECORD.get(r["event"])
        if event is None or (r["event"] == Record.STEP_FINISHED and r.get("outcome") != "fail"):
            return None
        return getattr(self, event)(r)

    def campaign(self, r: dict[str, Any]) -> dict[str, Any]:
        c = self.journal.campaign(self.cid)
        waves = len(self.plan()["waves"])
        return {"id": self.cid, "target": c["target"], "state": c["state"], "wave": min(c["wave"], waves),
                "waves": waves, "event_seq": r["seq"]}

    def plan(self) -> dict[str, Any]:
        return json.loads(self.journal.campaign(self.cid)["plan"])

    def event(self, r: dict[str, Any], event: str, severity: str, summary: str, action: str | None,
              host: str | None = None, reason: str | None = None, campaign: dict[str, Any] | None = None,
              **fields: Any):
        return envelope(event, severity, "campaign", summary, action, campaign=campaign or self.campaign(r),
                        host=host, reason=reason, counts=self.journal.tally(self.cid), **fields)

    def ended(self, r: dict[str, Any], event: str, severity: str, summary: str, action: str | None,
              **fields: Any) -> dict[str, Any]:
        """A campaign's last event (done, rolled_back, aborted), with what it cost in capacity: the figures, and
        their line at the end of its summary."""
        figures = capacity.summary(capacity.of_campaign(self.journal, self.cid))
        return self.event(r, event, severity, f"{summary}; capacity: {capacity.text(figures)}", action,
                          capacity=figures, **fields)

    def head(self) -> str:
        return f"campaign {self.cid} to {self.journal.campaign(self.cid)['target']}"

    def show(self) -> str:
        return f"fleetctl campaign show {self.cid}"

    def started(self, r):
        waves = r.get("waves") or []
        hosts = sum(len(w) for w in waves)
        text = (f"{self.head()} started: {hosts} host{'s' if hosts != 1 else ''} in {len(waves)} "
                f"wave{'s' if len(waves) != 1 else ''} (canary: {names(waves[0]) if waves else '-'})")
        if r.get("locked_elsewhere"):
            text += f"; left out, in another campaign: {names(r['locked_elsewhere'])}"
        return self.event(r, "started", "info", text, None, campaign=dict(self.campaign(r), wave=1))

    def wave_passed(self, r):
        passed = (r.get("wave") or 2) - 1
        c = self.campaign(r)
        soak = self.journal.campaign(self.cid)["soak_until"]
        text = f"{self.head()}: wave {passed} of {c['waves']} passed; wave {passed + 1} starts"
        text += f" after the soak, at {soak}" if soak else ""
        if r.get("failed"):
            text += f" (failed within the wave's budget, rolled back alone: {names(r['failed'])})"
        return self.event(r, "wave_passed", "info", text, None, campaign=dict(c, wave=passed))

    def host_failed(self, r):
        host, step = r["host"], r["step"]
        rollback = step.startswith("rollback_")
        if (host, rollback) in self.reported:  # e.g. the undrain after a failed drain failing too
            return None
        self.reported.add((host, rollback))
        reason = r.get("reason") or f"{step} failed"
        if rollback:
            return self.event(r, "host_failed", "critical", f"{self.head()}: {host} failed its rollback at {step}: "
                              f"{reason}", f"{host} needs a person: it is neither on its recorded packages nor "
                              f"known good; its steps: {self.show()}", host=host, reason=reason)
        changed = any(h["host"] == host and h["changed"] for h in self.journal.hosts(self.cid))
        action = (f"nothing yet: the campaign rolls {host} back to its recorded packages (alone within the "
                  f"wave's failure budget, with the others at it); its steps: {self.show()}" if changed else
                  f"nothing was installed on {host}; its steps: {self.show()}")
        return self.event(r, "host_failed", "warning", f"{self.head()}: {host} failed {step}: {reason}", action,
                          host=host, reason=reason)

    def node_left(self, r):
        """fleetctl did not resume a node it had drained: someone changed its Slurm state or reason meanwhile."""
        host, node = r["host"], r.get("node")
        reason = f"Slurm node {node} is {r.get('state')}, reason {r.get('node_reason') or 'none'!r}"
        return self.event(r, "node_left", "warning",
                          f"{self.head()}: fleetctl left {host}'s Slurm node as it is: {reason}, not this "
                          f"campaign's drain any more",
                          f"whoever drained {node} resumes it when done (scontrol update nodename={node} "
                          f"state=resume)", host=host, reason=reason)

    def wave_failed(self, r):
        back = sorted(h for h, s in (r.get("hosts") or {}).items() if s == transitions.ROLLBACK_START)
        text = f"{self.head()}: {r.get('reason') or 'a wave failed'}; rolling back {len(back)} host" \
               f"{'s' if len(back) != 1 else ''}" + (f": {names(back)}" if back else "")
        return self.event(r, "wave_failed", "warning", text,
                          "nothing yet: the campaign rolls the hosts back on its own (rolled_back follows)",
                          reason=r.get("reason"))

    @staticmethod
    def metrics(observation: dict[str, Any] | None) -> dict[str, Any]:
        """The event's `canary_metrics` when the soak OBSERVATION (journal.latest_soak) judged them: METRIC_KEYS of
        each verdict; else no field."""
        verdicts = (observation or {}).get("detail", {}).get("canary_metrics")
        return {"canary_metrics": [{k: m.get(k) for k in METRIC_KEYS} for m in verdicts]} if verdicts else {}

    def soak_failed(self, r):
        host, reason = r["host"], r.get("reason") or "a soak check failed"
        what = "the end-of-soak gate" if r.get("kind") == "gate" else "a soak check"
        seen = self.journal.latest_soak(self.cid, host, r.get("gap"), r.get("kind"))  # the failed observation
        return self.event(r, "soak_failed", "critical",
                          f"{self.head()}: {host}, on the new driver, failed {what} after wave {r.get('gap')}: "
                          f"{reason}", f"no later wave starts; the campaign rolls {host} back (alone within its "
                          f"wave's failure budget, else with the others). What it saw: {self.show()}; take the host "
                          f"out of service if its jobs fail meanwhile", host=host, reason=reason,
                          **self.metrics(seen))

    def rolled_back(self, r):
        hosts = self.journal.hosts(self.cid)
        broken = [h["host"] for h in hosts if h["state"] == HostState.ROLLBACK_FAILED]
        back = [h["host"] for h in hosts if h["state"] == HostState.ROLLED_BACK]
        reason = self.journal.campaign(self.cid)["reason"]
        text = f"{self.head()} rolled back ({len(back)} host{'s' if len(back) != 1 else ''} back on their " \
               f"recorded packages)" + (f": {reason}" if reason else "")
        if broken:
            return self.ended(r, "rolled_back", "critical", text + f"; rollback FAILED on {names(broken)}",
                              f"{names(broken)} need a person; the steps: {self.show()}", reason=reason)
        return self.ended(r, "rolled_back", "warning", text,
                          f"nothing for the fleet; why it failed: {self.show()}", reason=reason)

    def halted(self, r):
        held = [h["host"] for h in self.journal.hosts(self.cid) if h["state"] == HostState.HELD]
        # a held soak (soak_held): the end-of-soak gate of the first held host, which the reason names
        gates = self.journal.soak_records(self.cid, gap=self.journal.campaign(self.cid)["wave"] - 1, kind="gate") \
            if r["event"] == Record.SOAK_HELD else []
        seen = min((o for o in gates if o["detail"].get("hold")), key=lambda o: o["host"], default=None)
        look = (f"look at the failed hosts ({names(sorted(r.get('failures') or {}))}): {self.show()}; then go on"
                if r["event"] == Record.BREAKER_TRIPPED else
                f"look at the held hosts ({names(held)}): {self.show()}; then accept them and go on")
        return self.event(
            r, "halted", "critical", f"{self.head()} halted for a person: {r.get('reason')}",
            f"{look}: "
            f"fleetctl campaign resume {self.cid}; or roll the campaign back: fleetctl rollback {self.cid}",
            reason=r.get("reason"), **self.metrics(seen))

    def window_closed(self, r):
        go_on = ("stop here: fleetctl campaign abort {cid}" if r["event"] == Record.CAPACITY_SPENT else
                 "go on in a new window: fleetctl campaign resume {cid} --window 2h").format(cid=self.cid)
        return self.event(r, "window_closed", "warning", f"{self.head()} halted: {r.get('reason')}",
                          f"{go_on}; or roll back: fleetctl rollback {self.cid}", reason=r.get("reason"))

    def aborted(self, r):
        return self.ended(
            r, "aborted", "warning", f"{self.head()} aborted: {r.get('reason') or 'by the operator'}",
            f"the hosts stay where they are; to take back what it changed: fleetctl rollback {self.cid}",
            reason=r.get("reason"))

    def done(self, r):
        hosts = self.journal.hosts(self.cid)
        failed = [h["host"] for h in hosts if h["state"] in transitions.FAILED]
        broken = [h["host"] for h in hosts if h["state"] == HostState.ROLLBACK_FAILED]
        left_out = [h["name"] for h in self.plan()["excluded"]]
        ok = [h["host"] for h in hosts if h["state"] == HostState.DONE]
        text = f"{self.head()} done: {len(ok)} host{'s' if len(ok) != 1 else ''} on the new driver"
        if broken:
            return self.ended(r, "done", "critical", text + f"; rollback FAILED on {names(broken)}",
                              f"{names(broken)} need a person; the steps: {self.show()}")
        if left_out:
            text += f"; left out at plan, not on the target: {names(left_out)}"
            if failed:
                text += f"; failed and rolled back alone: {names(failed)}"
            return self.ended(r, "done", "warning", text, f"why they were left out or failed: {self.show()}")
        if failed:
            return self.ended(r, "done", "warning", text + f"; failed and rolled back alone: {names(failed)}",
                              f"why they failed: {self.show()}")
        return self.ended(r, "done", "info", text, None)


@contextmanager
def delivering(notes: CampaignNotes | None) -> Iterator[None]:
    """Around a campaign's drive: at the end wait for every notification and record the failures; on an
    interrupt or crash, leave at once."""
    if notes is None:
        yield
        return
    try:
        yield
    except BaseException:
        notes.abandon()
        raise
    notes.finish()


# ---- audit and probe ----------------------------------------------------------------------------------------

class RunNotes:
    """The notifier of an audit or probe run (what audit.run and probe.run are given)."""

    def __init__(self, notifier: Notifier):
        self.notifier = notifier

    def after_run(self, run: Any, summary: dict[str, Any], hosts: list[dict[str, Any]]) -> None:
        """audit / probe: the `findings` event when the run found something; what happened to it in SUMMARY's
        `notifications` (none when nothing was sent), also when a signal stops the wait (runs.close)."""
        try:
            payload = run_payload(run, summary, hosts)
        except Exception as e:  # a bug here never costs the run its result
            failure = Failure("fleetctl", "findings", f"{run.kind} run {run.id}",
                              f"internal error building the event: {type(e).__name__}")
            warn(failure.line())
            summary["notifications"] = self.outcome([failure])
            return
        if payload is None:
            return
        dispatch = self.notifier.dispatch()
        dispatch.submit(payload)
        try:
            dispatch.close(wait=True)
        finally:
            summary["notifications"] = self.outcome(dispatch.take_failures())

    def outcome(self, failed: list[Failure]) -> dict[str, Any]:
        return {"event": "findings", "targets": len(self.notifier.targets), "failed": [f.record() for f in failed]}


def run_payload(run: Any, summary: dict[str, Any], hosts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The `findings` event of an audit or probe run (RUN: runs.Run), or None when it found nothing."""
    if summary["exit_code"] == Exit.OK:
        return None
    kind = run.kind
    unreachable = [h["name"] for h in hosts if not h["reachable"]]
    problems: dict[str, list[str]] = {}
    critical = False
    for h in hosts:
        if not h["reachable"]:
            problems[h["name"]] = [f"unreachable: {h.get('error') or 'no answer'}"]
        elif kind == "audit":
            failing = [f for f in h["findings"] if blocking(f, summary["fail_on"])]
            critical |= any(f["severity"] == "critical" for f in failing)
            if failing:
                problems[h["name"]] = [f"{f['control']} {f['severity']} {f['status']}: {f['message']}"
                                       for f in failing]
        elif h["health"]["status"] != "pass":
            critical |= h["health"]["status"] in ("fail", "error")
            problems[h["name"]] = [f"{h['health']['status']}: {reason}" for reason in h["health"]["reasons"]] \
                or [h["health"]["status"]]
    listed = list(problems)[:HOSTS_LISTED]
    if kind == "audit":
        counts = {k: summary[k] for k in ("hosts", "reachable", "unreachable", "compliant", "noncompliant")}
        text = (f"audit of {summary['hosts']} host{'s' if summary['hosts'] != 1 else ''}: {summary['noncompliant']} "
                f"not compliant at --fail-on {summary['fail_on']}, {len(unreachable)} unreachable")
    else:
        counts = {k: summary[k] for k in ("hosts", "reachable", "unreachable", "healthy", "unhealthy")}
        text = (f"probe of {summary['hosts']} host{'s' if summary['hosts'] != 1 else ''}: {summary['unhealthy']} "
                f"unhealthy or inconclusive, {len(unreachable)} unreachable")
    shown = [f"{name} ({problems[name][0][:150]}"
             + (f", +{len(problems[name]) - 1} more" if len(problems[name]) > 1 else "") + ")" for name in listed[:5]]
    if shown:
        text += ": " + "; ".join(shown) + (f"; and {len(problems) - 5} more hosts" if len(problems) > 5 else "")
    inventory = run.fleet.source
    again = f"fleetctl {kind}" + (f" -i {inventory}" if inventory != "localhost" else "") \
        + (f" -l {','.join(listed[:10])}" if len(problems) <= 10 else (f" -l '{run.limit}'" if run.limit else ""))
    action = (f"see each host's findings and their remediation: {again}" if kind == "audit" else
              f"drain a failed host before it takes work again; the reasons: {again} --format json")
    if unreachable and len(unreachable) == len(problems):
        action = f"check SSH to {names(unreachable)}, then: {again}"
    run_info = {"id": run.id, "uuid": run.uuid, "kind": kind, "inventory": inventory, "limit": run.limit}
    if kind == "audit":
        run_info["fail_on"] = summary["fail_on"]
    return envelope("findings", "critical" if critical else "warning", kind, text, action, run=run_info,
                    host=None, reason=None, counts=counts,
                    hosts=[{"name": n, "problems": problems[n][:PROBLEMS_LISTED]} for n in listed])

