"""fleetctl audit: collect facts from every host in one module call each, evaluate them against the baseline."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import baseline as baseline_mod, controls, inputs, schemas, settings
from .fleet import domains, inventory
from .exitcodes import Exit

if TYPE_CHECKING:
    from .fleet import runner
    from .fleet.execution_nodes import RunnerConfig
    from .history.store import Store  # imported where used: `fleetctl check` imports this module and needs no history


@dataclass(frozen=True, kw_only=True)
class AuditOptions:
    inventory: str | None = None
    limit: str | None = None
    baseline: str | None = None
    fail_on: str = settings.FAIL_ON.value
    forks: int | None = None
    preflight: bool = True


def xid_overrides(fleet: inventory.Fleet, base: baseline_mod.Baseline) -> dict[str, dict[str, Any]]:
    """Each host's Xid overrides from its baseline policy (only hosts that have some), for the on-host classifier."""
    per_host = {h.name: base.policy_for(list(h.groups)).get("xid", {}).get("overrides", {}) for h in fleet.hosts}
    return {name: o for name, o in per_host.items() if o}


def blocking(finding: dict[str, Any], fail_on: str) -> bool:
    """A failed or unverifiable control at or above --fail-on fails the audit (Exit.FINDINGS)."""
    return (fail_on != "never" and finding["status"] in ("fail", "error")
            and controls.severity_rank(finding["severity"]) >= controls.severity_rank(fail_on))


def host_entry(host: inventory.Host, facts: dict[str, Any] | None, findings: list[dict[str, Any]],
               reachable: bool, error: str | None) -> dict[str, Any]:
    return {"name": host.name, "groups": [g for g in host.groups if g != "all"], "reachable": reachable,
            "error": error, "facts": facts, "findings": findings}


def evaluate_host(host: inventory.Host, outcome: runner.HostOutcome, base: baseline_mod.Baseline,
                  reference: dict[str, dict[str, Any]] | None = None, peers: dict[str, Any] | None = None,
                  found: tuple[Any, str | None] | None = None) -> dict[str, Any]:
    """FOUND: outcome_facts(OUTCOME) when the caller has it already."""
    if outcome.status == "unreachable":
        return host_entry(host, None, [controls.error_finding("host.reachable", "Host reachable", outcome.message)],
                          False, outcome.message)
    if outcome.status == "failed":
        message = f"fact collection failed: {outcome.message}"
        return host_entry(host, None, [controls.error_finding("facts.collected", "Facts collected", message)],
                          True, message)
    facts, problem = found or outcome_facts(outcome)
    return evaluate_facts(host, facts, base, reference, problem, peers, checked=True)


def outcome_facts(outcome: runner.HostOutcome) -> tuple[Any, str | None]:
    """The facts a host's gpu_facts returned (as a dictionary, or as one JSON text: playbooks/audit.yml asks for
    that, docs/benchmarks.md) and what makes them untrustworthy (too large, too deep, not JSON, not valid)."""
    result = outcome.results.get("fleetctl.gpu.gpu_facts", {})
    problem = inputs.dropped_result(outcome.results, "fleetctl.gpu.gpu_facts")
    facts = result.get("facts")
    if "facts_json" in result and problem is None:
        facts, problem = inputs.json_text(result["facts_json"])
    return facts, problem or schemas.host_result_problem("host-facts", facts)


def evaluate_facts(host: inventory.Host, facts: Any, base: baseline_mod.Baseline,
                   reference: dict[str, dict[str, Any]] | None = None, problem: str | None = None,
                   peers: dict[str, Any] | None = None, checked: bool = False) -> dict[str, Any]:
    """The host's entry from the facts its gpu_facts returned (the audit's, or `fleetctl check`'s in-process):
    facts too large, too deep or not valid are the one `facts.collected` error, else the controls' findings.
    CHECKED: PROBLEM is already what outcome_facts found (None: the facts are valid)."""
    if not checked:
        problem = problem or schemas.host_result_problem("host-facts", facts)  # one line
    if problem is not None:
        message = f"the host returned facts fleetctl cannot trust: {problem}"
        return host_entry(host, None, [controls.error_finding("facts.collected", "Facts collected", message)],
                          True, message)
    return host_entry(host, facts, controls.evaluate(facts, base.policy_for(list(host.groups)), reference, peers),
                      True, None)


def peer_sets(fleet: inventory.Fleet, facts: dict[str, Any], by: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each host's peers as controls.PEERS_BY names them: {host: (the set's name, its members)}, one members tuple
    per set, shared by the hosts it is the set of (memory linear in the fleet: 60,000 hosts of one group are not
    60,000 tuples of 60,000)."""
    if by == "nvlink_domain":
        return {name: (d.name, d.members) for name, d in domains.group(fleet, facts).items()}
    members: dict[str, list[str]] = {}
    for h in fleet.hosts:
        for g in h.groups:
            members.setdefault(g, []).append(h.name)
    sets = {g: tuple(names) for g, names in members.items()}
    return {h.name: (h.group, sets.get(h.group, ())) for h in fleet.hosts}


def peers(fleet: inventory.Fleet, facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What each control registered with peers (controls.peer_controls) gets for each host: the name of its peers'
    set (its inventory group, its NVLink domain) and what the control's peers function made of them ({Host: its
    trusted facts from FACTS, None where there are none}), computed once per set: {host: {control: (name, answer)}}."""
    checks = controls.peer_controls()
    out: dict[str, dict[str, Any]] = {h.name: {} for h in fleet.hosts}
    hosts = {h.name: h for h in fleet.hosts}
    for by in dict.fromkeys(c.peers_by for c in checks):
        sets = peer_sets(fleet, facts, by)
        answers: dict[int, dict[str, Any]] = {}  # by the set's shared members tuple (peer_sets), alive meanwhile
        for name, (label, members) in sets.items():
            if id(members) not in answers:
                view = {hosts[m]: facts.get(m) for m in members}
                answers[id(members)] = {c.id: (label, c.peers(view)) for c in checks if c.peers_by == by}
            out[name].update(answers[id(members)])
    return out


def references(fleet: inventory.Fleet, history: Store | None) -> dict[str, dict[str, dict[str, Any]]]:
    """Each host's facts at its latest recorded audit where a history-comparing control (gpu.nvlink, gpu.topology)
    passed: {host: {control: facts}}, one query for the fleet. Without a store given, the user's history is read."""
    names, compared = [h.name for h in fleet.hosts], controls.reference_controls()
    if history is not None:
        return history.passing_facts(names, compared)
    from .history.store import Store
    with Store() as store:
        return store.passing_facts(names, compared)


def collect(playbooks: runner.Runner, fleet: inventory.Fleet, base: baseline_mod.Baseline, forks: int | None = None,
            preflight: bool = True, history: Store | None = None) -> list[dict[str, Any]]:
    """Every host's facts (one gpu_facts call each, run by PLAYBOOKS) evaluated against the baseline: audit, plan,
    upgrade and the campaigns' precheck/verify. Controls that compare a host with itself get its last passing audit
    from HISTORY (the user's history when None); those that compare it with its inventory group or its NVLink domain
    get that set's view (peers)."""
    outcomes = playbooks.run_on_fleet("audit.yml", fleet, {"fleetctl_xid_overrides": xid_overrides(fleet, base)},
                                      forks, preflight)
    return evaluate_outcomes(fleet, base, outcomes, history)


def evaluate_outcomes(fleet: inventory.Fleet, base: baseline_mod.Baseline, outcomes: dict[str, runner.HostOutcome],
                      history: Store | None = None) -> list[dict[str, Any]]:
    """Every host's entry from the outcomes of a playbook run that called gpu_facts (audit.yml, the soak's
    soak.yml): its findings, with its last passing audit from HISTORY and its peers' view (collect)."""
    refs = references(fleet, history)
    found = {name: outcome_facts(o) for name, o in outcomes.items() if o.status not in ("unreachable", "failed")}
    group_view = peers(fleet, {name: facts for name, (facts, problem) in found.items() if problem is None})
    return [evaluate_host(h, outcomes[h.name], base, refs.get(h.name), group_view.get(h.name), found.get(h.name))
            for h in fleet.hosts]


def summarize(hosts: list[dict[str, Any]], fail_on: str) -> dict[str, Any]:
    counts = {s: 0 for s in controls.STATUSES}
    for h in hosts:
        for f in h["findings"]:
            counts[f["status"]] += 1
    unreachable = [h["name"] for h in hosts if not h["reachable"]]
    drifted = {h["name"] for h in hosts if h["reachable"] and any(blocking(f, fail_on) for f in h["findings"])}
    exit_code = Exit.UNREACHABLE if unreachable else Exit.FINDINGS if drifted else Exit.OK
    return {"hosts": len(hosts), "reachable": len(hosts) - len(unreachable), "unreachable": len(unreachable),
            "compliant": sum(1 for h in hosts if h["reachable"] and h["name"] not in drifted),
            "noncompliant": len(drifted), "findings": counts, "fail_on": fail_on, "exit_code": exit_code}


def run(opts: AuditOptions, store: Store, argv: list[str], notifier=None, deliver=None, *,
        runner_config: RunnerConfig) -> dict[str, Any]:
    """Audit the fleet (its playbook run as RUNNER_CONFIG says) and record it. Input errors (InputError) are raised
    before anything is recorded.
    NOTIFIER (notify_events.RunNotes): told of findings before the run is sealed, what became of that in its
    summary.
    DELIVER(report): the command's output, before the run is sealed (runs.close)."""
    from .fleet import runner
    from . import runs  # here: `fleetctl check` imports this module and never Ansible
    started = time.monotonic()
    fleet, base = runs.prepare(opts.inventory, opts.limit, opts.baseline)
    with runs.recorded(store, "audit", argv, fleet, base, opts.limit) as run_:
        hosts = collect(runner.Runner(runner_config), fleet, base, opts.forks, opts.preflight, store)
        summary = summarize(hosts, opts.fail_on)
        summary["duration_s"] = round(time.monotonic() - started, 3)
        report = {**runs.header(store, run_), "summary": summary, "hosts": hosts}  # schema-valid: tests/unit prove it
        return runs.close(report, lambda code, at, status: store.finish_run(run_.id, code, summary, hosts, at,
                                                                            status), deliver,
                          (lambda: notifier.after_run(run_, summary, hosts)) if notifier else None)
