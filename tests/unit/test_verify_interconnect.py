"""The campaign's verify on multi-GPU hosts: only what the change broke rolls a host back, and the fabric manager
gets time to register the GPUs after the host is back."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.judge import gate
from orchestrator.campaign import steps


def entry(up=(18, 18), fabric="completed", findings=()):
    gpus = [{"index": i, "uuid": f"GPU-{i}"} for i in range(len(up))]
    ic = {"gpus": [{"index": i, "pci_bus_id": f"0000:0{i}:00.0", "fabric": {"state": fabric},
                    "nvlink": {"supported": True, "up": n, "total": 18, "links": []}} for i, n in enumerate(up)]}
    return {"facts": {"gpus": gpus, "interconnect": ic},
            "findings": [{"control": c, "status": s, "message": m} for c, s, m in findings]}


def test_a_problem_the_host_had_at_the_precheck_does_not_roll_it_back():
    before_entry = entry(findings=[("gpu.topology", "fail", "pair 2-3 is PHB"), ("gpu.nvlink", "pass", "ok")])
    before = {"nvlink_up": steps.nvlink_up(before_entry["facts"]),
              "interconnect": {f["control"]: f["status"] for f in before_entry["findings"]}}
    assert before["nvlink_up"] == {"GPU-0": 18, "GPU-1": 18}
    same = entry(findings=[("gpu.topology", "fail", "pair 2-3 is PHB"), ("gpu.nvlink", "pass", "ok")])
    assert steps.interconnect_problems(same, before) == []
    worse = entry(up=(18, 17), fabric="in_progress",
                  findings=[("gpu.topology", "fail", "pair 2-3 is PHB"), ("gpu.nvlink", "fail", "GPU 1: 17 of 18"),
                            ("gpu.fabric", "fail", "fabric in progress")])
    assert steps.interconnect_problems(worse, before) == [
        "gpu.nvlink: GPU 1: 17 of 18", "gpu.fabric: fabric in progress",
        "GPU GPU-1: 17 of the 18 NVLink links up at the pre-check are up"]


def test_verify_waits_for_the_fabric_manager_then_judges(monkeypatch):
    """A fabric still registering is collected again every poll until the baseline's fabric_wait_s."""
    clock = [0.0]
    monkeypatch.setattr(steps.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(steps.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(steps, "FABRIC_POLL_S", 10.0)
    seen = []

    def facts_of(ctx, hosts):
        seen.append((clock[0], list(hosts)))
        return {h: entry(fabric="completed" if h == "late" and clock[0] >= 30 else
                         "in_progress" if h in ("late", "stuck") else "completed") for h in hosts}

    monkeypatch.setattr(steps, "facts_of", facts_of)
    ctx = SimpleNamespace(policy=lambda h: {"campaign": {"fabric_wait_s": 60}})
    got = steps.facts_after_activation(ctx, ["ok", "late", "stuck"])
    assert got["late"]["facts"]["interconnect"]["gpus"][0]["fabric"]["state"] == "completed"
    assert got["stuck"]["facts"]["interconnect"]["gpus"][0]["fabric"]["state"] == "in_progress"
    assert seen[0] == (0.0, ["ok", "late", "stuck"]) and seen[3] == (30.0, ["late", "stuck"])
    assert seen[-1] == (60.0, ["stuck"]) and len(seen) == 7  # the last poll at the deadline, then judged


def test_probe_compares_links_of_the_same_gpu_by_its_pci_slot():
    def ic(order):
        return {"gpus": [{"index": i, "pci_bus_id": pci, "fabric": None,
                          "nvlink": {"up": up, "links": []}} for i, (pci, up) in enumerate(order)]}
    before = ic([("0000:18:00.0", 18), ("0000:2a:00.0", 12)])  # a board with fewer links wired on one GPU
    renumbered = ic([("0000:2a:00.0", 12), ("0000:18:00.0", 18)])
    assert gate.interconnect_lines(before, renumbered) == []


def test_an_interconnect_measurement_that_broke_is_inconclusive_not_a_regression():
    t = {"engine": "builtin", "trial_s": 1, "metrics": {"allreduce_busbw_gbs": {"unit": "GB/s", "higher_is_better": True},
                                                        "gemm_tflops": {"unit": "TFLOP/s", "higher_is_better": True}},
         "samples": [{"gpu": None, "metric": "allreduce_busbw_gbs", "value": 328.0 + i / 10} for i in range(10)]
         + [{"gpu": 0, "metric": "gemm_tflops", "value": 670.0 + i / 10} for i in range(10)]}
    after = dict(t, samples=[s for s in t["samples"] if s["metric"] == "gemm_tflops"])
    v = gate.judge_throughput(t, after, gate.DEFAULTS, {"throughput.allreduce": "NCCL all-reduce did not finish in 600 s"})
    assert v.status == "inconclusive" and "did not finish in 600 s" in " ".join(v.reasons)
    assert gate.judge_throughput(t, after, gate.DEFAULTS).status == "fail"  # missing without a reason: a regression


def test_a_value_nvml_could_not_read_once_after_the_reboot_does_not_roll_back():
    before_entry = entry(findings=[("gpu.nvlink", "pass", "ok"), ("gpu.fabric", "pass", "ok")])
    before = {"nvlink_up": steps.nvlink_up(before_entry["facts"]),
              "interconnect": {f["control"]: f["status"] for f in before_entry["findings"]}}
    unread = entry(findings=[("gpu.nvlink", "error", "NVLink state unread: GPU 1: link 3 replay: NVML return 999"),
                             ("gpu.fabric", "pass", "ok")])
    assert steps.interconnect_problems(unread, before) == []


def test_a_fabric_with_a_status_but_no_state_is_named_not_a_crash():
    before = {"gpus": [{"index": 0, "pci_bus_id": "0000:18:00.0", "fabric": {"state": "completed", "status": "success"},
                        "nvlink": {"up": 18, "links": []}}]}
    after = {"gpus": [{"index": 0, "pci_bus_id": "0000:18:00.0", "fabric": {"state": None, "status": "NVML_ERROR_UNKNOWN"},
                       "nvlink": {"up": 18, "links": []}}]}
    assert any("fabric state unknown (NVML_ERROR_UNKNOWN)" in line for line in gate.interconnect_lines(before, after))
