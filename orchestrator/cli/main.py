"""fleetctl's root command and its exit codes (the README: flags and exit codes are relied on by scripts and cron).

Each command group is a module of this package; the services they call (orchestrator/*.py) return data and events
and never import click or rich."""

from __future__ import annotations

import os
import sys

import click

from .. import __version__, interrupts, logs
from ..errors import InputError, OperationError
from . import audit, campaign, completion, config, metrics, plan, plugins, probe, report, systemd
from ..sanitize import clean_line

EXIT_USAGE = 2
EXIT_INTERNAL = 70  # a fleetctl bug: never confused with "findings" (1) by a script


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleetctl")
@click.pass_context
def cli(ctx) -> None:
    """Keep NVIDIA GPU fleets on a known-good driver baseline.

    Flags default to the config file's values ($FLEETCTL_CONFIG, ~/.config/fleetctl/config.yml or
    /etc/fleetctl/config.yml): `fleetctl config show`.
    """
    config.apply(ctx)


for command in (audit.audit, probe.probe, plan.plan, campaign.upgrade, campaign.campaign, campaign.rollback,
                report.report, metrics.metrics, config.config_group, completion.completion):
    cli.add_command(command)
cli.add_command(systemd.systemd_group(cli))  # after `upgrade`: install offers its options
plugins.add_to(cli)


def main() -> None:
    logs.configure()
    interrupts.install()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("fleetctl: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:  # usage errors: one line, exit 2
        click.echo(f"fleetctl: error: {clean_line(e.format_message())}", err=True)
        sys.exit(EXIT_USAGE)
    except (InputError, OperationError) as e:
        click.echo(f"fleetctl: error: {clean_line(e)}", err=True)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, interrupts.Interrupted) as e:
        name = e.name if isinstance(e, interrupts.Interrupted) else "SIGINT"
        hint = getattr(e, "hint", None)
        click.echo(f"fleetctl: interrupted ({name})" + (f": {hint}" if hint else ""), err=True)
        sys.exit(e.exit_code if isinstance(e, interrupts.Interrupted) else 130)
    except Exception as e:  # a bug: one line for the operator, the traceback with FLEETCTL_DEBUG=1
        if os.environ.get("FLEETCTL_DEBUG"):
            raise
        click.echo(f"fleetctl: internal error (a bug, please report it): {type(e).__name__}: {clean_line(e)}", err=True)
        sys.exit(EXIT_INTERNAL)

