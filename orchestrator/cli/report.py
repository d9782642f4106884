"""`fleetctl report` (compliance exports from the history) and `fleetctl report verify`."""

from __future__ import annotations

import io
import json
import sqlite3
import sys
from pathlib import Path

import click

from .. import settings
from ..exitcodes import Exit, documented
from ..files import writable
from ..history.store import Store
from . import options
from .output import emit


@click.group(invoke_without_command=True)
@options.fmt("json", "csv", "html", "oscal")
@options.output("Write the report to FILE instead of stdout.")
@options.declared(settings.SINCE, settings.UNTIL)
@options.limit(options.HOST_PATTERNS_HELP)
@options.option(settings.SIGN)
@click.pass_context
@documented("report")
def report(ctx, fmt, output, since, until, limit, sign_key) -> None:
    """Compliance exports from the history (and `report verify`: is the history intact).

    Every export states the history's hash-chain head it was made from.
    """
    if ctx.invoked_subcommand is not None:
        return
    from .. import report as report_mod
    from ..history import signing
    if sign_key and not output:
        raise click.UsageError("--sign needs -o FILE (the signature goes to FILE.sig)")
    if sign_key:  # a bad key, or a FILE.sig that cannot be written: an input error before anything is written
        signing.load_private(sign_key)
        writable(str(signing.signature_of(output)))
    writable(output)
    with Store(readonly=True) as store, store.snapshot():  # the head it states is that of the runs it reports
        doc = report_mod.build(store, since, until, limit)
    render = {"json": lambda d: json.dumps(d, indent=2) + "\n", "csv": report_mod.to_csv, "html": report_mod.to_html,
              "oscal": lambda d: json.dumps(report_mod.to_oscal(d), indent=2) + "\n"}
    emit(render[fmt](doc), output)
    if sign_key:
        click.echo(f"signature: {signing.sign(Path(output), sign_key, fmt, doc['chain']['digest'])}", err=True)


@report.command("verify")
@options.declared(settings.HEAD, settings.SIGNATURE, settings.SIGNED_FILE, settings.KEY)
@documented("report verify")
def report_verify(head, signature, signed_file, key) -> None:
    """Check the history's hash chain and name the first broken record, and SQLite's integrity check of the file
    (or, with --signature, an export's signature). All of it reads the history as of one moment: runs other
    fleetctl processes record meanwhile never make it look broken."""
    from ..history import chain, signing
    if signature:
        ok, line = signing.verify(signature, signed_file, key)
        click.echo(line)
        sys.exit(Exit.OK if ok else Exit.FINDINGS)
    lingering = []
    with Store(readonly=True, check=False) as store, store.snapshot():
        damage = store.damage()
        try:
            verdict = chain.verify(store.db, head)
            line = verdict.line()
            lingering = [r["id"] for r in store.interrupted_runs()]
        except sqlite3.DatabaseError as e:  # damage SQLite found too
            verdict, line = None, f"history chain unreadable ({e})"
    click.echo(f"{line}; SQLite integrity_check: {damage or 'ok'}")
    if lingering:
        click.echo(f"note: run{'s' if len(lingering) > 1 else ''} {', '.join(map(str, lingering))} never finished: "
                   "the process that ran them is gone (a crash, kill -9, a history that could not be written); "
                   "unfinished runs are not in the chain, and the next recorded run closes them as interrupted")
    sys.exit(Exit.HISTORY if damage or verdict is None else Exit.OK if verdict.ok else Exit.FINDINGS)


@report.command("drivers")
@options.fmt("table", "json", "csv", "html")
@options.output("Write the report to FILE instead of stdout.")
@options.option(settings.DRIVERS_WITHIN)
@options.option(settings.SINCE, "Count from DATE (YYYY-MM-DD, UTC) or an ISO timestamp instead.")
@documented("report drivers")
def report_drivers(fmt, output, within, since) -> None:
    """Which driver is best: per driver version and GPU model, the hosts and GPU-days observed and the incidents of
    each class per 1,000 GPU-days (exact Poisson 95% intervals); and each version against the one it replaced, as a
    rate ratio with its 95% interval and p-value (the exact conditional test). From the history's ledger
    (docs/hosts.md, "Which driver is best")."""
    from ..errors import InputError
    from ..report import parse_day
    if since is not None and within is not None:
        raise InputError("--since and --within: give one of them")
    since = parse_day(since, "--since")
    writable(output)
    from rich.console import Console
    from rich.table import Table

    from .. import drivers
    from ..history import ledger as ledger_mod
    from .output import terminal, to_stdout
    from .render import clean, safe
    with Store(readonly=True) as store, ledger_mod.Ledger(store) as ledger:
        doc = drivers.build(ledger, since, within)
    if fmt != "table":
        render = {"json": lambda d: json.dumps(d, indent=2) + "\n", "csv": drivers.to_csv, "html": drivers.to_html}
        emit(render[fmt](doc), output)
        return
    if not doc["drivers"]:
        emit("no observations of any host on a driver in the window\n", output)
        return
    table = Table(title=safe(f"fleetctl report drivers - incidents per 1,000 GPU-days (95% CI), since "
                             f"{doc['generated']['since'] or 'the first record'}", "table.title"),
                  title_justify="left")
    for column in ("Driver", "GPU model", "Hosts", "GPU-days", "Replaced", "Incidents: count, rate (95% CI)"):
        table.add_column(column, overflow="fold")
    for r in doc["drivers"]:
        table.add_row(safe(r["driver"]), safe(r["model"]), str(r["hosts"]), f"{r['gpu_days']:,.0f}",
                      safe(f"{r['replaced']} ({r['replaced_how']})" if r["replaced"] else "-"),
                      safe(drivers.classes_text(r)))
    lines = [c["line"] for c in doc["comparisons"]] or ["no version replaced another with incidents on either"]
    text = "Each version against the one it replaced (rate ratio, 95% CI, exact conditional test):\n" + \
        "".join(f"{clean(line)}\n" for line in lines)
    if output:  # the table as plain text
        console = Console(file=io.StringIO(), width=160, color_system=None)
        console.print(table)
        emit(console.file.getvalue() + text, output)
        return
    with to_stdout():
        terminal().print(table)
        click.echo(text, nl=False)
