"""The schedulers a campaign drains through, one interface (below), one module each; and Slurm's own view.

    slurmctl.py   Slurm's view of its nodes and the node-state changes fleetctl makes (sinfo, scontrol)
    slurm.py      drains fleetctl owns (--drain-preset slurm), over slurmctl.py
    templates.py  drains by command templates: the operator's, the Kubernetes preset
    nodes.py      what every scheduler shares
    scheduler.py  the interface (Scheduler) and the campaign's scheduler from its drain options (of)

May import: the shared helpers, the fleet, and the campaign's context, journal, options, hooks and
transitions (a scheduler acts inside a campaign). Never the engine, the steps nor a command.
"""

MAY_IMPORT = (
    "orchestrator.fleet",
    "orchestrator.campaign.context",
    "orchestrator.campaign.journal",
    "orchestrator.campaign.options",
    "orchestrator.campaign.hooks",
    "orchestrator.campaign.transitions",
)
