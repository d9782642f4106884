"""What a step works with (the campaign, its hosts, options, journal and scheduler) and what it returns for each
host: the steps (steps.py) and the schedulers (orchestrator/schedulers/) share these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import baseline as baseline_mod, probe
from ..fleet import inventory, runner
from .journal import Journal
from .options import CampaignOptions


@dataclass
class Outcome:
    outcome: str  # ok | fail | inconclusive | skip
    reason: str | None = None
    detail: dict[str, Any] | None = None
    before: dict[str, Any] | None = None  # precheck only: what the host was before the campaign touched it


@dataclass
class Context:
    journal: Journal
    campaign: int
    target: str
    fleet: inventory.Fleet
    base: baseline_mod.Baseline
    options: CampaignOptions
    befores: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> recorded "before"
    prometheus: Any = None  # promql.Client where the baseline's canary metrics are judged (docs/canary.md)
    scheduler: Any = None  # scheduler.Scheduler: what the hosts drain through (the engine's: scheduler.of(options))
    playbooks: runner.Runner = field(default_factory=runner.Runner)  # what runs its playbooks (the engine's: Parts)

    def probe_options(self, throughput: bool) -> probe.ProbeOptions:
        o = self.options.probe
        return probe.ProbeOptions(throughput=throughput, samples=o.samples, warmup_s=o.warmup_s,
                                  trial_s=o.trial_s, forks=self.options.forks, preflight=False)

    def policy(self, host: str) -> dict[str, Any]:
        return self.base.policy_for(list(self.fleet.host(host).groups))

    def activation(self, host: str) -> str:
        return activation(self.policy(host))


def activation(policy: dict[str, Any]) -> str:
    """How a host's new driver is loaded: reboot (default) or reload (baseline campaign.activation)."""
    return str(policy.get("campaign", {}).get("activation", "reboot"))
