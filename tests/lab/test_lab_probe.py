"""fleetctl probe on lab hosts: each host is judged against its own previous probe.

Injected Xid 79, a GPU off the bus and a 0.9 throughput factor each make the probe fail that host, and only that
host; a clean host passes on noise alone.
"""

from __future__ import annotations

import json

import pytest

from orchestrator import schemas
from tests.lab.conftest import fleetctl_lab

pytestmark = pytest.mark.lab

SPECS = ("4xh100-sxm/2@570.86.15",)
FAST = ("--throughput", "--samples", "10", "--warmup", "0", "--trial", "0.02", "--format", "json")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with fleetctl_lab(tmp_path_factory.mktemp("probe"), SPECS) as handle:
        yield handle


def probe(lab, *args):
    proc = lab.fleetctl("probe", "-i", lab.inventory, *FAST, *args)
    assert proc.returncode in (0, 1, 3), proc.stderr
    report = json.loads(proc.stdout)
    assert schemas.first_error("probe-report", report) is None
    return proc.returncode, {h["name"]: h for h in report["hosts"]}


def test_first_probe_then_noise_alone_passes(lab):
    code, hosts = probe(lab)
    assert code == 0 and all(h["health"]["status"] == "pass" for h in hosts.values())
    first = hosts["h100-01"]["probe"]
    assert first["sources"]["gpus"] == "nvml" and first["throughput"]["engine"] == "command"
    assert first["throughput"]["device"] == "command: nvidia-lab-bench"
    assert {s["metric"] for s in first["throughput"]["samples"]} == \
        {"gemm_tflops", "bandwidth_gbs", "allreduce_busbw_gbs", "p2p_gbs"}
    # 2 GPUs x (GEMM, copy, P2P to the other) x 10 samples, and one host-wide all-reduce per sample
    assert len(first["throughput"]["samples"]) == 2 * 3 * 10 + 10
    code, hosts = probe(lab)  # against the first: the same hardware, new noise
    assert code == 0, {n: h["health"] for n, h in hosts.items()}


def test_each_injected_fault_fails_its_host_and_only_it(lab):
    lab.inject("h100-01", "xid", "79", "--gpu", "1")
    lab.inject("h100-02", "fall-off-bus", "--gpu", "0")
    lab.inject("h100-03", "throughput", "0.9", "--driver", "570.86.15")
    code, hosts = probe(lab)
    assert code == 1
    status = {n: h["health"]["status"] for n, h in hosts.items()}
    assert status == {"h100-01": "fail", "h100-02": "fail", "h100-03": "fail", "h100-04": "pass"}
    why = {n: " ".join(h["health"]["reasons"]) for n, h in hosts.items()}
    assert "79" in why["h100-01"]
    assert "GPU 0 is lost" in why["h100-02"]
    assert "gemm_tflops" in why["h100-03"] and "%" in why["h100-03"]
    # The Xid marker: the next probe counts only newer kernel-log lines, so h100-01's old Xid is not news.
    lab.inject("h100-03", "throughput", "1.0", "--driver", "570.86.15")
    code, hosts = probe(lab, "-l", "h100-01")
    assert hosts["h100-01"]["probe"]["health"]["xid"]["events"] == []
    assert hosts["h100-01"]["health"]["status"] == "pass", hosts["h100-01"]["health"]


def test_probe_results_are_in_the_history(lab):
    from orchestrator.store import Store
    from pathlib import Path

    with Store(Path(lab.env["FLEETCTL_HOME"]) / "history.sqlite3") as store:
        runs = store.runs("probe")
        assert len(runs) >= 4 and all(r["status"] == "done" for r in runs)
        rows = store.probe_results(runs[-2]["id"])
        assert {r["host"]: r["health"] for r in rows}["h100-02"] == "fail"
