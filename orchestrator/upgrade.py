"""fleetctl upgrade, campaign resume|judge|abort, rollback: the commands around the campaign engine. What they and
`campaign show|list` read of a campaign is its read model, campaign/readmodel.py."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from . import audit, baseline as baseline_mod, interrupts, plan, runs, settings
from .fleet import domains, inventory, runner
from .judge import gate
from .notify import send as notify, events as notify_events
from .history import offenders
from .campaign import hooks, packages, progress, steps, transitions
from .schedulers import scheduler
from .campaign.transitions import CampaignState, HostState, Record
from .campaign.engine import Engine, Parts, accept_held, later, request_rollback
from .campaign.journal import Journal, driven_elsewhere
from .campaign.options import IDLE_TIMEOUT_S, CampaignOptions, IdleOptions
from .campaign.readmodel import campaign_row, exit_code, summary_text
from .errors import InputError, OperationError
from .fleet.execution_nodes import RunnerConfig
from .judge.canary import planning as canary_planning
from .exitcodes import Exit
from .history.store import Store, operator

@dataclass(frozen=True, kw_only=True)
class UpgradeOptions:
    """What `fleetctl upgrade` was given: the run's own (what to plan) and the campaign's options as the command line
    made them (campaign_options), which the engine reads and the history records."""
    target: str
    waves: str = settings.WAVES.value
    inventory: str | None = None
    limit: str | None = None
    baseline: str | None = None
    preflight: bool = True
    campaign: CampaignOptions = field(default_factory=lambda: campaign_options({}))


def campaign_options(given: dict[str, Any]) -> CampaignOptions:
    """The campaign's options from GIVEN, the command's parameters (by the settings' `param`; a setting not given:
    its default), checked: every setting settings.CAMPAIGN declares `recorded` as it is, and what follows from the
    others. --max-in-flight stays the words given until the plan counts the hosts (start)."""
    g = {s.param: s.value for s in settings.CAMPAIGN} | given
    h = hooks.resolve(g["drain_preset"], g["drain"], g["undrain"])
    for s in (settings.ROLLBACK_SCOPE, settings.PACE, settings.DRAIN_MODE):
        if g[s.param] not in s.choices:
            raise InputError(f"{s.flag} {g[s.param]!r}: choose {' or '.join(s.choices)}")
    if g["canary"] is not None and not g["canary"].strip():
        raise InputError("--canary: an empty command")
    window_s = g["window"]
    idle_s = math.ceil(g["idle_timeout"] if g["idle_timeout"] is not None else
                       window_s if window_s else IDLE_TIMEOUT_S)  # the role's idle wait takes whole seconds
    if g["drain_mode"] == "reservation" and not scheduler.of(CampaignOptions(hooks=h)).reserves:
        raise InputError("--drain-mode reservation: only fleetctl's own Slurm drains reserve nodes "
                         "(--drain-preset slurm, without --drain or --undrain)")
    in_flight_at_most(g["max_in_flight"], 1)  # the share's own bounds, before anything is contacted
    budget = g["capacity_budget"]
    if budget is not None and not 0 < budget <= settings.CAPACITY_BUDGET.maximum:
        raise InputError(f"--capacity-budget {budget!r}: node-hours above 0, at most "
                         f"{settings.CAPACITY_BUDGET.maximum:.0f}")
    if g["max_in_flight"] is not None and g["pace"] == "wave":
        raise InputError("--max-in-flight paces hosts one by one: it needs --pace host (a wave's hosts move together)")
    return CampaignOptions.recording(
        g, window_end=later(window_s) if window_s else None, hooks=h,
        idle=IdleOptions(timeout_s=idle_s, poll_s=min(IdleOptions.poll_s, max(1, idle_s // 5))))


def in_flight_at_most(value: str | None, units: int) -> int | None:
    """--max-in-flight N|P% as a number of units (hosts, NVLink domains) out of UNITS, at least 1; None: no bound.
    0, or a share of 0 or over 100%, is an input error."""
    if value is None:
        return None
    text = str(value).strip()
    share = text.endswith("%")
    try:
        number = int(text.removesuffix("%"))
    except ValueError:
        raise InputError(f"--max-in-flight {text!r}: a number of hosts or a share such as 25%") from None
    if number < 1 or (share and number > 100):
        raise InputError(f"--max-in-flight {text!r}: " + ("a share from 1% to 100%" if share else "at least 1 host"))
    return max(1, units * number // 100) if share else number


def make_plan(opts: UpgradeOptions, store: Store, fleet: inventory.Fleet, base: baseline_mod.Baseline, ramp,
              locks: dict[str, int], options: CampaignOptions,
              playbooks: runner.Runner) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The plan (as `fleetctl plan` makes it, repeat offenders left out), hosts locked by another campaign excluded,
    and those the campaign's scheduler leaves out (with fleetctl's Slurm drains: nodes someone else took out of
    service, left as they are)."""
    entries = audit.collect(playbooks, fleet, base, opts.campaign.forks, opts.preflight)
    out = [{"name": e["name"], "code": "in_campaign", "reason": f"in campaign {locks[e['name']]} (host lock)"}
           for e in entries if e["name"] in locks]
    out += offenders.left_out(store, [(e["name"], e["groups"]) for e in entries if e["name"] not in locks], base)
    taken = {h["name"] for h in out}
    out += scheduler.of(options).left_out(fleet, [e["name"] for e in entries if e["name"] not in taken])
    made = plan.build(plan.parse_target(opts.target), ramp, entries, base,
                      domains.group(fleet, {e["name"]: e["facts"] for e in entries}), out)
    return made, entries


def dry_run_text(made: dict[str, Any], entries: list[dict[str, Any]], options: CampaignOptions,
                 base: baseline_mod.Baseline) -> str:
    facts = {e["name"]: e["facts"] for e in entries}
    activation = {e["name"]: steps.activation(base.policy_for(list(e["groups"]))) for e in entries}
    lines = [f"dry run: nothing will be changed. Campaign to {made['target']}, "
             f"{sum(w['size'] for w in made['waves'])} hosts in {len(made['waves'])} waves"]
    for w in made["waves"]:
        lines.append(f"wave {w['index']} ({w['budget']['rule']}):")
        for h in w["hosts"]:
            before = packages.driver_versioned(facts[h["name"]]["driver"]["packages"], h["from_version"])
            lines.append(f"  {h['name']}: {h['from_version']} -> {made['target']}: drain"
                         f" ({options.hooks.drain or 'no hook'}), wait for idle GPUs, install "
                         f"{packages.describe(packages.target_set(before, h['from_version'], made['target']))}"
                         f" (held; rollback to {packages.describe(before)}), "
                         f"{'module reload (reboot if in use)' if activation[h['name']] == 'reload' else 'reboot'},"
                         " verify, probe and gate, undrain")
        if w["index"] < len(made["waves"]):
            length = options.soak_length(w["index"])
            lines.append(f"  soak {length:g}s" + (
                f", watched: a health check and the canary ({options.canary or 'the probe engine'}) every "
                f"{options.soak_interval_s:g}s, the throughput gate at its end" if length else " (not watched)"))
    for h in made["skipped"] + made["excluded"]:
        lines.append(f"not in the campaign: {h['name']}: {h['reason']}")
    breaker = plan.breaker_summary(made)
    if breaker is not None:
        lines.append(breaker)
    canary = canary_planning.summary(made)
    if canary is not None:
        lines.append(canary)
        for wave, cohorts in (made.get("canary") or {}).get("control", {}).items():
            lines += [f"  control cohort of wave {wave}, {c}: {', '.join(hosts) or 'none'}"
                      for c, hosts in cohorts.items()]
    return "\n".join(lines) + "\n"


# A live view of the campaign (the command line's, on a terminal): LIVE(hosts, title) gives a listener that is also
# a context manager, shown while the engine runs; without one, plain lines.
Live = Callable[[list[dict[str, Any]], str], Any]


def listener_for(journal: Journal, cid: int, live: Live | None, notes=None):
    """The JSONL log always; a live view on a terminal, plain lines otherwise; then the notifications (NOTES:
    notify_events.CampaignNotes), if any."""
    log = progress.EventLog(cid, journal.events(cid))
    if live is not None:
        c = journal.campaign(cid)
        view = live([dict(r) for r in journal.hosts(cid)], f"fleetctl campaign {cid} to {c['target']}")
        return progress.Fanout(log.write, progress.Display(view, cid), notes), view
    return progress.Fanout(log.write, progress.Display(progress.PlainLines(), cid), notes), None


def drive(journal: Journal, cid: int, fleet: inventory.Fleet, base: baseline_mod.Baseline,
          live: Live | None, notifier: notify.Notifier | None = None, parts: Parts | None = None) -> str:
    engine = Engine(journal, journal.handle(cid), fleet, base, parts)
    engine.parts.playbooks.meanwhile(gate.warm)
    notes = notify_events.CampaignNotes(notifier, journal, cid) if notifier else None
    listener, view = listener_for(journal, cid, live, notes)
    journal.listener = listener
    try:
        with notify_events.delivering(notes):  # at the end: every notification sent or failed, failures recorded
            if view is None:
                return engine.run()
            with view:
                return engine.run()
    except interrupts.Interrupted as e:  # between two journal writes: the record is consistent, resume goes on
        if journal.campaign(cid)["state"] not in transitions.CAMPAIGN_AT_WORK:
            raise  # it had stopped: only its last notifications were cut short (notification_failed says which)
        with interrupts.deferred():
            journal.note(cid, Record.INTERRUPTED, signal=e.name, state=journal.campaign(cid)["state"])
        e.hint = f"campaign {cid} stopped between steps; go on with: fleetctl campaign resume {cid}"
        raise


def start(opts: UpgradeOptions, store: Store, argv: list[str], dry_run: bool,
          live: Live | None, notifier: notify.Notifier | None = None,
          prometheus: Any = None, *, runner_config: RunnerConfig) -> tuple[int | None, Exit, str]:
    """(campaign id or None, exit code, text for the operator). The planning audit is a run of its own (kind plan),
    sealed as soon as it is made, as `fleetctl plan`'s; the campaign it starts has another (kind campaign), closed
    with the campaign's outcome and exit code when it stops (a rolled-back campaign's run says 4)."""
    ramp = plan.parse_ramp(opts.waves)
    plan.parse_target(opts.target)
    options = opts.campaign
    fleet, base = runs.prepare(opts.inventory, opts.limit, opts.baseline)
    plan.blessed_for_some(fleet, base, opts.target)  # a dry run too: exit 2 before any host is contacted
    metrics = canary_planning.check_metrics(fleet, base, prometheus)  # a query that does not parse: before any host
    journal, playbooks = Journal(store), runner.Runner(runner_config)
    with runs.recorded(store, "plan", argv, fleet, base, opts.limit) as planning:
        made, entries = make_plan(opts, store, fleet, base, ramp, journal.locks(), options, playbooks)
        if metrics:
            made["canary"] = canary_planning.section(metrics, made)
        hosts = sum(w["size"] for w in made["waves"])
        refused = not hosts and made["excluded"] and all(h["code"] in plan.REFUSED for h in made["excluded"])
        # The command's code where no campaign starts, and a dry run's: what the plan implies (its facts may refuse
        # every host the matrix let through: exit 2 then too).
        code = Exit.USAGE if refused else plan.implied_exit(made) if dry_run or not hosts else Exit.OK
        summary = {"hosts": len(entries), "eligible": hosts, "waves": len(made["waves"]), "dry_run": dry_run}
        store.finish_run(planning.id, code, {**summary, "plan": made, "exit_code": code}, entries)
    if dry_run:
        return None, code, dry_run_text(made, entries, options, base)
    if refused:
        raise InputError(f"no host's baseline allows {made['target']}: " + "; ".join(
            f"{h['name']}: {h['reason']}" for h in made["excluded"][:5]) + (
            f" (and {len(made['excluded']) - 5} more)" if len(made["excluded"]) > 5 else ""))
    if not hosts:
        return None, code, "nothing to upgrade: " + "; ".join(
            f"{h['name']}: {h['reason']}" for h in made["skipped"] + made["excluded"]) + "\n"
    units = {h.get("domain") or h["name"] for w in made["waves"] for h in w["hosts"]}
    options = replace(options, max_in_flight=in_flight_at_most(options.max_in_flight, len(units)))
    with runs.recorded(store, "campaign", argv, fleet, base, opts.limit) as run_:
        cid, _ = journal.create(run_.id, made, options)
        return cid, *driven(store, journal, run_, cid, fleet, base, live, notifier,
                            {**summary, "plan_run": planning.id}, prometheus, playbooks=playbooks)


def driven(store: Store, journal: Journal, run_: runs.Run, cid: int, fleet: inventory.Fleet,
           base: baseline_mod.Baseline, live: Live | None, notifier: notify.Notifier | None,
           summary: dict[str, Any], prometheus: Any = None, *, playbooks: runner.Runner) -> tuple[Exit, str]:
    """Drive the campaign, then close RUN_ with where the campaign stands and its exit code. Every command that
    drives a campaign (upgrade, resume, rollback) has a run of its own, kind campaign, its summary naming the
    campaign: the latest such run of a campaign says what `campaign show` says. A campaign stopped by a signal
    leaves its run interrupted; a signal after it stopped (its last notifications under way) closes the run with
    the signal's code, the campaign's own in its summary."""
    stopped = None
    try:
        drive(journal, cid, fleet, base, live, notifier, Parts(prometheus=prometheus, playbooks=playbooks))
    except interrupts.Interrupted as e:
        if journal.campaign(cid)["state"] in transitions.CAMPAIGN_AT_WORK:
            raise  # between two steps: runs.recorded marks the run interrupted
        stopped = e
    code = exit_code(journal, cid)
    if summary.get("rollback") and code == Exit.ROLLED_BACK:
        code = Exit.OK  # `fleetctl rollback` did what it was asked: a systemd OnFailure= must not fire
    closing = {**summary, "campaign": cid, "state": journal.campaign(cid)["state"], "exit_code": code}
    if stopped is None:
        store.close_run(run_.id, code, closing)
        return code, summary_text(journal, cid)
    with interrupts.deferred():  # the record written whole, a second signal waits for it
        store.close_run(run_.id, stopped.exit_code, {**closing, "delivery": f"Interrupted: {stopped}"})
    raise stopped


def load_for(store: Store, journal: Journal, cid: int, inventory_path: str | None,
             baseline_path: str | None) -> tuple[inventory.Fleet, baseline_mod.Baseline]:
    """The fleet and baseline a campaign was started with (or the ones given), checked."""
    c = campaign_row(journal, cid)
    run = store.run(c["run_id"])
    source = inventory_path or (run["inventory"] if run["inventory"] != "localhost" else None)
    fleet, base = runs.prepare(source, None, baseline_path or run["baseline_path"])
    if baseline_path is None and base.digest != run["baseline_digest"]:
        raise InputError(f"{base.path}: the baseline changed since campaign {cid} started "
                         f"({run['baseline_digest'][:19]} then, {base.digest[:19]} now); give -b to use it anyway")
    return fleet, base


def resume(store: Store, cid: int, inventory_path: str | None, baseline_path: str | None,
           window_s: float | None, live: Live | None,
           notifier: notify.Notifier | None = None, *, argv: list[str], prometheus: Any = None,
           capacity_budget: float | None = None, judgement: dict[str, Any] | None = None,
           runner_config: RunnerConfig) -> tuple[Exit, str]:
    journal = Journal(store)
    c = campaign_row(journal, cid)
    if c["state"] in transitions.CAMPAIGN_TERMINAL:
        # A resume after a crash may find the campaign finished (the kill came after its last record): answer
        # with its outcome, as its own run would have, so a retry loop or a unit's ExecStartPre reads it right.
        return exit_code(journal, cid), (f"campaign {cid} is {c['state']}: nothing to resume\n"
                                         + release_reservations(journal, cid) + summary_text(journal, cid))
    journal.claim(cid)  # first: of two resumes at once, the second refuses here before it changes anything
    fleet, base = load_for(store, journal, cid, inventory_path, baseline_path)
    with runs.recorded(store, "campaign", argv, fleet, base, None) as run_:
        if window_s:
            journal.update_options(cid, window_end=later(window_s))
        if capacity_budget is not None:
            new_budget(journal, cid, capacity_budget)
        if judgement:
            journal.note(cid, Record.JUDGED, **judgement)
        if c["state"] == CampaignState.HALTED:
            accept_held(journal, cid)
        return driven(store, journal, run_, cid, fleet, base, live, notifier, {"resumed": True}, prometheus,
                      playbooks=runner.Runner(runner_config))


def new_budget(journal: Journal, cid: int, node_hours: float) -> None:
    """`campaign resume --capacity-budget`: the campaign's capacity budget from now on (node-hours counted from its
    start, as the first): one that halted on its budget goes on under a larger one. Recorded as an event."""
    was = CampaignOptions.from_dict(json.loads(journal.campaign(cid)["options"])).capacity_budget_node_hours
    journal.update_options(cid, capacity_budget_node_hours=node_hours)
    journal.note(cid, Record.CAPACITY_BUDGET_CHANGED, node_hours=node_hours, was=was)


def interrupted(journal: Journal) -> list[int]:
    """Campaigns the history shows at work (running, soaking, rolling back) whose process is gone: a crash, a
    reboot of the control node, a kill. Halted ones wait for a person and are not among them."""
    return [c["id"] for c in journal.campaigns()
            if c["state"] in transitions.CAMPAIGN_AT_WORK and not driven_elsewhere(c["driver"])]


def resume_interrupted(store: Store, inventory_path: str | None, baseline_path: str | None, window_s: float | None,
                       live: Live | None, notifier: notify.Notifier | None = None, *,
                       argv: list[str], prometheus: Any = None, runner_config: RunnerConfig) -> tuple[Exit, str]:
    """`campaign resume --interrupted` (a maintenance window's unit runs it before anything new): every interrupted
    campaign, oldest first. Exit 0 when there is none; else the highest of their exit codes."""
    ids = interrupted(Journal(store))
    if not ids:
        return Exit.OK, "no interrupted campaign\n"
    codes, texts = [], []
    for cid in ids:
        code, text = resume(store, cid, inventory_path, baseline_path, window_s, live, notifier, argv=argv,
                            prometheus=prometheus, runner_config=runner_config)
        codes.append(code if code is not None else Exit.INTERNAL)  # a drive ends in a state with a code
        texts.append(f"campaign {cid}: " + text if len(ids) > 1 else text)
    return max(codes), "".join(texts)


def judge(store: Store, cid: int, decision: str, reason: str | None, inventory_path: str | None,
          baseline_path: str | None, live: Live | None, notifier: notify.Notifier | None = None, *,
          argv: list[str], prometheus: Any = None, runner_config: RunnerConfig) -> tuple[Exit, str]:
    """`fleetctl campaign judge ID --promote|--rollback`: a person's decision on a campaign halted for one (an
    inconclusive gate, a canary metric not judged, the breaker, a closed window, the capacity budget), recorded as a
    `judged` event (the decision, who decided, why, and the halt it `answers`), then carried out: promote as `campaign
    resume` goes on (held hosts accepted, the next wave), rollback as `fleetctl rollback`."""
    c = campaign_row(Journal(store), cid)
    if c["state"] != CampaignState.HALTED:
        raise InputError(f"campaign {cid} is {c['state']}: only a campaign halted for a person is judged "
                         f"(fleetctl campaign show {cid})")
    judgement = {"decision": decision, "by": operator(), "reason": reason, "answers": c["reason"]}
    if decision == "promote":
        return resume(store, cid, inventory_path, baseline_path, None, live, notifier, argv=argv,
                      prometheus=prometheus, judgement=judgement, runner_config=runner_config)
    return rollback(store, cid, inventory_path, baseline_path, live, notifier, argv=argv, judgement=judgement,
                    runner_config=runner_config)


def rollback(store: Store, cid: int, inventory_path: str | None, baseline_path: str | None,
             live: Live | None, notifier: notify.Notifier | None = None, *,
             argv: list[str], judgement: dict[str, Any] | None = None, runner_config: RunnerConfig) -> tuple[Exit, str]:
    journal = Journal(store)
    c = campaign_row(journal, cid)
    if ("%s" % c["state"], Record.ROLLBACK_REQUESTED) not in transitions.CAMPAIGN_TABLE:
        raise InputError(f"campaign {cid} is {c['state']}: "
                         + ("resume it first" if c["state"] in transitions.CAMPAIGN_AT_WORK
                            else "nothing to roll back"))
    journal.claim(cid)  # refused while another fleetctl drives it
    fleet, base = load_for(store, journal, cid, inventory_path, baseline_path)
    with runs.recorded(store, "campaign", argv, fleet, base, None) as run_:
        if judgement:
            journal.note(cid, Record.JUDGED, **judgement)
        request_rollback(journal, cid, f"rolled back by {judgement['by']}'s judgement (fleetctl campaign judge)"
                         if judgement else "manual rollback (fleetctl rollback)")
        return driven(store, journal, run_, cid, fleet, base, live, notifier, {"rollback": True},
                      playbooks=runner.Runner(runner_config))


def abort(store: Store, cid: int) -> str:
    journal = Journal(store)
    c = campaign_row(journal, cid)
    if c["state"] in transitions.CAMPAIGN_TERMINAL:
        raise InputError(f"campaign {cid} is already {c['state']}")
    if c["state"] == CampaignState.ROLLING_BACK:
        raise InputError(f"campaign {cid} is rolling back: let it finish (fleetctl campaign resume {cid})")
    if driven_elsewhere(c["driver"]) and c["state"] != CampaignState.HALTED:
        journal.request_abort(cid)
        return f"campaign {cid}: abort requested; it stops before its next wave\n"
    # Hosts mid-step, and (while running) failed hosts the campaign changed whose wave was not judged yet: the
    # wave's decision (perhaps a rollback) is still owed to them.
    midway = [f"{r['host']} ({r['state']})" for r in journal.hosts(cid)
              if (not transitions.is_terminal(r["state"]) and r["state"] not in transitions.READ_ONLY_STATES)
              or (c["state"] == CampaignState.RUNNING and r["state"] == HostState.FAILED and r["changed"])]
    if midway:
        raise InputError(f"campaign {cid} stopped with hosts mid-way: {', '.join(midway)}; "
                         f"resume it (fleetctl campaign resume {cid}) or roll it back after")
    journal.transition(cid, Record.ABORT_REQUESTED, reason="aborted by the operator",
                       moves={"abandon": [r["host"] for r in journal.hosts(cid)]})
    return f"campaign {cid}: aborted\n" + release_reservations(journal, cid)


def release_reservations(journal: Journal, cid: int) -> str:
    """A stopped campaign's reservations (--drain-mode reservation) deleted, where no engine did it (an abort of
    a campaign nobody drives, a resume finding it stopped after a crash); what kept them, as a line, if anything."""
    options = CampaignOptions.from_dict(json.loads(journal.campaign(cid)["options"]))
    if options.drain_mode != "reservation":
        return ""
    try:
        scheduler.of(options).release(journal, cid)
    except OperationError as e:
        return f"its reservations are still held: {e}; `fleetctl campaign resume {cid}` deletes them\n"
    return ""
