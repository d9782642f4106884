"""Repeat offenders (docs/hosts.md): a host with at least `count` incidents of the policy's classes in the ledger
within `within` before now. The baseline's policy, per group as the rest of it (`incidents.repeat_offender`), says
how many, in which window, of which classes (ledger.CLASSES; DEFAULT_CLASSES where it names none). The plan leaves
such a host out (code repeat_offender, its evidence as the reason), so it is in no wave and no control cohort;
`fleetctl hosts --repeat-offenders` lists them to send for repair.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable

from . import ledger as ledger_mod, timefmt
from .. import settings

# The hardware's own failures: an Xid (other than 79) is often the workload's doing (13, 31, 43), a failed gate or a
# rollback the driver's (the campaign's breaker watches those).
DEFAULT_CLASSES = ("xid_79", "ecc_uncorrectable", "row_remap", "gpu_lost", "nvlink_down")
WITHIN = settings.WITHIN  # a window of incidents, as `fleetctl hosts --within` reads it: above 0, at most a year


@dataclass(frozen=True)
class Policy:
    count: int
    within_s: float
    classes: tuple[str, ...]


def problem(groups: dict[str, Any]) -> str | None:
    """'JSON path: why' of the first repeat-offender policy the schema cannot refuse (a window that is no duration
    above 0, an unknown incident class), or None."""
    for group, pol in groups.items():
        section = pol.get("incidents", {}).get("repeat_offender")
        if section is None:
            continue
        where = f"$.groups.{group}.incidents.repeat_offender"
        try:
            WITHIN.duration(section["within"])
        except ValueError as e:
            return f"{where}.within: {e}"
        for i, cls in enumerate(section.get("classes", ())):
            if cls not in ledger_mod.CLASSES:
                return (f"{where}.classes[{i}]: {str(cls)[:40]!r} is not an incident class "
                        f"({', '.join(ledger_mod.CLASSES)})")
    return None


def policy(pol: dict[str, Any]) -> Policy | None:
    """The repeat-offender policy of a host's baseline policy (Baseline.policy_for), None where it sets none."""
    section = pol.get("incidents", {}).get("repeat_offender")
    if section is None:
        return None
    return Policy(count=section["count"], within_s=WITHIN.duration(section["within"]),
                  classes=tuple(section.get("classes", DEFAULT_CLASSES)))


def label(cls: str) -> str:
    return "Xid 79" if cls == "xid_79" else cls


def span(within_s: float) -> str:
    """A window in words: '14 days', '36h'."""
    return f"{within_s / 86400:g} days" if within_s % 86400 == 0 else settings.duration_text(within_s)


def evidence(count: int, within_s: float, classes: dict[str, int]) -> str:
    """'4 incidents in 14 days: Xid 79 x2, ecc_uncorrectable x2' (most first)."""
    said = ", ".join(f"{label(c)} x{n}" for c, n in sorted(classes.items(), key=lambda c: (-c[1], c[0])))
    return f"{count} incident{'s' if count != 1 else ''} in {span(within_s)}: {said}"


def find(ledger: ledger_mod.Ledger, policies: dict[str, Policy | None],
         now: str | None = None) -> dict[str, dict[str, Any]]:
    """Of the hosts of POLICIES (host -> its policy; None: none), the repeat offenders at NOW (default: the clock's):
    host -> {count, within_s, classes: {class: n}, last, evidence}, in host order."""
    end = timefmt.parse(now or timefmt.now())
    until = timefmt.stamp(end + timedelta(milliseconds=1))
    counted: dict[float, dict[str, dict[str, Any]]] = {}  # one query per window
    out = {}
    for host, p in sorted(policies.items()):
        if p is None:
            continue
        if p.within_s not in counted:
            counted[p.within_s] = ledger.counts(timefmt.stamp(end - timedelta(seconds=p.within_s)), until)
        seen = counted[p.within_s].get(host)
        classes = {c: n for c, n in (seen or {}).get("classes", {}).items() if c in p.classes}
        count = sum(classes.values())
        if count >= p.count:
            out[host] = {"count": count, "within_s": p.within_s, "threshold": p.count, "classes": classes,
                         "last": seen["last"], "evidence": evidence(count, p.within_s, classes)}
    return out


def listed(ledger: ledger_mod.Ledger, p: Policy, now: str | None = None) -> list[dict[str, Any]]:
    """Every host of the ledger that is a repeat offender by P at NOW (default: the clock's), most incidents first:
    host, count, within_s, threshold, classes, last, evidence and its incidents counted (Ledger.incidents)."""
    end = timefmt.parse(now or timefmt.now())
    since, until = timefmt.stamp(end - timedelta(seconds=p.within_s)), timefmt.stamp(end + timedelta(milliseconds=1))
    found = find(ledger, dict.fromkeys(ledger.counts(since, until), p), timefmt.stamp(end))
    out = [{"host": h, **o, "incidents": ledger.incidents(host=h, since=since, until=until, classes=p.classes)}
           for h, o in found.items()]
    return sorted(out, key=lambda o: (-o["count"], o["host"]))


def left_out(store: Any, hosts: Iterable[tuple[str, list[str]]], base: Any) -> list[dict[str, Any]]:
    """The plan's hosts to leave out (plan.build's LEFT_OUT: name, code, reason) of HOSTS ((name, groups)), each
    judged by its groups' policy of BASE against the history's ledger. No policy anywhere: the ledger is not read."""
    policies = {name: policy(base.policy_for(list(groups))) for name, groups in hosts}
    if not any(policies.values()):
        return []
    with ledger_mod.Ledger(store) as ledger:
        found = find(ledger, policies)
    return [{"name": h, "code": "repeat_offender", "reason": f"repeat offender: {o['evidence']}"}
            for h, o in found.items()]

