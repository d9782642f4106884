"""`fleetctl upgrade`, `fleetctl campaign list|show|resume|abort` and `fleetctl rollback`: the commands around the
campaign engine (orchestrator/upgrade.py), a campaign shown live on a terminal (campaign_view.py)."""

from __future__ import annotations

import json
import sys

import click

from .. import plan as plan_mod, upgrade as upgrade_mod
from ..sanitize import clean
from ..store import Store
from . import campaign_view, options
from .output import stored_argv, terminal


@click.command()
@options.target()
@options.inventory()
@options.limit("Ansible host pattern to restrict the campaign to.")
@options.baseline("Baseline YAML (blessed versions, budget, gate).")
@options.waves(plan_mod.DEFAULT_RAMP)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@click.option("--dry-run", is_flag=True, help="Print what would be done, change nothing.")
@click.option("--soak", "soak", default=upgrade_mod.soak.DEFAULT_SOAK, show_default=True, metavar="DURATIONS",
              help="Watched soak between waves, one length per gap (the last repeated), e.g. 2h,30m; 0: none.")
@click.option("--soak-interval", "soak_interval", default="60", show_default=True, metavar="DURATION",
              help="A health check and a canary run of every changed host this often while soaking.")
@click.option("--soak-grace", "soak_grace", default="5m", show_default=True, metavar="DURATION",
              help="A changed host unreachable this long during a soak fails.")
@click.option("--canary", metavar="CMD", help="The canary workload run on changed hosts while soaking (the probe "
              "command engine's protocol; default: the host's probe engine).")
@click.option("--canary-max-failures", type=click.IntRange(0, 100000), default=0, show_default=True,
              help="Failed canary runs a host may have before it fails.")
@options.window("Maintenance window length: no wave starts after it (exit 5).")
@click.option("--rollback-scope", type=click.Choice(upgrade_mod.ROLLBACK_SCOPES), default="campaign",
              show_default=True, help="On a failed wave roll back every changed host, or the wave's only.")
@click.option("--drain-preset", type=click.Choice(sorted(upgrade_mod.hooks.PRESETS)),
              help="Drain/undrain with Slurm (scontrol) or Kubernetes (kubectl drain/uncordon).")
@click.option("--drain", metavar="CMD", help="Drain command template run on this machine: {host} {node} {campaign}.")
@click.option("--undrain", metavar="CMD", help="Undrain command template.")
@click.option("--idle-timeout", type=click.IntRange(0, 86400), default=300, show_default=True,
              help="Seconds to wait for GPUs to be free after the drain.")
@options.samples(5, "Throughput samples per probe (>= 5: the gate's test needs them).")
@options.warmup()
@options.trial()
@options.forks("Hosts of a wave worked on at once (default: all, up to 64).")
@options.no_preflight("Skip the SSH pre-flight of the planning audit.")
@options.notifications
def upgrade(target, inventory_path, limit, baseline, waves, yes, dry_run, soak, soak_interval, soak_grace, canary,
            canary_max_failures, window, rollback_scope, drain_preset, drain, undrain, idle_timeout, samples, warmup_s,
            trial_s, forks, no_preflight) -> None:
    """Move the fleet's driver to VERSION in canary waves, gated by GPU probes, watched while they soak, rolled
    back on failure.

    Exit codes: 0 done, 1 done but hosts are off the target (failed and rolled back within the budget, or left
    out at plan), 2 usage or input error, 4 rolled back, 5 halted for a person (inconclusive gate, window closed)
    or aborted, 6 a host's rollback failed: it needs a person.
    """
    if canary and ("{{" in canary or "{%" in canary):
        raise click.UsageError("--canary may not contain '{{' or '{%'")  # Ansible would template it here
    opts = upgrade_mod.UpgradeOptions(
        target, waves, inventory_path, limit, baseline, forks, not no_preflight,
        upgrade_mod.parse_soaks(soak), upgrade_mod.parse_duration(soak_interval, "--soak-interval"),
        upgrade_mod.parse_duration(soak_grace, "--soak-grace", allow_zero=True), canary, canary_max_failures,
        upgrade_mod.parse_duration(window, "--window") if window else None, rollback_scope, drain_preset, drain,
        undrain, idle_timeout_s=idle_timeout, samples=samples, warmup_s=warmup_s, trial_s=trial_s)
    if not dry_run and not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("--yes is needed to upgrade without a terminal (or use --dry-run)")
        click.confirm(f"Upgrade the fleet's driver to {target}?", abort=True)
    with Store() as store:
        cid, code, text = upgrade_mod.start(opts, store, stored_argv(), dry_run, campaign_view.live(terminal()),
                                           options.notifier())
    click.echo(clean(text), nl=False)  # reasons quote hosts
    sys.exit(code)


@click.group()
def campaign() -> None:
    """Upgrade campaigns in the history: list, show, resume, abort."""


@campaign.command("list")
def campaign_list() -> None:
    """Every campaign, newest last."""
    with Store(readonly=True) as store:
        campaign_view.list_table(store, terminal())


@campaign.command("show")
@options.campaign_id()
@options.fmt("table", "json")
def campaign_show(campaign_id, fmt) -> None:
    """One campaign: hosts, steps (with attempts and times), reasons."""
    with Store(readonly=True) as store:
        doc = upgrade_mod.document(store, campaign_id)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        campaign_view.show_table(doc, terminal())


@campaign.command("resume")
@options.campaign_id(required=False)
@click.option("--interrupted", is_flag=True,
              help="Every campaign at work whose process is gone (a crash or reboot); exit 0 when there is none.")
@options.inventory(options.OWN_INVENTORY_HELP)
@options.baseline(options.OWN_BASELINE_HELP)
@options.window("A new maintenance window from now.")
@options.notifications
def campaign_resume(campaign_id, interrupted, inventory_path, baseline, window) -> None:
    """Continue a campaign after a crash, or after a halt (held hosts are accepted and undrained).

    Two resumes of one campaign at once: the second refuses (exit 1) before it changes anything.
    """
    if (campaign_id is None) == (not interrupted):
        raise click.UsageError("give a CAMPAIGN_ID or --interrupted (not both)")
    window_s = upgrade_mod.parse_duration(window, "--window") if window else None
    with Store() as store:
        if interrupted:
            code, text = upgrade_mod.resume_interrupted(store, inventory_path, baseline, window_s,
                                                        campaign_view.live(terminal()), options.notifier())
        else:
            code, text = upgrade_mod.resume(store, campaign_id, inventory_path, baseline, window_s,
                                            campaign_view.live(terminal()), options.notifier())
    click.echo(clean(text), nl=False)
    sys.exit(code)


@campaign.command("abort")
@options.campaign_id()
def campaign_abort(campaign_id) -> None:
    """Stop a campaign before its next wave (hosts stay where they are: roll back with fleetctl rollback)."""
    with Store() as store:
        click.echo(upgrade_mod.abort(store, campaign_id), nl=False)


@click.command()
@options.campaign_id()
@options.inventory(options.OWN_INVENTORY_HELP)
@options.baseline(options.OWN_BASELINE_HELP)
@options.notifications
def rollback(campaign_id, inventory_path, baseline) -> None:
    """Roll every host a campaign changed back to the exact packages recorded before it (exit 4 when done)."""
    with Store() as store:
        code, text = upgrade_mod.rollback(store, campaign_id, inventory_path, baseline, campaign_view.live(terminal()),
                                          options.notifier())
    click.echo(clean(text), nl=False)
    sys.exit(code)
