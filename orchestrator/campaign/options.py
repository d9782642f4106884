"""A campaign and its options, typed: what the engine, the steps and the soak read, instead of a bare id and the
nested dict the history keeps (campaigns.options, JSON: the same keys as ever, read back by `from_dict` with the
defaults a campaign recorded before a key existed). The options are those `fleetctl upgrade` is given: a field for
each setting orchestrator/settings.py declares `recorded`, so a new campaign flag is its declaration alone."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, make_dataclass
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


# Where a campaign recorded before a key existed differs from the setting's default: no soak then, hosts paced by
# waves, reservations not led.
RECORDED_BEFORE = {"soak_s": 0, "pace": "wave", "lead_s": 0.0}
NESTED = ("hooks", "idle", "probe")


@dataclass(frozen=True, kw_only=True)
class Derived:
    """What the campaign records that follows from its settings rather than being one (CampaignOptions adds a field
    for every setting recorded as it is given: settings.Setting.recorded)."""
    window_end: str | None = None  # from --window
    hooks: Hooks = field(default_factory=Hooks)  # from --drain-preset, --drain, --undrain
    idle: IdleOptions = field(default_factory=IdleOptions)  # from --idle-timeout and --window
    probe: ProbeSettings = field(default_factory=ProbeSettings)  # --samples, --warmup, --trial (probe.NAME)

    @classmethod
    def recording(cls, given: dict[str, Any], **derived: Any) -> CampaignOptions:
        """The options of a new campaign: each recorded setting's value from GIVEN (a command's parameters, by the
        settings' `param`; a list where the command line gives a tuple, as the history reads it back), and DERIVED."""
        flat: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for s in settings.CAMPAIGN:
            if not s.recorded or s.param not in given:
                continue
            value = list(given[s.param]) if isinstance(given[s.param], tuple) else given[s.param]
            head, _, key = s.recorded.partition(".")
            if key:
                nested.setdefault(head, {})[key] = value
            else:
                flat[s.recorded] = value
        if "probe" in nested and "probe" not in derived:
            derived["probe"] = ProbeSettings(**nested.pop("probe"))
        assert not nested, nested
        return cls(**flat, **derived)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CampaignOptions:
        """As the history keeps it; a key recorded by a version that had it and this one has not is dropped."""
        flat = {k: v for k, v in d.items() if k not in NESTED and k in cls.__dataclass_fields__}
        return cls(**flat, hooks=Hooks(**d.get("hooks", {})), idle=IdleOptions(**d.get("idle", {})),
                   probe=ProbeSettings(**d.get("probe", {})))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def soak_length(self, gap: int) -> float:
        return soak_length(self.soak_s, gap)


def options_class(recorded: tuple[settings.Setting, ...]) -> type:
    """The campaign's options: Derived's fields, and one for each setting RECORDED as it is given (its key, its
    default the setting's, or RECORDED_BEFORE's for a campaign recorded before the key existed). One is resolved
    before the campaign is recorded: max_in_flight, the words given (N or P%) until upgrade.start counts the hosts."""
    fields = [(s.recorded, Any, field(default=RECORDED_BEFORE.get(s.recorded, s.value)))
              for s in recorded if s.recorded and "." not in s.recorded]
    return make_dataclass("CampaignOptions", fields, bases=(Derived,), frozen=True, kw_only=True,
                          namespace={"__module__": __name__, "__doc__": "A campaign's options, as the engine reads "
                                     "them and the history records them (campaigns.options)."})


CampaignOptions = options_class(settings.CAMPAIGN)


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
