"""Drive a campaign from its journal. Everything the engine decides is read back from the history first, so
`run` after a crash (a resume) continues exactly where the record stops."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from .. import baseline as baseline_mod, inventory, runner
from ..errors import OperationError
from ..store import now
from ..timefmt import parse as parse_time, stamp
from . import soak, steps, transitions
from .journal import Journal
from .transitions import CampaignState, HostState
from .options import Campaign


DOMAIN_PEER = "NVLink domain "  # how the reason of a host stopped with its domain begins


def later(seconds: float, start: datetime | None = None) -> str:
    return stamp((start or datetime.now(timezone.utc)) + timedelta(seconds=seconds))


class Clock:
    """The time the engine reads and waits on."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


Runner = Callable[[steps.Context, list[str]], dict[str, steps.Outcome]]
Observe = Callable[[steps.Context, list[str], bool], dict[str, soak.Observation]]


@dataclass(frozen=True)
class Parts:
    """What the engine works with besides the journal: the step runners (step -> runner, steps.STEPS), the soak's
    observation, the clock and the counter of seconds spent inside ansible-playbook. Tests give their own."""
    steps: Mapping[str, Runner] = field(default_factory=lambda: steps.STEPS)
    observe: Observe = soak.observe
    clock: Clock = field(default_factory=Clock)
    playbook_time: runner.Seconds = runner.PLAYBOOK_TIME
    prometheus: Any = None  # promql.Client: the soak judges the baseline's canary metrics with it (soak.py)


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
                                 prometheus=self.parts.prometheus)
        # Each host's unit of change: its multi-node NVLink domain, or itself (plans recorded before domains: itself)
        self.unit = {h["name"]: h.get("domain") or h["name"] for w in self.plan["waves"] for h in w["hosts"]}

    # ---- the campaign table ------------------------------------------------------------------------------
    def run(self) -> CampaignState:
        """Work until the campaign is done, rolled back, aborted or halted for a person; returns that state."""
        self.journal.claim(self.cid)
        while True:
            c = self.journal.campaign(self.cid)
            if c["state"] == CampaignState.RUNNING:
                self.run_wave(c)
            elif c["state"] == CampaignState.SOAKING:
                self.soak(c)
            elif c["state"] == CampaignState.ROLLING_BACK:
                self.advance(self.hosts_in_rollback())
                self.journal.transition(self.cid, "rollback_finished", summary=self.tally())
            else:
                return CampaignState(c["state"])

    def run_wave(self, c) -> None:
        wave = c["wave"]
        members = [h["host"] for h in self.journal.hosts(self.cid) if h["wave"] == wave]
        # Until a host of the wave is drained nothing has changed: the wave may still be stopped cleanly.
        untouched = not any(s["step"] not in transitions.READ_ONLY_STATES
                            for h in members for s in self.journal.steps(self.cid, h))
        if untouched and c["abort_requested"]:
            self.journal.transition(self.cid, "abort_requested", reason="aborted by the operator", wave=wave)
            return
        if untouched and self.window_closed():
            self.journal.transition(self.cid, "window_closed", wave=wave,
                                    reason=f"the maintenance window closed at {self.options.window_end} "
                                           f"before wave {wave}")
            return
        self.advance(members)
        rows = {h["host"]: h for h in self.journal.hosts(self.cid) if h["wave"] == wave}
        failed = sorted((h for h, r in rows.items() if r["state"] in transitions.FAILED),
                        key=lambda h: (rows[h]["reason"] or "").startswith(DOMAIN_PEER))  # who failed first
        budget = self.plan["waves"][wave - 1]["budget"]
        units, unit = {self.unit.get(h, h) for h in failed}, budget.get("unit", "host")
        if failed and len(units) >= budget["fail_at"]:
            everyone = self.journal.hosts(self.cid)
            moves = {"roll_back": [r["host"] for r in everyone
                                   if self.options.rollback_scope == "campaign" or r["wave"] == wave],
                     "cancel": [r["host"] for r in everyone if r["wave"] > wave]}
            of = len({self.unit.get(h, h) for h in rows})
            self.journal.transition(self.cid, "wave_failed", moves=moves, wave=wave,
                                    reason=f"wave {wave} failed ({len(units)} of {of} {unit}s, "
                                           f"{budget['rule']}): {first_host(failed, rows)}")
            return
        # within budget: only the failed hosts go back (with every host of their NVLink domains), the campaign goes on
        lone = [h for h, r in rows.items() if r["changed"] and self.unit.get(h, h) in units
                and r["state"] in (HostState.FAILED, HostState.DONE)]
        if lone:
            self.journal.move(self.cid, "host_rollback", {"roll_back": lone}, reason="failed within the wave's budget")
            self.advance(lone)
            return self.run_wave(self.journal.campaign(self.cid))
        held = [h for h, r in rows.items() if r["state"] == HostState.HELD]
        if held:
            self.journal.transition(self.cid, "host_held", wave=wave,
                                    reason=f"inconclusive gate, measured twice: {first_host(held, rows)}")
        elif wave == len(self.plan["waves"]):
            self.journal.transition(self.cid, "last_wave_passed", wave=wave, summary=self.tally())
        else:
            self.journal.transition(self.cid, "wave_passed", wave=wave + 1,
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
                self.journal.transition(self.cid, "abort_requested", reason="aborted by the operator")
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
            self.clock.sleep(min(1.0, max(0.05, (wake - now_).total_seconds())))
        held = soak.held(self.journal, self.cid, gap) if watching else {}
        if held:  # the canary metrics could not be judged and the baseline says hold: a person decides
            self.journal.transition(self.cid, "soak_held", reason=f"the soak after wave {gap} is held: "
                                    + first_host(sorted(held), {h: {"reason": r} for h, r in held.items()}))
        elif self.window_closed():
            self.journal.transition(self.cid, "window_closed",
                                    reason=f"the maintenance window closed at {self.options.window_end} "
                                           f"before wave {c['wave']}")
        else:
            self.journal.transition(self.cid, "soaked", wave=c["wave"])

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
        over = []
        for wave in sorted({r["wave"] for r in rows if r["host"] in failures}):
            members = [r for r in rows if r["wave"] == wave]
            failed = {self.unit.get(r["host"], r["host"]) for r in members
                      if r["state"] in transitions.FAILED or r["host"] in failures}
            budget = self.plan["waves"][wave - 1]["budget"]
            of, unit = len({self.unit.get(r["host"], r["host"]) for r in members}), budget.get("unit", "host")
            if len(failed) >= budget["fail_at"]:
                over.append(f"wave {wave} ({len(failed)} of {of} {unit}s, {budget['rule']})")
        reasons = {h: r for h, r in failures.items()}
        text = first_host(sorted(failures), {h: {"reason": r} for h, r in failures.items()})
        if over:
            failed_waves = {int(w.split()[1]) for w in over}
            moves = {"roll_back": [r["host"] for r in rows
                                   if self.options.rollback_scope == "campaign" or r["wave"] in failed_waves],
                     "cancel": [r["host"] for r in rows if r["wave"] >= c["wave"]]}
            self.journal.transition(self.cid, "soak_failed", moves=moves, host_reasons=reasons, wave=c["wave"] - 1,
                                    reason=f"the soak after wave {c['wave'] - 1} failed, over the budget of "
                                           f"{', '.join(over)}: {text}")
            return True
        self.journal.transition(self.cid, "soak_host_failed", moves={"roll_back": list(failures)},
                                host_reasons=reasons, soak_until=c["soak_until"],
                                reason=f"failed during the soak, within the wave's budget: {text}")
        self.advance(sorted(failures))
        return False

    def window_closed(self) -> bool:
        end = self.options.window_end
        return bool(end) and self.clock.now() >= parse_time(end)

    def later(self, seconds: float) -> str:
        return later(seconds, self.clock.now())

    # ---- the host table ----------------------------------------------------------------------------------
    def advance(self, names: list[str]) -> None:
        """Move NAMES through the host table until each is in a terminal state: one step at a time, for every
        host in the earliest state (a batch: one playbook run)."""
        scope = set(names)
        while True:
            rows = [r for r in self.journal.hosts(self.cid)
                    if r["host"] in scope and not transitions.is_terminal(r["state"])]
            if not rows:
                return
            state = min((r["state"] for r in rows), key=transitions.ORDER.__getitem__)
            batch = [r["host"] for r in rows if r["state"] == state]
            step = transitions.HOST_ROWS[state].step
            self.load_befores()
            self.journal.begin_step(self.cid, batch, step)
            started, in_ansible = self.clock.monotonic(), self.parts.playbook_time.total
            results = self.parts.steps[step](self.ctx, batch)
            timing = {"batch_s": round(self.clock.monotonic() - started, 3),
                      "ansible_s": round(self.parts.playbook_time.total - in_ansible, 3)}
            for host in batch:
                o = results[host]
                self.journal.finish_step(self.cid, host, step, o.outcome, o.reason, o.detail, o.before)
            self.journal.note(self.cid, "batch_finished", step=step, batch=batch, **timing)
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
            self.journal.move(self.cid, "domain_peer_failed", {"stop": peers, "release": peers, "fail": peers},
                              reason=f"{DOMAIN_PEER}{self.unit[first]}: {first} failed "
                                     f"({rows[first]['reason'] or rows[first]['state']}): the domain moves as one",
                              host_reason=True)

    def load_befores(self) -> None:
        """What precheck recorded of each host, for the steps and the soak checks (read back: a resume has it)."""
        self.ctx.befores = {r["host"]: json.loads(r["before"]) for r in self.journal.hosts(self.cid) if r["before"]}

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
    journal.transition(cid, "rollback_requested", reason=reason, lock=True,
                       moves={"roll_back": [r["host"] for r in journal.hosts(cid)]})


def accept_held(journal: Journal, cid: int) -> None:
    """fleetctl campaign resume of a halted campaign: the operator accepts held hosts (they are undrained)."""
    held = [r["host"] for r in journal.hosts(cid) if r["state"] == HostState.HELD]
    journal.transition(cid, "resumed", reason=None, moves={"accept": held}, accepted=held, at=now())
