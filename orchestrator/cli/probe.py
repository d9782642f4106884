"""`fleetctl probe`."""

from __future__ import annotations

import sys

import click

from .. import probe as probe_mod, settings
from ..exitcodes import documented
from ..files import writable
from ..history.store import Store
from . import config, options, render
from .output import run_notes, stored_argv, write_report


@click.command()
@options.inventory()
@options.limit("Ansible host pattern to restrict the run to.")
@options.baseline("Baseline YAML (gate thresholds, Xid overrides).")
@options.declared(settings.THROUGHPUT, settings.ENGINE, settings.COMMAND)
@options.samples(1)
@options.warmup()
@options.trial()
@options.fmt("table", "json", "prometheus")
@options.output()
@options.forks()
@options.no_preflight()
@options.notifications
@documented("probe")
def probe(inventory_path, limit, baseline, throughput, engine, canary, samples, warmup_s, trial_s, fmt, output, forks,
          no_preflight) -> None:
    """GPU health (NVML, Xid, ECC, remaps, PCIe, clocks) and, with --throughput, GEMM and bandwidth samples."""
    if engine == "command" and not canary:
        raise click.UsageError("--engine command needs --command CMD")
    if canary and ("{{" in canary or "{%" in canary):
        # Ansible would evaluate it as a template on this machine before the host ever ran it.
        raise click.UsageError("--command may not contain '{{' or '{%'")
    writable(output)
    opts = probe_mod.ProbeOptions(inventory=inventory_path, limit=limit, baseline=baseline, throughput=throughput,
                                  engine=engine, command=canary, samples=samples, warmup_s=warmup_s, trial_s=trial_s,
                                  forks=forks, preflight=not no_preflight)
    with Store() as store:
        report = probe_mod.run(opts, store, stored_argv(), run_notes(),
                               lambda r: write_report(r, fmt, output, render.print_probe),
                               runner_config=config.runner_config())
    sys.exit(report["summary"]["exit_code"])
