"""The blessed matrix: load, validate, and resolve the policy that applies to one host."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import inputs, resources, schemas
from .judge import promql
from .judge.canary import kinds
from .errors import InputError, yaml_error

DEFAULT_PATH = resources.data_path("default-baseline.yml")


@dataclass(frozen=True)
class Baseline:
    path: Path
    name: str
    digest: str  # sha256 of the file's bytes, so an auditor can check it with sha256sum
    groups: dict[str, dict[str, Any]]

    def policy_for(self, host_groups: list[str]) -> dict[str, Any]:
        """'all' first, then the host's groups in inventory order (parents before children); later wins."""
        policy: dict[str, Any] = {}
        for group in ["all"] + [g for g in host_groups if g != "all"]:
            if group in self.groups:
                policy = deep_merge(policy, self.groups[group])
        return policy

    def check_groups(self, known_groups: set[str]) -> None:
        unknown = sorted(set(self.groups) - known_groups - {"all"})
        if unknown:
            raise InputError(f"{self.path}: $.groups.{unknown[0]}: group '{unknown[0]}' is not in the inventory")

    def canary_for(self, host_groups: list[str]) -> Canary:
        """The canary analysis of a host of HOST_GROUPS (its policy's `canary`, inherited as the rest)."""
        section = self.policy_for(host_groups).get("canary", {})
        metrics = tuple(CanaryMetric(name=m["name"], query=m["query"], good=m["good"],
                                     max_change=max_change(m["max_change"]), kind=m.get("kind", kinds.DEFAULT),
                                     host_label=m.get("host_label", promql.DEFAULT_HOST_LABEL))
                        for m in section.get("metrics", ()))
        return Canary(on_missing=section.get("on_missing", "hold"), min_samples=section.get("min_samples"),
                      metrics=metrics)

    def xid_overrides(self) -> dict[str, dict[str, Any]]:
        """Overrides of the 'all' group: the ones that travel to every host's collector."""
        return self.groups.get("all", {}).get("xid", {}).get("overrides", {})


@dataclass(frozen=True, kw_only=True)
class CanaryMetric:
    name: str
    query: str  # with the {hosts} placeholder: promql.render
    good: str  # higher | lower
    max_change: float  # the fraction tolerated in the bad direction, in (0, 1]
    kind: str = kinds.DEFAULT  # a name of judge/canary/kinds.py
    host_label: str = promql.DEFAULT_HOST_LABEL


@dataclass(frozen=True, kw_only=True)
class Canary:
    on_missing: str = "hold"  # hold | fail | ignore
    min_samples: int | None = None  # None: the judge's default
    metrics: tuple[CanaryMetric, ...] = ()


def max_change(value: float | str) -> float:
    """A max_change as a fraction: 0.05 or '5%' -> 0.05 (the schema has checked its form)."""
    return float(value[:-1]) / 100 if isinstance(value, str) else float(value)


def canary_problem(groups: dict[str, Any]) -> str | None:
    """'JSON path: why' of the first canary metric the schema cannot refuse (a second one of a name in its group, a
    percentage outside (0%, 100%], a {hosts} outside a quoted matcher, a kind judge/canary/kinds.py does not know),
    or None."""
    for group, policy in groups.items():
        seen: set[str] = set()
        for i, metric in enumerate(policy.get("canary", {}).get("metrics", ())):
            where = f"$.groups.{group}.canary.metrics[{i}]"
            if metric["name"] in seen:
                return f"{where}.name: a second metric named {metric['name']!r} in group {group}"
            seen.add(metric["name"])
            if not 0 < max_change(metric["max_change"]) <= 1:
                return f"{where}.max_change: {metric['max_change']!r} is not above 0% and at most 100%"
            try:
                promql.placeholders(metric["query"])
            except ValueError as e:
                return f"{where}.query: {e}"
            try:
                kinds.of(metric.get("kind", kinds.DEFAULT))
            except LookupError as e:
                return f"{where}.kind: {e.args[0]}"
    return None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def non_string_key(node: Any, where: str = "$") -> tuple[str | None, Any]:
    """(JSON path, key) of the first mapping key YAML did not read as a string (94:, null:, 2024-01-01:), or
    (None, None). The schema's key patterns only look at strings, and the rest of fleetctl expects strings."""
    if isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, str):
                return where, key
            found = non_string_key(value, f"{where}.{key}")
            if found[0]:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found = non_string_key(value, f"{where}[{i}]")
            if found[0]:
                return found
    return None, None


def repeat_offender_problem(groups: dict[str, Any]) -> str | None:
    """offenders.problem, where a group sets a repeat-offender policy: offenders (and the ledger and settings it
    imports, 10 ms) is imported only then, not on each `fleetctl check` of a baseline without one."""
    if not any("repeat_offender" in policy.get("incidents", {}) for policy in groups.values()):
        return None
    from .history import offenders
    return offenders.problem(groups)


def load(path: str | Path | None, cached: bool = False) -> Baseline:
    """The baseline at PATH (the embedded one: None), or one InputError line. CACHED: a file whose bytes were found
    valid against the schema before is not validated against it again (schemas.check; `fleetctl check`)."""
    if isinstance(path, str) and not path.strip():  # "$BASELINE" unset: not silently the embedded one
        raise InputError(f"--baseline {path!r}: empty (a variable that is not set?)")
    path = Path(path) if path is not None else DEFAULT_PATH
    raw = inputs.read_regular(path, "baseline", inputs.MAX_DOCUMENT_BYTES)  # a FIFO, /dev/zero...: one line
    try:
        doc = inputs.load_yaml(raw, path)  # YAML too deep or full of aliases: one line
        schemas.check("baseline", doc, inputs.shown(path), raw if cached else None)
    except yaml.YAMLError as e:
        raise yaml_error(inputs.shown(path), e) from None
    except RecursionError:
        raise InputError(f"{inputs.shown(path)}: nested too deeply to be a baseline") from None
    where, key = non_string_key(doc)
    if where:
        raise InputError(f"{inputs.shown(path)}: {where}: key {key} is not a string (quote it in the YAML)")
    problem = canary_problem(doc["groups"]) or repeat_offender_problem(doc["groups"])
    if problem:
        raise InputError(f"{inputs.shown(path)}: {problem}")
    return Baseline(path=path, name=doc.get("name", path.stem), digest="sha256:" + hashlib.sha256(raw).hexdigest(),
                    groups=doc["groups"])
