"""What a soak check makes of a host's probe result (campaign/soak.py), on a real H100 probe result
(tests/testdata/probe, driver 580.159.04) changed the way a failing host changes it; the playbook run is replaced
by the results, the journal is the real one."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from orchestrator import controls
from orchestrator.campaign import soak, steps
from tests.helpers.facts import tray_facts
from tests.helpers.soak import FACTS, REAL, Prometheus, answer, observe, slower, soaking_after, tensor, with_metrics


@pytest.fixture
def soaking(store):
    return soaking_after(store, ["b"])


# A critical Xid as the on-host classifier reports it (schema xid_event)
XID_119 = {"code": 119, "pci_bus_id": "00000000:18:00.0", "gpu_instance": None, "pid": None, "process": None,
           "message": "Timeout after 6s of waiting for RPC response from GPU0 GSP!", "recovery_action": None,
           "seq": 9, "uptime_s": 1234.5, "raw": "NVRM: Xid (PCI:0000:18:00): 119, Timeout after 6s",
           "name": "GSP RPC timeout", "class": "critical", "severity": "critical", "action": "reset the GPU",
           "source": "catalog"}


def changed(**health_changes) -> dict:
    result = copy.deepcopy(REAL)
    for key, value in health_changes.items():
        result["health"][key] = value
    return result


def test_a_quiet_host_passes_and_the_next_check_reads_on_from_its_marker(soaking, monkeypatch):
    result = changed(xid={"since_seq": 0, "last_seq": 4242, "events": []})
    seen = answer(monkeypatch, result)
    o = soak.observe(soaking, ["a"], final=False)["a"]
    assert o.status == "ok" and o.detail["marker"] == {"seq": 4242, "boot_id": REAL["host"]["boot_id"]}
    assert seen["markers"]["a"]["boot_id"] == REAL["host"]["boot_id"]  # the gate probe's marker, the first time
    assert seen["opts"]["gpu_probe_throughput"] and "gpu_probe_engine" not in seen["opts"]  # the host's own engine
    soaking.journal.record_soak(soaking.campaign, 1, "check", {"a": o})
    seen = answer(monkeypatch, result)
    soak.observe(soaking, ["a"], final=False)
    assert seen["markers"] == {"a": {"seq": 4242, "boot_id": REAL["host"]["boot_id"]}}


def test_a_new_critical_xid_fails_the_host(soaking, monkeypatch):
    event = XID_119
    xid = dict(REAL["health"]["xid"], events=[event])
    o = observe(soaking, monkeypatch, changed(xid=xid))
    assert o.status == "fail" and "new Xid 119" in o.reason
    assert soak.failing(soaking.journal, soaking.campaign) == {"a": o.reason}


def test_a_reboot_nobody_asked_for_and_a_lost_gpu_fail_the_host(soaking, monkeypatch):
    rebooted = copy.deepcopy(REAL)
    rebooted["host"]["boot_id"] = "00000000-dead-beef-0000-000000000000"
    o = observe(soaking, monkeypatch, rebooted)
    assert o.status == "fail" and "rebooted during the soak without fleetctl asking" in o.reason
    gone = changed(gpu_count=0, gpus=[])
    o = observe(soaking, monkeypatch, gone)
    assert o.status == "fail" and "0 GPUs answer after, 1 expected" in o.reason


def test_failed_canary_runs_over_the_limit_fail_the_host(soaking, monkeypatch):
    soaking.options = dataclasses.replace(soaking.options, canary="/opt/canary --token s3cr3t", canary_max_failures=1)
    broken = dict(copy.deepcopy(REAL), throughput=None, errors={"throughput": "canary exited 3: CUDA error"})
    seen = answer(monkeypatch, broken)
    first = soak.observe(soaking, ["a"], final=False)["a"]
    assert seen["opts"]["gpu_probe_engine"] == "command"
    assert seen["opts"]["gpu_probe_command"] == "/opt/canary --token s3cr3t"
    assert first.status == "ok" and "canary run failed (1 failed run(s), at most 1 allowed)" in first.detail["seen"][0]
    soaking.journal.record_soak(soaking.campaign, 1, "check", {"a": first})
    second = observe(soaking, monkeypatch, broken)
    assert second.status == "fail" and "2 failed run(s), at most 1 allowed): throughput: canary exited 3" in second.reason


def test_an_unreachable_host_fails_after_the_grace(soaking, monkeypatch):
    o = observe(soaking, monkeypatch, None, reachable=False, error="ssh: connect timed out")
    assert o.status == "unreachable" and "of the 300s grace" in o.reason
    assert soak.failing(soaking.journal, soaking.campaign) == {}
    # the streak began 301 s ago
    soaking.journal.db.execute("UPDATE campaign_soak SET at='2000-01-01T00:00:00.000Z'")
    o = observe(soaking, monkeypatch, None, reachable=False, error="ssh: connect timed out")
    assert o.status == "fail" and "over the 300s grace: ssh: connect timed out" in o.reason


def test_the_end_of_soak_gate_judges_throughput_against_probe_before(soaking, monkeypatch):
    o = observe(soaking, monkeypatch, copy.deepcopy(REAL), final=True)
    assert o.status == "ok" and o.detail["gate"]["status"] == "pass"
    slower = copy.deepcopy(REAL)
    for s in slower["throughput"]["samples"]:
        s["value"] *= 0.9
    o = observe(soaking, monkeypatch, slower, final=True)
    assert o.status == "fail" and o.reason == ("end of the soak: throughput: 2 of 2 series below 0.95x their median "
                                               "before; worst GPU 0 bandwidth_gbs -10.0%")
    assert [f["rule"] for f in o.detail["gate"]["figures"]] == ["floor", "floor"]  # in full in the history
    assert sum("below the floor" in r for r in o.detail["gate"]["reasons"]) == 2


def test_an_end_of_soak_gate_failing_several_ways_is_one_line_worst_first(soaking, monkeypatch):
    """The canary command's metrics fall between its first and last run, throughput falls against probe_before and
    a critical Xid comes: one line naming the Xid, then what else failed; each in full in the observation."""
    soaking.options = dataclasses.replace(soaking.options, canary="/opt/canary")
    for factor in (1.0, 0.9):
        run = copy.deepcopy(REAL)
        run["throughput"]["engine"] = "command"
        for s in run["throughput"]["samples"]:
            s["value"] *= factor
        observe(soaking, monkeypatch, run)
    slower = copy.deepcopy(REAL)
    for s in slower["throughput"]["samples"]:
        s["value"] *= 0.9
    slower["health"]["xid"] = dict(REAL["health"]["xid"], events=[
        XID_119])
    o = observe(soaking, monkeypatch, slower, final=True)
    assert o.status == "fail" and o.reason == ("end of the soak: new Xid 119 (GSP RPC timeout) on 00000000:18:00.0: "
                                               "severity critical (+2 more: throughput, canary command)")
    assert o.detail["seen"][0] == ("new Xid 119 (GSP RPC timeout) on 00000000:18:00.0: severity critical [catalog] -> "
                                   "reset the GPU")
    assert o.detail["seen"][2].startswith("canary command: 2 of 2 series below 0.95x their median before; worst")
    assert o.detail["canary_gate"]["status"] == "fail" and len(o.detail["canary_gate"]["figures"]) == 2


def test_a_soak_watches_only_changed_hosts_on_the_target(soaking):
    rows = {r["host"]: r for r in soaking.journal.hosts(soaking.campaign)}
    assert rows["a"]["changed"] and not rows["b"]["changed"]
    assert soak.watched(soaking.journal, soaking.campaign) == ["a"]
    assert steps.STEPS  # the real step table is back after the fixture


# ---- the canary metrics: the canary cohort against the control cohort, from a Prometheus's answers ----------

XIDS = 'sum by (Hostname) (DCGM_EXP_XID_ERRORS_TOTAL{Hostname=~"{hosts}"})'


def test_a_fleet_wide_drift_the_control_cohort_shows_excuses_the_end_of_soak_self_comparison(store, tmp_path,
                                                                                              monkeypatch):
    """Every host 8% slower during the soak, canary and control alike: the canary against itself fails, the canary
    against the control passes and says the control moved 8%; less that drift the gate passes: no failure, and the
    record has both verdicts."""
    ctx = tensor(soaking_after(store, ["b", "c", "d"]), tmp_path, Prometheus(during=0.92))
    o = observe(ctx, monkeypatch, slower(0.92), final=True)
    assert o.status == "ok", (o.reason, o.detail.get("canary_metrics")[0]["reason"])
    assert o.detail["gate"]["status"] == "fail"  # the self-comparison alone
    assert o.detail["gate_less_drift"]["status"] == "pass" and o.detail["gate_less_drift"]["metric"] == "tensor_active"
    assert o.detail["gate_less_drift"]["moved"] == pytest.approx(-0.08, abs=0.01)
    [metric] = o.detail["canary_metrics"]
    assert metric["verdict"] == "pass" and metric["control_hosts"] == ["b", "c", "d"]
    said = next(n for n in o.detail["seen"] if n.startswith("throughput at the end of the soak against itself"))
    assert "below 0.95x" in said and "control cohort moved -8" in said and said.endswith("drift, pass")


def test_a_drift_excuses_no_more_than_itself_nor_a_canary_its_metrics_fail(store, tmp_path, monkeypatch):
    """The fleet 8% slower and the canary 20% on its own probe: still a failure; the canary 6% below its controls on
    top of the drift: the metric fails and nothing is excused."""
    ctx = tensor(soaking_after(store, ["b", "c", "d"]), tmp_path, Prometheus(during=0.92))
    o = observe(ctx, monkeypatch, slower(0.80), final=True)
    assert o.status == "fail" and o.reason.startswith("end of the soak: throughput:")
    assert o.detail["gate_less_drift"]["status"] == "fail"
    ctx.prometheus.canary = 0.94
    o = observe(ctx, monkeypatch, slower(0.92), final=True)
    # the canary against its controls names the failure; the self-comparison the drift also failed comes second
    assert o.status == "fail" and o.reason.startswith("end of the soak: tensor_active: canary")
    assert o.reason.endswith("(+1 more: throughput)") and "gate_less_drift" not in o.detail
    assert any(n.startswith("tensor_active: canary") and "past the 3% tolerated" in n for n in o.detail["seen"])


def test_the_control_cohort_is_the_group_hosts_of_the_canarys_gpu_model_not_changed_yet(store, tmp_path,
                                                                                         monkeypatch):
    """'d' carries other GPUs: it is in no query and no cohort; the Xid rate counts each host's GPUs as the plan
    found them (the canary's 8 against 2 + 2), and more Xids per GPU-hour on the canary fail it."""
    models = {"a": (8, "NVIDIA H100 80GB HBM3"), "b": (2, "NVIDIA H100 80GB HBM3"), "c": (2, "NVIDIA H100 80GB HBM3"),
              "d": (8, "NVIDIA H200")}
    ctx = with_metrics(soaking_after(store, ["b", "c", "d"], gpus=models), tmp_path, Prometheus(xids={"a": 12}),
                       f"{{name: xid, query: '{XIDS}', host_label: Hostname, good: lower, max_change: 50%, kind: rate}}")
    o = observe(ctx, monkeypatch, copy.deepcopy(REAL), final=True)
    [metric] = o.detail["canary_metrics"]
    assert metric["control_hosts"] == ["b", "c"] and all('"d"' not in q and "|d)" not in q
                                                          for q, _, _ in ctx.prometheus.queries)
    assert metric["gpu_hours"]["canary"] == pytest.approx(2 * metric["gpu_hours"]["control"])
    assert o.status == "fail" and o.reason.startswith("end of the soak: xid: canary") and metric["verdict"] == "fail"


def test_a_plan_lists_a_control_cohort_per_group_and_gpu_model():
    from orchestrator.judge.canary import planning
    h = lambda name, model: {"name": name, "groups": ["all", "gpu"], "gpu_model": model}  # noqa: E731
    made = {"waves": [{"index": 1, "hosts": [h("a", "H100")]},
                      {"index": 2, "hosts": [h("b", "H100"), h("c", "H200"), h("d", None)]}]}
    assert planning.control_cohorts(made) == {"1": {"gpu (H100)": ["b"]}, "2": {"gpu (H100)": [], "gpu (H200)": [],
                                                                             "gpu": []}}


# ---- the controls: the verify's rule at every soak check ----------------------------------------------------

def precheck_found(ctx, facts) -> None:
    """The host's pre-check as the real precheck records it: each control's status on FACTS."""
    ctx.befores["a"]["findings"] = {f["control"]: f["status"] for f in controls.evaluate(facts, ctx.policy("a"))}


def test_an_imex_domain_that_degrades_during_the_soak_fails_the_tray(soaking, monkeypatch, device_facts):
    """A peer lost from a tray's IMEX node list mid-soak (the domain DEGRADED): no Xid, no GPU lost, the probe's
    health is clean, and the soak fails the tray on imex.domain, which passed at the pre-check."""
    tray = tray_facts(device_facts)
    precheck_found(soaking, tray)
    assert observe(soaking, monkeypatch, copy.deepcopy(REAL), facts=tray).status == "ok"
    degraded = copy.deepcopy(tray)
    degraded["imex"]["domain"] = {"status": "DEGRADED", "nodes": degraded["imex"]["domain"]["nodes"][:2]}
    o = observe(soaking, monkeypatch, copy.deepcopy(REAL), facts=degraded)
    assert o.status == "fail"
    assert o.reason.startswith("soak: imex.domain: IMEX domain DEGRADED") and "(it was pass at the pre-check)" in o.reason
    assert soak.failing(soaking.journal, soaking.campaign) == {"a": o.reason}


def test_a_control_failing_at_the_pre_check_or_left_out_of_the_soak_fails_nothing(soaking, monkeypatch):
    """What the host already had before the change is not the change's doing; a GPU's memory read while a job
    starts (gpu.memory_leak, "not_soaked") is no fault either. A control that passed and fails now does fail."""
    precheck_found(soaking, FACTS)
    assert soaking.befores["a"]["findings"]["nouveau.blacklisted"] == "fail"  # the captured VM's own
    leaking = copy.deepcopy(FACTS)
    leaking["gpus"][0]["memory"] = {"total_bytes": 80 << 30, "reserved_bytes": 0, "used_bytes": 40 << 30,
                                    "processes": 0}
    assert next(f for f in controls.evaluate(leaking, soaking.policy("a"))
                if f["control"] == "gpu.memory_leak")["status"] == "fail"
    assert observe(soaking, monkeypatch, copy.deepcopy(REAL), facts=leaking).status == "ok"
    off = copy.deepcopy(FACTS)
    for g in off["gpus"]:
        g["persistence_mode"] = False
    o = observe(soaking, monkeypatch, copy.deepcopy(REAL), facts=off, final=True)
    assert o.status == "fail" and "persistence.mode: " in o.reason


def test_the_soak_judges_every_control_but_those_that_say_otherwise():
    """No control can be forgotten by the soak: one added to the registry is judged unless it declares
    "not_soaked" (or compares a host with its peers, as at the verify)."""
    entry = {"findings": [{"control": c.id, "status": "fail", "message": "x"} for c in controls.CONTROLS]}
    before = {"findings": {c.id: "pass" for c in controls.CONTROLS}}
    named = {p.split(":")[0] for p in steps.changed_controls(entry, before, stated=controls.with_role("not_soaked"))}
    left_out = {c.id for c in controls.CONTROLS} - named
    assert left_out == set(controls.with_role("not_soaked")) | {c.id for c in controls.peer_controls()}
    assert {"imex.domain", "gpu.fabric_clique", "gpu.fabric", "imex.service"} <= named
