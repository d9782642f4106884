"""The canary's room: the canary cohort judged against a control cohort measured at the same time (docs/canary.md).

    kinds.py     the metric kinds (level, rate): a new kind is one register() there; each kind's judge takes the
                 series (a Window) and never reads Prometheus itself
    planning.py  the cohorts a plan's hosts are judged within, each wave's control cohort, the plan-time check of
                 the baseline's canary metrics
    statistics.py  the tests, without I/O

Who reads Prometheus for the soak and calls the judge: campaign/soak.py and campaign/cohort.py. This room imports
neither the campaign nor the plan.
"""

# What this room's modules may import of fleetctl besides each other and the shared helpers (orchestrator.SHARED;
# tests/unit/test_layers.py checks it).
MAY_IMPORT = (
    "orchestrator.judge.canary.statistics",
    "orchestrator.judge.promql",
    "orchestrator.judge.gate",
    "orchestrator.fleet.inventory",
)
