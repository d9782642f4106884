"""`fleetctl plan`."""

from __future__ import annotations

import sys

import click

from .. import plan as plan_mod
from ..exitcodes import documented
from ..files import writable
from ..history.store import Store
from . import config, options, render
from .output import stored_argv, write_report


@click.command()
@options.target()
@options.inventory()
@options.limit("Ansible host pattern to restrict the plan to.")
@options.baseline("Baseline YAML (blessed versions, failure budget).")
@options.waves()
@options.fmt("table", "json")
@options.output("Write the plan to FILE instead of stdout.")
@options.forks()
@options.no_preflight()
@options.prometheus
@documented("plan")
def plan(target, inventory_path, limit, baseline, waves, fmt, output, forks, no_preflight) -> None:
    """Plan canary waves to move the fleet's driver to VERSION (nothing is changed on any host).

    Hosts already on VERSION are skipped; unreachable, unhealthy, driverless hosts and hosts whose baseline does
    not bless VERSION are excluded, each with its reason; unreachable ones fail it as hosts unreachable (the plan
    is still made).
    """
    opts = plan_mod.PlanOptions(target=target, waves=waves, inventory=inventory_path, limit=limit, baseline=baseline,
                                forks=forks, preflight=not no_preflight)
    writable(output)
    with Store() as store:
        report = plan_mod.run(opts, store, stored_argv(), options.prometheus_client(),
                              lambda r: write_report(r, fmt, output, render.print_plan),
                              runner_config=config.runner_config())
    sys.exit(report["summary"]["exit_code"])
