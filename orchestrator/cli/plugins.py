"""Commands from other distributions: click commands registered under the entry-point group `fleetctl.commands`
(`[project.entry-points."fleetctl.commands"] lab = "package.module:command"`: `fleetctl lab` from the lab's). One
that fails to load is one warning line on stderr, and fleetctl goes on without it; none replaces a built-in
command."""

from __future__ import annotations


from typing import Any

import click

from ..sanitize import clean_line

GROUP = "fleetctl.commands"


def entry_points() -> dict[str, Any]:
    """The installed plugins by name (a name twice: the first found): importlib.metadata.EntryPoint each."""
    from importlib import metadata  # here: a command of fleetctl's own never scans the installed distributions
    found: dict[str, Any] = {}
    for ep in metadata.entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def add_to(root: click.Group) -> None:
    """Every installed plugin into ROOT (those whose names ROOT has left alone)."""
    for name in sorted(entry_points()):
        add_one(root, name)


def add_one(root: click.Group, name: str) -> None:
    """The plugin NAME into ROOT, when one is installed under that name and ROOT has no command of that name."""
    ep = entry_points().get(name)
    if ep is None or name in root.commands:
        return
    try:
        command = ep.load()
        if not isinstance(command, click.Command):
            raise TypeError(f"{type(command).__name__} is not a click command")
    except Exception as e:  # a broken plugin never stands in the way of fleetctl's own commands
        click.echo(f"fleetctl: warning: command {name} ({ep.value}) not loaded: {type(e).__name__}: "
                   f"{clean_line(e)}", err=True)
        return
    root.add_command(command, name)
