"""fleetctl's command line: the one layer that imports click and rich.

main.py          the root group, main() (the exit codes: orchestrator/exitcodes.py)
options.py       the options the commands share, each declared once (and the notifier they build)
output.py        -o FILE or stdout, tables on a terminal, the command line as the history keeps it, one-line errors
audit.py probe.py plan.py campaign.py (upgrade, campaign, rollback) report.py metrics.py config.py systemd.py
completion.py    one module per command group
plugins.py       commands from other distributions (entry points `fleetctl.commands`)
render.py        the audit, probe and plan tables
campaign_view.py a campaign live on a terminal, `campaign list` and `campaign show`
"""

from .main import cli, main  # noqa: F401


def __getattr__(name: str):
    """stored_argv on first use: output.py imports rich, which `fleetctl check` does without."""
    if name == "stored_argv":
        from .output import stored_argv
        return stored_argv
    raise AttributeError(name)
