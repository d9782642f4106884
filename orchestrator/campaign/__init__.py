"""fleetctl upgrade: canary waves, health gates between waves, automatic rollback, resumable campaigns.

transitions.py   the state machine, as two tables (hosts, campaign)
journal.py       the write-ahead record in the SQLite history (steps, host states, events, host locks)
packages.py      which exact packages a host moves to, and back
hooks.py         drain / undrain command templates (the Kubernetes preset, the operator's own) run on the control node
context.py       what a step works with (Context) and returns for each host (Outcome)
steps.py         each step of the host table: one playbook run (or hook) for a batch of hosts
soak.py          the watched soak between waves
engine.py        drives a campaign from the journal: start, resume, rollback, abort
progress.py      what the operator sees: plain lines without a TTY, and the JSONL event log (the live view on a TTY:
                 cli/campaign_view.py)
readmodel.py     what `campaign show`, `campaign list` and the reports read of a campaign

The scheduler a campaign drains through (Slurm's, the templates', Kubernetes') is orchestrator/schedulers/.
"""
