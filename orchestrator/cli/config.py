"""`fleetctl config show`, and the configuration file as click's default_map: the file's keys (config.KEYS) become the
defaults of the commands' flags; `config show` offers each key as a flag of its own."""

from __future__ import annotations

import json

import click

from .. import config as config_mod, inputs, settings
from ..fleet import execution_nodes
from ..config import KEYS
from ..settings import Setting
from ..exitcodes import documented
from . import options

META = "fleetctl.config"  # the root context's meta key of the config file in use
RUNNER = "fleetctl.runner"  # and of how the command's playbooks run (runner_config)


def apply(ctx: click.Context) -> None:
    """In the root command: the file's keys become the defaults of the subcommands' flags (commands that read
    none, such as `lab down`, do not even open it: a broken file never stands in their way)."""
    if ctx.invoked_subcommand not in config_mod.COMMANDS:
        return
    cfg = config_mod.load()
    ctx.meta[META] = cfg
    nodes = cfg.values.get(settings.EXECUTION_NODES.name, [])  # no flag: the runner takes them (a bad one: exit 2)
    quiet = settings.WORKER_SILENCE  # no flag either: how long a worker may send nothing
    silence = quiet.parse(cfg.values.get(quiet.name, quiet.default))
    ctx.meta[RUNNER] = execution_nodes.RunnerConfig(
        execution_nodes.parse(nodes, inputs.shown(cfg.path)) if nodes else (), silence)
    if cfg.values:
        ctx.default_map = config_mod.merge(ctx.default_map or {}, config_mod.default_map(cfg.values))


def runner_config() -> execution_nodes.RunnerConfig:
    """How this command's playbooks run: the config file's execution nodes and worker silence (apply)."""
    return click.get_current_context().find_root().meta.get(RUNNER, execution_nodes.RunnerConfig())


def option_type(key: Setting) -> click.ParamType | None:
    """As the file has it: words, numbers and choices, checked as the file is (config.effective)."""
    return click.Choice(key.choices) if key.kind == "choice" else click.INT if key.kind == "int" else \
        click.FLOAT if key.kind == "number" else None


@click.group("config")
def config_group() -> None:
    """The configuration file: defaults for the commands' flags (a flag given wins)."""


def show_options(f):
    for key in reversed([k for k in KEYS if k.flag]):
        f = click.option(key.flag, key.name, multiple=key.many, type=option_type(key), metavar="VALUE",
                         help=f"As a command would get {key.flag}.")(f)
    return f


@config_group.command("show")
@options.fmt("table", "json")
@show_options
@click.pass_context
@documented("config show")
def config_show(ctx, fmt, **flags) -> None:
    """Each key's effective value and where it came from: flag, the file, or the built-in default.

    Give a command's flags to see what wins over the file."""
    cfg = ctx.find_root().meta.get(META) or config_mod.load()
    doc = config_mod.effective(cfg, flags)
    click.echo(json.dumps(doc, indent=2) if fmt == "json" else config_mod.text(doc), nl=fmt == "json")
