"""What the commands share around the services: their output (-o FILE or stdout, a table on a terminal), the
command line as the history keeps it, an error as one line."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console

from .. import redact
from ..errors import OutputError, stdout_failed
from ..exitcodes import Exit
from ..files import write_atomically
from ..inputs import shown
from ..sanitize import clean
from . import options


def write_report(report: dict, fmt: str, output: str | None, printer) -> None:
    """JSON, Prometheus metrics, or a table through PRINTER(report, console), to OUTPUT or stdout."""
    if fmt == "json":
        emit(indented_json(report) + "\n", output)
    elif fmt == "prometheus":
        from .. import prometheus
        emit(prometheus.report_text(report), output)
    elif output:
        buffer = io.StringIO()
        printer(report, Console(file=buffer, width=160, force_terminal=False))
        emit(buffer.getvalue(), output)
    else:
        with to_stdout():
            printer(report, terminal())


def indented_json(document: Any) -> str:
    """DOCUMENT as `json.dumps(document, indent=2)` lays it out, by orjson: the json module indents in pure Python
    (an audit's report of 64 hosts, 10 MB: 0.6 s of CPU; orjson: 25 ms). A NaN or an infinity is null (json writes
    NaN and Infinity, which are not JSON); what orjson writes otherwise (a character outside ASCII, which json
    escapes) or refuses (an integer past 64 bits) is left to json."""
    try:
        text = orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(document, indent=2)
    return text if text.isascii() else json.dumps(document, indent=2)


def run_notes():
    """An audit's or probe's notifier (the `findings` event), None without notification targets."""
    from ..notify import events as notify_events
    notifier = options.notifier()
    return notify_events.RunNotes(notifier) if notifier else None


def stored_argv() -> list[str]:
    """The command line as the history keeps it (orchestrator/redact.py: no token of a command, no webhook path)."""
    return redact.argv(sys.argv[1:])


def emit(text: str, output: str | None) -> None:
    """TEXT to OUTPUT (a file, written atomically) or stdout; either failing is an OutputError."""
    if output:
        try:
            write_atomically(Path(output), text)
        except OSError as e:
            raise OutputError(f"{shown(output)}: cannot write: {e.strerror}") from None
    else:
        with to_stdout():
            click.echo(text, nl=False)


@contextlib.contextmanager
def to_stdout():
    """A block that writes standard output: its failing (a full disk, a closed pipe) is an OutputError."""
    try:
        yield
    except OSError as e:
        raise OutputError.of_stdout(e) from None


def campaign_end(text: str, code: int) -> None:
    """A campaign command's last words, then its exit CODE whatever became of standard output: a campaign that
    rolled back or needs a person says so by its code even when nobody reads its output (Display kept it going). A
    standard output that cannot be written is one line on stderr, and Exit.OUTPUT where the campaign's code is OK."""
    try:
        click.echo(clean(text), nl=False)  # reasons quote hosts
    except OSError as e:
        if not stdout_failed(e) or code == Exit.OK:
            raise
        from .main import quiet_stdout  # main imports no rich: `fleetctl check` stays light
        click.echo(f"fleetctl: error: {OutputError.of_stdout(e)}", err=True)
        quiet_stdout()
    sys.exit(code)


class Stdout(Console):
    """rich's Console, but a closed pipe is the output's failure (to_stdout(): Exit.OUTPUT), not rich's silent
    Exit.FINDINGS."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def terminal() -> Console:
    """A console for stdout; logs and cron mail get 160 columns instead of rich's 80 when no width is known."""
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Stdout()
    return Stdout(width=160)
