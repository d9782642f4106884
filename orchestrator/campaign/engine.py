"""Drive a campaign from its journal. Everything the engine decides is read back from the history first, so
`run` after a crash (a resume) continues exactly where the record stops."""

from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from .. import baseline as baseline_mod, interrupts
from ..fleet import inventory, runner
from ..errors import InputError, OperationError
from ..settings import duration_text
from ..history.store import Store, now
from ..history.timefmt import parse as parse_time, stamp
from . import capacity, soak, steps, transitions
from ..schedulers import scheduler
from .journal import Journal
from .transitions import IN_ROLLBACK, OUT_OF_SERVICE, WAIT, WAITING, CampaignState, HostState, Record
from .options import Campaign


DOMAIN_PEER = "NVLink domain "  # how the reason of a host stopped with its domain begins


def later(seconds: float, start: datetime | None = None) -> str:
    return stamp((start or datetime.now(timezone.utc)) + timedelta(seconds=seconds))


BATCHES = 16  # batches of steps under way at once, at most (each its own playbook run or hooks)
LOOK_S = 1.0  # the longest the engine waits without looking at its hosts (and at a signal)
BREAKER_NAMES = 5  # the failed hosts the circuit breaker's line names, at most (the event has them all)


class Clock:
    """The time the engine reads and waits on, and how it runs a batch of steps beside the others (a simulated clock
    runs the engine in simulated time: bench/drain_policies.py)."""

    look_s = LOOK_S  # the longest the engine waits without looking (for a signal, an abort, a host's change)

    def unchanged_until(self, at: float) -> float:
        """The monotonic time before which nothing the engine waits on outside it (a host's jobs) can change, as
        seen at AT: a host still busy then is not looked at again before it. This clock cannot tell: AT. (A
        simulated clock, which runs the cluster, can: the next end of a job on a drained node.)"""
        return at

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def submit(self, pool: ThreadPoolExecutor, step: HostState, fn: Callable[..., Any], *args: Any) -> Future:
        """Start FN(*ARGS), the runner of STEP for a batch, in POOL."""
        return pool.submit(fn, *args)

    def wait(self, futures: set[Future], timeout: float) -> set[Future]:
        """The batches of FUTURES done within TIMEOUT seconds (at least one, unless the time ran out)."""
        return wait(futures, timeout=timeout, return_when=FIRST_COMPLETED).done


Runner = Callable[[steps.Context, list[str]], dict[str, steps.Outcome]]
Observe = Callable[[steps.Context, list[str], bool], dict[str, soak.Observation]]


@dataclass(frozen=True)
class Parts:
    """What the engine works with besides the journal: the step runners (step -> runner, steps.STEPS), the soak's
    observation, the clock, the counter of seconds spent inside ansible-playbook, the scheduler the hosts are
    drained through (None: the campaign's own, scheduler.of) and what runs the playbooks (the command's execution
    nodes: runner.Runner). Tests give their own."""
    steps: Mapping[HostState, Runner] = field(default_factory=lambda: steps.STEPS)
    observe: Observe = soak.observe
    clock: Clock = field(default_factory=Clock)
    playbook_time: runner.Seconds = runner.PLAYBOOK_TIME
    prometheus: Any = None  # promql.Client: the soak judges the baseline's canary metrics with it (soak.py)
    scheduler: Any = None  # scheduler.Scheduler (bench/drain_policies.py: a simulated cluster)
    playbooks: runner.Runner = field(default_factory=runner.Runner)


class Engine:
    def __init__(self, journal: Journal, campaign: Campaign, fleet: inventory.Fleet, base: baseline_mod.Baseline,
                 parts: Parts | None = None):
        self.journal, self.campaign, self.cid = journal, campaign, campaign.id
        self.parts = parts or Parts()
        self.clock = self.parts.clock
        self.options, self.plan = campaign.options, campaign.plan
        missing = sorted({h["host"] for h in journal.hosts(self.cid)} - {h.name for h in fleet.hosts})
        if missing:
            raise OperationError(f"campaign {self.cid}: host {missing[0]} is not in the inventory any more "
                                 f"(give the inventory the campaign was started with)")
        self.ctx = steps.Context(journal, self.cid, campaign.target, fleet, base, self.options,
                                 prometheus=self.parts.prometheus,
                                 scheduler=self.parts.scheduler or scheduler.of(self.options),
                                 playbooks=self.parts.playbooks)
        self.held_for: tuple[str, int] | None = None  # the campaign's (state, wave) its reservations were set for
        # Each host's unit of change: its multi-node NVLink domain, or itself (plans recorded before domains: itself)
        self.unit = {h["name"]: h.get("domain") or h["name"] for w in self.plan["waves"] for h in w["hosts"]}
        self.begun: set[tuple[str, str]] = set()  # (host, waiting step) written ahead by this advance
        self.gives_up: dict[tuple[str, str], float] = {}  # (host, waiting step) -> when it stops waiting (monotonic)
        self.read_befores: dict[str, tuple[str, Any]] = {}  # load_befores' decoded records
        self.paced: tuple[str, int] | None = None  # the last `paced` event's (why, hosts waiting)
        self.spent: str | None = None  # the capacity budget is spent with nothing out of service: why
        self.listening = threading.RLock()  # the listener hears one event at a time, from any batch's thread
        self.heard: Callable[[dict[str, Any]], None] | None = None  # the journal's own listener, behind `listen`

    # ---- the campaign table ------------------------------------------------------------------------------
    def run(self) -> CampaignState:
        """Work until the campaign is done, rolled back, aborted or halted for a person; returns that state."""
        self.journal.claim(self.cid)
        while True:
            c = self.journal.campaign(self.cid)
            self.hold_nodes(c)
            if c["state"] == CampaignState.RUNNING:
                self.run_wave(c)
            elif c["state"] == CampaignState.SOAKING:
                self.soak(c)
            elif c["state"] == CampaignState.ROLLING_BACK:
                self.advance(self.hosts_in_rollback())
                self.journal.transition(self.cid, Record.ROLLBACK_FINISHED, summary=self.tally())
            else:
                return CampaignState(c["state"])

    def run_wave(self, c) -> None:
        wave = c["wave"]
        members = [h["host"] for h in self.journal.hosts(self.cid) if h["wave"] == wave]
        untouched = self.untouched(wave)
        if untouched and c["abort_requested"]:
            self.journal.transition(self.cid, Record.ABORT_REQUESTED, reason="aborted by the operator", wave=wave)
            return
        if untouched and self.window_closed():
            self.journal.transition(self.cid, Record.WINDOW_CLOSED, wave=wave,
                                    reason=f"the maintenance window closed at {self.options.window_end} "
                                           f"before wave {wave}")
            return
        if untouched and self.before_its_reservation(c, members):
            return
        self.advance(members)
        if self.spent:
            self.journal.transition(self.cid, Record.CAPACITY_SPENT, wave=wave, reason=f"wave {wave}: {self.spent}")
            return
        rows = {h["host"]: h for h in self.journal.hosts(self.cid) if h["wave"] == wave}
        failed = sorted((h for h, r in rows.items() if r["state"] in transitions.FAILED),
                        key=lambda h: (rows[h]["reason"] or "").startswith(DOMAIN_PEER))  # who failed first
        if over := self.over_budget(wave, failed, rows):
            self.journal.transition(self.cid, Record.WAVE_FAILED, moves=self.over_moves({wave}, wave), wave=wave,
                                    reason=f"wave {wave} failed {over}: {first_host(failed, rows)}")
            return
        # within budget: only the failed hosts go back (with every host of their NVLink domains), the campaign goes on
        units = {self.unit.get(h, h) for h in failed}
        lone = [h for h, r in rows.items() if r["changed"] and self.unit.get(h, h) in units
                and r["state"] in (HostState.FAILED, HostState.DONE)]
        if lone:
            self.journal.move(self.cid, Record.HOST_ROLLBACK, {"roll_back": lone},
                              reason="failed within the wave's budget")
            self.advance(lone)
            return self.run_wave(self.journal.campaign(self.cid))
        if self.tripped(wave=wave):
            return
        held = [h for h, r in rows.items() if r["state"] == HostState.HELD]
        if held:
            self.journal.transition(self.cid, Record.HOST_HELD, wave=wave,
                                    reason=f"inconclusive gate, measured twice: {first_host(held, rows)}")
        elif wave == len(self.plan["waves"]):
            self.journal.transition(self.cid, Record.LAST_WAVE_PASSED, wave=wave, summary=self.tally())
        else:
            self.journal.transition(self.cid, Record.WAVE_PASSED, wave=wave + 1,
                                    soak_until=self.later(self.options.soak_length(wave)), failed=failed)

    def soak(self, c) -> None:
        """Wait out the soak after wave GAP while watching the changed hosts (campaign/soak.py): a check every
        soak interval, the gate at the end; a failure acts like a gate failure against the host's wave's budget.
        Everything is read back from the journal each round, so a resume continues with the time left."""
        gap = c["wave"] - 1
        deadline = parse_time(c["soak_until"]) if c["soak_until"] else self.clock.now()
        watching = self.options.soak_length(gap) > 0  # --soak 0: no soak, nothing watched
        interval = float(self.options.soak_interval_s)
        while True:
            failures = soak.failing(self.journal, self.cid) if watching else {}
            if failures:
                if self.soak_failed(failures):
                    return
                continue
            if self.journal.campaign(self.cid)["abort_requested"]:
                self.journal.transition(self.cid, Record.ABORT_REQUESTED, reason="aborted by the operator")
                return
            hosts = soak.watched(self.journal, self.cid) if watching else []
            now_ = self.clock.now()
            if now_ >= deadline:
                gated = {r["host"] for r in self.journal.soak_records(self.cid, gap=gap, kind="gate")}
                todo = [h for h in hosts if h not in gated]
                if not todo:
                    break
                self.load_befores()
                self.journal.record_soak(self.cid, gap, "gate", self.parts.observe(self.ctx, todo, True))
                continue
            checks = self.journal.soak_records(self.cid, gap=gap, kind="check")
            due = parse_time(checks[-1]["at"]) + timedelta(seconds=interval) if checks else now_
            if hosts and now_ >= due:
                self.load_befores()
                self.journal.record_soak(self.cid, gap, "check", self.parts.observe(self.ctx, hosts, False))
                continue
            wake = min(deadline, due) if hosts else deadline  # nothing to watch: only the clock
            self.clock.sleep(min(self.clock.look_s, max(0.05, (wake - now_).total_seconds())))
        held = soak.held(self.journal, self.cid, gap) if watching else {}
        if held:  # the canary metrics could not be judged and the baseline says hold: a person decides
            self.journal.transition(self.cid, Record.SOAK_HELD, reason=f"the soak after wave {gap} is held: "
                                    + first_host(sorted(held), {h: {"reason": r} for h, r in held.items()}))
        elif self.window_closed():
            self.journal.transition(self.cid, Record.WINDOW_CLOSED,
                                    reason=f"the maintenance window closed at {self.options.window_end} "
                                           f"before wave {c['wave']}")
        else:
            self.journal.transition(self.cid, Record.SOAKED, wave=c["wave"])

    def over_budget(self, wave: int, failed: list[str], members: dict[str, Any]) -> str | None:
        """Whether the FAILED hosts of WAVE (its MEMBERS, by name) reach its budget, counted in its unit (a host, or
        an NVLink domain: self.unit): "(F of M units, the rule)", or None within it."""
        budget = self.plan["waves"][wave - 1]["budget"]
        units = {self.unit.get(h, h) for h in failed}
        if not failed or len(units) < budget["fail_at"]:
            return None
        of = len({self.unit.get(h, h) for h in members})
        return f"({len(units)} of {of} {budget.get('unit', 'host')}s, {budget['rule']})"

    def over_moves(self, waves: set[int], last: int) -> dict[str, list[str]]:
        """Where a campaign goes whose WAVES failed over their budgets: their hosts roll back (every host with
        --rollback-scope campaign), the waves after LAST will not run."""
        everyone = self.journal.hosts(self.cid)
        return {"roll_back": [r["host"] for r in everyone
                              if self.options.rollback_scope == "campaign" or r["wave"] in waves],
                "cancel": [r["host"] for r in everyone if r["wave"] > last]}

    def soak_failed(self, failures: dict[str, str]) -> bool:
        """Watched hosts failed a soak observation: each against its own wave's budget (the canary: any failure).
        Over a budget the campaign rolls back as for a failed wave (True); within, those hosts roll back alone and
        the soak goes on."""
        c, rows = self.journal.campaign(self.cid), self.journal.hosts(self.cid)
        watched = set(soak.watched(self.journal, self.cid))
        for host, why in list(failures.items()):  # the soak watches an NVLink domain as one
            for peer in sorted(h for h in watched if h != host and self.unit.get(h, h) == self.unit.get(host, host)):
                failures.setdefault(peer, f"{DOMAIN_PEER}{self.unit[host]}: {host} failed ({why}): "
                                          "the domain moves as one")
        over: dict[int, str] = {}
        for wave in sorted({r["wave"] for r in rows if r["host"] in failures}):
            members = [r for r in rows if r["wave"] == wave]
            failed = [r["host"] for r in members if r["state"] in transitions.FAILED or r["host"] in failures]
            if said := self.over_budget(wave, failed, {r["host"]: r for r in members}):
                over[wave] = f"wave {wave} {said}"
        reasons = {h: r for h, r in failures.items()}
        text = first_host(sorted(failures), {h: {"reason": r} for h, r in failures.items()})
        if over:
            gap = c["wave"] - 1
            self.journal.transition(self.cid, Record.SOAK_FAILED, moves=self.over_moves(set(over), gap),
                                    host_reasons=reasons, wave=gap,
                                    reason=f"the soak after wave {gap} failed, over the budget of "
                                           f"{', '.join(over.values())}: {text}")
            return True
        self.journal.transition(self.cid, Record.SOAK_HOST_FAILED, moves={"roll_back": list(failures)},
                                host_reasons=reasons, soak_until=c["soak_until"],
                                reason=f"failed during the soak, within the wave's budget: {text}")
        self.advance(sorted(failures))
        return self.tripped()

    def tripped(self, **data: Any) -> bool:
        """The campaign's circuit breaker (the plan's `breaker`, from the baseline's campaign.breaker): once the hosts
        that failed a step of the upgrade or the soak within the window ending now (the journal's time) reach
        max(failures, percent of the hosts whose install began within it), the campaign halts (`breaker_tripped`,
        with those hosts). A failure counts toward one trip only: after a resume, only hosts a trip has not named."""
        b = self.plan.get("breaker")
        if not b:
            return False
        since = parse_time(now()).timestamp() - b["within_s"]
        named = {h for e in self.journal.events(self.cid) if e["event"] == Record.BREAKER_TRIPPED
                 for h in e["failures"]}
        failed: dict[str, tuple[float, str]] = {}  # host -> (when, what failed: the step or the soak, and why)
        changed = set()
        for s in self.journal.steps(self.cid):
            at = parse_time(s["finished_at"] or s["started_at"]).timestamp()
            if s["step"] == HostState.INSTALL and parse_time(s["started_at"]).timestamp() >= since:
                changed.add(s["host"])
            if s["status"] == "fail" and s["step"] in transitions.HOST_ROWS and s["step"] not in IN_ROLLBACK:
                failed.setdefault(s["host"], (at, f"{s['step']}: {s['reason'] or 'failed'}"))
        for o in self.journal.soak_records(self.cid):
            if o["status"] == "fail":
                failed.setdefault(o["host"], (parse_time(o["at"]).timestamp(), f"soak: {o['reason'] or 'failed'}"))
        counted = sorted((at, h, what) for h, (at, what) in failed.items() if at >= since and h not in named)
        share = math.ceil(b["percent"] * len(changed) / 100) if b["percent"] else 0
        limit = max(b["failures"], share)
        if len(counted) < limit:
            return False
        rule = (f"max({b['failures']} hosts, {b['percent']:g}% of {len(changed)} hosts changed within {b['within']})"
                f" = {limit}" if b["percent"] else f"{limit}")
        shown = ", ".join(f"{h} ({what})" for _, h, what in counted[:BREAKER_NAMES])
        more = f" (+{len(counted) - BREAKER_NAMES} more hosts)" if len(counted) > BREAKER_NAMES else ""
        self.journal.transition(self.cid, Record.BREAKER_TRIPPED,
                                failures={h: what.split(":")[0] for _, h, what in counted},
                                reason=f"the circuit breaker tripped: {len(counted)} hosts failed within "
                                       f"{b['within']} (halts at >= {rule}): {shown}{more}", **data)
        return True

    # ---- reservations (--drain-mode reservation) ------------------------------------------------------------
    def hold_nodes(self, c) -> None:
        """At each change of the campaign's state or wave, the reservations it holds (scheduler.reserve): the wave
        about to start, or under way, holds its hosts not back in service yet from when its drain is due (the canary
        wave's: --lead after the campaign began; a later wave's: the end of the soak before it, plus what the steps
        before the drain took on the wave before, held_from), so that nodes already idle do not wait in it through
        their checks; any other is released, all once the campaign stops or rolls back. Refused before the campaign
        touched a host (a name the scheduler already holds, a scheduler that refuses), the campaign stops there: one
        line, an input error. Refused later, the campaign says so (`reservation_failed`) and that wave's drain does
        without it."""
        if self.options.drain_mode != "reservation" or self.held_for == (c["state"], c["wave"]):
            return
        wave = c["wave"]
        try:
            if c["state"] in (CampaignState.RUNNING, CampaignState.SOAKING):
                hosts = [r["host"] for r in self.journal.hosts(self.cid) if r["wave"] == wave
                         and not transitions.is_terminal(r["state"]) and r["state"] not in transitions.IN_ROLLBACK]
                start = self.canary_start(c) if wave == 1 else self.held_from(c)
                self.ctx.scheduler.release(self.journal, self.cid, keep=wave)
                self.ctx.scheduler.reserve(self.ctx, wave, hosts, start)
            else:
                self.ctx.scheduler.release(self.journal, self.cid)
        except (InputError, OperationError) as e:
            if c["state"] == CampaignState.RUNNING and wave == 1 and self.untouched(wave):
                reason = f"--drain-mode reservation: {e}"
                self.journal.transition(self.cid, Record.ABORT_REQUESTED, reason=reason, wave=wave,
                                        moves={"abandon": [r["host"] for r in self.journal.hosts(self.cid)]})
                raise InputError(reason) from None
            self.journal.note(self.cid, Record.RESERVATION_FAILED, wave=wave, reason=str(e))
        self.held_for = (c["state"], wave)

    def canary_start(self, c) -> datetime:
        """When the canary wave's drain is due in reservation mode: --lead after the campaign began, with its
        reservation."""
        return parse_time(c["created_at"]) + timedelta(seconds=self.options.lead_s)

    def held_from(self, c) -> datetime:
        """When a later wave's drain is due in reservation mode: the end of the soak before it, plus the least time a
        host of the wave before spent in the steps before its drain (transitions.BEFORE_DRAIN, from the journal's
        step records: the hosts drained). The least: a reservation begun a little early costs an idle node minutes,
        one begun after the drain lets a job start that the drain must then wait for."""
        spent: dict[str, timedelta] = {}
        drained = set()
        for s in self.journal.steps(self.cid):
            if s["step"] == HostState.DRAIN:
                drained.add(s["host"])
            elif s["step"] in transitions.BEFORE_DRAIN and s["finished_at"]:
                spent[s["host"]] = (spent.get(s["host"], timedelta())
                                    + parse_time(s["finished_at"]) - parse_time(s["started_at"]))
        before = {r["host"] for r in self.journal.hosts(self.cid) if r["wave"] == c["wave"] - 1}
        took = min((t for h, t in spent.items() if h in before and h in drained), default=timedelta())
        return parse_time(c["soak_until"] or now()) + took

    def before_its_reservation(self, c, members: list[str]) -> bool:
        """The canary wave's drain waits for its reservation to start (--drain-mode reservation): meanwhile its hosts
        go through the steps before the drain (they only look: an abort still stops the wave cleanly). True while
        a host of the wave waits so, after a look's sleep at most (the campaign table looks again: an abort or
        the window's end still stop it)."""
        if self.options.drain_mode != "reservation" or c["wave"] != 1:
            return False
        left = (self.canary_start(c) - self.clock.now()).total_seconds()
        if left <= 0:
            return False
        self.advance(members, only=transitions.BEFORE_DRAIN)
        if not any(r["state"] == HostState.DRAIN for r in self.journal.hosts(self.cid) if r["host"] in members):
            return False  # none left to drain (each failed or was skipped): the wave's rules judge it now
        self.clock.sleep(min(self.clock.look_s, left))
        return True

    def untouched(self, wave: int) -> bool:
        """No host of WAVE has begun a step beyond looking (a drain, an install): it may still be stopped cleanly."""
        return not any(s["step"] not in transitions.READ_ONLY_STATES for r in self.journal.hosts(self.cid)
                       if r["wave"] == wave for s in self.journal.steps(self.cid, r["host"]))

    def window_closed(self) -> bool:
        end = self.options.window_end
        return bool(end) and self.clock.now() >= parse_time(end)

    def later(self, seconds: float) -> str:
        return later(seconds, self.clock.now())

    # ---- the host table ----------------------------------------------------------------------------------
    def advance(self, names: list[str], only: tuple[HostState, ...] | None = None) -> None:
        """Move NAMES through the host table until each is in a terminal state (ONLY: until none is in one of these
        states; the others wait). Hosts in the same state whose NVLink domains are ready form a batch (one playbook
        run); batches of different states run at once, each in a thread of its own (pace host: a host goes on as soon
        as its own jobs have ended); with pace wave one batch at a time, the hosts in the earliest state, as the
        wave's hosts move together. A signal stops the batches under way (their playbooks are cancelled) and none of
        their results is recorded: each host's step is written ahead, and a resume runs it again."""
        scope, running, looked = set(names), {}, {}
        self.begun, self.spent = set(), None  # a waiting step is written ahead once per run (a resume: attempts + 1)
        self.gives_up = {}  # (host, waiting step) -> the monotonic time it stops waiting (--idle-timeout)
        if self.journal.listener != self.listen:  # every event heard one at a time, from any batch's thread
            self.heard, self.journal.listener = self.journal.listener, self.listen
        with interrupts.deferred(), ThreadPoolExecutor(BATCHES, "fleetctl-step") as pool:
            while True:
                live = {r["host"]: r for r in self.journal.hosts(self.cid)
                        if r["host"] in scope and not transitions.is_terminal(r["state"])
                        and (only is None or r["state"] in only)}
                if not running and (not live or interrupts.requested() or self.spent):
                    return  # a signal: raised as the deferred block ends; the budget spent: run_wave halts
                if not interrupts.requested():
                    for step, batch in self.ready(live, running, looked):
                        running[self.start_batch(pool, step, batch)] = (step, batch, self.clock.monotonic())
                due = min((looked[h] + self.options.idle.poll_s for h in live if h in looked), default=None)
                look = self.clock.look_s
                pause = look if due is None else min(look, max(0.05, due - self.clock.monotonic()))
                if not running:
                    self.clock.sleep(pause)
                    continue
                for future in self.clock.wait(set(running), pause):
                    step, batch, started = running.pop(future)
                    results, in_ansible = future.result()
                    if not interrupts.requested():
                        self.finish_batch(step, batch, results, started, in_ansible, looked, scope)

    def ready(self, live: dict[str, Any], running: dict[Future, Any], looked: dict[str, float]) -> list[tuple]:
        """The batches to start now, (step, hosts): a host moves when its NVLink domain's hosts are all in its state
        and none is in a batch (a host waiting for its jobs is looked at every idle poll on its own), within
        --max-in-flight (a drain waits for a unit out of service to come back)."""
        busy = {h for _, batch, _ in running.values() for h in batch}
        members: dict[str, list[str]] = {}
        for h in live:
            members.setdefault(self.unit.get(h, h), []).append(h)
        poll, clock = self.options.idle.poll_s, self.clock.monotonic()

        def moves(h: str) -> bool:
            state = live[h]["state"]
            if h in busy:
                return False
            if state in WAITING:
                return h not in looked or clock >= looked[h] + poll
            return all(live[m]["state"] == state and m not in busy for m in members[self.unit.get(h, h)])
        if self.options.pace == "wave":  # the wave's hosts together: the earliest state, one batch at a time
            if running:
                return []
            state = min((r["state"] for r in live.values()), key=transitions.ORDER.__getitem__)
            batch = [h for h, r in live.items() if r["state"] == state
                     and (state not in WAITING or h not in looked or clock >= looked[h] + poll)]
            if state == HostState.DRAIN and batch and self.admitted(batch, busy) != batch:
                return []  # the capacity budget: the wave is drained whole or not at all
            return [(transitions.HOST_ROWS[state].step, batch)] if batch else []
        groups: dict[str, list[str]] = {}
        for h, r in live.items():
            if moves(h):
                groups.setdefault(r["state"], []).append(h)
        drains = groups.get(HostState.DRAIN)
        if drains:
            groups[HostState.DRAIN] = self.admitted(drains, busy)
        return [(transitions.HOST_ROWS[state].step, batch)
                for state, batch in sorted(groups.items(), key=lambda g: transitions.ORDER[g[0]]) if batch]

    def admitted(self, drains: list[str], busy: set[str]) -> list[str]:
        """Of the hosts about to be drained, those whose NVLink domains fit, whole and in plan order, within
        --max-in-flight beside the units out of service now (drained and not back, in this campaign) and within the
        capacity budget (capacity.pacing); the rest wait, and the campaign says why once each time it waits
        (`paced`)."""
        rows = self.journal.hosts(self.cid)
        out_now = {self.unit.get(r["host"], r["host"]) for r in rows
                   if r["state"] in OUT_OF_SERVICE or (r["host"] in busy and r["state"] == HostState.DRAIN)}
        bound = self.options.max_in_flight
        members: dict[str, list[str]] = {}
        for h in drains:
            members.setdefault(self.unit.get(h, h), []).append(h)
        chosen, why, budget = [], None, None
        for hosts in members.values():
            taken = len(out_now) + len({self.unit.get(h, h) for h in chosen})
            if bound is not None and taken >= bound:
                why = f"{taken} out of service at once (--max-in-flight {bound})"
                break
            why = budget = capacity.pacing(self.journal, self.cid, self.options, self.clock.now(),
                                           hosts=len(chosen) + len(hosts))
            if why:
                break
            chosen += hosts
        waiting = len(members) - len({self.unit.get(h, h) for h in chosen})
        if why and self.paced != (why, waiting):
            self.paced = (why, waiting)
            self.journal.note(self.cid, Record.PACED, waiting=waiting, out_of_service=len(out_now),
                              reason=f"{waiting} waiting to be drained: {why}")
        # the budget spent with nothing out of service: waiting gives nothing back, the campaign halts (run_wave)
        self.spent = budget if budget and not chosen and not out_now else None
        return chosen

    def start_batch(self, pool: ThreadPoolExecutor, step: HostState, batch: list[str]) -> Future:
        """Write STEP ahead for BATCH (a host still waiting for its jobs is written once, as it starts waiting) and
        run it in a thread of its own, on a connection of its own to the history."""
        begin = [h for h in batch if (h, step) not in self.begun]
        if begin:
            self.journal.begin_step(self.cid, begin, step)
            if transitions.HOST_ROWS[step].waits:
                self.begun.update((h, step) for h in begin)
        self.load_befores()
        ctx = replace(self.ctx, befores=dict(self.ctx.befores))
        return self.clock.submit(pool, step, self.run_batch, step, ctx, batch)

    def run_batch(self, step: HostState, ctx: steps.Context,
                  batch: list[str]) -> tuple[dict[str, steps.Outcome], float]:
        """STEP's runner for BATCH (in its own thread): its outcomes, and the seconds it spent in ansible-playbook."""
        in_ansible = self.parts.playbook_time.here
        if threading.current_thread() is threading.main_thread():  # a clock that runs it here (a simulated one)
            return self.parts.steps[step](ctx, batch), self.parts.playbook_time.here - in_ansible
        with Store(self.journal.store.path, check=False) as store:
            ctx.journal = Journal(store, listener=self.listen, create=False)
            return self.parts.steps[step](ctx, batch), self.parts.playbook_time.here - in_ansible

    def listen(self, record: dict[str, Any]) -> None:
        """The campaign's listener (the display, the JSONL log, the notifications), one event at a time."""
        with self.listening:
            if self.heard:
                self.heard(record)

    def finish_batch(self, step: HostState, batch: list[str], results: dict[str, steps.Outcome], started: float,
                     in_ansible: float, looked: dict[str, float], scope: set[str]) -> None:
        """Record each host's outcome of STEP (a host still waiting for its jobs: when it was looked at)."""
        finished = []
        for host in batch:
            o = results[host]
            if o.outcome == WAIT:
                at, gives_up = self.clock.monotonic(), self.gives_up.get((host, step))
                if gives_up is None:  # --idle-timeout after the step began (written ahead: a resume keeps it)
                    waited = self.clock.now() - parse_time(self.journal.step_started(self.cid, host, step))
                    gives_up = self.gives_up[host, step] = at - waited.total_seconds() + self.options.idle.timeout_s
                if at < gives_up:  # looked at again every idle poll, from the first that may find it changed
                    poll, quiet = self.options.idle.poll_s, min(self.clock.unchanged_until(at), gives_up)
                    first = quiet if poll <= 0 else at + math.ceil((quiet - at) / poll) * poll  # the first look then
                    looked[host] = max(at, first - poll)
                    continue
                o = steps.Outcome("fail", f"after {duration_text(self.options.idle.timeout_s)}: {o.reason}", o.detail)
            looked.pop(host, None)
            self.journal.finish_step(self.cid, host, step, o.outcome, o.reason, o.detail, o.before)
            finished.append(host)
        if finished:
            self.journal.note(self.cid, Record.BATCH_FINISHED, step=step, batch=finished,
                              batch_s=round(self.clock.monotonic() - started, 3), ansible_s=round(in_ansible, 3))
            self.stop_domains(scope)

    def stop_domains(self, scope: set[str]) -> None:
        """A host of a multi-node NVLink domain failed: the domain's other hosts stop where they are (those not yet
        changed are released, those changed fail with it: the wave's rules then roll the domain back whole)."""
        rows = {r["host"]: r for r in self.journal.hosts(self.cid)}
        failed = {self.unit.get(h, h): h for h, r in rows.items() if h in scope and self.unit.get(h, h) != h
                  and (r["state"] in transitions.FAILED or r["state"] in (HostState.RELEASE,))}
        peers = sorted(h for h in scope if self.unit.get(h, h) in failed and h not in failed.values()
                       and not transitions.is_terminal(rows[h]["state"]) and rows[h]["state"] != HostState.RELEASE
                       and rows[h]["state"] not in transitions.IN_ROLLBACK)
        if peers:
            first = failed[self.unit[peers[0]]]
            self.journal.move(self.cid, Record.DOMAIN_PEER_FAILED, {"stop": peers, "release": peers, "fail": peers},
                              reason=f"{DOMAIN_PEER}{self.unit[first]}: {first} failed "
                                     f"({rows[first]['reason'] or rows[first]['state']}): the domain moves as one",
                              host_reason=True)

    def load_befores(self) -> None:
        """What precheck recorded of each host, for the steps and the soak checks (read back: a resume has it)."""
        rows = self.journal.befores(self.cid)
        read = self.read_befores  # each record decoded once (host -> (its text, decoded))
        for host, text in rows:
            if host not in read or read[host][0] != text:
                read[host] = (text, json.loads(text))
        self.ctx.befores = {host: read[host][1] for host, _ in rows}

    def hosts_in_rollback(self) -> list[str]:
        return [r["host"] for r in self.journal.hosts(self.cid) if r["state"] in transitions.IN_ROLLBACK]

    def tally(self) -> dict[str, int]:
        return self.journal.tally(self.cid)


def first_host(hosts: list[str], rows: Mapping[str, Mapping[str, str | None]]) -> str:
    """Why HOSTS failed, in one line: the first one's reason (ROWS: host -> its row) and how many more hosts (each
    host's own reason stays on its row)."""
    more = f" (+{len(hosts) - 1} more host{'s' if len(hosts) > 2 else ''})" if len(hosts) > 1 else ""
    return f"{hosts[0]}: {rows[hosts[0]]['reason']}{more}"


def request_rollback(journal: Journal, cid: int, reason: str) -> None:
    """fleetctl rollback: every host the campaign changed goes back (its locks are taken again first)."""
    journal.transition(cid, Record.ROLLBACK_REQUESTED, reason=reason, lock=True,
                       moves={"roll_back": [r["host"] for r in journal.hosts(cid)]})


def accept_held(journal: Journal, cid: int) -> None:
    """fleetctl campaign resume of a halted campaign: the operator accepts held hosts (they are undrained)."""
    held = [r["host"] for r in journal.hosts(cid) if r["state"] == HostState.HELD]
    journal.transition(cid, Record.RESUMED, reason=None, moves={"accept": held}, accepted=held, at=now())
