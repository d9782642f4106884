"""The campaign state machine: one table for hosts, one for the campaign. Everything else executes them.

A host's state names the step it does next. The step's outcome (ok, fail, inconclusive, skip) picks the next
state; a waiting step's `wait` (the host's jobs still run) keeps it. States without a row are terminal. Hosts that
reach a step together share one playbook run (a batch); with pace host each host goes on as soon as it may (its
NVLink domain's hosts move as one), with pace wave the engine runs one batch at a time, every host in the earliest
state (table order).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum

from ..exitcodes import Exit


class HostState(StrEnum):
    """A host's state in a campaign: the step it does next (a row of HOST_TABLE), or a terminal state. StrEnum: the
    history, the JSON documents and the event log hold the very same strings."""
    PRECHECK = "precheck"
    PROBE_BEFORE = "probe_before"
    DRAIN = "drain"
    WAIT_IDLE = "wait_idle"
    INSTALL = "install"
    ACTIVATE = "activate"
    VERIFY = "verify"
    PROBE_AFTER = "probe_after"
    PROBE_AGAIN = "probe_again"
    UNDRAIN = "undrain"
    RELEASE = "release"
    ROLLBACK_DRAIN = "rollback_drain"
    ROLLBACK_WAIT_IDLE = "rollback_wait_idle"
    ROLLBACK_INSTALL = "rollback_install"
    ROLLBACK_ACTIVATE = "rollback_activate"
    ROLLBACK_VERIFY = "rollback_verify"
    ROLLBACK_PROBE = "rollback_probe"
    ROLLBACK_UNDRAIN = "rollback_undrain"
    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"
    HELD = "held"
    ROLLED_BACK = "rolled_back"
    ROLLBACK_FAILED = "rollback_failed"
    NOT_STARTED = "not_started"


class CampaignState(StrEnum):
    """A campaign's state (CAMPAIGN_TABLE)."""
    RUNNING = "running"
    SOAKING = "soaking"
    HALTED = "halted"
    DONE = "done"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"


class Record(StrEnum):
    """The names of a campaign's records in the journal (its events: the history, the JSONL log and the
    notifications read the very same strings)."""
    # the campaign's own transitions (CAMPAIGN_TABLE) and the moves of hosts between the tables (EVENT_MOVES)
    CAMPAIGN_STARTED = "campaign_started"
    WAVE_PASSED = "wave_passed"
    LAST_WAVE_PASSED = "last_wave_passed"
    WAVE_FAILED = "wave_failed"
    HOST_HELD = "host_held"
    ABORT_REQUESTED = "abort_requested"
    SOAKED = "soaked"
    SOAK_FAILED = "soak_failed"
    SOAK_HOST_FAILED = "soak_host_failed"
    WINDOW_CLOSED = "window_closed"
    SOAK_HELD = "soak_held"
    CAPACITY_SPENT = "capacity_spent"
    BREAKER_TRIPPED = "breaker_tripped"
    RESUMED = "resumed"
    ROLLBACK_REQUESTED = "rollback_requested"
    ROLLBACK_FINISHED = "rollback_finished"
    HOST_ROLLBACK = "host_rollback"
    DOMAIN_PEER_FAILED = "domain_peer_failed"
    # a host's steps, and the batches that run them
    STEP_STARTED = "step_started"
    STEP_FINISHED = "step_finished"
    BATCH_FINISHED = "batch_finished"
    # notes: what happened, no state changed
    SOAK_CHECK = "soak_check"
    SOAK_CHECK_FAILED = "soak_check_failed"
    PACED = "paced"
    RESERVATION_FAILED = "reservation_failed"
    SLURM_RESERVATION = "slurm_reservation"  # --drain-preset slurm: this campaign made (is making) the one it names
    SLURM_NODE_LEFT = "slurm_node_left"  # a node it drained is no longer its own in Slurm: not resumed by it
    ABORT_REQUESTED_BY_OPERATOR = "abort_requested_by_operator"
    CAPACITY_BUDGET_CHANGED = "capacity_budget_changed"
    JUDGED = "judged"
    INTERRUPTED = "interrupted"
    NOTIFICATION_FAILED = "notification_failed"


H, C, R = HostState, CampaignState, Record


@dataclass(frozen=True)
class Row:
    state: HostState  # names the step a host in it does next
    ok: HostState
    fail: HostState
    inconclusive: HostState | None = None
    skip: HostState | None = None
    # what the step is: each is read by whoever needs it, none is kept anywhere else (`doc`: the steps reference)
    runner: str = ""             # the function of campaign/steps.py that runs it (steps.STEPS)
    read_only: bool = field(default=False, metadata={"doc": "the step only looks (a wave whose hosts ran nothing "
                                                            "else may still be stopped cleanly)"})
    hook: bool = field(default=False, metadata={"doc": "it runs the drain/undrain hook on the control node, not a "
                                                       "playbook"})
    changes_host: bool = field(default=False, metadata={"doc": "once begun, the host counts as changed (a rollback "
                                                               "concerns it)"})
    waits: bool = field(default=False, metadata={"doc": "it may answer `wait` (the host's jobs still run): the host "
                                                        "stays, looked at again every idle poll, until --idle-timeout"})

    @property
    def step(self) -> HostState:
        return self.state

    def next(self, outcome: str) -> HostState:
        target = getattr(self, outcome)
        if target is None:
            raise ValueError(f"step {self.step}: outcome {outcome!r} has no transition from {self.state}")
        return target


_ = None
LOOKS, HOOK, CHANGES, WAITS = {"read_only": True}, {"hook": True}, {"changes_host": True}, {"waits": True}
HOST_TABLE = (
    # state (the step)      ok                    fail               inconclusive       skip
    #   runner (steps.py)                      what the step is
    Row(H.PRECHECK,           H.PROBE_BEFORE,       H.FAILED,          _,                 H.SKIPPED,
        runner="precheck",                     **LOOKS),
    Row(H.PROBE_BEFORE,       H.DRAIN,              H.FAILED,
        runner="probe_before",                 **LOOKS),
    Row(H.DRAIN,              H.WAIT_IDLE,          H.RELEASE,
        runner="drain",                        **HOOK),
    Row(H.WAIT_IDLE,          H.INSTALL,            H.RELEASE,
        runner="wait_idle",                    **WAITS),
    Row(H.INSTALL,            H.ACTIVATE,           H.FAILED,
        runner="install",                      **CHANGES),
    Row(H.ACTIVATE,           H.VERIFY,             H.FAILED,
        runner="activate"),
    Row(H.VERIFY,             H.PROBE_AFTER,        H.FAILED,
        runner="verify"),
    Row(H.PROBE_AFTER,        H.UNDRAIN,            H.FAILED,          H.PROBE_AGAIN,
        runner="probe_after"),
    Row(H.PROBE_AGAIN,        H.UNDRAIN,            H.FAILED,          H.HELD,
        runner="probe_after"),
    Row(H.UNDRAIN,            H.DONE,               H.FAILED,
        runner="undrain",                      **HOOK),
    Row(H.RELEASE,            H.FAILED,             H.FAILED,
        runner="undrain",                      **HOOK),
    # rollback to the exact versions recorded before the campaign touched the host
    Row(H.ROLLBACK_DRAIN,     H.ROLLBACK_WAIT_IDLE, H.ROLLBACK_FAILED,
        runner="drain",                        **HOOK),
    Row(H.ROLLBACK_WAIT_IDLE, H.ROLLBACK_INSTALL,   H.ROLLBACK_FAILED,
        runner="wait_idle",                    **WAITS),
    Row(H.ROLLBACK_INSTALL,   H.ROLLBACK_ACTIVATE,  H.ROLLBACK_FAILED,
        runner="rollback_install"),
    Row(H.ROLLBACK_ACTIVATE,  H.ROLLBACK_VERIFY,    H.ROLLBACK_FAILED,
        runner="rollback_activate"),
    Row(H.ROLLBACK_VERIFY,    H.ROLLBACK_PROBE,     H.ROLLBACK_FAILED,
        runner="rollback_verify"),
    Row(H.ROLLBACK_PROBE,     H.ROLLBACK_UNDRAIN,   H.ROLLBACK_FAILED, H.ROLLBACK_UNDRAIN,
        runner="rollback_probe"),
    Row(H.ROLLBACK_UNDRAIN,   H.ROLLED_BACK,        H.ROLLBACK_FAILED,
        runner="undrain",                      **HOOK),
)
HOST_ROWS = {r.state: r for r in HOST_TABLE}
ORDER = {r.state: i for i, r in enumerate(HOST_TABLE)}

# Terminal host states. A host counts against its wave's budget when it ends failed, held for a person
# does not; "changed" (the install step began) decides whether a rollback concerns it.
TERMINAL = (H.DONE, H.SKIPPED, H.FAILED, H.HELD, H.ROLLED_BACK, H.ROLLBACK_FAILED, H.NOT_STARTED)
FAILED = (H.FAILED, H.ROLLED_BACK, H.ROLLBACK_FAILED)
HOST_START = HOST_TABLE[0].state
ROLLBACK_START = H.ROLLBACK_DRAIN
IN_ROLLBACK = tuple(s for s in HostState if s.startswith("rollback_"))  # the rollback's steps and rollback_failed
# Read off the host table, for those who ask by name.
# Hosts in them have changed nothing yet; a state names its step (a HostState equals its step's name).
READ_ONLY_STATES = tuple(r.state for r in HOST_TABLE if r.read_only)
HOOK_STEPS = tuple(r.step for r in HOST_TABLE if r.hook)
ATTRIBUTES = {f.name: f.metadata["doc"] for f in fields(Row) if "doc" in f.metadata}  # what a step is, in words
WAITING = tuple(r.state for r in HOST_TABLE if r.waits)
WAIT = "wait"  # a waiting step's answer while the host's jobs still run: no transition, looked at again later
# Before the drain: the steps a host goes through still in service (--drain-mode reservation holds a wave's nodes
# from when its drain is due: after these).
BEFORE_DRAIN = tuple(r.state for r in HOST_TABLE if ORDER[r.state] < ORDER[H.DRAIN])
# Out of service: drained, not back yet (a state names the step done next: undrain is still drained).
OUT_OF_SERVICE = tuple(r.state for r in HOST_TABLE if ORDER[H.DRAIN] < ORDER[r.state] <= ORDER[H.RELEASE]
                       or ORDER[H.ROLLBACK_DRAIN] < ORDER[r.state])


@dataclass(frozen=True)
class Move:
    """Hosts put in a state outside the host table: of the hosts named, those the move concerns go to TO."""
    to: HostState
    changed: bool = False                         # only hosts the campaign changed
    unchanged: bool = False                       # only hosts the campaign has not changed
    only: tuple[HostState, ...] | None = None     # only hosts in one of these states
    never: tuple[HostState, ...] = ()             # never hosts in one of these states

    def concerns(self, state: str, changed: bool) -> bool:
        return ((changed or not self.changed) and (not changed or not self.unchanged)
                and (self.only is None or state in self.only) and state not in self.never)


def moves_of(table: tuple[Row, ...]) -> dict[str, Move]:
    """The moves, read off a host TABLE: which hosts each concerns follows from where the table drains a host (its
    first hook step), where it first changes it (its first changes_host step), where it undrains it (the next hook
    step), where a held host was (the step whose inconclusive holds it) and where the rollback ends."""
    order = [r.state for r in table]

    def between(first: HostState, last: HostState) -> tuple[HostState, ...]:
        return tuple(order[order.index(first):order.index(last) + 1])

    drain = next(r.state for r in table if r.hook)
    drained = table[order.index(drain) + 1]  # a drained host's first step: its failure undrains the host
    change = next(r.state for r in table if r.changes_host)
    undrain = next(r.state for r in table[order.index(change):] if r.hook)
    held_at = next(r for r in table if r.inconclusive == H.HELD)
    rollback = [r for r in table if r.state in IN_ROLLBACK]
    looks = tuple(r.state for r in table if r.read_only)
    return {
        # move       -> host state          which of the hosts named it concerns
        "roll_back": Move(rollback[0].state, changed=True, never=(rollback[-1].ok, rollback[-1].fail)),
        "cancel":    Move(H.NOT_STARTED),                                # a later wave that will not run
        "accept":    Move(held_at.ok,        only=(H.HELD,)),            # the operator accepts a held host
        "abandon":   Move(H.NOT_STARTED,     only=looks),                # aborted before anything changed it
        # a host of its NVLink domain failed: the others stop where they are, the domain moves as one
        "stop":      Move(H.FAILED,          only=between(order[0], drain)),  # nothing done to it yet
        "release":   Move(drained.fail,      unchanged=True, only=between(drained.state, change)),  # undrained
        "fail":      Move(H.FAILED,          changed=True, only=between(change, undrain)),  # goes back with it
    }


MOVES = moves_of(HOST_TABLE)

# The events that move hosts between the tables, and how; Journal.transition (and Journal.move, for a host's own
# rollback within its wave's budget) apply them in the event's transaction, in this order.
EVENT_MOVES = {
    R.WAVE_FAILED:            ("roll_back", "cancel"),
    R.SOAK_FAILED:            ("roll_back", "cancel"),
    R.SOAK_HOST_FAILED:       ("roll_back",),
    R.HOST_ROLLBACK:          ("roll_back",),
    R.DOMAIN_PEER_FAILED:     ("stop", "release", "fail"),
    R.ROLLBACK_REQUESTED:     ("roll_back",),
    R.RESUMED:                ("accept",),
    R.ABORT_REQUESTED:        ("abandon",),
}


def moves_for(event: str, moves: dict[str, list[str]]) -> list[tuple[str, Move, list[str]]]:
    """MOVES (move name -> hosts named) checked against what EVENT may do, in the table's order."""
    allowed = EVENT_MOVES.get(event, ())
    for name in moves:
        if name not in allowed:
            raise ValueError(f"event {event!r} cannot {name} hosts")
    return [(name, MOVES[name], list(moves[name])) for name in allowed if name in moves]


CAMPAIGN_TABLE = {
    # (state, event)                      -> next state
    (C.RUNNING, R.WAVE_PASSED):           C.SOAKING,
    (C.RUNNING, R.LAST_WAVE_PASSED):      C.DONE,
    (C.RUNNING, R.WAVE_FAILED):           C.ROLLING_BACK,
    (C.RUNNING, R.HOST_HELD):             C.HALTED,
    (C.RUNNING, R.ABORT_REQUESTED):       C.ABORTED,
    (C.SOAKING, R.SOAKED):                C.RUNNING,
    # the watched soak (campaign/soak.py): a changed host failed a check; over its wave's budget the campaign
    # rolls back (scope as for a failed wave), within it that host rolls back alone and the soak goes on
    (C.SOAKING, R.SOAK_FAILED):           C.ROLLING_BACK,
    (C.SOAKING, R.SOAK_HOST_FAILED):      C.SOAKING,
    (C.SOAKING, R.WINDOW_CLOSED):         C.HALTED,
    # the canary metrics could not be judged at the end of the soak and the baseline's canary.on_missing is hold:
    # a person decides (campaign resume goes on with the next wave, rollback takes the changed hosts back)
    (C.SOAKING, R.SOAK_HELD):             C.HALTED,
    (C.SOAKING, R.ABORT_REQUESTED):       C.ABORTED,
    (C.RUNNING, R.WINDOW_CLOSED):         C.HALTED,
    # --capacity-budget spent with no host out of service: waiting gives nothing back; a person decides (abort,
    # rollback, or resume to try again: each resume drains no host the budget does not allow)
    (C.RUNNING, R.CAPACITY_SPENT):        C.HALTED,
    # the circuit breaker (baseline campaign.breaker): the campaign's failures within its window, across waves each
    # within its own budget, reached its limit; a person decides (resume goes on, counting only later failures)
    (C.RUNNING, R.BREAKER_TRIPPED):       C.HALTED,
    (C.SOAKING, R.BREAKER_TRIPPED):       C.HALTED,
    (C.HALTED, R.RESUMED):                C.RUNNING,
    (C.HALTED, R.ABORT_REQUESTED):        C.ABORTED,
    (C.HALTED, R.ROLLBACK_REQUESTED):     C.ROLLING_BACK,
    (C.DONE, R.ROLLBACK_REQUESTED):       C.ROLLING_BACK,
    (C.ABORTED, R.ROLLBACK_REQUESTED):    C.ROLLING_BACK,
    (C.ROLLING_BACK, R.ROLLBACK_FINISHED): C.ROLLED_BACK,
}
CAMPAIGN_START = C.RUNNING
CAMPAIGN_TERMINAL = (C.DONE, C.ROLLED_BACK, C.ABORTED)
CAMPAIGN_AT_WORK = (C.RUNNING, C.SOAKING, C.ROLLING_BACK)  # a process drives it (a crash leaves it so)
# A campaign's exit code by its state. Besides: done with hosts off the target (failed, each rolled back within
# the budget, or left out at plan) is Exit.FINDINGS, and a host whose rollback failed makes it Exit.NEEDS_PERSON.
CAMPAIGN_EXIT = {C.DONE: Exit.OK, C.ROLLED_BACK: Exit.ROLLED_BACK, C.HALTED: Exit.HALTED, C.ABORTED: Exit.HALTED}


def campaign_next(state: str, event: str) -> CampaignState:
    try:
        return CAMPAIGN_TABLE[(state, event)]
    except KeyError:
        raise ValueError(f"campaign in state {state!r} cannot take event {event!r}") from None


def is_terminal(state: str) -> bool:
    return state in TERMINAL
