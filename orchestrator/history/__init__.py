"""The history: what fleetctl remembers and can prove.

    store.py      the SQLite history (runs, hosts, findings)
    chain.py      the tamper-evident hash chain over every record
    signing.py    detached signatures of exports
    ledger.py     each host's incidents and observations, derived from the history
    offenders.py  repeat offenders, from the ledger
    timefmt.py    the history's timestamps

May import: the shared helpers (errors, exitcodes, sanitize, inputs, files, settings...) and a campaign's
record and state names (campaign/transitions.py: the journal writes what the chain covers). Never the
fleet, the judges, the notifications nor a command.
"""

# What this package's modules may import of fleetctl besides each other and the shared helpers (orchestrator.SHARED;
# tests/unit/test_layers.py checks every import against them).
MAY_IMPORT = (
    "orchestrator.campaign.transitions",
)
