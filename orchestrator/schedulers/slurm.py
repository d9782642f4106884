"""Drains fleetctl owns (`--drain-preset slurm`): the campaign's side of Slurm, over slurmctl.py.

- plan: a node someone else took out of service (drained, draining, down, reserved for maintenance) is left out of
  the campaign with its state and reason shown (`drained_elsewhere`); fleetctl never drains nor resumes it.
- drain: with a reason fleetctl recognises later, `fleetctl campaign N: A -> B`; the node's state before is kept in
  the step's record. A node taken out of service by someone else since the plan is left alone (the host fails).
- busy (wait_idle): whether Slurm reports a job allocated on the node (DRAINING, not DRAINED); the engine looks again
  until --idle-timeout; the GPU-process check runs after it as a second opinion.
- activate: the node's reboot goes through Slurm, asked on the node itself (`slurm.reboot_command`: FAIL, then
  `scontrol reboot nextstate=DOWN` with the campaign's reason): slurmctld shows it rebooting, and it stays out of
  service until the undrain. A node someone else took out of service is not changed: its host reboots by itself.
- undrain (also of a rollback, a release and an accepted held host): only a node whose reason is still this
  campaign's own is resumed (a reboot the activation asked that Slurm has not done is withdrawn first:
  `scontrol cancel_reboot`), once its slurmd answers slurmctld again (after the activation's reboot; one that does
  not within SLURMD_WAIT_S fails its host and stays drained); one whose reason someone changed is left as it is,
  and the campaign says so (the `slurm_node_left` event, a notification).
- soak: jobs that ended on a watched node since its change, as Slurm's job completion log records them: NODE_FAIL
  and FAILED count as failed canary runs.
- reservations (`--drain-mode reservation`): a maintenance reservation per wave, `fleetctl-c<campaign>-w<wave>`.
  The journal's `slurm_reservation` event, written before Slurm is asked, is what makes one the campaign's: a
  reservation of that name the journal does not show is someone else's, never changed nor deleted (the campaign
  refuses it). A node leaves its wave's reservation when it is resumed.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

from ..fleet import inventory
from . import slurmctl as slurm
from ..errors import InputError
from ..history.timefmt import parse, stamp
from ..campaign import transitions
from ..campaign.transitions import HostState, Record
from ..campaign.context import Context, Outcome
from ..campaign.journal import Journal
from .nodes import node_names

SLURMD_WAIT_S, RESPONDING_POLL_S = 120.0, 2.0  # before a resume: slurmd back in touch with slurmctld
FAILED_JOB_STATES = ("NODE_FAIL", "FAILED")
MADE = Record.SLURM_RESERVATION
_RESERVING = threading.Lock()  # a reservation's nodes are read, then written: one change at a time (worker threads)


def reservation_name(campaign: int, wave: int) -> str:
    return f"{prefix(campaign)}{wave}"


def prefix(campaign: int) -> str:
    return f"fleetctl-c{campaign}-w"


def made(journal: Journal, campaign: int) -> set[str]:
    """The reservations the journal shows the campaign made."""
    return {e["name"] for e in journal.events(campaign) if e["event"] == MADE}


class Slurm:
    name = "slurm"
    reserves = True

    def left_out(self, fleet: inventory.Fleet, hosts: list[str]) -> list[dict[str, Any]]:
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

    def drain(self, ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
        names = node_names(ctx.fleet, hosts)
        nodes = slurm.nodes(sorted(set(names.values())))
        ours = reserved_by(ctx, nodes)
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
            if taken_out(node, ours):
                # Someone took it out of service meanwhile: fleetctl neither drains nor (later) resumes it. A rollback
                # goes on (no job lands on it either way); a change does not start on it.
                detail = {"slurm": {"node": name, "before": before, "left": True}}
                out[host] = (Outcome("ok", None, detail) if rollback else
                             Outcome("fail", f"taken out of service in Slurm since the plan, left as it is: "
                                             f"{node.describe()}", detail))
                continue
            text = reason(ctx, host, rollback)
            try:
                slurm.drain(name, text)
            except slurm.SlurmError as e:
                out[host] = Outcome("fail", f"slurm: {e}", {"slurm": {"node": name, "before": before}})
                continue
            out[host] = Outcome("ok", None, {"slurm": {"node": name, "before": before, "reason": text}})
        return out

    def busy(self, ctx: Context, hosts: list[str]) -> dict[str, str]:
        """One look: host -> why Slurm still has work on its node (jobs allocated: DRAINING, not DRAINED), or that
        Slurm has no such node; the hosts not named are idle as far as Slurm knows."""
        names = node_names(ctx.fleet, hosts)
        nodes = slurm.nodes(sorted(set(names.values())))
        return {h: (f"Slurm has no node {n}" if n not in nodes else
                    f"Slurm still has jobs on {n}: {nodes[n].describe()}")
                for h, n in names.items() if n not in nodes or not nodes[n].drained}

    def reboot_commands(self, ctx: Context, hosts: list[str], rollback: bool) -> dict[str, str]:
        """`scontrol reboot` for each host whose node the campaign holds (its own reason); a node someone else
        took out of service meanwhile is not changed: its host reboots by itself."""
        names = node_names(ctx.fleet, hosts)
        nodes = slurm.nodes(sorted(set(names.values())))
        return {h: slurm.reboot_command(n, reason(ctx, h, rollback)) for h, n in names.items()
                if n in nodes and slurm.owned_by_campaign(nodes[n], ctx.campaign)}

    def undrain(self, ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
        names = node_names(ctx.fleet, hosts)
        nodes = _answering(names, SLURMD_WAIT_S)
        ours = reserved_by(ctx, nodes)
        out = {}
        for host, name in names.items():
            node = nodes.get(name)
            if node is None:
                out[host] = Outcome("fail", f"Slurm has no node {name}")
            elif slurm.owned_by_campaign(node, ctx.campaign):
                if not node.responding:  # a slurmd that did not come back (its GRES refused by the new driver, ...)
                    out[host] = Outcome("fail", f"slurmd on {name} has not answered slurmctld for "
                                                f"{SLURMD_WAIT_S:g}s after the change ({node.describe()}): the node "
                                                "stays drained",
                                        {"slurm": {"node": name, "resumed": False, "state": node.state}})
                    continue
                try:
                    if node.reboot_pending:  # the activation's reboot did not happen (a failed or aborted change)
                        slurm.cancel_reboot(name)
                    slurm.resume(name)
                except slurm.SlurmError as e:
                    out[host] = Outcome("fail", f"slurm: {e}", {"slurm": {"node": name, "state": node.state}})
                    continue
                out[host] = Outcome("ok", None, {"slurm": {"node": name, "resumed": True, "was": node.state}})
            else:
                # Not this campaign's drain (any more): someone changed the reason, drained it for their own cause,
                # or the drain never happened (a drain that failed). Leave the node; say so where it is drained.
                detail = {"node": name, "resumed": False, "state": node.state, "reason": node.reason}
                if taken_out(node, ours):
                    ctx.journal.note(ctx.campaign, Record.SLURM_NODE_LEFT, host=host, node=name, state=node.state,
                                     node_reason=node.reason)
                out[host] = Outcome("ok", None, {"slurm": detail})
        if ctx.options.drain_mode == "reservation":
            leave(ctx, [names[h] for h, o in out.items() if o.outcome == "ok"])
        return out

    def failed_jobs(self, ctx: Context, hosts: list[str]) -> tuple[dict[str, list[dict[str, Any]]], str | None]:
        """(host -> the Slurm jobs that failed on its node since fleetctl resumed it (its undrain), each job once
        however many checks see it; what kept the log from being read, if anything: the check notes it, the canary
        still runs)."""
        names = node_names(ctx.fleet, hosts)
        since = {h: parse(t) for h in hosts
                 if (t := next((r["finished_at"] for r in ctx.journal.steps(ctx.campaign, h)
                                if r["step"] == HostState.UNDRAIN), None))}
        if not since:
            return {}, None
        try:
            by_node = failed_jobs(sorted({names[h] for h in since}), min(since.values()))
        except slurm.SlurmError as e:
            return {}, str(e)
        return {h: [dict(j, end=stamp(j["end"])) for j in by_node.get(names[h], []) if j["end"] >= t]
                for h, t in since.items()}, None

    def reserve(self, ctx: Context, wave: int, hosts: list[str], start: datetime) -> None:
        name = reservation_name(ctx.campaign, wave)
        nodes = sorted(set(node_names(ctx.fleet, hosts).values()))
        with _RESERVING:
            held = slurm.reservations()
            mine = made(ctx.journal, ctx.campaign)
            foreign = sorted(n for n in held if n.startswith(prefix(ctx.campaign)) and n not in mine)
            if foreign:
                raise InputError(f"Slurm already holds a reservation named {foreign[0]}, which campaign "
                                 f"{ctx.campaign} did not make: fleetctl leaves it alone (delete it if it is left "
                                 "from another fleetctl history)")
            if name in held:
                if not nodes:
                    slurm.delete_reservation(name)
                elif set(slurm.hostnames(held[name].nodelist)) != set(nodes):
                    slurm.update_reservation(name, nodes)
            elif nodes:
                ctx.journal.note(ctx.campaign, MADE, name=name, wave=wave, start=stamp(start), nodes=nodes,
                                 reason=f"{name} holds {', '.join(nodes)} for wave {wave} from {stamp(start)}")
                slurm.create_reservation(name, start, nodes)

    def release(self, journal: Journal, campaign: int, keep: int | None = None) -> None:
        kept = reservation_name(campaign, keep) if keep is not None else None
        with _RESERVING:
            held = [n for n in slurm.reservations() if n.startswith(prefix(campaign)) and n != kept]
            mine = made(journal, campaign) if held else set()
            for name in held:
                if name in mine:
                    slurm.delete_reservation(name)


def reason(ctx: Context, host: str, rollback: bool) -> str:
    """The campaign's reason for HOST's node: `fleetctl campaign N: A -> B`, a rollback's `B -> A (rollback)`."""
    was = ctx.befores.get(host, {}).get("version")
    return (slurm.campaign_reason(ctx.campaign, ctx.target, f"{was or '?'} (rollback)") if rollback
            else slurm.campaign_reason(ctx.campaign, was, ctx.target))


def taken_out(node: slurm.Node, ours: set[str]) -> bool:
    """Taken out of service by someone else: drained, down, or reserved other than by this campaign (OURS: the
    nodes only its own active reservations hold)."""
    return node.drained_or_draining or node.down or (node.maintenance and node.name not in ours)


def reserved_by(ctx: Context, nodes: dict[str, slurm.Node]) -> set[str]:
    """Those of NODES that only this campaign's active reservations hold (asked only if one shows reserved)."""
    if not any(n.maintenance for n in nodes.values()):
        return set()
    active = {name: r for name, r in slurm.reservations().items() if r.active}
    mine = made(ctx.journal, ctx.campaign) if any(n.startswith(prefix(ctx.campaign)) for n in active) else set()
    ours: set[str] = set()
    others: set[str] = set()
    for name, r in active.items():
        (ours if name in mine else others).update(slurm.hostnames(r.nodelist))
    return ours - others


def leave(ctx: Context, nodes: list[str]) -> None:
    """NODES, back in service, leave the campaign's reservations (the last one out deletes it). Whatever Slurm
    refuses is noted (`reservation_failed`): the node then stays reserved until its wave ends."""
    try:
        with _RESERVING:
            held = {n: r for n, r in slurm.reservations().items() if n.startswith(prefix(ctx.campaign))}
            mine = made(ctx.journal, ctx.campaign) if held else set()
            for name in sorted(set(held) & mine):
                now = slurm.hostnames(held[name].nodelist)
                rest = [n for n in now if n not in nodes]
                if rest and len(rest) < len(now):
                    slurm.update_reservation(name, rest)
                elif not rest:
                    slurm.delete_reservation(name)
    except slurm.SlurmError as e:
        ctx.journal.note(ctx.campaign, Record.RESERVATION_FAILED, nodes=nodes, reason=str(e))


def _answering(names: dict[str, str], timeout_s: float) -> dict[str, slurm.Node]:
    """The nodes of NAMES as Slurm reports them once each one's slurmd answers slurmctld again (no NOT_RESPONDING:
    after the activation's reboot slurmctld hears from slurmd at its registration or next ping), or TIMEOUT_S."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = slurm.nodes(sorted(set(names.values())))
        if all(nodes[n].responding for n in names.values() if n in nodes) or time.monotonic() >= deadline:
            return nodes
        time.sleep(RESPONDING_POLL_S)


def failed_jobs(nodes: list[str], since: datetime) -> dict[str, list[dict[str, Any]]]:
    """node -> the jobs that ended on it in a failed state at or after SINCE (Slurm's job completion log)."""
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in nodes}
    for job in slurm.finished_jobs(since, FAILED_JOB_STATES):
        for n in set(job["nodes"]) & set(nodes):
            out[n].append(job)
    return out
