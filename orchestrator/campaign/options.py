"""A campaign and its options, typed: what the engine, the steps and the soak read, instead of a bare id and the
nested dict the history keeps (campaigns.options, JSON: the same keys as ever, read back by `from_dict` with the
defaults a campaign recorded before a key existed)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import settings
from .hooks import Hooks


def soak_length(soak_s: float | list[float], gap: int) -> float:
    """The soak after wave GAP: one length per gap between waves, the last repeated (a number: every gap)."""
    if isinstance(soak_s, list):
        return float(soak_s[min(gap, len(soak_s)) - 1]) if soak_s else 0.0
    return float(soak_s)


IDLE_TIMEOUT_S = 86400  # --idle-timeout's default without a window (with one: the time left in it)


@dataclass(frozen=True, kw_only=True)
class IdleOptions:
    timeout_s: int = 300  # whole seconds; a campaign recorded before the default became the window's
    poll_s: int = 10


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    samples: int = settings.SAMPLES.value
    warmup_s: float = settings.WARMUP.value
    trial_s: float = settings.TRIAL.value


@dataclass(frozen=True, kw_only=True)
class CampaignOptions:
    """The defaults are those of a campaign recorded before its key existed (no soak then)."""
    rollback_scope: str = settings.ROLLBACK_SCOPE.value
    forks: int | None = None
    window_end: str | None = None
    soak_s: float | list[float] = 0
    soak_interval_s: float = settings.SOAK_INTERVAL.value
    soak_grace_s: float = settings.SOAK_GRACE.value
    canary: str | None = None
    canary_max_failures: int = settings.CANARY_MAX_FAILURES.value
    pace: str = "wave"  # host: each host goes on when its own jobs end (a campaign before per-host pipelines: wave)
    max_in_flight: int | None = None  # hosts (NVLink domains: one each) out of service at once; None: a whole wave
    drain_mode: str = settings.DRAIN_MODE.value  # drain | reservation (campaign/scheduler/slurm.py)
    lead_s: float = 0.0  # reservation mode: how long before the canary wave its reservation starts
    capacity_budget_node_hours: float | None = None  # idle and change node-hours it may cost (campaign/capacity.py)
    hooks: Hooks = field(default_factory=Hooks)
    idle: IdleOptions = field(default_factory=IdleOptions)
    probe: ProbeSettings = field(default_factory=ProbeSettings)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CampaignOptions:
        flat = {k: v for k, v in d.items() if k not in ("hooks", "idle", "probe") and k in cls.__dataclass_fields__}
        return cls(**flat, hooks=Hooks(**d.get("hooks", {})), idle=IdleOptions(**d.get("idle", {})),
                   probe=ProbeSettings(**d.get("probe", {})))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def soak_length(self, gap: int) -> float:
        return soak_length(self.soak_s, gap)


@dataclass(frozen=True)
class Campaign:
    """One campaign of the history, as the engine drives it."""
    id: int
    target: str
    options: CampaignOptions
    plan: dict[str, Any]

    @classmethod
    def of(cls, row: Any) -> Campaign:
        """From its campaigns row."""
        return cls(row["id"], row["target"], CampaignOptions.from_dict(json.loads(row["options"])),
                   json.loads(row["plan"]))
