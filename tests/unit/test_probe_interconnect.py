"""The probe's interconnect metrics: what a host without NCCL, torch or a second GPU gets, and how the gate judges
the real 2x H200 all-reduce series."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_collective as collective
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_throughput import command

from orchestrator.judge import gate

SERIES = Path(__file__).parents[1] / "testdata" / "probe" / "h200x2-580.159.04-allreduce-series.json"


class FakeDistributed:
    def __init__(self, nccl):
        self.nccl = nccl

    def is_available(self):
        return True

    def is_nccl_available(self):
        return self.nccl


class FakeTorch:
    """Enough of torch for the code paths that decide before any CUDA work."""

    def __init__(self, nccl):
        self.distributed = FakeDistributed(nccl)


def test_one_gpu_has_no_interconnect_metric():
    assert collective.interconnect(FakeTorch(True), 3, 0, 0.1, [0], lambda i: {}) == ([], {})
    assert collective.allreduce(3, 0, 0.1, [0]) == []


def test_torch_without_nccl_is_an_error_entry_not_a_crash():
    class NoCuda(FakeTorch):
        bfloat16 = "bf16"

        def randn(self, *a, **k):
            raise RuntimeError("CUDA is not available")

        def device(self, *a):
            return None

    rows, errors = collective.interconnect(NoCuda(False), 3, 0, 0.1, [0, 1], lambda i: {})
    assert rows == []
    assert errors["throughput.allreduce"] == "this torch has no NCCL: no all-reduce figure"
    assert errors["throughput.p2p.gpu0"].startswith("RuntimeError: CUDA is not available")


def test_a_worker_that_cannot_import_torch_names_the_reason(monkeypatch, tmp_path):
    """The all-reduce workers run the remote Python; one without torch ends the family with that line."""
    (tmp_path / "torch.py").write_text("raise ImportError('No module named torch (test)')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(collective.CollectiveError, match=r"worker exited 1: ImportError: No module named torch"):
        collective.allreduce(2, 0, 0.1, [0, 1], timeout_s=60)


def test_workers_always_run_with_nvlink_multicast_off(monkeypatch, tmp_path):
    """NVLS stays off whatever the environment says: a program using it can take a shared host's GPUs down."""
    (tmp_path / "torch.py").write_text(
        "import os, sys\nsys.stderr.write('NVLS=%s\\n' % os.environ['NCCL_NVLS_ENABLE'])\nsys.exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    with pytest.raises(collective.CollectiveError, match="exited 3: NVLS=0"):
        collective.allreduce(2, 0, 0.1, [0, 1], timeout_s=60)


def test_canary_series_keep_the_peer_of_p2p_samples(tmp_path):
    canary = tmp_path / "bench.py"
    canary.write_text("import json\nprint(json.dumps({'metrics': {'p2p_gbs': {'unit': 'GB/s', 'higher_is_better': True},"
                      " 'allreduce_busbw_gbs': {'unit': 'GB/s', 'higher_is_better': True}}, 'samples': ["
                      "{'gpu': 0, 'peer': 1, 'metric': 'p2p_gbs', 'value': 370.0},"
                      "{'gpu': None, 'metric': 'allreduce_busbw_gbs', 'value': 480.0}]}))\n")
    rows, spec, _ = command(f"{sys.executable} {canary}", 1)
    assert rows == [{"gpu": 0, "peer": 1, "metric": "p2p_gbs", "value": 370.0},
                    {"gpu": None, "metric": "allreduce_busbw_gbs", "value": 480.0}]


def real_allreduce_probes():
    doc = json.loads(SERIES.read_text())
    return [[s["value"] for s in probe["samples"]] for probe in doc["allreduce"]]


def test_real_h200_allreduce_probes_never_fail_each_other():
    """Every pair of the 15 real probes (210 ordered comparisons) passes the default gate: no false rollback."""
    probes = real_allreduce_probes()
    assert len(probes) == 15 and all(len(p) == 10 for p in probes)
    pol = gate.DEFAULTS
    for i, before in enumerate(probes):
        for j, after in enumerate(probes):
            if i != j:
                status, reason, _ = gate.judge_series("host allreduce_busbw_gbs", "allreduce_busbw_gbs", before, after,
                                                      True, "GB/s", pol)
                assert status == "pass", reason


def test_one_nvlink_of_eighteen_lost_fails_the_real_series():
    """A link down costs the all-reduce ~1/18 (5.6%): over the 3% limit, significant, and under the 0.95 floor."""
    before, after = real_allreduce_probes()[0], [v * 17 / 18 for v in real_allreduce_probes()[1]]
    status, reason, fig = gate.judge_series("host allreduce_busbw_gbs", "allreduce_busbw_gbs", before, after, True,
                                            "GB/s", gate.DEFAULTS)
    assert status == "fail" and "below the floor" in reason
    assert gate.DEFAULTS.max_drop_for("allreduce_busbw_gbs") == 0.03


def _ic(up_links, fabric=("completed", "success")):
    """health.interconnect of a 2-GPU HGX host: GPU 1 with UP_LINKS of its 18 links up."""
    def gpu(i, up):
        links = [{"link": n, "state": "up" if n < up else "down", "version": "4.0",
                  "remote": {"type": "switch", "pci_bus_id": None}, "errors": {}} for n in range(18)]
        return {"index": i, "pci_bus_id": f"00000000:0{i}:00.0",
                "nvlink": {"supported": True, "up": up, "total": 18, "links": links},
                "fabric": {"state": fabric[0], "status": fabric[1], "clique_id": 0, "cluster_uuid": None,
                           "health_mask": None}}
    return {"gpus": [gpu(0, 18), gpu(1, up_links)], "topology": [{"gpus": [0, 1], "link": f"NV{up_links}",
                                                                  "nvlinks": up_links}], "peermem_loaded": False}


def test_probe_health_fails_a_link_down_and_a_fabric_not_completed():
    assert gate.interconnect_lines(_ic(18), _ic(18)) == []
    assert gate.interconnect_lines(_ic(18), _ic(17)) == ["GPU 1: NVLink links up 18 -> 17 (down: 17)"]
    stuck = gate.interconnect_lines(_ic(18), _ic(18, ("in_progress", None)))
    assert stuck == [f"GPU {i}: fabric in progress: multi-GPU CUDA programs fail (error 802) until it completes"
                     for i in (0, 1)]
    failed = gate.interconnect_lines(None, _ic(18, ("completed", "NVML_ERROR_INSUFFICIENT_RESOURCES")))
    assert "fabric completed (NVML_ERROR_INSUFFICIENT_RESOURCES)" in failed[0]
    # A host without NVLink or fabric (L40S), and a probe of a driver that reads no interconnect at all.
    assert gate.interconnect_lines(None, None) == []


def test_nvlink_errors_fail_the_probe_only_past_the_baselines_limit():
    before, after = _ic(18), _ic(18)
    after["gpus"][0]["nvlink"]["links"][2]["errors"] = {"replay": 900, "crc": 200, "crc_data": 5000, "ecc_data": 9000}
    assert gate.interconnect_lines(before, after, True, None) == []  # no errors_fail in the baseline: not judged
    assert gate.interconnect_lines(before, after, True, 2000) == []  # the legacy data counters do not count
    assert gate.interconnect_lines(before, after, True, 1000) == [
        "GPU 0: 1100 NVLink errors (replay, recovery, CRC) since the previous probe, over the baseline's 1000"]
    before["gpus"][0]["nvlink"]["links"][2]["errors"] = {"replay": 800, "crc": 200}
    assert gate.interconnect_lines(before, after, True, 1000) == []  # 100 new since the previous probe
    assert "since the driver loaded" in gate.interconnect_lines(before, after, False, 1000)[0]  # counters restarted
    assert gate.gate_policy({"interconnect": {"nvlink": {"errors_fail": 50}}}).nvlink_errors_fail == 50
