"""Drains fleetctl owns (`--drain-preset slurm`): the campaign's side of Slurm, over orchestrator/slurm.py.

- plan: a node someone else took out of service (drained, draining, down, reserved for maintenance) is left out of
  the campaign with its state and reason shown (`drained_elsewhere`); fleetctl never drains nor resumes it.
- drain: with a reason fleetctl recognises later, `fleetctl campaign N: A -> B`; the node's state before is kept in
  the step's record. A node taken out of service by someone else since the plan is left alone (the host fails).
- wait_idle: until Slurm reports no job allocated on the node (DRAINED, not DRAINING), bounded by --idle-timeout; the
  GPU-process check runs after it as a second opinion.
- undrain (also of a rollback, a release and an accepted held host): only a node whose reason is still this
  campaign's own is resumed, once its slurmd answers slurmctld again (after the activation's reboot; one that does
  not within SLURMD_WAIT_S fails its host and stays drained); one whose reason someone changed is left as it is,
  and the campaign says so (the `slurm_node_left` event, a notification).
- soak: jobs that ended on a watched node since its change, as Slurm's job completion log records them: NODE_FAIL
  and FAILED count as failed canary runs.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from .. import inventory, slurm
from . import transitions
from .context import Context, Outcome

SLURMD_WAIT_S, RESPONDING_POLL_S = 120.0, 2.0  # before a resume: slurmd back in touch with slurmctld
FAILED_JOB_STATES = ("NODE_FAIL", "FAILED")


def node_names(fleet: inventory.Fleet, hosts: list[str]) -> dict[str, str]:
    """host -> the scheduler's node name (the `fleetctl_node_name` host variable, else the inventory name)."""
    return {h: str(fleet.host(h).vars.get("fleetctl_node_name", h)) for h in hosts}


def left_out(fleet: inventory.Fleet, hosts: list[str]) -> list[dict[str, Any]]:
    """The plan's exclusions: hosts whose node is out of service (or not a Slurm node at all), with why."""
    names = node_names(fleet, hosts)
    nodes = slurm.nodes(sorted(set(names.values())))
    out = []
    for host, name in names.items():
        node = nodes.get(name)
        if node is None:
            out.append({"name": host, "code": "not_in_slurm",
                        "reason": f"Slurm has no node {name} (set the host's fleetctl_node_name)"})
        elif node.taken_out:
            out.append({"name": host, "code": "drained_elsewhere",
                        "reason": f"out of service in Slurm, left as it is: {node.describe()}"})
    return out


def drain(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    names = node_names(ctx.fleet, hosts)
    nodes = slurm.nodes(sorted(set(names.values())))
    states = {r["host"]: r["state"] for r in ctx.journal.hosts(ctx.campaign)}
    out = {}
    for host, name in names.items():
        node = nodes.get(name)
        if node is None:
            out[host] = Outcome("fail", f"Slurm has no node {name}")
            continue
        before = {"state": node.state, "reason": node.reason}
        if slurm.owned_by_campaign(node, ctx.campaign):  # drained by this campaign already (a resumed run)
            out[host] = Outcome("ok", None, {"slurm": {"node": name, "before": None, "reason": node.reason}})
            continue
        rollback = states.get(host) == transitions.ROLLBACK_START  # the rollback's drain
        if node.taken_out:
            # Someone took it out of service meanwhile: fleetctl neither drains nor (later) resumes it. A rollback
            # goes on (no job lands on it either way); a change does not start on it.
            detail = {"slurm": {"node": name, "before": before, "left": True}}
            out[host] = (Outcome("ok", None, detail) if rollback else
                         Outcome("fail", f"taken out of service in Slurm since the plan, left as it is: "
                                         f"{node.describe()}", detail))
            continue
        was = ctx.befores.get(host, {}).get("version")
        text = (slurm.campaign_reason(ctx.campaign, ctx.target, f"{was or '?'} (rollback)") if rollback
                else slurm.campaign_reason(ctx.campaign, was, ctx.target))
        try:
            slurm.drain(name, text)
        except slurm.SlurmError as e:
            out[host] = Outcome("fail", f"slurm: {e}", {"slurm": {"node": name, "before": before}})
            continue
        out[host] = Outcome("ok", None, {"slurm": {"node": name, "before": before, "reason": text}})
    return out


def wait_drained(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    """Hosts whose node still runs jobs after --idle-timeout, failed (the others are ready for the GPU check)."""
    names = node_names(ctx.fleet, hosts)
    idle = ctx.options.idle
    deadline = time.monotonic() + idle.timeout_s
    while True:
        nodes = slurm.nodes(sorted(set(names.values())))
        busy = {h: nodes[n] for h, n in names.items() if n in nodes and not nodes[n].drained}
        if not busy or time.monotonic() >= deadline:
            break
        time.sleep(max(0.5, min(float(idle.poll_s), deadline - time.monotonic())))
    out = {h: Outcome("fail", f"Slurm still has jobs on {names[h]} after {idle.timeout_s}s: {n.describe()}",
                      {"slurm": {"node": names[h], "state": n.state}}) for h, n in busy.items()}
    for h, n in names.items():
        if n not in nodes:
            out[h] = Outcome("fail", f"Slurm has no node {n}")
    return out


def _answering(names: dict[str, str], timeout_s: float) -> dict[str, slurm.Node]:
    """The nodes of NAMES as Slurm reports them once each one's slurmd answers slurmctld again (no NOT_RESPONDING:
    after the activation's reboot slurmctld hears from slurmd at its registration or next ping), or TIMEOUT_S."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = slurm.nodes(sorted(set(names.values())))
        if all(nodes[n].responding for n in names.values() if n in nodes) or time.monotonic() >= deadline:
            return nodes
        time.sleep(RESPONDING_POLL_S)


def undrain(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    names = node_names(ctx.fleet, hosts)
    nodes = _answering(names, SLURMD_WAIT_S)
    out = {}
    for host, name in names.items():
        node = nodes.get(name)
        if node is None:
            out[host] = Outcome("fail", f"Slurm has no node {name}")
        elif slurm.owned_by_campaign(node, ctx.campaign):
            if not node.responding:  # a slurmd that did not come back (its GRES refused by the new driver, ...)
                out[host] = Outcome("fail", f"slurmd on {name} has not answered slurmctld for {SLURMD_WAIT_S:g}s "
                                            f"after the change ({node.describe()}): the node stays drained",
                                    {"slurm": {"node": name, "resumed": False, "state": node.state}})
                continue
            try:
                slurm.resume(name)
            except slurm.SlurmError as e:
                out[host] = Outcome("fail", f"slurm: {e}", {"slurm": {"node": name, "state": node.state}})
                continue
            out[host] = Outcome("ok", None, {"slurm": {"node": name, "resumed": True, "was": node.state}})
        else:
            # Not this campaign's drain (any more): someone changed the reason, drained it for their own cause, or
            # the drain never happened (a drain that failed). Leave the node; say so where it is drained.
            detail = {"node": name, "resumed": False, "state": node.state, "reason": node.reason}
            if node.taken_out:
                ctx.journal.note(ctx.campaign, "slurm_node_left", host=host, node=name, state=node.state,
                                 node_reason=node.reason)
            out[host] = Outcome("ok", None, {"slurm": detail})
    return out


def failed_jobs(nodes: list[str], since: datetime) -> dict[str, list[dict[str, Any]]]:
    """node -> the jobs that ended on it in a failed state at or after SINCE (Slurm's job completion log)."""
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in nodes}
    for job in slurm.finished_jobs(since, FAILED_JOB_STATES):
        for n in set(job["nodes"]) & set(nodes):
            out[n].append(job)
    return out
