"""fleetctl probe on lab hosts: each host is judged against its own previous probe.

Injected Xid 79, a GPU off the bus and a 0.9 throughput factor each make the probe fail that host, and only that
host; a clean host passes on noise alone.
"""

from __future__ import annotations

import json

import pytest

from orchestrator import schemas
from tests.helpers.lab import fleetctl_lab

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
        {"gemm_tflops", "bandwidth_gbs", "h2d_gbs", "d2h_gbs", "allreduce_busbw_gbs", "p2p_gbs"}
    # 2 GPUs x (GEMM, copy, H2D, D2H, P2P to the other) x 10 samples, and one host-wide all-reduce per sample
    assert len(first["throughput"]["samples"]) == 2 * 5 * 10 + 10
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
    from orchestrator.history.store import Store
    from pathlib import Path

    with Store(Path(lab.env["FLEETCTL_HOME"]) / "history.sqlite3") as store:
        runs = store.runs("probe")
        assert len(runs) >= 4 and all(r["status"] == "done" for r in runs)
        rows = store.probe_results(runs[-2]["id"])
        assert {r["host"]: r["health"] for r in rows}["h100-02"] == "fail"


def test_a_pcie_link_trained_at_x8_fails_the_host_copies(lab):
    """GPU 1's link at x8 (NVML says so) halves its host<->device copies: the probe fails the host on h2d_gbs and
    d2h_gbs of that GPU, below the floor, and on nothing else."""
    probe(lab, "-l", "h100-04")  # the host's own before, at Gen5 x16
    lab.inject("h100-04", "pcie-downgrade", "--gpu", "1", "--width", "8")
    code, hosts = probe(lab, "-l", "h100-04")
    health = hosts["h100-04"]["health"]
    assert code == 1 and health["status"] == "fail", health
    failing = [r for r in health["reasons"] if "below the floor" in r]
    assert [r.split(":")[0] for r in failing] == ["GPU 1 d2h_gbs", "GPU 1 h2d_gbs"], health["reasons"]
    assert all("(-50." in r or "(-49." in r for r in failing), failing
    gpu1 = [g for g in hosts["h100-04"]["probe"]["health"]["gpus"] if g["index"] == 1][0]
    assert gpu1["pcie"]["width"] == 8 and gpu1["pcie"]["width_max"] == 16


def scrape(port: int) -> dict[str, list]:
    """node_exporter's /metrics, parsed: {name: [(labels, value)]} (retried while it starts)."""
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                text = response.read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_node_exporter_textfile_collector_serves_fleetctl_metrics(lab, tmp_path):
    """audit and probe --format prometheus -o into a real node_exporter's textfile directory, side by side, then
    `fleetctl metrics -o` alone: scraped as Prometheus would, no textfile error, the lab hosts' series there."""
    import shutil
    import socket
    import subprocess

    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        pytest.skip("node_exporter is not installed (Debian package prometheus-node-exporter)")
    hosts = {f"h100-0{i}" for i in range(1, 5)}
    lab.inject("h100-04", "xid", "79", "--gpu", "0")
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    audit = lab.fleetctl("audit", "-i", lab.inventory, "--format", "prometheus", "-o", str(textfiles / "audit.prom"))
    assert audit.returncode in (0, 1) and audit.stdout == "", audit.stderr
    probe = lab.fleetctl("probe", "-i", lab.inventory, "--format", "prometheus", "-o", str(textfiles / "probe.prom"))
    assert probe.returncode in (0, 1) and probe.stdout == "", probe.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "node_exporter.log"
    exporter = subprocess.Popen([binary, f"--collector.textfile.directory={textfiles}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                                 "--collector.textfile"], stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        both = scrape(port)
        (textfiles / "audit.prom").unlink()
        (textfiles / "probe.prom").unlink()
        made = lab.fleetctl("metrics", "-o", str(textfiles / "fleetctl.prom"))
        assert made.returncode == 0 and made.stdout == "", made.stderr
        history = scrape(port)
    finally:
        exporter.terminate()
        try:
            exporter.wait(10)
        except subprocess.TimeoutExpired:
            exporter.kill()
            exporter.wait()
    for metrics in (both, history):
        assert metrics["node_textfile_scrape_error"] == [({}, 0.0)], log.read_text()[-2000:]
        assert {lab_["host"] for lab_, v in metrics["fleetctl_host_reachable"] if v == 1} == hosts
        assert {lab_["host"] for lab_, _ in metrics["fleetctl_driver_info"] if lab_["version"] == "570.86.15"} == hosts
        assert {lab_["host"]: v for lab_, v in metrics["fleetctl_gpus"]}["h100-04"] == 2
        xids = {(lab_["host"], lab_["code"], lab_["class"]): v for lab_, v in metrics["fleetctl_xid_events"]}
        assert xids[("h100-04", "79", "critical")] >= 1
        passing = {(lab_["host"], lab_["control"]) for lab_, v in metrics["fleetctl_control_status"]
                   if lab_["status"] == "pass"}
        assert ("h100-03", "driver.version_allowed") in passing
        assert ("h100-04", "fail") in {(lab_["host"], lab_["status"]) for lab_, _ in metrics["fleetctl_probe_status"]}
        probe_xids = {(lab_["host"], lab_["code"]) for lab_, _ in metrics["fleetctl_probe_xid_events"]}
        assert ("h100-04", "79") in probe_xids
    assert {lab_["file"].rsplit("/", 1)[-1] for lab_, _ in both["node_textfile_mtime_seconds"]} == \
        {"audit.prom", "probe.prom"}
    assert history["fleetctl_history_chain_head_age_seconds"][0][1] >= 0
