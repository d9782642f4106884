"""fleetctl upgrade: canary waves, health gates between waves, automatic rollback, resumable campaigns.

transitions.py   the state machine, as two tables (hosts, campaign)
journal.py       the write-ahead record in the SQLite history (steps, host states, events, host locks)
packages.py      which exact packages a host moves to, and back
hooks.py         drain / undrain commands (Slurm, Kubernetes presets) run on the control node
steps.py         each step of the host table: one playbook run (or hook) for a batch of hosts
engine.py        drives a campaign from the journal: start, resume, rollback, abort
progress.py      what the operator sees: plain lines without a TTY, and the JSONL event log (the live view on a TTY:
                 cli/campaign_view.py)
"""
