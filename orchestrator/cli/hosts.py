"""`fleetctl hosts` (each host's incidents in a window, from the ledger) and `fleetctl hosts show NAME` (one host's
timeline)."""

from __future__ import annotations

import json

import click
from rich.table import Table

from .. import baseline as baseline_mod, inputs, settings
from ..history import ledger as ledger_mod, offenders
from ..errors import InputError
from ..exitcodes import documented
from ..history.store import Store
from . import options
from .output import terminal, to_stdout
from .render import safe


@click.group(invoke_without_command=True)
@options.option(settings.WITHIN)
@options.option(settings.REPEAT_OFFENDERS)
@options.baseline("Baseline YAML whose repeat-offender policy applies (the embedded one sets none: "
                  "docs/hosts.md shows one).")
@options.fmt("table", "json")
@click.pass_context
@documented("hosts")
def hosts(ctx, within, repeat_offenders, baseline, fmt) -> None:
    """Each host with incidents in the window (Xid, ECC, a GPU lost, NVLink down, a failed probe or gate, a
    rollback, unreachable at a campaign step): how many of each class, the time since the last one and the mean time
    between them, most incidents first. Read from the history's ledger (docs/hosts.md), caught up first."""
    if ctx.invoked_subcommand is not None:
        return
    if repeat_offenders:
        return offenders_list(baseline, fmt)
    with Store(readonly=True) as store, ledger_mod.Ledger(store) as ledger:
        rows = ledger_mod.hosts_summary(ledger, within)
    if fmt == "json":
        with to_stdout():
            click.echo(json.dumps({"within_s": within, "hosts": rows}, indent=2))
        return
    span = f"{within / 86400:g}d" if within % 86400 == 0 else settings.duration_text(within)
    table = Table(title=safe(f"fleetctl hosts - incidents in the last {span}", "table.title"), title_justify="left")
    for name in ("Host", "Incidents", "Classes", "Since last", "Mean between"):
        table.add_column(name, overflow="fold")
    for h in rows:
        table.add_row(safe(h["host"]), str(h["count"]),
                      safe(", ".join(f"{c} x{n}" for c, n in h["classes"].items())),
                      ledger_mod.age(h["since_last_s"]), ledger_mod.age(h["mtbi_s"]))
    with to_stdout():
        console = terminal()
        console.print(table) if rows else click.echo(
            f"no host has incidents in the last {span}")


def offenders_list(path: str | None, fmt: str) -> None:
    """`fleetctl hosts --repeat-offenders`: the hosts the baseline's policy (its all group's) calls repeat
    offenders."""
    base = baseline_mod.load(path)
    policy = offenders.policy(base.policy_for([]))
    if policy is None:
        raise InputError(f"{inputs.shown(base.path)}: sets no incidents.repeat_offender for its all group "
                         "(docs/hosts.md)")
    with Store(readonly=True) as store, ledger_mod.Ledger(store) as ledger:
        rows = offenders.listed(ledger, policy)
    if fmt == "json":
        with to_stdout():
            click.echo(json.dumps({"policy": {"count": policy.count, "within_s": policy.within_s,
                                              "classes": list(policy.classes)}, "hosts": rows}, indent=2))
        return
    said = f"{policy.count} incidents in {offenders.span(policy.within_s)}"
    table = Table(title=safe(f"fleetctl hosts --repeat-offenders - {len(rows)} host(s) with at least {said} "
                             f"({', '.join(policy.classes)})", "table.title"), title_justify="left")
    for name in ("Host", "Evidence", "Last"):
        table.add_column(name, overflow="fold")
    for h in rows:
        table.add_row(safe(h["host"]), safe(h["evidence"]), safe(h["last"]))
    with to_stdout():
        terminal().print(table) if rows else click.echo(f"no repeat offender: none has {said}")


@hosts.command("show")
@click.argument("name")
@options.fmt("table", "json")
@documented("hosts show")
def hosts_show(name, fmt) -> None:
    """NAME's timeline: every incident the history holds of it, oldest first, with its driver, GPU and the record
    it came from (run:ID, campaign:ID:SEQ). A host the history never saw is an input error."""
    with Store(readonly=True) as store, ledger_mod.Ledger(store) as ledger:
        if not ledger.known(name):
            raise InputError(f"host {name[:100]!r}: the history holds no record of it (fleetctl hosts lists those "
                             "with incidents)")
        rows = ledger.incidents(host=name)
    if fmt == "json":
        with to_stdout():
            click.echo(json.dumps({"host": name, "incidents": rows}, indent=2))
        return
    table = Table(title=safe(f"fleetctl hosts show {name} - {len(rows)} incidents", "table.title"),
                  title_justify="left")
    for column in ("When", "Class", "Driver", "GPU", "What", "Record"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(safe(r["at"]), safe(r["class"]), safe(r["driver"] or "-"), safe(r["gpu"] or "-"),
                      safe(r["detail"]), safe(r["source"]))
    with to_stdout():
        terminal().print(table) if rows else click.echo(f"{name}: no incidents")
