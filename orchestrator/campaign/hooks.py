"""Drain and undrain: commands run on the control node, where the scheduler's credentials are.

A hook is a command template. It is split into words first and the placeholders are filled in per word
afterwards, so a host name can never become shell syntax: {host} (inventory name), {node} (the host's
`fleetctl_node_name` inventory variable, else its inventory name), {campaign} (the campaign id).
Presets: slurm (fleetctl's own Slurm drains, schedulers/slurm.py; its scontrol templates when the operator gives
one side) and kubernetes (kubectl drain / uncordon).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import redact
from ..errors import InputError

@dataclass(frozen=True)
class Preset:
    """A --drain-preset: its drain and undrain templates, and what it drains with (the flag's help says it)."""
    drain: str | None
    undrain: str | None
    says: str


# A new preset is an entry here (and `python -m orchestrator.settings > schemas/config.schema.json`: its choices);
# one that does more than run its templates is also a scheduler of its own (orchestrator/schedulers/).
PRESETS = {
    "none": Preset(None, None, "none: no drain"),
    "slurm": Preset('scontrol update nodename={node} state=drain reason="fleetctl campaign {campaign}"',
                    "scontrol update nodename={node} state=resume", "slurm: Slurm (fleetctl's own drains)"),
    "kubernetes": Preset("kubectl drain {node} --ignore-daemonsets --delete-emptydir-data --timeout=600s",
                         "kubectl uncordon {node}", "kubernetes: kubectl drain/uncordon"),
}
PLACEHOLDERS = ("host", "node", "campaign")


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """A campaign's drain hooks (CampaignOptions.hooks; the history keeps them under these keys)."""
    drain: str | None = None
    undrain: str | None = None
    timeout_s: float = 900.0  # each hook command's
    slurm: bool = False  # fleetctl's own Slurm drains (schedulers/slurm.py), not templates


def resolve(preset: str | None, drain: str | None, undrain: str | None) -> Hooks:
    """--drain-preset and/or explicit templates (explicit wins), checked now: a bad template is an input error.
    `--drain-preset slurm` alone is fleetctl's Slurm integration (drains it owns, schedulers/slurm.py); with a
    template of the operator's, the templates run as given (the preset's scontrol commands fill the other side)."""
    if preset and preset not in PRESETS:
        raise InputError(f"--drain-preset {preset!r}: unknown (choose from {', '.join(PRESETS)})")
    if preset == "slurm" and drain is None and undrain is None:
        return Hooks(slurm=True)
    chosen = PRESETS[preset or "none"]
    hooks = Hooks(drain=chosen.drain if drain is None else drain, undrain=chosen.undrain if undrain is None else undrain)
    for flag, template in (("--drain", hooks.drain), ("--undrain", hooks.undrain)):
        if template is not None:
            argv(template, {"host": "h", "node": "h", "campaign": "1"}, flag)
    return hooks


def argv(template: str, values: dict[str, str], where: str = "hook") -> list[str]:
    try:
        words = shlex.split(template)
    except ValueError as e:
        raise InputError(f"{where}: cannot split the command into words: {e}") from None  # never the template
    if not words:
        raise InputError(f"{where}: empty command")
    try:
        return [w.format(**values) for w in words]
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:  # {x} {0} {host!z} {host.x} {host[x]}
        raise InputError(f"{where}: an unknown placeholder (use {{host}}, {{node}}, {{campaign}}; {{{{ and }}}} for "
                         f"braces)") from None


def run(template: str | None, hosts: dict[str, str], campaign: int, timeout_s: float) -> dict[str, dict[str, Any]]:
    """host -> {ok, reason, detail}: TEMPLATE for every host at once (HOSTS: inventory name -> node name)."""
    if template is None:
        return {h: {"ok": True, "reason": None, "detail": {"hook": None}} for h in hosts}

    def one(host: str) -> tuple[str, dict[str, Any]]:
        command = argv(template, {"host": host, "node": hosts[host], "campaign": str(campaign)})
        shown = [command[0], redact.NOT_RECORDED]  # the history keeps no token a template may carry
        started = time.monotonic()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return host, {"ok": False, "reason": f"hook {command[0]}: command not found", "detail": {"argv": shown}}
        except subprocess.TimeoutExpired:
            return host, {"ok": False, "reason": f"hook {command[0]}: no answer in {timeout_s:g}s",
                          "detail": {"argv": shown}}
        detail = {"argv": shown, "rc": proc.returncode, "seconds": round(time.monotonic() - started, 3),
                  "output": (proc.stdout + proc.stderr)[-1000:]}
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()
            return host, {"ok": False, "reason": f"hook {command[0]} exited {proc.returncode}: "
                                                 f"{last[-1] if last else 'no output'}", "detail": detail}
        return host, {"ok": True, "reason": None, "detail": detail}

    with ThreadPoolExecutor(max_workers=min(32, len(hosts)) or 1) as pool:
        return dict(pool.map(one, hosts))
