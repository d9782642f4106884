"""`fleetctl audit`."""

from __future__ import annotations

import sys

import click

from .. import audit as audit_mod, settings
from ..exitcodes import documented
from ..files import writable
from ..history.store import Store
from . import config, options, render
from .output import run_notes, stored_argv, write_report


@click.command()
@options.inventory("Ansible inventory (file or directory). Default: localhost over the local connection.")
@options.limit("Ansible host pattern to restrict the run to.")
@options.baseline("Baseline YAML (blessed matrix). Default: the embedded one.")
@options.fmt("table", "json", "prometheus")
@options.output()
@options.option(settings.FAIL_ON)
@options.forks()
@options.no_preflight()
@options.option(settings.SHOW_ALL)
@options.notifications
@documented("audit")
def audit(inventory_path, limit, baseline, fmt, output, fail_on, forks, no_preflight, show_all) -> None:
    """Audit driver, nouveau, persistence, container runtime and GPU health against the baseline."""
    opts = audit_mod.AuditOptions(inventory=inventory_path, limit=limit, baseline=baseline, fail_on=fail_on,
                                  forks=forks, preflight=not no_preflight)
    writable(output)
    with Store() as store:  # the report written before the run is sealed: its record holds what fleetctl exits with
        report = audit_mod.run(opts, store, stored_argv(), run_notes(), lambda r: write_report(
            r, fmt, output, lambda r, console: render.print_audit(r, console, show_all)),
            runner_config=config.runner_config())
    sys.exit(report["summary"]["exit_code"])
