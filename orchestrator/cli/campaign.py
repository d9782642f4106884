"""`fleetctl upgrade`, `fleetctl campaign list|show|resume|abort` and `fleetctl rollback`: the commands around the
campaign engine (orchestrator/upgrade.py; what `campaign show` reads: campaign/readmodel.py), a campaign shown live
on a terminal (campaign_view.py)."""

from __future__ import annotations

import json
import sys

import click

from ..judge import gate
from .. import settings, upgrade as upgrade_mod
from ..exitcodes import documented
from ..campaign import readmodel
from ..history.store import Store
from . import campaign_view, config, options
from .output import campaign_end, stored_argv, terminal


@click.command()
@options.target()
@options.inventory()
@options.limit("Ansible host pattern to restrict the campaign to.")
@options.baseline("Baseline YAML (blessed versions, budget, gate).")
@options.waves()
@options.declared(settings.YES, settings.DRY_RUN)
@options.campaign(samples=options.samples(gate.DEFAULTS.min_samples, f"Throughput samples per probe (>= "
                                          f"{gate.DEFAULTS.min_samples}: the gate's test needs them)."),
                  forks=options.forks(f"Hosts of a wave worked on at once (default: all, up to {settings.FORKS_CAP})."))
@options.no_preflight("Skip the SSH pre-flight of the planning audit.")
@options.notifications
@options.prometheus
@documented("upgrade")
def upgrade(target, inventory_path, limit, baseline, waves, yes, dry_run, no_preflight, **campaign) -> None:
    """Move the fleet's driver to VERSION in canary waves, gated by GPU probes, watched while they soak, rolled
    back on failure. Done with hosts off the target (failed and rolled back within the budget, or left out at
    plan) is not a success.
    """
    canary = campaign["canary"]
    if canary and ("{{" in canary or "{%" in canary):
        raise click.UsageError("--canary may not contain '{{' or '{%'")  # Ansible would template it here
    opts = upgrade_mod.UpgradeOptions(target=target, waves=waves, inventory=inventory_path, limit=limit,
                                      baseline=baseline, preflight=not no_preflight,
                                      campaign=upgrade_mod.campaign_options(campaign))
    if not dry_run and not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("--yes is needed to upgrade without a terminal (or use --dry-run)")
        click.confirm(f"Upgrade the fleet's driver to {target}?", abort=True)
    with Store() as store:
        cid, code, text = upgrade_mod.start(opts, store, stored_argv(), dry_run, campaign_view.live(terminal()),
                                           options.notifier(), options.prometheus_client(),
                                           runner_config=config.runner_config())
    campaign_end(text, code)


@click.group()
def campaign() -> None:
    """Upgrade campaigns in the history: list, show, resume, abort."""


@campaign.command("list")
@documented("campaign list")
def campaign_list() -> None:
    """Every campaign, newest last."""
    with Store(readonly=True) as store:
        campaign_view.list_table(store, terminal())


@campaign.command("show")
@options.campaign_id()
@options.fmt("table", "json")
@options.option(settings.VERBOSE)
@documented("campaign show")
def campaign_show(campaign_id, fmt, verbose) -> None:
    """One campaign: hosts, steps (with attempts and times), reasons (one line each; in full with --verbose or
    --format json)."""
    with Store(readonly=True) as store:
        doc = readmodel.document(store, campaign_id)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        campaign_view.show_table(doc, terminal(), verbose)


@campaign.command("resume")
@options.campaign_id(required=False)
@options.option(settings.INTERRUPTED)
@options.inventory(options.OWN_INVENTORY_HELP)
@options.baseline(options.OWN_BASELINE_HELP)
@options.window("A new maintenance window from now.")
@options.option(settings.CAPACITY_BUDGET, "A new capacity budget for the campaign, node-hours counted from its start "
                "(one halted on its budget goes on under a larger one); needs a CAMPAIGN_ID.")
@options.notifications
@options.prometheus
@documented("campaign resume")
def campaign_resume(campaign_id, interrupted, inventory_path, baseline, window, capacity_budget) -> None:
    """Continue a campaign after a crash, or after a halt (held hosts are accepted and undrained).

    Two resumes of one campaign at once: the second refuses before it changes anything.
    """
    if (campaign_id is None) == (not interrupted):
        raise click.UsageError("give a CAMPAIGN_ID or --interrupted (not both)")
    if interrupted and capacity_budget is not None:
        raise click.UsageError("--capacity-budget changes one campaign's budget: give its CAMPAIGN_ID, not --interrupted")
    with Store() as store:
        if interrupted:
            code, text = upgrade_mod.resume_interrupted(store, inventory_path, baseline, window,
                                                        campaign_view.live(terminal()), options.notifier(),
                                                        argv=stored_argv(), prometheus=options.prometheus_client(),
                                                        runner_config=config.runner_config())
        else:
            code, text = upgrade_mod.resume(store, campaign_id, inventory_path, baseline, window,
                                            campaign_view.live(terminal()), options.notifier(), argv=stored_argv(),
                                            prometheus=options.prometheus_client(), capacity_budget=capacity_budget,
                                            runner_config=config.runner_config())
    campaign_end(text, code)


@campaign.command("judge")
@options.campaign_id()
@options.declared(settings.PROMOTE, settings.ROLLBACK, settings.REASON)
@options.inventory(options.OWN_INVENTORY_HELP)
@options.baseline(options.OWN_BASELINE_HELP)
@options.notifications
@options.prometheus
@documented("campaign judge")
def campaign_judge(campaign_id, decision, reason, inventory_path, baseline) -> None:
    """Decide a campaign halted for a person (an inconclusive gate, a canary metric not judged, the breaker, a
    closed window, the capacity budget): --promote or --rollback, recorded with who decided and why, then carried
    out. `campaign resume` of a halted campaign promotes without a recorded judgement."""
    if decision is None:
        raise click.UsageError("give --promote or --rollback")
    if reason is not None and (len(reason) > 500 or not reason.isprintable()):
        raise click.BadParameter("one printable line of at most 500 characters", param_hint="--reason")
    with Store() as store:
        code, text = upgrade_mod.judge(store, campaign_id, decision, reason, inventory_path, baseline,
                                       campaign_view.live(terminal()), options.notifier(), argv=stored_argv(),
                                       prometheus=options.prometheus_client(), runner_config=config.runner_config())
    campaign_end(text, code)


@campaign.command("abort")
@options.campaign_id()
@documented("campaign abort")
def campaign_abort(campaign_id) -> None:
    """Stop a campaign before its next wave (hosts stay where they are: roll back with fleetctl rollback)."""
    with Store() as store:
        click.echo(upgrade_mod.abort(store, campaign_id), nl=False)


@click.command()
@options.campaign_id()
@options.inventory(options.OWN_INVENTORY_HELP)
@options.baseline(options.OWN_BASELINE_HELP)
@options.notifications
@documented("rollback")
def rollback(campaign_id, inventory_path, baseline) -> None:
    """Roll every host a campaign changed back to the exact packages recorded before it."""
    with Store() as store:
        code, text = upgrade_mod.rollback(store, campaign_id, inventory_path, baseline, campaign_view.live(terminal()),
                                          options.notifier(), argv=stored_argv(), runner_config=config.runner_config())
    campaign_end(text, code)
