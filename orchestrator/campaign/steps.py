"""The steps of the host table: each runs once for a batch of hosts (one playbook run, or one hook per host) and
returns every host's outcome: ok | fail | inconclusive | skip, a reason, and what to keep in the history."""

from __future__ import annotations

import time
from typing import Any, Callable

from .. import audit, controls, plan, probe
from ..fleet import domains, runner
from ..judge import gate
from ..history.store import now
from . import cohort, packages, transitions
from .context import Context, Outcome, activation
from .transitions import HostState


FABRIC_WAIT_S, FABRIC_POLL_S = 120.0, 10.0  # verify waits this long for the fabric manager to register the GPUs
IMEX_POLL_S = 2.0  # and looks this often whether an NVLink domain's IMEX has re-formed (its trays reboot together)
FABRIC_PENDING = ("not_started", "in_progress")
# What a rollback must give back as it was at the precheck: the driver's own findings (the controls of the
# "restored_on_rollback" role) and its daemons.
DAEMON_UNITS = {"nvidia-persistenced.service": ("persistence", "daemon_running"),
                "nvidia-fabricmanager.service": ("fabric_manager", "running"),
                "nvidia-imex.service": ("imex", "running")}


def unreachable_or_failed(outcome: runner.HostOutcome) -> Outcome | None:
    if outcome.status == "unreachable":
        return Outcome("fail", f"unreachable: {outcome.message}")
    if outcome.status == "failed":
        return Outcome("fail", outcome.message)
    return None


def playbook(ctx: Context, name: str, hosts: list[str], extravars: dict[str, Any],
             check_ssh: bool = True) -> dict[str, runner.HostOutcome]:
    return ctx.playbooks.run_on_fleet(name, ctx.fleet.only(hosts), extravars, ctx.options.forks, check_ssh)


def facts_of(ctx: Context, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """Audit-style host entries (facts, findings) collected with the audit's playbook."""
    return {e["name"]: e for e in audit.collect(ctx.playbooks, ctx.fleet.only(hosts), ctx.base, ctx.options.forks,
                                                history=ctx.journal.store)}


# ---- the upgrade ---------------------------------------------------------------------------------------

def precheck(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    """Reachable, healthy, blessed, not on the target yet: and what it is now, recorded (the rollback's goal)."""
    out = {}
    for name, entry in facts_of(ctx, hosts).items():
        verdict, code, detail = plan.classify(entry, ctx.base, ctx.target)
        if verdict == "skipped":
            out[name] = Outcome("skip", detail)
        elif verdict == "excluded":
            out[name] = Outcome("fail", f"pre-check: {detail}")
        else:
            facts = entry["facts"]
            before = {"version": detail, "boot_id": facts["host"]["boot_id"],
                      "gpus": len(controls.live_gpus(facts)),
                      "packages": packages.driver_versioned(facts["driver"]["packages"], detail),
                      "held": facts["driver"]["held"], "nvlink_up": nvlink_up(facts),
                      "cliques": domains.cliques(facts),
                      "interconnect": {f["control"]: f["status"] for f in entry["findings"]
                                       if f["control"] in controls.with_role("interconnect")},
                      "driver_findings": {f["control"]: f["status"] for f in entry["findings"]
                                          if f["control"] in controls.with_role("restored_on_rollback")},
                      "findings": {f["control"]: f["status"] for f in entry["findings"]},
                      "daemons": running_daemons(facts)}
            if not before["packages"]:
                out[name] = Outcome("fail", f"pre-check: no installed package carries driver {detail}: "
                                            "fleetctl only changes package-managed drivers")
            else:
                out[name] = Outcome("ok", None, {"from": detail, "packages": before["packages"]}, before)
    return out


def running_daemons(facts: dict[str, Any]) -> list[str]:
    """The driver's daemons running on the host (nvidia-persistenced, the NVSwitch fabric manager)."""
    return [unit for unit, (part, key) in DAEMON_UNITS.items() if (facts.get(part) or {}).get(key)]


def _probe(ctx: Context, hosts: list[str], throughput: bool) -> dict[str, dict[str, Any]]:
    return probe.collect(ctx.playbooks, ctx.probe_options(throughput), ctx.fleet.only(hosts), ctx.base)


def probe_before(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    """Health and the throughput samples every later probe of this host is judged against."""
    out = {}
    for name, entry in _probe(ctx, hosts, True).items():
        if entry["probe"] is None:
            out[name] = Outcome("fail", entry["error"] or "no probe result")
            continue
        v = gate.judge_health(entry["probe"], entry["probe"], gate.gate_policy(ctx.policy(name)),
                              ctx.policy(name).get("gpus", {}).get("count"))
        detail = {"probe": entry["probe"], "verdict": v.status, "reasons": v.reasons}
        out[name] = Outcome("ok" if v.status == "pass" else "fail",
                            None if v.status == "pass" else f"unhealthy before the change: {v.summary()}",
                            detail)
    return out


def _gate(ctx: Context, hosts: list[str], reference_step: HostState) -> dict[str, Outcome]:
    """Each host's probe now against its REFERENCE_STEP's; one that does not pass is judged again less the fleet's
    drift since the host was drained (cohort.judged_less_drift), and that verdict decides."""
    out = {}
    for name, entry in _probe(ctx, hosts, True).items():
        if entry["probe"] is None:
            out[name] = Outcome("fail", f"probe: {entry['error'] or 'no probe result'}")
            continue
        before, after = ctx.journal.step_detail(ctx.campaign, name, reference_step)["probe"], entry["probe"]
        pol = ctx.policy(name)
        policy, count = gate.gate_policy(pol), pol.get("gpus", {}).get("count")
        v = gate.judge(before, after, policy, count)
        detail = {"probe": after, "verdict": v.status, "reasons": list(v.reasons), "figures": v.as_dict()}
        if after.get("throughput"):
            def again(shift: float) -> gate.Verdict:
                return gate.judge(before, {**after, "throughput": cohort.less_drift(after["throughput"], shift)},
                                  policy, count)
            v = cohort.judged_less_drift(ctx, name, v, "the gate against itself", cohort.drained(ctx, name),
                                         cohort.now(), again, detail, "less_drift", detail["reasons"])
            detail["verdict"] = v.status
        outcome = {"pass": "ok", "fail": "fail", "inconclusive": "inconclusive"}[v.status]
        out[name] = Outcome(outcome, None if outcome == "ok" else f"gate {v.status}: {v.summary()}", detail)
    return out


def probe_after(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    return _gate(ctx, hosts, HostState.PROBE_BEFORE)


def drain(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    return ctx.scheduler.drain(ctx, hosts)


def undrain(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    return ctx.scheduler.undrain(ctx, hosts)


def wait_idle(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    """One look, no waiting here: a host whose scheduler still runs jobs on it, or whose GPUs a process still holds,
    answers `wait` (the engine looks again every idle poll while the other hosts go on, and fails it cleanly once it
    has waited --idle-timeout). A host found idle records when (`idle_at`: the campaign's capacity figures)."""
    busy = ctx.scheduler.busy(ctx, hosts)
    rest = [h for h in hosts if h not in busy]
    out = {**{h: Outcome(transitions.WAIT, why) for h, why in busy.items()}, **(_gpus_in_use(ctx, rest) if rest else {})}
    at = now()
    return {h: out.get(h) or Outcome("ok", None, {"users": [], "idle_at": at}) for h in hosts}


def _gpus_in_use(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    """One look at each host's GPUs: host -> `wait` with why it is not idle (a process holds a GPU, a leaked
    context), or `fail` where it could not be looked at; idle hosts are not named."""
    outcomes = playbook(ctx, "gpu_idle.yml", hosts, {"fleetctl_idle_timeout_s": 1, "fleetctl_idle_poll_s": 1})
    out = {}
    for name, o in outcomes.items():
        if o.status == "failed":
            result = o.results.get("fleetctl.gpu.gpu_users") or {}
            users, leaked = result.get("users") or [], result.get("leaked") or []
            if users or leaked:
                said = []
                if users:
                    said.append("the driver is in use: " + ", ".join(f"{u['name']} (pid {u['pid']})" for u in users[:5]))
                said += [f"GPU {g['index']} holds {g['used_mib']} MiB with no process: a leaked context, reset the GPU"
                         for g in leaked[:8]]
                out[name] = Outcome(transitions.WAIT, "; ".join(said), {"users": users, "leaked": leaked})
                continue
        failed = unreachable_or_failed(o)
        if failed:
            out[name] = failed
    return out


def _install(ctx: Context, hosts: list[str], wanted: Callable[[str], dict[str, str]]) -> dict[str, Outcome]:
    requests = {h: wanted(h) for h in hosts}
    outcomes = playbook(ctx, "driver_install.yml", hosts, {"fleetctl_packages": requests})
    out = {}
    for name, o in outcomes.items():
        res = o.results.get("fleetctl.gpu.nvidia_driver_packages") or {}
        detail = {"requested": requests[name], "installed": res.get("installed"), "removed": res.get("removed"),
                  "before": res.get("before"), "after": res.get("after"), "boot_id": res.get("boot_id")}
        failed = unreachable_or_failed(o)
        if failed:
            failed.reason = f"install {packages.describe(requests[name])}: {failed.reason}"
            failed.detail = detail
            out[name] = failed
        else:
            out[name] = Outcome("ok", None, detail)
    return out


def install(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    def wanted(host: str) -> dict[str, str]:
        before = ctx.befores[host]
        return packages.target_set(before["packages"], before["version"], ctx.target)
    return _install(ctx, hosts, wanted)


def _activate(ctx: Context, hosts: list[str], install_step: HostState,
              version_of: Callable[[str], str]) -> dict[str, Outcome]:
    boot_ids = {h: (ctx.journal.step_detail(ctx.campaign, h, install_step) or {}).get("boot_id") or "" for h in hosts}
    # No SSH pre-flight: after an interrupted run the host may be rebooting; the play waits for it.
    outcomes = playbook(ctx, "driver_activate.yml", hosts,
                        {"fleetctl_boot_ids": boot_ids, "fleetctl_versions": {h: version_of(h) for h in hosts},
                         # a reboot through the scheduler (scontrol reboot) where it has one
                         "fleetctl_reboot_commands": ctx.scheduler.reboot_commands(
                             ctx, hosts, rollback=install_step == HostState.ROLLBACK_INSTALL),
                         "fleetctl_activation": {h: ctx.activation(h) for h in hosts},
                         # a reinstall stops them (prerm) and a reload or no-op activation does not start them
                         "fleetctl_running_units": {h: ctx.befores.get(h, {}).get("daemons", []) for h in hosts}},
                        check_ssh=False)
    out = {}
    for name, o in outcomes.items():
        out[name] = unreachable_or_failed(o) or Outcome("ok", None, activation_detail(o.results))
    return out


def activation_detail(results: dict[str, Any]) -> dict[str, Any]:
    """How the driver got loaded: rebooted, reloaded, and why a reload had to become a reboot."""
    def ran(task: str) -> dict[str, Any] | None:
        r = results.get(task)
        return r if r and not r.get("skipped") else None
    reboot, reload = ran("ansible.builtin.reboot"), ran("fleetctl.gpu.nvidia_module_reload")
    detail: dict[str, Any] = {"rebooted": reboot is not None,
                              "reloaded": bool(reload and reload.get("changed") and reload.get("outcome") == "loaded")}
    if reload and reload.get("outcome") == "refused":
        detail["reload_refused"] = str(reload.get("msg"))[:500]
    if reload and reload.get("not_started"):
        detail["units_not_started"] = reload["not_started"]
    return detail


def activate(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    return _activate(ctx, hosts, HostState.INSTALL, lambda h: ctx.target)


def nvlink_up(facts: dict[str, Any]) -> dict[str, int]:
    """NVLink links up per GPU (by UUID, else index) of a host's facts; empty without NVLink."""
    uuids = {g["index"]: g.get("uuid") for g in facts.get("gpus", [])}
    return {str(uuids.get(g["index"]) or g["index"]): g["nvlink"]["up"]
            for g in (facts.get("interconnect") or {}).get("gpus", []) if g.get("nvlink") and g["nvlink"]["supported"]}


def interconnect_problems(entry: dict[str, Any], before: dict[str, Any]) -> list[str]:
    """What the change broke between the GPUs: a control failing now that did not fail at the precheck (a fabric
    not completed, a pair fallen off NVLink, link errors past the baseline's limit), and a link that was up at the
    precheck and is not now (one that trains down after the reboot leaves every single-GPU check green). A
    problem the host already had at the precheck is not the change's doing and does not roll it back; nor does a
    value NVML could not read this once (an `error` finding): a false rollback costs a maintenance window."""
    was = before.get("interconnect") or {}
    problems = [f"{f['control']}: {f['message']}" for f in entry["findings"]
                if f["control"] in controls.with_role("interconnect") and f["status"] == "fail"
                and was.get(f["control"]) not in ("fail", "error")]
    now = nvlink_up(entry["facts"])
    for gpu, up in sorted((before.get("nvlink_up") or {}).items()):
        if gpu in now and now[gpu] < up:  # a GPU gone altogether is the GPU count's problem
            problems.append(f"GPU {gpu}: {now[gpu]} of the {up} NVLink links up at the pre-check are up")
    cliques = domains.cliques(entry["facts"])
    for gpu, was in sorted((before.get("cliques") or {}).items()):
        if cliques.get(gpu) != was:  # the tray came back outside its rack's NVLink domain
            problems.append(f"GPU {gpu}: NVLink clique {cliques.get(gpu) or 'none'}, {was} at the pre-check")
    return problems


def fabric_pending(entry: dict[str, Any]) -> bool:
    """The fabric manager has not registered every GPU yet (not an error state: it may just be starting)."""
    ic = (entry["facts"] or {}).get("interconnect") or {}
    return any((g.get("fabric") or {}).get("state") in FABRIC_PENDING for g in ic.get("gpus", []))


def imex_pending(entry: dict[str, Any]) -> bool:
    """The host's NVLink domain has not re-formed yet: its IMEX is not running, or does not see every peer of its
    node list connected and ready (the domain's trays reboot together and come back one by one)."""
    return bool(domain_problems(entry))


def domain_problems(entry: dict[str, Any]) -> list[str]:
    """Why the host's rack-scale NVLink domain has not formed (the "domain_formed" controls not passing), [] when it
    has or the host is in none."""
    if (entry["facts"] or {}).get("imex") is None:
        return []
    return [f"{f['control']}: {f['message']}" for f in entry["findings"]
            if f["control"] in controls.with_role("domain_formed") and f["status"] not in ("pass", "not_applicable")]


def facts_after_activation(ctx: Context, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """facts_of, collected again (up to the baseline's campaign.fabric_wait_s) for hosts whose NVSwitch fabric is
    still being registered (every FABRIC_POLL_S: the fabric manager starts after sshd is back) or whose NVLink
    domain has not re-formed yet (every IMEX_POLL_S)."""
    entries = facts_of(ctx, hosts)
    deadline = {h: time.monotonic() + ctx.policy(h).get("campaign", {}).get("fabric_wait_s", FABRIC_WAIT_S)
                for h in hosts}

    def pending(h: str) -> bool:
        return entries[h]["facts"] is not None and (fabric_pending(entries[h]) or imex_pending(entries[h]))
    waiting = [h for h in entries if pending(h)]
    while True:
        poll = FABRIC_POLL_S if any(fabric_pending(entries[h]) for h in waiting) else IMEX_POLL_S
        waiting = [h for h in waiting if time.monotonic() + poll <= deadline[h]]
        if not waiting:
            return entries
        time.sleep(poll)
        entries.update(facts_of(ctx, waiting))
        waiting = [h for h in waiting if pending(h)]


def not_restored(entry: dict[str, Any], before: dict[str, Any]) -> list[str]:
    """The driver's findings (driver, nouveau, persistence, runtime/CDI, fabric manager) failing now that did not at
    the precheck, and its daemons that ran then and do not now: a rollback gives the whole host back."""
    was = before.get("driver_findings") or {}
    problems = [f"{f['control']}: {f['message']} (it was {was[f['control']]} at the pre-check)"
                for f in entry["findings"] if f["control"] in was and f["status"] in ("fail", "error")
                and f["control"] not in controls.with_role("verify_always")  # verify judges those itself
                and was[f["control"]] not in ("fail", "error")]
    now = running_daemons(entry["facts"])
    problems += [f"{unit} ran at the pre-check and is not running" for unit in before.get("daemons") or []
                 if unit not in now]
    return problems


def changed_controls(entry: dict[str, Any], before: dict[str, Any],
                     stated: tuple[str, ...] | None = None) -> list[str]:
    """The whole host after the change: a control that passed at the precheck (or warned, or did not apply) and
    fails now, naming it; the controls whose outcome follows from the driver version (the "target" role) fail the
    host whenever they fail now, whatever they were before the change: they are judged against the target. A value
    not read this once (`error`) is no failure: a false rollback costs a maintenance window. STATED: the controls
    the caller judges otherwise or not at all (the verify, by default: those it states itself, "judged_by_verify";
    the soak: those it leaves out, "not_soaked")."""
    was = before.get("findings")
    if was is None:  # a campaign recorded before the precheck kept every finding
        return []
    target = set(controls.with_role("target"))
    stated = controls.with_role("judged_by_verify") if stated is None else stated
    # A control comparing the host with its inventory group (gpu.firmware_uniform) answers for the hosts collected
    # together, which the verify's (those that got that far) need not be: not the change's doing.
    grouped = {c.id for c in controls.peer_controls()}
    return [f"{f['control']}: {f['message']}" + ("" if f["control"] in target else
                                                 f" (it was {was.get(f['control'], 'not judged')} at the pre-check)")
            for f in entry["findings"] if f["status"] == "fail" and f["control"] not in stated
            and f["control"] not in grouped and (f["control"] in target or was.get(f["control"]) != "fail")]


def _verify(ctx: Context, hosts: list[str], version_of: Callable[[str], str],
            whole_host: bool = False) -> dict[str, Outcome]:
    """The running module and the userspace are VERSION, NVML answers, every GPU is back, packages held, and the
    interconnect is as whole as at the precheck (fabric completed, every NVLink link up again); forward, every other
    control as at the precheck or, for those the version decides, as the target should be (changed_controls).
    WHOLE_HOST (the rollback): every driver finding and daemon as at the precheck."""
    out = {}
    for name, entry in facts_after_activation(ctx, hosts).items():
        if entry["facts"] is None:
            out[name] = Outcome("fail", entry["error"] or "no facts")
            continue
        want, facts = version_of(name), entry["facts"]
        d = facts["driver"]
        problems = []
        running = controls.running_version(facts)
        if d["state"] != "loaded" or running != want:
            problems.append(f"driver {d['state'].replace('_', ' ')}, module {d['module_version']}, "
                            f"userspace {d['userspace_version']} (want {want})")
        gpus = controls.live_gpus(facts)
        expected = ctx.befores[name].get("gpus")
        if expected is not None and len(gpus) < expected:
            problems.append(f"{len(gpus)} of {expected} GPUs answer NVML")
        if d["held"] is False:
            problems.append("driver packages are not held")
        problems += interconnect_problems(entry, ctx.befores[name])
        problems += [p for p in domain_problems(entry) if p not in problems]  # the NVLink domain formed again
        problems += [f"driver.next_boot: {f['message']}" for f in entry["findings"]
                     if f["control"] == "driver.next_boot" and f["status"] == "fail"]
        if whole_host:
            problems += [p for p in not_restored(entry, ctx.befores[name]) if p not in problems]
        else:
            problems += changed_controls(entry, ctx.befores[name])
        detail = {"running": running, "state": d["state"], "gpus": len(gpus), "held": d["held"],
                  "nvlink_up": nvlink_up(facts)}
        out[name] = Outcome("fail", "verify: " + "; ".join(problems), detail) if problems else Outcome("ok", None, detail)
    return out


def verify(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    return _verify(ctx, hosts, lambda h: ctx.target)


# ---- the rollback: back to exactly what precheck recorded ---------------------------------------------

def rollback_set(ctx: Context, host: str) -> dict[str, str]:
    """What precheck recorded, plus any package of the old version the install took away or changed that the
    facts did not list (e.g. libnvidia-decode-550, removed with its branch): back exactly as it was."""
    before = ctx.befores[host]
    wanted = dict(before["packages"])
    install = ctx.journal.step_detail(ctx.campaign, host, HostState.INSTALL) or {}
    after = install.get("after") or {}
    for name, version in (install.get("before") or {}).items():
        if name not in wanted and after.get(name) != version and packages.upstream(version) == before["version"]:
            wanted[name] = version
    return wanted


def rollback_install(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    return _install(ctx, hosts, lambda h: rollback_set(ctx, h))


def rollback_activate(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    return _activate(ctx, hosts, HostState.ROLLBACK_INSTALL, lambda h: ctx.befores[h]["version"])


def rollback_verify(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    return _verify(ctx, hosts, lambda h: ctx.befores[h]["version"], whole_host=True)


def rollback_probe(ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
    return _gate(ctx, hosts, HostState.PROBE_BEFORE)


# Each step's runner, as the host table names it (transitions.HOST_TABLE: the step's whole row).
STEPS: dict[HostState, Callable[[Context, list[str]], dict[str, Outcome]]] = {
    row.step: globals()[row.runner] for row in transitions.HOST_TABLE}
