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

    def next(self, outcome: str) -> str:
        target = getattr(self, outcome)
        if target is None:
            raise ValueError(f"step {self.step}: outcome {outcome!r} has no transition from {self.state}")
        return target


_ = None
HOST_TABLE = (
    # state              step                ok                   fail              inconclusive      skip
    Row("precheck",          "precheck",          "probe_before",      "failed",         _,                "skipped"),
    Row("probe_before",      "probe_before",      "drain",             "failed"),
    Row("drain",             "drain",             "wait_idle",         "release"),
    Row("wait_idle",         "wait_idle",         "install",           "release"),
    Row("install",           "install",           "activate",          "failed"),
    Row("activate",          "activate",          "verify",            "failed"),
    Row("verify",            "verify",            "probe_after",       "failed"),
    Row("probe_after",       "probe_after",       "undrain",           "failed",         "probe_again"),
    Row("probe_again",       "probe_again",       "undrain",           "failed",         "held"),
    Row("undrain",           "undrain",           "done",              "failed"),
    Row("release",           "release",           "failed",            "failed"),
    # rollback to the exact versions recorded before the campaign touched the host
    Row("rollback_drain",    "rollback_drain",    "rollback_wait_idle", "rollback_failed"),
    Row("rollback_wait_idle", "rollback_wait_idle", "rollback_install", "rollback_failed"),
    Row("rollback_install",  "rollback_install",  "rollback_activate", "rollback_failed"),
    Row("rollback_activate", "rollback_activate", "rollback_verify",   "rollback_failed"),
    Row("rollback_verify",   "rollback_verify",   "rollback_probe",    "rollback_failed"),
    Row("rollback_probe",    "rollback_probe",    "rollback_undrain",  "rollback_failed", "rollback_undrain"),
    Row("rollback_undrain",  "rollback_undrain",  "rolled_back",       "rollback_failed"),
)
HOST_ROWS = {r.state: r for r in HOST_TABLE}
ORDER = {r.state: i for i, r in enumerate(HOST_TABLE)}

# Terminal host states. A host counts against its wave's budget when it ends failed, held for a person
# does not; "changed" (the install step began) decides whether a rollback concerns it.
TERMINAL = ("done", "skipped", "failed", "held", "rolled_back", "rollback_failed", "not_started")
FAILED = ("failed", "rolled_back", "rollback_failed")
ROLLBACK_START = "rollback_drain"
# Steps that change a host's packages: once one has begun, the host is "changed" by the campaign.
CHANGES_HOST = ("install",)


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
