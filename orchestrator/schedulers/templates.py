"""Drains by command templates (campaign/hooks.py): the operator's --drain/--undrain, or a preset's. They run on the
control node, one per host; what they drained is theirs to know, so nothing is left out at plan, nothing is known
to be busy (the GPU check decides) and nothing is reserved."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..fleet import inventory
from ..errors import InputError
from ..campaign import hooks
from ..campaign.context import Context, Outcome
from ..campaign.journal import Journal
from .nodes import node_names


class Templates:
    name = "templates"
    reserves = False

    def __init__(self, templates: hooks.Hooks):
        self.hooks = templates

    def _run(self, ctx: Context, hosts: list[str], template: str | None) -> dict[str, Outcome]:
        results = hooks.run(template, node_names(ctx.fleet, hosts), ctx.campaign, self.hooks.timeout_s)
        return {h: Outcome("ok" if r["ok"] else "fail", r["reason"], r["detail"]) for h, r in results.items()}

    def left_out(self, fleet: inventory.Fleet, hosts: list[str]) -> list[dict[str, Any]]:
        return []

    def drain(self, ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
        return self._run(ctx, hosts, self.hooks.drain)

    def busy(self, ctx: Context, hosts: list[str]) -> dict[str, str]:
        return {}

    def reboot_commands(self, ctx: Context, hosts: list[str], rollback: bool) -> dict[str, str]:
        return {}

    def undrain(self, ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
        return self._run(ctx, hosts, self.hooks.undrain)

    def failed_jobs(self, ctx: Context, hosts: list[str]) -> tuple[dict[str, list[dict[str, Any]]], str | None]:
        return {}, None

    def reserve(self, ctx: Context, wave: int, hosts: list[str], start: datetime) -> None:
        raise InputError("--drain-mode reservation: only fleetctl's own Slurm drains reserve nodes "
                         "(--drain-preset slurm, without --drain or --undrain)")

    def release(self, journal: Journal, campaign: int, keep: int | None = None) -> None:
        return None


class Kubernetes(Templates):
    """The kubernetes preset: `kubectl drain` evicts the node's pods and waits for them (--timeout), so once it
    has answered Kubernetes knows of no work left on the node."""
    name = "kubernetes"
