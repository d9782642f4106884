"""The options the commands share (as pip's cli/cmdoptions.py declares its options): a command takes one as a
decorator, `@options.inventory()`, and may word the help for itself. A setting's option follows from its one
declaration in orchestrator/settings.py (`option(settings.SOAK)`), its time flags read by Duration. The notification
flags and the notifier they build are here too: the services are given the notifier, they never look for it."""

from __future__ import annotations

import functools
from typing import Callable

import click

from ..notify import send as notify
from ..judge import promql
from .. import settings
from ..notify.send import build as build_notifier  # the wrapper's `notify` parameter hides the module
from ..settings import Setting

CAMPAIGN_ID = click.IntRange(1, 2**63 - 1)  # what SQLite can look up: a bigger number is a usage error, not a crash
NOTIFIER = "fleetctl.notifier"  # the context's meta key of the command's notifier
PROMETHEUS = "fleetctl.prometheus"  # the context's meta key of the command's Prometheus client

OWN_INVENTORY_HELP = "Default: the campaign's own."
OWN_BASELINE_HELP = "Default: the campaign's own (unchanged)."
HOST_PATTERNS_HELP = "Hosts or groups (shell patterns, comma separated)."


class Duration(click.ParamType):
    """A duration flag (settings.Setting.duration): 90, 90s, 5m, 2h -> seconds; a comma list of them for a
    `durations` setting (--soak) -> a tuple. Out of the setting's bounds, or not a duration: a usage error."""

    name = "duration"

    def __init__(self, setting: Setting):
        self.setting = setting

    def convert(self, value, param, ctx):
        try:
            if isinstance(value, tuple) and value and self.setting.kind == "durations":  # converted: checked again
                return tuple(self.setting.duration(v) for v in value)
            return self.setting.parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)

    @staticmethod
    def text(value: float | tuple[float, ...]) -> str:
        """VALUE as a word this type reads back (a systemd unit's command line)."""
        return ",".join(map(settings.duration_text, value)) if isinstance(value, tuple) else \
            settings.duration_text(value)


def param_type(s: Setting) -> click.ParamType | None:
    if s.kind == "int":
        return click.IntRange(s.minimum, s.maximum)
    if s.kind == "number":
        return click.FloatRange(s.minimum, s.maximum, min_open=s.above)
    if s.kind == "choice":
        return click.Choice(s.choices)
    return Duration(s) if s.timed else None


def option(s: Setting, help: str | None = None, **changes) -> Callable:
    """S as a click option; HELP: the command's own wording of it; CHANGES: click.option's arguments where a
    command takes it otherwise (upgrade's --samples minimum, a command's --format choices)."""
    flags = [s.short, s.flag] if s.short else [s.flag]
    help = help or s.help
    if s.kind == "switch":
        return click.option(*flags, s.param, is_flag=True, help=help,
                            **({"flag_value": s.flag_value} if s.flag_value else {}), **changes)
    if s.timed and s.bounds:
        help = f"{help.rstrip('.')} ({s.bounds})."
    given = {"type": param_type(s), "default": s.default, "multiple": s.many, "show_default": s.default is not None,
             "metavar": s.metavar, "help": help, **changes}
    if given.get("required") and s.default is None:
        given.pop("default")  # click's "Missing option", not a None given
    return click.option(*flags, s.param, **given)


def declared(*names: Setting) -> Callable:
    """The options of NAMES, in that order (a command's help lists them so)."""
    def add(f: Callable) -> Callable:
        for s in reversed(names):
            f = option(s)(f)
        return f
    return add


def campaign(**own: Callable) -> Callable:
    """The campaign's options (settings.CAMPAIGN, in their order): `upgrade` hands them to the campaign as they
    are, by their parameters. OWN: a setting's option (by its name) as the command words it itself."""
    def add(f: Callable) -> Callable:
        for s in reversed(settings.CAMPAIGN):
            f = own[s.name](f) if s.name in own else option(s)(f)
        return f
    assert set(own) <= {s.name for s in settings.CAMPAIGN}, own
    return add


def inventory(help: str | None = None) -> Callable:
    return option(settings.INVENTORY, help)


def limit(help: str) -> Callable:
    return option(settings.LIMIT, help)


def baseline(help: str) -> Callable:
    return option(settings.BASELINE, help)


def output(help: str | None = None) -> Callable:
    return option(settings.OUTPUT, help)


def fmt(*choices: str) -> Callable:
    """--format, its first choice the default."""
    assert set(choices) <= set(settings.FORMAT.choices), choices
    return option(settings.FORMAT, type=click.Choice(list(choices)), default=choices[0], show_default=True)


def forks(help: str | None = None) -> Callable:
    return option(settings.FORKS, help)


def no_preflight(help: str | None = None) -> Callable:
    return option(settings.NO_PREFLIGHT, help)


def target(required: bool = True, help: str | None = None) -> Callable:
    return option(settings.TARGET, help, required=required)


def waves() -> Callable:
    return option(settings.WAVES)


def window(help: str | None = None) -> Callable:
    return option(settings.WINDOW, help)


def samples(minimum: int, help: str | None = None) -> Callable:
    return option(settings.SAMPLES, help, type=click.IntRange(minimum, settings.SAMPLES.maximum))


def warmup(help: str | None = None) -> Callable:
    return option(settings.WARMUP, help)


def trial(help: str | None = None) -> Callable:
    return option(settings.TRIAL, help)


def campaign_id(required: bool = True) -> Callable:
    return click.argument("campaign_id", type=CAMPAIGN_ID, required=required)


def unit_dir(default: str) -> Callable:
    return option(settings.UNIT_DIR, default=default, show_default=True)


def notifications(f: Callable) -> Callable:
    """The notification flags, for audit, probe, upgrade, campaign resume and rollback: the command finds its
    notifier (checked before anything runs) with notifier()."""

    @functools.wraps(f)
    def command(*args, notify, webhook, webhook_format, webhook_headers, webhook_ca, notify_timeout, **kwargs):
        click.get_current_context().meta[NOTIFIER] = build_notifier(notify, webhook, webhook_format, webhook_headers,
                                                                    webhook_ca, notify_timeout)
        return f(*args, **kwargs)

    for s in reversed(NOTIFICATIONS):
        command = option(s)(command)
    return command


NOTIFICATIONS = (settings.NOTIFY, settings.WEBHOOK, settings.WEBHOOK_FORMAT, settings.WEBHOOK_HEADERS,
                 settings.WEBHOOK_CA, settings.NOTIFY_TIMEOUT)


def prometheus(f: Callable) -> Callable:
    """The Prometheus flags, for plan, upgrade and campaign resume: the command finds its client (checked before
    anything runs: the URL, the headers file) with prometheus_client()."""

    @functools.wraps(f)
    def command(*args, prometheus_url, prometheus_headers, prometheus_timeout, **kwargs):
        click.get_current_context().meta[PROMETHEUS] = promql.client(prometheus_url, prometheus_headers,
                                                                     prometheus_timeout)
        return f(*args, **kwargs)

    for s in reversed(PROMETHEUS_SETTINGS):
        command = option(s)(command)
    return command


PROMETHEUS_SETTINGS = (settings.PROMETHEUS_URL, settings.PROMETHEUS_HEADERS, settings.PROMETHEUS_TIMEOUT)


def prometheus_client() -> promql.Client | None:
    """The client the command's Prometheus flags built (None without --prometheus-url)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(PROMETHEUS) if ctx is not None else None


def notifier() -> notify.Notifier | None:
    """The notifier the command's notification flags built (None without a target)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(NOTIFIER) if ctx is not None else None
