"""The campaign state machine: one table for hosts, one for the campaign. Everything else executes them.

A host's state names the step it does next. The step's outcome (ok, fail, inconclusive, skip) picks the next
state. States without a row are terminal. Hosts of a wave move together: the engine runs one step at a time for
every host in the earliest state (table order), so each step is one playbook run over a batch of hosts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    state: str
    step: str
    ok: str
    fail: str
    inconclusive: str | None = None
    skip: str | None = None
    # what the step is: each is read by whoever needs it, none is kept anywhere else
    runner: str = ""             # the function of campaign/steps.py that runs it (steps.STEPS)
    read_only: bool = False      # only looks: a wave whose hosts ran nothing else may still be stopped cleanly
    hook: bool = False           # runs the drain/undrain hook on the control node, not a playbook
    changes_host: bool = False   # changes packages: once it has begun, the host is "changed" (a rollback concerns it)

    def next(self, outcome: str) -> str:
        target = getattr(self, outcome)
        if target is None:
            raise ValueError(f"step {self.step}: outcome {outcome!r} has no transition from {self.state}")
        return target


_ = None
LOOKS, HOOK, CHANGES = {"read_only": True}, {"hook": True}, {"changes_host": True}
HOST_TABLE = (
    # state              step                ok                   fail              inconclusive      skip
    #                    runner (steps.py)   what the step is
    Row("precheck",          "precheck",          "probe_before",      "failed",         _,                "skipped",
        runner="precheck",                        **LOOKS),
    Row("probe_before",      "probe_before",      "drain",             "failed",
        runner="probe_before",                    **LOOKS),
    Row("drain",             "drain",             "wait_idle",         "release",
        runner="drain",                           **HOOK),
    Row("wait_idle",         "wait_idle",         "install",           "release",
        runner="wait_idle"),
    Row("install",           "install",           "activate",          "failed",
        runner="install",                         **CHANGES),
    Row("activate",          "activate",          "verify",            "failed",
        runner="activate"),
    Row("verify",            "verify",            "probe_after",       "failed",
        runner="verify"),
    Row("probe_after",       "probe_after",       "undrain",           "failed",         "probe_again",
        runner="probe_after"),
    Row("probe_again",       "probe_again",       "undrain",           "failed",         "held",
        runner="probe_after"),
    Row("undrain",           "undrain",           "done",              "failed",
        runner="undrain",                         **HOOK),
    Row("release",           "release",           "failed",            "failed",
        runner="undrain",                         **HOOK),
    # rollback to the exact versions recorded before the campaign touched the host
    Row("rollback_drain",    "rollback_drain",    "rollback_wait_idle", "rollback_failed",
        runner="drain",                           **HOOK),
    Row("rollback_wait_idle", "rollback_wait_idle", "rollback_install", "rollback_failed",
        runner="wait_idle"),
    Row("rollback_install",  "rollback_install",  "rollback_activate", "rollback_failed",
        runner="rollback_install"),
    Row("rollback_activate", "rollback_activate", "rollback_verify",   "rollback_failed",
        runner="rollback_activate"),
    Row("rollback_verify",   "rollback_verify",   "rollback_probe",    "rollback_failed",
        runner="rollback_verify"),
    Row("rollback_probe",    "rollback_probe",    "rollback_undrain",  "rollback_failed", "rollback_undrain",
        runner="rollback_probe"),
    Row("rollback_undrain",  "rollback_undrain",  "rolled_back",       "rollback_failed",
        runner="undrain",                         **HOOK),
)
HOST_ROWS = {r.state: r for r in HOST_TABLE}
ORDER = {r.state: i for i, r in enumerate(HOST_TABLE)}

# Terminal host states. A host counts against its wave's budget when it ends failed, held for a person
# does not; "changed" (the install step began) decides whether a rollback concerns it.
TERMINAL = ("done", "skipped", "failed", "held", "rolled_back", "rollback_failed", "not_started")
FAILED = ("failed", "rolled_back", "rollback_failed")
ROLLBACK_START = "rollback_drain"
# Read off the host table, for those who ask by name.
READ_ONLY_STEPS = tuple(r.step for r in HOST_TABLE if r.read_only)
HOOK_STEPS = tuple(r.step for r in HOST_TABLE if r.hook)
CHANGES_HOST = tuple(r.step for r in HOST_TABLE if r.changes_host)


@dataclass(frozen=True)
class Move:
    """Hosts put in a state outside the host table: of the hosts named, those the move concerns go to TO."""
    to: str
    changed: bool = False                   # only hosts the campaign changed
    only: tuple[str, ...] | None = None     # only hosts in one of these states
    never: tuple[str, ...] = ()             # never hosts in one of these states

    def concerns(self, state: str, changed: bool) -> bool:
        return ((changed or not self.changed) and (self.only is None or state in self.only)
                and state not in self.never)


MOVES = {
    # move         -> host state         which of the hosts named it concerns
    "roll_back":   Move(ROLLBACK_START,  changed=True, never=("rolled_back", "rollback_failed")),
    "cancel":      Move("not_started"),                      # a later wave that will not run
    "accept":      Move("undrain",       only=("held",)),    # the operator accepts a held host
    "abandon":     Move("not_started",   only=READ_ONLY_STEPS),  # aborted before anything changed it
}
# The events that move hosts between the tables, and how; Journal.transition (and Journal.move, for a host's own
# rollback within its wave's budget) apply them in the event's transaction, in this order.
EVENT_MOVES = {
    "wave_failed":        ("roll_back", "cancel"),
    "soak_failed":        ("roll_back", "cancel"),
    "soak_host_failed":   ("roll_back",),
    "host_rollback":      ("roll_back",),
    "rollback_requested": ("roll_back",),
    "resumed":            ("accept",),
    "abort_requested":    ("abandon",),
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
    ("running", "wave_passed"):           "soaking",
    ("running", "last_wave_passed"):      "done",
    ("running", "wave_failed"):           "rolling_back",
    ("running", "host_held"):             "halted",
    ("running", "abort_requested"):       "aborted",
    ("soaking", "soaked"):                "running",
    # the watched soak (campaign/soak.py): a changed host failed a check; over its wave's budget the campaign
    # rolls back (scope as for a failed wave), within it that host rolls back alone and the soak goes on
    ("soaking", "soak_failed"):           "rolling_back",
    ("soaking", "soak_host_failed"):      "soaking",
    ("soaking", "window_closed"):         "halted",
    ("soaking", "abort_requested"):       "aborted",
    ("running", "window_closed"):         "halted",
    ("halted", "resumed"):                "running",
    ("halted", "abort_requested"):        "aborted",
    ("halted", "rollback_requested"):     "rolling_back",
    ("done", "rollback_requested"):       "rolling_back",
    ("aborted", "rollback_requested"):    "rolling_back",
    ("rolling_back", "rollback_finished"): "rolled_back",
}
CAMPAIGN_TERMINAL = ("done", "rolled_back", "aborted")
CAMPAIGN_EXIT = {"done": 0, "rolled_back": 4, "halted": 5, "aborted": 5}
EXIT_HOSTS_OFF_TARGET = 1  # done, but hosts failed (each rolled back within the budget) or were left out at plan
EXIT_NEEDS_PERSON = 6  # a host could not be rolled back: neither on its recorded packages nor known good


def campaign_next(state: str, event: str) -> str:
    try:
        return CAMPAIGN_TABLE[(state, event)]
    except KeyError:
        raise ValueError(f"campaign in state {state!r} cannot take event {event!r}") from None


def is_terminal(state: str) -> bool:
    return state in TERMINAL
