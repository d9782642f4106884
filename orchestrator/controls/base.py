"""What every control is made of: the Check it returns, the Control the registry holds, and the helpers the
families share (statuses, severities, versions, the running driver, the GPUs that answer, unread facts)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

SEVERITIES = ("info", "low", "medium", "high", "critical")
STATUSES = ("pass", "fail", "warn", "not_applicable", "error")


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


def version_tuple(version: str | None) -> tuple[int, ...]:
    parts = []
    for p in (version or "").split("-", 1)[0].split(":")[-1].split("."):
        # ASCII digits ('²' is a digit to isdigit(), not to int()), at most 18 (int() refuses thousands of them)
        digits = "".join(ch for ch in p if ch in "0123456789")[:18]
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@dataclass
class Check:
    status: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Control:
    id: str
    title: str
    severity: str
    needs: tuple[str, ...]  # fact paths (host-facts schema) whose read errors make it `error` ("gpus[*].x": any GPU's x)
    remediation: str
    evaluate: Callable[..., Check | None]  # (facts, policy), + reference with uses_reference, + peers with peers
    uses_reference: bool = False
    roles: tuple[str, ...] = ()  # see registry.ROLES
    peers: Callable[[dict[Any, dict[str, Any] | None]], Any] | None = None  # the peers -> what evaluate gets last
    peers_by: str = "group"  # see registry.PEERS_BY


def passed(message: str, **evidence: Any) -> Check:
    return Check("pass", message, evidence)


def failed(message: str, **evidence: Any) -> Check:
    return Check("fail", message, evidence)


def warned(message: str, **evidence: Any) -> Check:
    return Check("warn", message, evidence)


def not_applicable(message: str, **evidence: Any) -> Check:
    return Check("not_applicable", message, evidence)


def running_version(facts: dict[str, Any]) -> str | None:
    d = facts["driver"]
    return d["module_version"] if d["state"] in ("loaded", "version_mismatch") else None


def live_gpus(facts: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in facts["gpus"] if not g.get("lost")]


def _pattern(path: str) -> str:
    return re.escape(path).replace(r"\[\*\]", r"\[\d+\]")


def unread(key: str, need: str) -> bool:
    """An error recorded at KEY leaves NEED unread: KEY is NEED, inside it, or one of its parents ("interconnect"
    leaves "interconnect.gpus[*].nvlink" unread). "[*]" in NEED stands for any index."""
    if re.fullmatch(_pattern(need) + r"(?:[.\[].*)?", key):
        return True
    parents = re.split(r"(?=[.\[])", need)[:-1]
    return any(re.fullmatch(_pattern("".join(parents[:i + 1])), key) for i in range(len(parents)))


def unread_message(facts: dict[str, Any], path: str) -> str:
    return next((f"{k}: {m}" for k, m in facts.get("errors", {}).items() if unread(k, path)), "not reported")
