"""fleetctl plan: which hosts move to a target driver version, in which canary waves, with which failure budget.

The facts come from the audit's collection (playbooks/audit.yml, one gpu_facts call per host, the same schema
check and policy evaluation as `fleetctl audit`); the plan is a pure function of those host entries, the baseline,
the target and the ramp (`build`), so it is tested without any host.

Ramp: a comma list of CUMULATIVE targets, each a host count ("1") or a percentage of the eligible hosts ("10%",
rounded up). Each wave brings the total up to its target, and takes at least one more host while any remain; waves
left empty are dropped. The last entry must be 100%: a plan that leaves eligible hosts behind is an input error.

NVLink domains (domains.py): the hosts of a multi-node NVLink domain (a GB200 NVL72 rack's trays) cannot run mixed
drivers, so the ramp counts units of change, a domain or a host on its own: "1" is one domain, "25%" a quarter of the
domains, and the failure budget counts failed domains. A domain goes into one wave whole, and is left out whole
(domain_left_out, naming the host and its reason) when any of its hosts is excluded, or when its IMEX node list
names more hosts than the inventory (after --limit) has of it: a rack is never changed in part. An HGX fleet's units are its
hosts: its plans are as they always were.

Order: a host's group is its most specific inventory group (the last of its groups: the one whose baseline policy
wins); groups keep the inventory's order, hosts within a group are in natural name order. The i-th host of a group of
n sits at i/n of the way through the sequence (ties: inventory group order). So the first hosts are one of every
group (the canary is the first group's first host, then wave 2 reaches the other SKUs early), and a small group is
spread over the ramp instead of being used up in the first waves.

Eligibility, first reason wins: a repeat offender (offenders.py: the baseline's incidents.repeat_offender against
the history's ledger; the reason is its evidence); unreachable; facts not collected; the baseline does not bless the
target for the host's groups; no driver installed (nothing to move from, nor to roll back to); unhealthy (a critical
fail or error in driver.loaded, driver.version_match or any gpu.* control); next boot at risk (nouveau loaded or not
blacklisted, or no matching nvidia module for the kernel it boots next: the new driver would not bind after the
reboot); then hosts already running the target are skipped; last, the target itself: the host's facts as they would
be on it (version, branch, the CUDA the branch supports, the flavor its packages install, the fabric manager moved
with it) judged by the controls that declare the "target" role (controls.with_role) with the host's own policy; one
failing at or above the baseline's `campaign.fail_on` (default medium) excludes the host (target_not_blessed), with
the message the audit would give after the change. The campaign's precheck applies the same rules to fresh facts.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping

import copy

from . import audit, baseline as baseline_mod, controls, runs, schemas, settings
from .fleet import domains
from .history import offenders
from .fleet.inventory import primary_group
from .judge.canary import planning
from .campaign import packages
from .errors import InputError
from .fleet.execution_nodes import RunnerConfig
from .exitcodes import Exit
from .history.store import Store

DEFAULT_BUDGET_HOSTS, DEFAULT_BUDGET_PERCENT = 2, 10  # docs/upgrades.md "Planning": later waves fail at >= 2 hosts or 10%
VERSION_RE = re.compile(r"[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?")  # whole string (fullmatch): no "570.86.15\n"
# ASCII digits, at most 9 a part: Fraction() and str() refuse numbers of thousands of digits (ValueError)
_STEP_RE = re.compile(r"^(?:(?P<count>[0-9]{1,9})|(?P<percent>[0-9]{1,9}(?:\.[0-9]{1,9})?)%)$")


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    target: str
    waves: str = settings.WAVES.default
    inventory: str | None = None
    limit: str | None = None
    baseline: str | None = None
    forks: int | None = None
    preflight: bool = True


@dataclass(frozen=True)
class Step:
    """One cumulative ramp target: a host count, or a percentage of the eligible hosts."""
    value: Fraction
    percent: bool

    def __str__(self) -> str:
        number = str(self.value.numerator) if self.value.denominator == 1 else f"{float(self.value):g}"
        return number + ("%" if self.percent else "")

    def target(self, eligible: int) -> int:
        return math.ceil(self.value * eligible / 100) if self.percent else int(self.value)


# ---- input ---------------------------------------------------------------------------------------

def parse_target(version: str) -> str:
    if not VERSION_RE.fullmatch(version or ""):
        raise InputError(f"--to {version!r}: not a driver version (expected e.g. 570.86.15: branch.minor[.patch])")
    return version


def parse_ramp(spec: str) -> tuple[Step, ...]:
    """'1,10%,50%,100%' -> Steps; every problem is one InputError line naming the entry."""
    where = f"--waves {spec!r}"
    if not spec or not spec.strip():
        raise InputError(f"{where}: empty ramp (give cumulative wave targets such as {settings.WAVES.default})")
    steps: list[Step] = []
    for n, text in enumerate(spec.split(","), 1):
        text = text.strip()
        match = _STEP_RE.match(text)
        if not match:
            raise InputError(f"{where}: entry {n} {text!r} is neither a host count (e.g. 1) "
                             f"nor a percentage (e.g. 10%)")
        step = (Step(Fraction(match["count"]), False) if match["count"] is not None
                else Step(Fraction(match["percent"]), True))
        if step.value == 0:
            raise InputError(f"{where}: entry {n} {text!r}: a wave target must be above zero")
        if step.percent and step.value > 100:
            raise InputError(f"{where}: entry {n} {text!r} is over 100%")
        earlier = next((s for s in reversed(steps) if s.percent == step.percent), None)
        if earlier is not None and step.value <= earlier.value:
            raise InputError(f"{where}: entry {n} {text!r} is not above the earlier {str(earlier)!r} "
                             f"(targets are cumulative: each must reach further)")
        steps.append(step)
    last = steps[-1]
    if not (last.percent and last.value == 100):
        raise InputError(f"{where}: the last entry is {str(last)!r}; it must be 100% "
                         f"(targets are cumulative: the last wave completes the fleet)")
    return tuple(steps)


def wave_sizes(ramp: tuple[Step, ...], eligible: int) -> list[int]:
    """Hosts per wave for ELIGIBLE hosts: each wave brings the total to its target, at least one more host."""
    sizes, done = [], 0
    for step in ramp:
        if done >= eligible:
            break
        total = min(eligible, max(step.target(eligible), done + 1))
        sizes.append(total - done)
        done = total
    return sizes


# ---- ordering ------------------------------------------------------------------------------------

def natural_key(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def order(hosts: list[dict[str, Any]], group_order: list[str]) -> list[dict[str, Any]]:
    """Spread the groups over the sequence: host i of a group of n at position i/n (see the module docstring)."""
    rank = {g: i for i, g in enumerate(group_order)}
    by_group: dict[str, list[dict[str, Any]]] = {}
    for h in hosts:
        by_group.setdefault(primary_group(h["groups"]), []).append(h)
    keyed = []
    for group, members in by_group.items():
        members.sort(key=lambda h: natural_key(h["name"]))
        keyed += [((Fraction(i, len(members)), rank.get(group, len(rank)), group), h) for i, h in enumerate(members)]
    return [h for _, h in sorted(keyed, key=lambda kh: kh[0])]


# ---- eligibility ---------------------------------------------------------------------------------

def blessing_problem(base: baseline_mod.Baseline, groups: list[str], target: str) -> str | None:
    """None when the host's policy allows TARGET; else the reason, naming the group whose rule forbids it."""
    chain = ["all"] + [g for g in groups if g != "all"]
    rules = base.policy_for(groups).get("driver", {})
    branch = target.split(".")[0]
    for key, allowed, ok in (("versions", rules.get("versions"), target in rules.get("versions", [target])),
                             ("branches", rules.get("branches"), branch in rules.get("branches", [branch]))):
        if not ok:
            group = next(g for g in reversed(chain) if key in base.groups.get(g, {}).get("driver", {}))
            return f"baseline does not bless {target} for group {group} (driver.{key}: {', '.join(allowed)})"
    return None


def blessed_for_some(fleet, base: baseline_mod.Baseline, target: str) -> None:
    """InputError (a usage error) when no host of FLEET may take TARGET by its groups' matrix: judged from the inventory
    and the baseline alone, before any host is contacted (a dry run then says what the run would)."""
    problems = [problem for h in fleet.hosts if (problem := blessing_problem(base, list(h.groups), target))]
    if fleet.hosts and len(problems) == len(fleet.hosts):
        first = max(set(problems), key=problems.count)
        raise InputError(f"no host may take {target}: {first}" + (
            f" ({problems.count(first)} of {len(problems)} hosts; others alike)" if len(problems) > 1 else ""))


def implied_exit(made: dict[str, Any]) -> Exit:
    """The code a plan implies where no campaign's outcome decides it (`fleetctl plan`, a dry run, nothing to
    upgrade): 3 where a host is unreachable, 1 where hosts are left out with a reason (off the target: an unattended
    window must not report success), else 0."""
    if any(h["code"] == "unreachable" for h in made["excluded"]):
        return Exit.UNREACHABLE
    return Exit.FINDINGS if made["excluded"] else Exit.OK


def health_problems(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Critical fails (or unverifiable controls) that make a host unsafe to touch: driver state and GPU health."""
    return [f for f in findings if f["status"] in ("fail", "error") and f["severity"] == "critical"
            and f["control"] in controls.with_role("health")]


def boot_risks(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fails (or unverifiable) of the controls that decide whether the driver comes back after a reboot."""
    return [f for f in findings if f["status"] in ("fail", "error") and f["control"] in controls.with_role("boot_risk")]


def on_target(facts: dict[str, Any], running: str, target: str) -> dict[str, Any]:
    """FACTS as they would be once the campaign moved the host from RUNNING to TARGET: the driver's version and
    branch, the CUDA version of the target's branch (the table: controls.CUDA_BY_BRANCH), the flavor the target's
    packages install, and a fabric manager and an IMEX package moved with the driver where the host has one."""
    after = copy.deepcopy(facts)
    d = after["driver"]
    before = packages.driver_versioned(facts["driver"]["packages"], running)
    names = list(packages.target_set(before, running, target)) or list(before)
    d.update(module_version=target, userspace_version=target, branch=target.split(".")[0], cuda_driver_version=None,
             module_flavor=packages.flavor_of(names, d.get("module_flavor")), state="loaded")
    fm = after.get("fabric_manager") or {}
    if fm.get("package_version") and any(packages.is_fabric_manager(n) for n in before):
        fm["package_version"] = f"{target}-1"
    imex = after.get("imex") or {}
    if imex.get("package_version") and any(packages.is_imex(n) for n in before):
        imex.update(package=next((n for n in names if packages.is_imex(n)), imex.get("package")),
                    package_version=f"{target}-1", version=target)
    return after


def target_problems(entry: dict[str, Any], base: baseline_mod.Baseline, running: str,
                    target: str) -> list[dict[str, Any]]:
    """The findings the audit would give on TARGET that fail at or above the campaign's severity, of the controls
    whose outcome follows from the driver version alone."""
    pol = base.policy_for(list(entry["groups"]))
    floor = controls.severity_rank(pol.get("campaign", {}).get("fail_on", "medium"))
    judged = set(controls.with_role("target"))
    return [f for f in controls.evaluate(on_target(entry["facts"], running, target), pol)
            if f["control"] in judged and f["status"] in ("fail", "error")
            and controls.severity_rank(f["severity"]) >= floor]


def classify(entry: dict[str, Any], base: baseline_mod.Baseline, target: str) -> tuple[str, str | None, str]:
    """(verdict, code, detail): ('wave', None, from_version) | ('skipped', code, why) | ('excluded', code, why)."""
    if not entry["reachable"]:
        return "excluded", "unreachable", f"unreachable: {entry['error']}"
    if entry["facts"] is None:
        return "excluded", "no_facts", entry["error"] or "no facts collected"
    problem = blessing_problem(base, entry["groups"], target)
    if problem:
        return "excluded", "not_blessed", problem
    facts = entry["facts"]
    if facts["driver"]["state"] == "not_installed":
        return "excluded", "no_driver", "no NVIDIA driver installed: no version to move from or to roll back to"
    bad = health_problems(entry["findings"])
    if bad:
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        word = "unhealthy" if bad[0]["status"] == "fail" else "health not verifiable"
        return "excluded", "unhealthy", f"{word}: {bad[0]['control']}: {bad[0]['message']}{more}"
    risky = boot_risks(entry["findings"])
    if risky:
        more = f" (+{len(risky) - 1} more)" if len(risky) > 1 else ""
        return "excluded", "boot_at_risk", (f"next boot at risk: {risky[0]['control']}: {risky[0]['message']}{more}; "
                                            "fix it (fleetctl audit shows how) before upgrading this host")
    running = controls.running_version(facts)
    if running is None:  # only where the baseline lowered driver.loaded below critical
        return "excluded", "unhealthy", "unhealthy: no nvidia kernel module loaded: no running version to move from"
    if running == target:
        return "skipped", "on_target", f"already running {target}"
    wrong = target_problems(entry, base, running, target)
    if wrong:
        more = f" (+{len(wrong) - 1} more)" if len(wrong) > 1 else ""
        return "excluded", "target_not_blessed", (f"{target} fails this host's baseline: {wrong[0]['control']} "
                                                  f"{wrong[0]['severity']}: {wrong[0]['message']}{more}")
    return "wave", None, running


# ---- failure budget ------------------------------------------------------------------------------

def budget(index: int, size: int, policies: list[dict[str, Any]], unit: str = "host") -> dict[str, Any]:
    """The canary fails on any failed UNIT (a host, or an NVLink domain: any of its hosts failed); a later wave at
    >= max(budget_hosts, budget_percent of it) failed units, never more than the wave's SIZE (in units); with several
    policies in one wave, the strictest wins."""
    if index == 1:
        return {"canary": True, "fail_at": 1, "budget_hosts": None, "budget_percent": None, "unit": unit,
                "rule": f"canary: any failed {unit} fails the wave"}
    options = set()
    for pol in policies:
        c = pol.get("campaign", {})
        options.add((c.get("budget_hosts", DEFAULT_BUDGET_HOSTS), c.get("budget_percent", DEFAULT_BUDGET_PERCENT)))
    best = None
    for hosts, percent in sorted(options):
        fail_at = min(size, max(hosts, math.ceil(Fraction(str(percent)) * size / 100)))
        if best is None or fail_at < best[0]:
            best = (fail_at, hosts, percent)
    fail_at, hosts, percent = best
    return {"canary": False, "fail_at": fail_at, "budget_hosts": hosts, "budget_percent": percent, "unit": unit,
            "rule": f"fails at >= max({hosts} {unit}s, {percent:g}% of {size}) = {fail_at} failed {unit}"
                    + ("s" if fail_at != 1 else "")}


def breaker(policies: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The campaign's circuit breaker (baseline campaign.breaker) of its hosts' POLICIES: the campaign halts once
    its hosts that failed within the window reach max(failures, percent of the hosts whose change began within
    it) (campaign/engine.py, Engine.breaker); with several, the strictest wins (fewest failures, then the lowest
    percent, then the longest window). None: no breaker."""
    found = {(b["failures"], b.get("percent", 0), -settings.UNITS[b["within"][-1]] * float(b["within"][:-1]),
              b["within"]) for pol in policies if (b := pol.get("campaign", {}).get("breaker"))}
    if not found:
        return None
    failures, percent, within_s, within = min(found)
    return {"failures": failures, "percent": percent or None, "within_s": -within_s, "within": within}


# ---- the plan ------------------------------------------------------------------------------------

def build(target: str, ramp: tuple[Step, ...], entries: list[dict[str, Any]], base: baseline_mod.Baseline,
          nvlink: Mapping[str, domains.Domain] | None = None,
          left_out: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Waves, skipped and excluded hosts from audit-style host entries (name, groups, reachable, error, facts,
    findings), in inventory order. NVLINK: each host's NVLink domain (domains.group; none given: every host its
    own); LEFT_OUT: hosts the caller already excludes (name, code, reason). The ramp counts units of change: a
    multi-node domain is one, laid into one wave whole, and left out whole when any of its hosts is."""
    nvlink = nvlink or {}
    group_order: list[str] = []
    for e in entries:
        if primary_group(e["groups"]) not in group_order:
            group_order.append(primary_group(e["groups"]))
    given = {h["name"]: h for h in left_out}
    verdicts = {e["name"]: (("excluded", given[e["name"]]["code"], given[e["name"]]["reason"]) if e["name"] in given
                            else classify(e, base, target)) for e in entries}
    own = dict(verdicts)
    for e in entries:  # a domain with a host that cannot take part is left out whole, that host named
        domain = nvlink.get(e["name"])
        if domain is None or not domain.multi or own[e["name"]][0] != "wave":
            continue
        bad = next((m for m in domain.members if own.get(m, ("",))[0] == "excluded"), None)
        listed = max((len(set(domains.node_list(x["facts"]))) for x in entries if x["name"] in domain.members),
                     default=0)
        if bad is not None:
            verdicts[e["name"]] = ("excluded", "domain_left_out",
                                   f"NVLink domain {domain.name} is left out whole: {bad}: {own[bad][2]}")
        elif listed > len(domain.members):  # trays outside the inventory or --limit: it changes whole or not at all
            verdicts[e["name"]] = ("excluded", "domain_left_out",
                                   f"NVLink domain {domain.name} is left out whole: its IMEX node list names "
                                   f"{listed} hosts, {len(domain.members)} of them in this inventory and --limit")
    eligible, skipped, excluded = [], [], []
    for e in entries:
        verdict, code, detail = verdicts[e["name"]]
        if verdict == "wave":
            change = "upgrade" if controls.version_tuple(target) > controls.version_tuple(detail) else "downgrade"
            domain = nvlink.get(e["name"])
            gpus = controls.live_gpus(e["facts"])
            eligible.append({"name": e["name"], "groups": list(e["groups"]), "from_version": detail, "change": change,
                             "domain": domain.name if domain is not None and domain.multi else None,
                             "gpus": len(gpus), "gpu_model": gpus[0].get("name") if gpus else None})
        else:
            (skipped if verdict == "skipped" else excluded).append(
                {"name": e["name"], "groups": list(e["groups"]), "code": code, "reason": detail})
    units: dict[str, list[dict[str, Any]]] = {}  # a domain's hosts where its first host comes in the sequence
    for h in order(eligible, group_order):
        units.setdefault(h["domain"] or f"host {h['name']}", []).append(h)
    sequence = list(units.values())
    unit = "domain" if any(h["domain"] for h in eligible) else "host"
    waves, start, moved = [], 0, 0
    for index, size in enumerate(wave_sizes(ramp, len(sequence)), 1):
        hosts = [h for u in sequence[start:start + size] for h in u]
        start += size
        moved += len(hosts)
        waves.append({"index": index, "size": len(hosts), "cumulative": moved,
                      "budget": budget(index, size, [base.policy_for(h["groups"]) for h in hosts], unit),
                      "hosts": hosts})
    return {"target": target, "ramp": [str(s) for s in ramp], "group_order": group_order, "waves": waves,
            "skipped": skipped, "excluded": excluded, "target_groups": target_groups(target, entries, excluded),
            "breaker": breaker([base.policy_for(h["groups"]) for h in eligible])}


def breaker_summary(report: dict[str, Any]) -> str | None:
    """The plan's circuit breaker in one line, or None where the baseline sets none."""
    b = report.get("breaker")
    if not b:
        return None
    share = f", {b['percent']:g}% of the hosts changed within it" if b.get("percent") else ""
    return (f"circuit breaker: the campaign halts (exit {int(Exit.HALTED)}) once max({b['failures']} failed "
            f"hosts{share}) failed within {b['within']}, across waves")


REFUSED = ("not_blessed", "target_not_blessed")  # the baseline's matrix refuses the target for the host


def target_groups(target: str, entries: list[dict[str, Any]], excluded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per group (the host's most specific), whether its baseline lets it take TARGET: refused when every host of
    the group was excluded by the matrix, with the first host's reason."""
    refused = {h["name"]: h["reason"] for h in excluded if h["code"] in REFUSED}
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        g = out.setdefault(primary_group(e["groups"]), {"group": primary_group(e["groups"]), "hosts": 0,
                                                         "refused": 0, "takes_target": True, "reason": None})
        g["hosts"] += 1
        if e["name"] in refused:
            g["refused"] += 1
            g["reason"] = g["reason"] or refused[e["name"]]
    for g in out.values():
        g["takes_target"] = g["refused"] < g["hosts"]
        if g["takes_target"]:
            g["reason"] = None
    return list(out.values())


def run(opts: PlanOptions, store: Store, argv: list[str], prometheus: Any = None, deliver=None, *,
        runner_config: RunnerConfig) -> dict[str, Any]:
    """Collect facts as the audit does (its playbook run as RUNNER_CONFIG says), build the plan, record it as a run
    of kind 'plan'. PROMETHEUS (promql.Client or None): where the baseline's canary metrics are checked.
    DELIVER(report): the command's output, before the run is sealed (runs.close).

    Input errors (InputError) are raised before anything is recorded."""
    from .fleet import runner  # here: Ansible only for a command that runs a playbook
    started = time.monotonic()
    target = parse_target(opts.target)
    ramp = parse_ramp(opts.waves)
    fleet, base = runs.prepare(opts.inventory, opts.limit, opts.baseline)
    blessed_for_some(fleet, base, target)
    metrics = planning.check_metrics(fleet, base, prometheus)
    with runs.recorded(store, "plan", argv, fleet, base, opts.limit) as run_:
        hosts = audit.collect(runner.Runner(runner_config), fleet, base, opts.forks, opts.preflight)
        plan = build(target, ramp, hosts, base, domains.group(fleet, {h["name"]: h["facts"] for h in hosts}),
                     offenders.left_out(store, [(h["name"], h["groups"]) for h in hosts], base))
        if metrics:
            plan["canary"] = planning.section(metrics, plan)
        unreachable = sum(1 for h in hosts if not h["reachable"])
        summary = {"hosts": len(hosts), "eligible": sum(w["size"] for w in plan["waves"]), "waves": len(plan["waves"]),
                   "skipped": len(plan["skipped"]), "excluded": len(plan["excluded"]), "unreachable": unreachable,
                   "exit_code": Exit.UNREACHABLE if unreachable else Exit.OK,
                   "duration_s": round(time.monotonic() - started, 3)}
        # The run's summary column carries the plan itself (what `upgrade` acts on); facts and findings go where
        # an audit's go.
        report = {**runs.header(store, run_), "summary": summary, **plan}
        schemas.check("campaign-plan", report, "fleetctl's own plan (a bug: please report it)")
        return runs.close(report, lambda code, at, status: store.finish_run(
            run_.id, code, {**summary, "plan": plan}, hosts, at, status), deliver)
