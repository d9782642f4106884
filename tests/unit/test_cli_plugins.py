"""Commands from other distributions (entry points `fleetctl.commands`): loaded into the root group; one that fails
to load is one warning line on stderr and fleetctl goes on."""

from __future__ import annotations

import sys
import types
from importlib import metadata

import click
from click.testing import CliRunner
import pytest

from orchestrator.cli import plugins


@click.command()
def hello() -> None:
    """A plugin's command."""
    click.echo("hello from a plugin")


@pytest.fixture
def installed(monkeypatch):
    """Entry points as an installed distribution would declare them (a module of good and bad commands)."""
    module = types.ModuleType("fleetctl_test_plugin")
    module.hello = hello
    module.not_a_command = object()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    eps = []
    monkeypatch.setattr(metadata, "entry_points",
                        lambda group: [ep for ep in eps if ep.group == group])
    return eps


def ep(name: str, value: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name, value, plugins.GROUP)


def root() -> click.Group:
    @click.group()
    def group() -> None:
        pass

    @group.command("audit")
    def audit() -> None:
        click.echo("the built-in audit")

    return group


def test_a_plugin_becomes_a_command(installed):
    installed.append(ep("hello", "fleetctl_test_plugin:hello"))
    group = root()
    plugins.add_to(group)
    result = CliRunner().invoke(group, ["hello"])
    assert result.exit_code == 0 and result.output == "hello from a plugin\n"


@pytest.mark.parametrize("value, why", [
    ("fleetctl_no_such_module:lab", "ModuleNotFoundError: No module named 'fleetctl_no_such_module'"),
    ("fleetctl_test_plugin:missing", "AttributeError"),
    ("fleetctl_test_plugin:not_a_command", "TypeError: object is not a click command"),
])
def test_a_broken_plugin_is_one_warning_line_and_the_rest_goes_on(installed, capsys, value, why):
    installed += [ep("broken", value), ep("hello", "fleetctl_test_plugin:hello")]
    group = root()
    plugins.add_to(group)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fleetctl: warning: command broken ({value}) not loaded: ")
    assert why in err
    assert sorted(group.commands) == ["audit", "hello"]


def test_a_plugin_never_replaces_a_built_in_command(installed):
    installed.append(ep("audit", "fleetctl_test_plugin:hello"))
    group = root()
    plugins.add_to(group)
    assert CliRunner().invoke(group, ["audit"]).output == "the built-in audit\n"


def test_the_lab_distribution_registers_fleetctl_lab():
    """scripts/setup --test installs lab/ (fleetctl-lab): its entry point makes `fleetctl lab`."""
    from orchestrator import cli

    assert plugins.entry_points()["lab"].value == "fleetctl_lab.cli:lab"
    assert cli.cli.get_command(None, "lab").name == "lab"
