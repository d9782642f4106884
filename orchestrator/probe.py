"""fleetctl probe: a GPU health snapshot (and throughput samples) of every host, recorded in the history."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from . import baseline as baseline_mod, inputs, resources, runs, schemas, settings
from .judge import gate
from .fleet import inventory, runner
from .audit import xid_overrides
from .fleet.execution_nodes import RunnerConfig
from .exitcodes import Exit
from .history.store import Store


@dataclass(frozen=True, kw_only=True)
class ProbeOptions:
    inventory: str | None = None
    limit: str | None = None
    baseline: str | None = None
    throughput: bool = False
    engine: str | None = None  # None: the host's gpu_probe_engine inventory variable, else builtin
    command: str | None = None
    samples: int = settings.SAMPLES.value
    warmup_s: float = settings.WARMUP.value
    trial_s: float = settings.TRIAL.value
    forks: int | None = None
    preflight: bool = True


def extravars(opts: ProbeOptions, fleet: inventory.Fleet, base: baseline_mod.Baseline,
              markers: dict[str, int] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "gpu_probe_xid_catalog": resources.xid_catalog(),
        "fleetctl_xid_overrides": xid_overrides(fleet, base),
        "fleetctl_kmsg_markers": markers or {},
        "gpu_probe_throughput": opts.throughput,
        "gpu_probe_samples": opts.samples,
        "gpu_probe_warmup_s": opts.warmup_s,
        "gpu_probe_trial_s": opts.trial_s,
    }
    if opts.engine:
        out["gpu_probe_engine"] = opts.engine
    if opts.command:
        out["gpu_probe_command"] = opts.command
    return out


def collect(playbooks: runner.Runner, opts: ProbeOptions, fleet: inventory.Fleet, base: baseline_mod.Baseline,
            markers: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """host -> {reachable, error, probe}: one gpu_probe call per host, run by PLAYBOOKS (also used between upgrade
    waves)."""
    outcomes = playbooks.run_on_fleet("probe.yml", fleet, extravars(opts, fleet, base, markers), opts.forks,
                                      opts.preflight)
    return results(fleet, outcomes)


def results(fleet: inventory.Fleet, outcomes: dict[str, runner.HostOutcome]) -> dict[str, dict[str, Any]]:
    """host -> {reachable, error, probe} from the outcomes of a playbook run that called gpu_probe (probe.yml, the
    soak's soak.yml)."""
    out = {}
    for host in fleet.hosts:
        outcome = outcomes[host.name]
        result = outcome.results.get("fleetctl.gpu.gpu_probe", {}).get("probe") if outcome.status == "ok" else None
        error = None if outcome.status == "ok" else outcome.message
        dropped = inputs.dropped_result(outcome.results, "fleetctl.gpu.gpu_probe") if outcome.status == "ok" else None
        if result is not None or dropped:
            problem = dropped or schemas.host_result_problem("probe-result", result)  # too large or deep, or not valid
            if problem is not None:
                result, error = None, f"the host returned a probe result fleetctl cannot trust: {problem}"
        out[host.name] = {"reachable": outcome.status != "unreachable", "error": error, "probe": result}
    return out


def markers(references: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
    """Where each host's kernel log was read up to last time: only newer Xids count (same boot only)."""
    return {host: {"seq": ref["health"]["xid"]["last_seq"], "boot_id": ref["host"]["boot_id"]}
            for host, ref in references.items() if ref and ref["health"]["xid"]["last_seq"] is not None}


def verdict(entry: dict[str, Any], reference: dict[str, Any] | None, policy: dict[str, Any]) -> dict[str, Any]:
    """The gate on this probe against the host's previous one (or against itself, the first time)."""
    if entry["probe"] is None:
        return {"status": "error", "reasons": [entry["error"] or "no probe result"]}
    v = gate.judge(reference or entry["probe"], entry["probe"], gate.gate_policy(policy),
                   policy.get("gpus", {}).get("count"))
    reasons = v.reasons if reference else ["first probe of this host: nothing to compare throughput with"] + v.reasons
    return {"status": v.status, "reasons": reasons}


def run(opts: ProbeOptions, store: Store, argv: list[str], notifier=None, deliver=None, *,
        runner_config: RunnerConfig) -> dict[str, Any]:
    """Probe the fleet (its playbook run as RUNNER_CONFIG says) and record it; DELIVER(report): the command's
    output, before the run is sealed."""
    started = time.monotonic()
    fleet, base = runs.prepare(opts.inventory, opts.limit, opts.baseline)
    with runs.recorded(store, "probe", argv, fleet, base, opts.limit) as run_:
        # Each host is judged against ITSELF: health against its last probe (whose kernel-log marker we pass on),
        # throughput against the last samples it gave, the same way, in a probe that passed.
        latest = {h.name: store.last_probe(h.name) for h in fleet.hosts}
        collected = collect(runner.Runner(runner_config), opts, fleet, base, markers(latest))
        hosts = []
        for host in fleet.hosts:
            entry = collected[host.name]
            reference = latest[host.name]
            now_tp = (entry["probe"] or {}).get("throughput")
            if reference is not None and now_tp:
                reference = dict(reference, throughput=store.last_healthy_throughput(
                    host.name, now_tp["engine"], now_tp["trial_s"]))
            hosts.append({"name": host.name, "groups": [g for g in host.groups if g != "all"], **entry,
                          "health": verdict(entry, reference, base.policy_for(list(host.groups)))})
        unreachable = sum(1 for h in hosts if not h["reachable"])
        unhealthy = sum(1 for h in hosts if h["reachable"] and h["health"]["status"] != "pass")
        summary = {"hosts": len(hosts), "reachable": len(hosts) - unreachable, "unreachable": unreachable,
                   "healthy": len(hosts) - unreachable - unhealthy, "unhealthy": unhealthy,
                   "exit_code": Exit.UNREACHABLE if unreachable else (Exit.FINDINGS if unhealthy else Exit.OK),
                   "duration_s": round(time.monotonic() - started, 3)}
        report = {**runs.header(store, run_), "summary": summary, "hosts": hosts}
        schemas.check("probe-report", report, "fleetctl's own probe report (a bug: please report it)")
        return runs.close(report, lambda code, at, status: store.finish_probe(run_.id, code, summary, hosts, at,
                                                                              status), deliver,
                          (lambda: notifier.after_run(run_, summary, hosts)) if notifier else None)  # RunNotes
