"""The options the commands share, each declared once (as pip's cli/cmdoptions.py declares its options): a command
takes one as a decorator, `@options.inventory()`, and may word the help for itself. The notification flags and the
notifier they build are here too: the services are given the notifier, they never look for it."""

from __future__ import annotations

import functools
from typing import Callable

import click

from .. import notify
from ..notify import build as build_notifier  # the wrapper's `notify` parameter hides the module

CAMPAIGN_ID = click.IntRange(1, 2**63 - 1)  # what SQLite can look up: a bigger number is a usage error, not a crash
NOTIFIER = "fleetctl.notifier"  # the context's meta key of the command's notifier

INVENTORY_HELP = "Ansible inventory. Default: localhost over the local connection."
OWN_INVENTORY_HELP = "Default: the campaign's own."
OWN_BASELINE_HELP = "Default: the campaign's own (unchanged)."
PREFLIGHT_HELP = "Skip the SSH reachability and host-key pre-flight."
FORKS_HELP = "Hosts worked on at once (default: all, up to 64)."
OUTPUT_HELP = "Write the report to FILE (atomically) instead of stdout."
HOST_PATTERNS_HELP = "Hosts or groups (shell patterns, comma separated)."
WAVES_HELP = "Cumulative wave targets: host counts or percentages of the eligible hosts, ending at 100%."


def inventory(help: str = INVENTORY_HELP) -> Callable:
    return click.option("-i", "--inventory", "inventory_path", metavar="INVENTORY", help=help)


def limit(help: str) -> Callable:
    return click.option("-l", "--limit", metavar="LIMIT", help=help)


def baseline(help: str) -> Callable:
    return click.option("-b", "--baseline", metavar="BASELINE", help=help)


def output(help: str = OUTPUT_HELP) -> Callable:
    return click.option("-o", "--output", metavar="FILE", help=help)


def fmt(*choices: str) -> Callable:
    """--format, its first choice the default."""
    return click.option("--format", "fmt", type=click.Choice(list(choices)), default=choices[0], show_default=True)


def forks(help: str = FORKS_HELP) -> Callable:
    return click.option("--forks", type=click.IntRange(1, 1000), help=help)


def no_preflight(help: str = PREFLIGHT_HELP) -> Callable:
    return click.option("--no-preflight", is_flag=True, help=help)


def target(required: bool = True, help: str = "Target driver version, e.g. 570.86.15.") -> Callable:
    return click.option("--to", "target", required=required, metavar="VERSION", help=help)


def waves(default: str) -> Callable:
    return click.option("--waves", default=default, show_default=True, metavar="RAMP", help=WAVES_HELP)


def window(help: str) -> Callable:
    return click.option("--window", metavar="DURATION", help=help)


def samples(minimum: int, help: str | None = None) -> Callable:
    return click.option("--samples", type=click.IntRange(minimum, 1000), default=10, show_default=True, help=help)


def warmup(help: str | None = None) -> Callable:
    return click.option("--warmup", "warmup_s", type=click.FloatRange(0, 600), default=20.0, show_default=True,
                        help=help)


def trial(help: str | None = None) -> Callable:
    return click.option("--trial", "trial_s", type=click.FloatRange(0.01, 60), default=1.0, show_default=True,
                        help=help)


def campaign_id(required: bool = True) -> Callable:
    return click.argument("campaign_id", type=CAMPAIGN_ID, required=required)


def unit_dir(default: str) -> Callable:
    return click.option("--unit-dir", default=default, show_default=True, metavar="DIR")


def notifications(f: Callable) -> Callable:
    """The notification flags, for audit, probe, upgrade, campaign resume and rollback: the command finds its
    notifier (checked before anything runs) with notifier()."""

    @functools.wraps(f)
    def command(*args, notify, webhook, webhook_format, webhook_headers, webhook_ca, notify_timeout, **kwargs):
        click.get_current_context().meta[NOTIFIER] = build_notifier(notify, webhook, webhook_format, webhook_headers,
                                                                    webhook_ca, notify_timeout)
        return f(*args, **kwargs)

    flags = [
        click.option("--notify", "notify", multiple=True, metavar="CMD",
                     help="Run CMD on this machine for each event (no shell; the event as JSON on stdin; "
                          "placeholders {event} {severity} {kind} {campaign} {host} {target} {state} {run}). "
                          "Repeatable."),
        click.option("--webhook", "webhook", multiple=True, metavar="URL",
                     help="POST each event to URL (TLS verified, 3 tries). Repeatable."),
        click.option("--webhook-format", type=click.Choice(notify.FORMATS), default="json", show_default=True,
                     help="The event as it is, a Slack message or a Microsoft Teams Adaptive Card."),
        click.option("--webhook-headers", metavar="FILE",
                     help=f"HTTP headers for the webhooks ('Name: value' lines; also ${notify.HEADERS_ENV}); never "
                          "shown or recorded."),
        click.option("--webhook-ca", metavar="FILE", help="Also trust this CA (PEM) for https webhooks."),
        click.option("--notify-timeout", type=click.FloatRange(0.1, 600), default=notify.DEFAULT_TIMEOUT_S,
                     metavar="SECONDS", show_default=True,
                     help="Seconds for each --notify command and each webhook try."),
    ]
    for flag in reversed(flags):
        command = flag(command)
    return command



def notifier() -> notify.Notifier | None:
    """The notifier the command's notification flags built (None without a target)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(NOTIFIER) if ctx is not None else None
