"""Judging: verdicts from measurements.

    gate.py      the health gate: a host against its own probe before the change
    canary/      the canary cohort against a control cohort (its own room: kinds, planning, statistics)
    promql.py    the PromQL client the soak and the plan read the canary metrics with

May import: the shared helpers, the controls (the gate judges them), the inventory (a query names its
hosts) and notify's HTTP pieces (promql shares the webhook's TLS, headers and proxy). Never the campaign,
the plan nor a command.
"""


# What this package's modules may import of fleetctl besides each other and the shared helpers (orchestrator.SHARED;
# tests/unit/test_layers.py checks every import against them).
MAY_IMPORT = (
    "orchestrator.controls",
    "orchestrator.fleet.inventory",
    "orchestrator.notify.send",
    "orchestrator.notify.webhook",
)
