"""fleetctl's root command and main(), which turns what a command raises into its exit code (orchestrator/exitcodes.py:
flags and exit codes are relied on by scripts and cron).

Each command group is a module of this package; the services they call (orchestrator/*.py) return data and events
and never import click or rich. A command's module is imported when that command is used (BUILTIN), so `fleetctl
check`, which Slurm runs on every node, imports neither Ansible nor rich nor the campaign engine."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import NoReturn

import click

from .. import __version__, interrupts, logs
from ..errors import InputError, OperationError, OutputError, stdout_failed
from ..exitcodes import Exit, documented
from . import plugins
from ..sanitize import error_line

# command name -> (module of this package, its attribute): fleetctl's own commands, imported on first use.
BUILTIN = {"audit": ("audit", "audit"), "check": ("check", "check"), "probe": ("probe", "probe"),
           "plan": ("plan", "plan"), "upgrade": ("campaign", "upgrade"), "campaign": ("campaign", "campaign"),
           "rollback": ("campaign", "rollback"), "report": ("report", "report"), "metrics": ("metrics", "metrics"),
           "hosts": ("hosts", "hosts"),
           "config": ("config", "config_group"), "completion": ("completion", "completion"),
           "systemd": ("systemd", "systemd_group")}


class Root(click.Group):
    """The root group: BUILTIN commands imported when asked for, then plugins (plugins.py) by name."""

    def get_command(self, ctx, name):
        if name not in self.commands:
            if name in BUILTIN:
                module, attr = BUILTIN[name]
                command = getattr(importlib.import_module(f"{__package__}.{module}"), attr)
                self.add_command(command(self) if name == "systemd" else command, name)  # install offers upgrade's
            else:
                plugins.add_one(self, name)
        return self.commands.get(name)

    def list_commands(self, ctx):
        return sorted(set(self.commands) | set(BUILTIN) | set(plugins.entry_points()))

    def make_context(self, *args, **kwargs):
        with stdout_errors():  # --help, --version
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with stdout_errors():
            return super().invoke(ctx)


@contextlib.contextmanager
def stdout_errors():
    """A block whose writing standard output fails (a full disk, a closed pipe or descriptor: stdout_failed)
    raises an OutputError: one line, Exit.OUTPUT. click would end a closed pipe itself silently with
    Exit.FINDINGS: "findings" to a script (Slurm drains a node whose check says so)."""
    try:
        yield
    except OSError as e:
        if not stdout_failed(e):
            raise
        raise OutputError.of_stdout(e) from None


def closed_stdout() -> None:
    """Standard output closed (`>&-`): Python leaves sys.stdout None (what is printed then vanishes, pexpect fails)
    and the next file opened would be descriptor 1, which a child process inherits as its output. Descriptor 1 is
    /dev/null open for reading instead: a command that writes standard output fails as on a closed pipe (EBADF,
    Exit.OUTPUT), one that writes -o FILE runs."""
    if sys.stdout is not None:
        return
    null = os.open(os.devnull, os.O_RDONLY)
    if null != 1:
        os.dup2(null, 1)
        os.close(null)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (standard output, for the process's life)


@click.group(cls=Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleetctl")
@click.pass_context
@documented()
def cli(ctx) -> None:
    """Keep NVIDIA GPU fleets on a known-good driver baseline.

    Flags default to the config file's values ($FLEETCTL_CONFIG, ~/.config/fleetctl/config.yml or
    /etc/fleetctl/config.yml): `fleetctl config show`.

    The history (every audit, plan, campaign and report's record) lives in $FLEETCTL_HOME, else
    $XDG_STATE_HOME/fleetctl, else ~/.local/state/fleetctl.
    """
    if ctx.invoked_subcommand != "check":  # check reads no configuration file (it runs on the nodes)
        from . import config
        config.apply(ctx)


def main() -> None:
    closed_stdout()
    logs.configure()
    interrupts.install()
    try:
        cli.main(standalone_mode=False)
    except SystemExit as e:  # a command's sys.exit(code)
        finish(e.code)
    except click.exceptions.Exit as e:
        finish(e.exit_code)
    except click.exceptions.Abort:
        click.echo("fleetctl: aborted", err=True)
        finish(Exit.INTERRUPTED)
    except click.ClickException as e:  # usage errors: one line, exit 2
        click.echo(f"fleetctl: error: {error_line(e.format_message())}", err=True)
        finish(Exit.USAGE)
    except (InputError, OperationError) as e:
        click.echo(f"fleetctl: error: {error_line(e)}", err=True)
        finish(e.exit_code, said=isinstance(e, OutputError))
    except (KeyboardInterrupt, interrupts.Interrupted) as e:
        name = e.name if isinstance(e, interrupts.Interrupted) else "SIGINT"
        hint = getattr(e, "hint", None)
        click.echo(f"fleetctl: interrupted ({name})" + (f": {hint}" if hint else ""), err=True)
        finish(e.exit_code if isinstance(e, interrupts.Interrupted) else Exit.INTERRUPTED)
    except Exception as e:
        internal_error(e)
    finish(Exit.OK)




def internal_error(e: Exception) -> NoReturn:
    """A bug: one line for the operator, the traceback with FLEETCTL_DEBUG=1."""
    if os.environ.get("FLEETCTL_DEBUG"):
        raise e
    click.echo(f"fleetctl: internal error (a bug, please report it): {type(e).__name__}: {error_line(e)}", err=True)
    finish(Exit.INTERNAL)  # never confused with "a check failed" (1) by a script


def quiet_stdout() -> None:
    """What is left for standard output goes nowhere from now on (it cannot be written): Python's own flush at exit
    then does not fail again and change the exit code."""
    with contextlib.suppress(OSError, ValueError):  # a test's stdout has no descriptor
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def finish(code: int | str | None, said: bool = False) -> NoReturn:
    """Exit with CODE once what is left of standard output is written. Where it cannot be, its one line (unless
    SAID: the command's error was that already) and Exit.OUTPUT; the rest goes nowhere, so that Python's own flush
    at exit does not fail again (and change the exit code)."""
    try:
        sys.stdout.flush()
    except OSError as e:
        if not said:
            click.echo(f"fleetctl: error: {OutputError.of_stdout(e)}", err=True)
            code = Exit.OUTPUT
        said = True
    if said:
        quiet_stdout()
    sys.exit(code)
