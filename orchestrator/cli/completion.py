"""`fleetctl completion SHELL`: the script click generates for shell completion (click's documented way, printed
so it can be written to a completion directory or eval'd from a shell's startup file)."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from ..exitcodes import documented

SHELLS = ("bash", "zsh", "fish")


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
@documented("completion")
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL.

    \b
    bash: eval "$(fleetctl completion bash)"   in ~/.bashrc
    zsh:  eval "$(fleetctl completion zsh)"    in ~/.zshrc
    fish: fleetctl completion fish > ~/.config/fish/completions/fleetctl.fish
    """
    # For the installed `fleetctl` command, whatever this one was started as (python -m orchestrator.cli).
    script = get_completion_class(shell)(ctx.find_root().command, {}, "fleetctl", "_FLEETCTL_COMPLETE").source()
    click.echo(script)
