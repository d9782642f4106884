"""The registry of controls: each family module declares its controls with @control (id, title, severity, the facts
it needs, remediation, roles); evaluate() runs them all, in the order they were declared, on one host's facts."""

from __future__ import annotations

from typing import Any, Callable

from .base import Check, Control, not_applicable, unread

CONTROLS: list[Control] = []
# What else a control is used for besides the audit, declared with the control (plan, precheck, verify and rollback
# ask with_role; tests/unit/test_controls_registry.py holds each role's members):
ROLES = {
    "target": "its outcome follows from the driver version alone, so a campaign judges the TARGET with it before "
              "touching a host (plan.target_problems: the host's facts as they would be on the target) and after "
              "the change",
    "health": "failing (or unverifiable) at critical severity makes a host unsafe to touch (plan.health_problems)",
    "boot_risk": "decides whether the driver comes back after a reboot: failing at any severity excludes a host "
                 "(plan.boot_risks)",
    "interconnect": "between the GPUs: the verify fails a host on one failing now that did not fail at the precheck",
    "restored_on_rollback": "the driver's own findings (driver, nouveau, persistence, runtime/CDI, fabric manager): "
                            "recorded at the precheck, and a rollback must give each back as it was",
    "judged_by_verify": "the forward verify states it itself (driver state and version, GPU count, held packages, "
                        "next boot, interconnect): changed_controls does not repeat it",
    "verify_always": "the verify fails a host on it whatever it was at the precheck (held packages, the next boot's "
                     "module), so the rollback's comparison with the precheck leaves it out",
    "not_soaked": "read while jobs start and end on the host, it can fail for a moment without a fault: the soak's "
                  "checks leave it out (every other control that passed at the precheck and fails at a soak check "
                  "fails the host, as at the verify: soak.observe)",
    "domain_formed": "passing says the host's rack-scale NVLink domain has formed again (IMEX running, every peer "
                     "ready and connected): after an activation the verify collects the facts again until it passes "
                     "(steps.imex_pending)",
}
# The hosts a control registered with peers compares a host with (audit.peer_sets):
PEERS_BY = {
    "group": "the host's inventory group (its most specific one)",
    "nvlink_domain": "the host's NVLink domain (domains.group: the trays of one rack-scale NVLink fabric)",
}


def control(id: str, title: str, severity: str, needs: tuple[str, ...], remediation: str, reference: bool = False,
            roles: tuple[str, ...] = (), peers: Callable[[dict[Any, dict[str, Any] | None]], Any] | None = None,
            peers_by: str = "group"):
    """PEERS: for a control that compares a host with other hosts (PEERS_BY says which), the function the audit calls
    once per set of peers with {inventory.Host: its facts, None where not collected}; what it returns is handed to the
    control."""
    assert set(roles) <= set(ROLES), roles
    assert id not in {c.id for c in CONTROLS}, id
    assert peers_by in PEERS_BY, peers_by

    def register(fn: Callable[..., Check | None]):
        CONTROLS.append(Control(id, title, severity, needs, remediation, fn, reference, roles, peers, peers_by))
        return fn
    return register


_BY_ROLE: dict[str, tuple[int, tuple[str, ...]]] = {}  # role -> (len(CONTROLS) when answered, ids)


def with_role(role: str) -> tuple[str, ...]:
    """Ids of the controls that declare ROLE, in registry order (remembered: callers ask once per finding)."""
    known = _BY_ROLE.get(role)
    if known is None or known[0] != len(CONTROLS):
        if role not in ROLES:
            raise KeyError(f"no control role {role!r}: {', '.join(ROLES)}")
        known = _BY_ROLE[role] = (len(CONTROLS), tuple(c.id for c in CONTROLS if role in c.roles))
    return known[1]


def reference_controls() -> list[str]:
    """Ids of the controls that compare a host with its own last passing audit."""
    return [c.id for c in CONTROLS if c.uses_reference]


def peer_controls() -> list[Control]:
    """The controls that compare a host with other hosts (its inventory group, its NVLink domain)."""
    return [c for c in CONTROLS if c.peers is not None]


def _fact_error(facts: dict[str, Any], needs: tuple[str, ...]) -> str | None:
    if any(n == "gpus" or n.startswith("gpus[") for n in needs):
        needs = needs + ("nvml",)  # NVML failing as a whole leaves every GPU fact unread
    for key, message in facts.get("errors", {}).items():
        if any(unread(key, n) for n in needs):
            return f"{key}: {message}"
    return None


def evaluate(facts: dict[str, Any], policy: dict[str, Any], reference: dict[str, dict[str, Any]] | None = None,
             peers: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Findings for one host, one per control, in CONTROLS order.

    REFERENCE maps a control id to the host's facts at its latest recorded audit where that control passed (see
    Store.passing_facts); controls registered with reference=True get theirs, or None. PEERS maps a control id to
    what its peers function made of the host's peers (audit.peers); controls registered with peers get
    theirs, or None (a host judged alone: fleetctl check, the plan's target)."""
    severities = policy.get("severity", {})
    findings = []
    for c in CONTROLS:
        error = _fact_error(facts, c.needs)
        if error:
            check = Check("error", f"could not read the facts this control needs: {error}")
        else:
            args = (facts, policy, (reference or {}).get(c.id)) if c.uses_reference else (facts, policy)
            if c.peers is not None:
                args += ((peers or {}).get(c.id),)
            check = c.evaluate(*args) or not_applicable("not required by the baseline")
        findings.append({"control": c.id, "title": c.title, "severity": severities.get(c.id, c.severity),
                         "status": check.status, "message": check.message, "evidence": check.evidence,
                         "remediation": c.remediation if check.status in ("fail", "warn", "error") else None})
    return findings


def error_finding(control_id: str, title: str, message: str) -> dict[str, Any]:
    """The one finding of a host whose facts could not be had (unreachable, or garbage returned)."""
    return {"control": control_id, "title": title, "severity": "critical", "status": "error", "message": message,
            "evidence": {}, "remediation": "check SSH access and the host's Python; rerun the audit"}
