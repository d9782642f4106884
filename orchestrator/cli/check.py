"""`fleetctl check`: kept light (no rich, no Ansible): Slurm runs it on every node, often."""

from __future__ import annotations

import gc
import json
import sys

import click

from .. import check as check_mod, settings
from ..exitcodes import documented
from ..controls import severity_rank
from ..sanitize import clean_line
from . import options

STATUS_ORDER = {"error": 0, "fail": 1, "warn": 2}


def text(report: dict) -> str:
    """One line per control that did not pass, then the verdict (and what was done to the Slurm node)."""
    lines = []
    shown = sorted((f for f in report["findings"] if f["status"] in STATUS_ORDER),
                   key=lambda f: (STATUS_ORDER[f["status"]], -severity_rank(f["severity"])))
    for f in shown:
        lines.append(clean_line(f"{f['status']:5} {f['severity']:8} {f['control']}: {f['message']}"))
    s = report["summary"]
    passed = sum(1 for f in report["findings"] if f["status"] == "pass")
    verdict = "healthy" if s["healthy"] else f"drain: {', '.join(s['failing'])}"
    lines.append(clean_line(f"{report['host']}: {verdict} ({passed} controls pass; baseline {report['baseline']['name']};"
                            f" exit {s['exit_code']}; {s['duration_s']:.2f}s)"))
    sl = report.get("slurm")
    if sl:
        lines.append(clean_line(f"slurm node {sl['node']}: " + (f"error: {sl['error']}" if sl["error"] else
                                                                 f"{sl['action']}: {sl['detail']}")))
    return "\n".join(lines) + "\n"


@click.command()
@options.baseline("Baseline YAML (blessed matrix). Default: the embedded one.")
@options.declared(settings.GROUP, settings.SLURM, settings.NODE)
@options.option(settings.TEXTFILE,
                f"Also write the results to DIR/{check_mod.TEXTFILE_NAME} (atomically), for node_exporter.")
@options.fmt("table", "json")
@documented("check")
def check(baseline, groups, use_slurm, node, textfile, fmt) -> None:
    """Evaluate the audit's controls on this machine itself (no SSH, no Ansible), e.g. as Slurm's
    HealthCheckProgram or a job prolog. A critical control that failed or could not be verified: drain this node
    (the check fails).
    """
    opts = check_mod.CheckOptions(baseline=baseline, groups=tuple(groups), slurm=use_slurm, node=node,
                                  textfile=textfile, evidence=fmt == "json")
    gc.disable()  # a process of a fraction of a second: no cyclic collections while it reads the node (~15 ms)
    try:
        report = check_mod.run(opts)
    finally:
        gc.enable()
    click.echo(json.dumps(report, indent=2) if fmt == "json" else text(report), nl=fmt == "json")
    sl = report.get("slurm")
    if sl and sl["error"]:
        click.echo(f"fleetctl: warning: slurm: {clean_line(sl['error'])}", err=True)
    # The process ends here: the interpreter's last collection need not walk every object of 230 modules (~20 ms of a
    # check's 0.2 s on the 2-core VM: bench/check_latency.py --profile, where "start" includes the exit).
    gc.freeze()
    sys.exit(report["summary"]["exit_code"])
