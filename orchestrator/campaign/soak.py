"""The watched soak between waves: every host the campaign has changed and that is on the target is looked at
while the next wave waits, because the faults a canary exists to catch show under load, after a while.

- A check every `soak_interval_s` (one probe playbook run over the watched hosts): the health part of the probe,
  judged with the gate's judge_health against the host's own passing gate probe (the same driver load): new Xids
  since the kernel-log marker the previous check read up to, GPUs lost or missing (against the precheck and the
  baseline too), new uncorrectable ECC, row remaps pending or failed, a recovery action, NVLink links down, a
  fabric not completed. A boot id that changed is a reboot nobody asked for: a failure. And the canary workload:
  the operators' command (`--canary`, the command engine's protocol) or, without one, the host's probe engine; a
  host whose failed runs exceed `canary_max_failures` fails. The audit's facts come in the same run (soak.yml) and
  every control is judged as the verify judges it (steps.changed_controls): one that passed at the precheck and
  fails now fails the host, but those declaring the role "not_soaked".
- An unreachable host fails once it has been unreachable for `soak_grace_s`.
- At the end of the soak, the gate: a throughput probe judged against the host's own `probe_before` samples with
  the existing gate (and the health part once more), and the canary's metrics of its last run against its first.

Each observation is written to the journal before anything acts on it (journal.record_soak): the engine reads
failures back from there, and the next check starts from the marker recorded last, so an Xid logged while fleetctl
was down is still seen by the resumed soak. Markers, not clocks, decide what is new.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import audit, controls, probe
from ..judge import gate
from ..history.timefmt import parse, stamp
from ..judge.canary import kinds
from . import cohort, steps
from .journal import Journal
from .options import soak_length
from .context import Context
from .transitions import HostState

GATE_STEPS = (HostState.PROBE_AGAIN, HostState.PROBE_AFTER)  # the gate probe a changed host passed last, newest first
GATE_VERDICTS = {"gate": "end-of-soak gate", "gate_less_drift": "end-of-soak gate less the fleet's drift",
                 "canary_gate": "canary command", "canary_gate_less_drift": "canary command less the fleet's drift"
                 }  # an end-of-soak observation's verdicts (_final_throughput)


@dataclass
class Observation:
    status: str  # ok | fail | unreachable
    reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def length(options: dict[str, Any], gap: int) -> float:
    """The soak after wave GAP of recorded OPTIONS (a dict; CampaignOptions.soak_length for the typed ones)."""
    return soak_length(options.get("soak_s", 0), gap)


def watched(journal: Journal, cid: int) -> list[str]:
    """The hosts the campaign changed that are on the target now (done): every earlier wave's, not only the last."""
    return [r["host"] for r in journal.hosts(cid) if r["changed"] and r["state"] == HostState.DONE]


def failing(journal: Journal, cid: int) -> dict[str, str]:
    """Watched hosts whose latest soak observation failed and that nothing has acted on yet: host -> reason."""
    latest = journal.latest_soak_status(cid)
    return {h: latest[h][1] for h in watched(journal, cid) if h in latest and latest[h][0] == "fail"}


def reference(ctx: Context, host: str) -> dict[str, Any]:
    """The probe result of the gate this host passed after its change: what the soak is judged against."""
    for step in GATE_STEPS:
        detail = ctx.journal.step_detail(ctx.campaign, host, step)
        if detail and detail.get("probe"):
            return detail["probe"]
    raise LookupError(f"{host}: no gate probe in the journal")


def marker(ctx: Context, host: str, ref: dict[str, Any]) -> dict[str, Any] | None:
    """Where this host's kernel log was read up to: the last soak observation's marker, else its gate probe's."""
    for record in reversed(ctx.journal.soak_records(ctx.campaign, host)):
        if record["detail"].get("marker"):
            return record["detail"]["marker"]
    return probe.markers({host: ref}).get(host)


def _probe_options(ctx: Context, canary: bool) -> probe.ProbeOptions:
    o, command = ctx.options.probe, ctx.options.canary if canary else None
    return probe.ProbeOptions(throughput=True, engine="command" if command else None, command=command,
                              samples=o.samples, warmup_s=o.warmup_s, trial_s=o.trial_s,
                              forks=ctx.options.forks, preflight=False)


def _since(stamp: str) -> float:
    return (datetime.now(timezone.utc) - parse(stamp)).total_seconds()


def _unreachable(ctx: Context, host: str, error: str | None) -> Observation:
    """Unreachable now: a failure once the streak of unreachable observations is older than the grace."""
    grace = float(ctx.options.soak_grace_s)
    streak = None
    for record in reversed(ctx.journal.soak_records(ctx.campaign, host)):
        if record["status"] != "unreachable":
            break
        streak = record["at"]
    down_s = _since(streak) if streak else 0.0
    if down_s >= grace:
        return Observation("fail", f"soak: unreachable for {down_s:.0f}s, over the {grace:g}s grace: {error}",
                           {"seen": [f"unreachable: {error}"]})
    return Observation("unreachable", f"unreachable ({down_s:.0f}s of the {grace:g}s grace): {error}",
                       {"seen": [f"unreachable: {error}"]})


def _health(ctx: Context, host: str, ref: dict[str, Any],
            result: dict[str, Any]) -> tuple[list[gate.Problem], list[str]]:
    """(failures, notes) of one probe result against the host's gate probe."""
    pol = ctx.policy(host)
    expected = max(ctx.befores.get(host, {}).get("gpus") or 0, pol.get("gpus", {}).get("count") or 0)
    verdict = gate.judge_health(ref, result, gate.gate_policy(pol), expected or None)
    fails = list(verdict.problems)
    notes = [r for r in verdict.reasons[len(fails):] if not r.startswith("GPU health unchanged")]
    was, now = ref["host"]["boot_id"], result["host"]["boot_id"]
    if was and now and was != now:
        fails.insert(0, gate.Problem("reboot", f"the host rebooted during the soak without fleetctl asking (boot id "
                                               f"{was[:8]} -> {now[:8]})"))
    notes += [f"could not check {k}: {v}" for k, v in result.get("errors", {}).items() if k in ("nvml", "xid")]
    return fails, notes


def _canary_run(result: dict[str, Any]) -> dict[str, Any]:
    broken = {k: v for k, v in result.get("errors", {}).items() if k.startswith("throughput")}
    tp = result.get("throughput")
    ok = not broken and bool(tp and tp.get("samples"))
    error = "; ".join(f"{k}: {v}" for k, v in sorted(broken.items())) or (None if ok else "no samples")
    return {"ok": ok, "error": error, "engine": (tp or {}).get("engine"), "throughput": tp}


def _marker_of(result: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any] | None:
    seq = result["health"]["xid"]["last_seq"]
    return {"seq": seq, "boot_id": result["host"]["boot_id"]} if seq is not None else previous


def observe(ctx: Context, hosts: list[str], final: bool) -> dict[str, Observation]:
    """One soak check (FINAL: the end-of-soak gate) of HOSTS, in one playbook run."""
    refs = {h: reference(ctx, h) for h in hosts}
    markers = {h: m for h in hosts if (m := marker(ctx, h, refs[h]))}
    # The end-of-soak gate measures with the engine probe_before used; a check runs the canary workload. The
    # audit's facts come in the same run: the controls are judged as the verify judges them (changed_controls).
    fleet = ctx.fleet.only(hosts)
    options = _probe_options(ctx, canary=not final)
    outcomes = ctx.playbooks.run_on_fleet("soak.yml", fleet, probe.extravars(options, fleet, ctx.base, markers),
                                          options.forks, options.preflight)
    collected = probe.results(fleet, outcomes)
    audited = {e["name"]: e for e in audit.evaluate_outcomes(fleet, ctx.base, outcomes, ctx.journal.store)}
    jobs_failed, jobs_unread = ctx.scheduler.failed_jobs(ctx, hosts) if not final else ({}, None)
    judged = canary_metrics(ctx, hosts, final)
    out = {}
    for host in hosts:
        entry, ref = collected[host], refs[host]
        result = entry["probe"]
        if result is None:
            out[host] = (_unreachable(ctx, host, entry["error"]) if not entry["reachable"] else
                         Observation("fail", f"soak: probe: {entry['error'] or 'no probe result'}",
                                     {"seen": [entry["error"] or "no probe result"]}))
            continue
        fails, notes = _health(ctx, host, ref, result)
        fails += [gate.Problem("control", p) for p in steps.changed_controls(
            audited[host], ctx.befores[host], stated=controls.with_role("not_soaked"))]
        detail: dict[str, Any] = {"marker": _marker_of(result, markers.get(host)), "boot_id": result["host"]["boot_id"],
                                  "gpus": result["health"]["gpu_count"]}
        if final:
            fails += _final_throughput(ctx, host, result, detail, notes, judged[host].verdicts)
        else:
            run = detail["canary"] = _canary_run(result)
            jobs = detail["failed_jobs"] = jobs_failed.get(host, [])
            if jobs_unread:
                notes.append(f"could not read Slurm's job completion log: {jobs_unread}")
            if not run["ok"] or jobs:
                failed = int(not run["ok"]) + len(jobs) + sum(
                    1 for r in ctx.journal.soak_records(ctx.campaign, host, kind="check")
                    if not r["detail"].get("canary", {}).get("ok", True))
                limit = int(ctx.options.canary_max_failures)
                what = "canary run failed" if not run["ok"] else "Slurm job failed"
                why = ([run["error"]] if not run["ok"] else []) + [
                    f"Slurm job {j['id']} ({j['name']}) ended {j['state']}, exit {j['exit_code']}" for j in jobs[:5]]
                line = f"{what} ({failed} failed run(s), at most {limit} allowed): " + "; ".join(why)
                if failed > limit:
                    fails.append(gate.Problem("canary runs", line))
                else:
                    notes.append(line)
        metrics = judged[host]
        if metrics.verdicts:
            detail["canary_metrics"] = metrics.verdicts
            fails += metrics.fails
            notes += metrics.notes
            if metrics.hold and not fails:
                detail["hold"] = metrics.hold
                notes.append(metrics.hold)
        detail["seen"] = [p.text for p in fails] + notes
        out[host] = (Observation("fail", ("end of the soak: " if final else "soak: ") + gate.one_line(fails), detail)
                     if fails else Observation("ok", None, detail))
    return out


# ---- the canary metrics: the canary cohort against a control cohort, from Prometheus (docs/canary.md) ----------

STEP_MIN_S, POINTS = 5.0, 600  # a range query's step: the window in POINTS steps, never finer than STEP_MIN_S


@dataclass
class Judged:
    """What the canary metrics say of one watched host: failures, notes, the verdicts, and why it is held."""
    fails: list[gate.Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    hold: str | None = None


def canary_metrics(ctx: Context, hosts: list[str], final: bool) -> dict[str, Judged]:
    """The baseline's canary metrics of HOSTS (the watched ones: the canary cohort), per cohort (group and GPU
    model, planning.cohort), judged against the cohort's hosts this campaign has not changed yet (the control cohort)
    over the window since the canary hosts came back, each by its kind (judge/canary/kinds.py: a level against each
    host's own level before its drain, a rate per GPU-hour of the GPUs the plan counted), from the series _window
    reads. A failing
    metric fails every canary host of the cohort; one that cannot be judged (Prometheus unreachable or erring, no
    control host, no series, too few samples) is a note at a check and, at the end of the soak (FINAL), what the
    baseline's canary.on_missing says: hold, fail or ignore."""
    out = {h: Judged() for h in hosts}
    entries = cohort.planned(ctx)
    of = cohort.names(ctx)
    cohorts: dict[str, list[str]] = {}
    for h in hosts:
        cohorts.setdefault(of.get(h) or ctx.fleet.host(h).group, []).append(h)
    untouched = cohort.untouched(ctx)
    gpus = {h: e.get("gpus") or (ctx.befores.get(h) or {}).get("gpus") or 1 for h, e in entries.items()}
    for name, canary in cohorts.items():
        conf = ctx.base.canary_for(list(ctx.fleet.host(canary[0]).groups))
        if not conf.metrics:
            continue
        control = [h for h in untouched if of.get(h) == name]
        for m in conf.metrics:
            verdict = _judge(ctx, m, canary, control, conf.min_samples, gpus)
            for h in canary:
                j = out[h]
                j.verdicts.append(verdict)
                if verdict["verdict"] == "fail":
                    j.fails.append(gate.Problem("canary metrics", verdict["reason"]))
                elif verdict["verdict"] in ("no_verdict", "missing") and final:
                    said = f"canary metric not judged at the end of the soak: {verdict['reason']}"
                    if conf.on_missing == "fail":
                        j.fails.append(gate.Problem("canary metrics", said))
                    elif conf.on_missing == "hold":
                        j.hold = j.hold or said + " (canary.on_missing: hold)"
                    else:
                        j.notes.append(said + " (canary.on_missing: ignore)")
                elif verdict["verdict"] != "pass":
                    j.notes.append(verdict["reason"])
    return out


def _judge(ctx: Context, m: Any, canary: list[str], control: list[str], min_samples: int | None,
           gpus: dict[str, int]) -> dict[str, Any]:
    """One metric's verdict (kinds.judge, from the series read here), or {"verdict": "missing", "reason"} when it
    cannot be asked."""
    said = {"name": m.name, "kind": m.kind, "good": m.good, "verdict": "missing"}
    window = _window(ctx, m, canary, control, gpus)
    if isinstance(window, str):
        return {**said, "reason": f"{m.name}: {window}"}
    result = kinds.judge(m, window, min_samples)
    return {**said, "window": [stamp_of(window.start), stamp_of(window.end)], "control_hosts": list(window.control),
            **result}


def _window(ctx: Context, m: Any, canary: list[str], control: list[str],
            gpus: dict[str, int]) -> kinds.Window | str:
    """METRIC's series from Prometheus since the CANARY hosts came back and as long before they were drained, the
    CONTROL hosts' beside them: the judge's data; or why they cannot be read."""
    from ..judge import promql
    now = datetime.now(timezone.utc).timestamp()
    back = [t for h in canary if (t := cohort.step_time(ctx, h, HostState.UNDRAIN, "finished_at")) is not None]
    drained = [t for h in canary if (t := cohort.step_time(ctx, h, HostState.DRAIN, "started_at")) is not None]
    if ctx.prometheus is None:
        return "no Prometheus configured (--prometheus-url or prometheus_url)"
    if not control:
        return "no control host (every host of the cohort is changed or in this wave)"
    if not back or not drained:
        return "the canary hosts' drain and return are not in the journal"
    start, end = max(back), now
    length = max(end - start, STEP_MIN_S * 10)
    step = max(STEP_MIN_S, length / POINTS)
    fleet = [ctx.fleet.host(h) for h in canary + control]
    query = promql.render(m.query, fleet)
    try:
        during = promql.by_host(ctx.prometheus.range(query, start, end, step, m.host_label), fleet)
        before = promql.by_host(ctx.prometheus.range(query, min(drained) - length, min(drained), step,
                                                     m.host_label), fleet)
    except (promql.PrometheusError, ValueError) as e:
        return str(e)
    silent = [h for h in canary + control if not during.get(h)]
    if any(h in silent for h in canary):
        return f"no series for {', '.join(h for h in canary if h in silent)} since it came back"
    ctl = [h for h in control if h not in silent]
    if not ctl:
        return "no series for any control host"
    return kinds.Window(canary={h: during[h] for h in canary}, control={h: during[h] for h in ctl}, start=start,
                        end=end, canary_before={h: before.get(h, []) for h in canary},
                        control_before={h: before.get(h, []) for h in ctl}, gpus=gpus)


def stamp_of(t: float) -> str:
    return stamp(datetime.fromtimestamp(t, timezone.utc))


def held(journal: Journal, cid: int, gap: int) -> dict[str, str]:
    """Watched hosts whose end-of-soak gate after wave GAP holds the campaign for a person: host -> why."""
    return {r["host"]: r["detail"]["hold"] for r in journal.soak_records(cid, gap=gap, kind="gate")
            if r["detail"].get("hold")}


def _final_throughput(ctx: Context, host: str, result: dict[str, Any], detail: dict[str, Any],
                      notes: list[str], metrics: list[dict[str, Any]]) -> list[gate.Problem]:
    """The end-of-soak gate's throughput: against probe_before (the existing gate), and the canary command's
    metrics, its last run against its first. An inconclusive verdict is a note: the wave's own gate passed. While
    every canary metric (their verdicts METRICS) passed, each self-comparison is judged less the fleet's drift
    between its two moments (cohort.judged_less_drift), and that verdict decides. The verdicts in full go to
    DETAIL ("gate", "canary_gate", each "..._less_drift"); what failed, one problem each."""
    pol = gate.gate_policy(ctx.policy(host))
    before = (ctx.journal.step_detail(ctx.campaign, host, HostState.PROBE_BEFORE) or {}).get("probe") or {}
    broken = {k: v for k, v in result.get("errors", {}).items() if k.startswith("throughput")}
    alike = bool(metrics) and all(m["verdict"] == "pass" for m in metrics)  # the canary moved as its controls did

    def judged(key: str, saying: str, was: dict[str, Any] | None, now: dict[str, Any] | None, since: float | None,
               until: float, **kw: Any) -> gate.Verdict:
        verdict = gate.judge_throughput(was, now, pol, **kw)
        detail[key] = verdict.as_dict()
        if not alike or now is None:
            return verdict
        return cohort.judged_less_drift(ctx, host, verdict, saying, since, until, lambda shift: gate.judge_throughput(
            was, cohort.less_drift(now, shift), pol, **kw), detail, f"{key}_less_drift", notes)

    verdict = judged("gate", "throughput at the end of the soak against itself", before.get("throughput"),
                     result.get("throughput"), cohort.drained(ctx, host), cohort.now(), broken=broken)
    fails = list(verdict.problems) if verdict.status == "fail" else []
    if verdict.status == "inconclusive":
        notes.append(f"throughput at the end of the soak, inconclusive: {verdict.summary()}")
    runs = [(parse(r["at"]).timestamp(), r["detail"]["canary"]["throughput"])
            for r in ctx.journal.soak_records(ctx.campaign, host, kind="check")
            if r["detail"].get("canary", {}).get("ok") and r["detail"]["canary"].get("engine") == "command"]
    if len(runs) >= 2:
        (first_at, first), (last_at, last) = runs[0], runs[-1]
        canary = judged("canary_gate", "the canary command's last run against its first", first, last, first_at,
                        last_at, what="canary command")
        if canary.status == "fail":
            fails += canary.problems
    return fails
