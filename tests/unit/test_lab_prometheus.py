"""The lab's DCGM exporter and Prometheus (lab/fleetctl_lab/exporter.py, prometheus.py), without root or a lab: a
host directory as `lab up` writes it, faults planted by the lab's own fault functions, the exposition parsed with
prometheus_client's parser, the scrape configuration checked by promtool, and a real prometheus scraping a real
exporter process over localhost."""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetctl_lab import exporter, faults, hosts, prometheus, state
from orchestrator.errors import InputError

DRIVER, NEW = "570.86.15", "580.95.05"
LABELS = {"gpu", "UUID", "device", "pci_bus_id", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


def make_lab(tmp_path, names=("h100-01",), gpus=2, loaded=DRIVER) -> state.Lab:
    """Host directories as `lab up` writes them (gpus.conf, faults.conf, host.json) with driver LOADED."""
    records = [state.HostRecord(state.HostSpec(name, gpus=gpus), i, f"10.213.0.{10 + i}", f"fl-{name}", f"flv{i}")
               for i, name in enumerate(names)]
    lab = state.Lab(tmp_path, "flbr0", "10.213.0.1/16", records, prometheus=9090)
    for record in records:
        hostdir = lab.host_dir(record.name)
        (hostdir / "hw").mkdir(parents=True)
        (hostdir / "kernel" / "sys-module" / "nvidia").mkdir(parents=True)
        (hostdir / "hw" / "gpus.conf").write_text(hosts.gpus_conf(record))
        (hostdir / "hw" / "faults.conf").write_text("")
        (hostdir / "kernel" / "kmsg").write_text("")
        (hostdir / "host.json").write_text(json.dumps({"name": record.name, "address": record.address}))
        load_driver(lab, record.name, loaded)
    return lab


def load_driver(lab, name, version):
    path = lab.host_dir(name) / "kernel" / "sys-module" / "nvidia" / "version"
    if version:
        path.write_text(version + "\n")
    else:
        path.unlink(missing_ok=True)


class Scrapes:
    """One host's exporter, scraped as Prometheus would: a minute apart (the noise forgets in ~3 s)."""

    def __init__(self, lab, name="h100-01"):
        self.now = 0.0
        self.collector = exporter.Exporter(lab.host_dir(name), rng=random.Random(7), clock=lambda: self.now)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)

    def scrape(self) -> dict[str, list]:
        self.now += 60.0
        text = generate_latest(self.registry).decode()
        return {f.name: f.samples for f in text_string_to_metric_families(text)}

    def mean(self, metric: str, n: int = 60, gpu: str | None = None) -> float:
        return statistics.fmean(s.value for _ in range(n) for s in self.scrape()[metric]
                                if gpu is None or s.labels["gpu"] == gpu)


def test_dcgm_names_and_labels_per_gpu_at_the_workloads_levels(tmp_path):
    lab = make_lab(tmp_path)
    scrapes = Scrapes(lab)
    families = scrapes.scrape()
    for name in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_GPU_UTIL",
                 "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"):
        samples = families[name]
        assert [s.labels["gpu"] for s in samples] == ["0", "1"], name
        assert set(samples[0].labels) == LABELS
    first = families["DCGM_FI_PROF_SM_ACTIVE"][0].labels
    conf = (lab.host_dir("h100-01") / "hw" / "gpus.conf").read_text()
    assert first["Hostname"] == "h100-01" and first["DCGM_FI_DRIVER_VERSION"] == DRIVER
    assert first["modelName"] == "NVIDIA H100 80GB HBM3" and first["device"] == "nvidia0"
    assert f"gpu.0.uuid={first['UUID']}" in conf and first["pci_bus_id"] == "00000000:18:00.0"
    assert families["DCGM_EXP_XID_ERRORS_TOTAL"] == []  # a series per code once one is seen, as dcgm-exporter's
    assert scrapes.mean("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") == pytest.approx(0.45, rel=0.02)
    assert scrapes.mean("DCGM_FI_PROF_SM_ACTIVE") == pytest.approx(0.80, rel=0.02)
    assert scrapes.mean("DCGM_FI_DEV_GPU_UTIL") == pytest.approx(97, rel=0.02)
    assert scrapes.mean("DCGM_FI_DEV_POWER_USAGE") == pytest.approx(71 + 0.8 * (700 - 71), rel=0.02)  # H100: W
    tensor = [s.value for _ in range(200) for s in scrapes.scrape()["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]]
    assert 0.01 < statistics.stdev(tensor) / statistics.fmean(tensor) < 0.04  # noise of 2%, and offsets


def test_the_throughput_fault_the_drift_and_a_metric_fault_move_the_levels(tmp_path):
    lab = make_lab(tmp_path)
    host = faults.Host(lab, "h100-01")
    scrapes = Scrapes(lab)
    base = {m: scrapes.mean(m) for m in exporter.SCALED}
    tensor = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
    faults.throughput(host, 0.9, driver=NEW)  # not the loaded driver: nothing moves
    assert scrapes.mean(tensor) == pytest.approx(base[tensor], rel=0.01)
    load_driver(lab, "h100-01", NEW)
    assert scrapes.mean(tensor) == pytest.approx(0.9 * base[tensor], rel=0.01)
    assert scrapes.scrape()["DCGM_FI_PROF_SM_ACTIVE"][0].labels["DCGM_FI_DRIVER_VERSION"] == NEW
    faults.metric(host, tensor, 0.94, driver=NEW)  # that metric only, on NEW only
    assert scrapes.mean(tensor) == pytest.approx(0.9 * 0.94 * base[tensor], rel=0.01)
    assert scrapes.mean("DCGM_FI_PROF_SM_ACTIVE") == pytest.approx(0.9 * base["DCGM_FI_PROF_SM_ACTIVE"], rel=0.01)
    load_driver(lab, "h100-01", DRIVER)
    assert scrapes.mean(tensor) == pytest.approx(base[tensor], rel=0.01)
    faults.metric(host, tensor, None, driver=NEW, restore=True)
    assert "metric." not in (lab.host_dir("h100-01") / "hw" / "faults.conf").read_text()
    faults.drift(lab, 0.92)  # every level of the host, power's span from idle
    for name in exporter.LEVELS:
        assert scrapes.mean(name) == pytest.approx(0.92 * base[name], rel=0.01), name
    idle = 71.0
    assert scrapes.mean("DCGM_FI_DEV_POWER_USAGE") - idle == pytest.approx(
        0.92 * (base["DCGM_FI_DEV_POWER_USAGE"] - idle), rel=0.01)
    faults.drift(lab, None, restore=True)
    assert scrapes.mean("DCGM_FI_DEV_GPU_UTIL") == pytest.approx(base["DCGM_FI_DEV_GPU_UTIL"], rel=0.01)
    with pytest.raises(InputError, match="no lab metric 'DCGM_FI_DEV_XID_ERRORS' to scale"):
        faults.metric(host, "DCGM_FI_DEV_XID_ERRORS", 0.5)
    with pytest.raises(InputError, match=r"factor must be in \(0, 2\]"):
        faults.drift(lab, 0)


def test_a_fleet_wide_drift_moves_canary_and_control_alike(tmp_path):
    lab = make_lab(tmp_path, names=("h100-01", "h100-02", "h100-03"))
    before = [Scrapes(lab, name).mean("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") for name in ("h100-01", "h100-02", "h100-03")]
    faults.drift(lab, 0.92)
    after = [Scrapes(lab, name).mean("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") for name in ("h100-01", "h100-02", "h100-03")]
    assert [a / b for a, b in zip(after, before)] == pytest.approx([0.92] * 3, rel=0.01)
    assert len(set(round(b, 4) for b in before)) == 3  # each host has its own offset (+-1%)


def test_xids_are_counted_per_gpu_and_code_and_replays_follow_the_gpu(tmp_path):
    lab = make_lab(tmp_path)
    host = faults.Host(lab, "h100-01")
    scrapes = Scrapes(lab)
    faults.xid(host, 13, gpu=1)
    faults.xid(host, 13, gpu=1, form="legacy")
    faults.xid(host, 31, gpu=1, form="mig")
    faults.pcie_errors(host, 0, replays=5)
    families = scrapes.scrape()
    totals = {(s.labels["gpu"], s.labels["xid"]): s.value for s in families["DCGM_EXP_XID_ERRORS_TOTAL"]}
    assert totals == {("1", "13"): 2, ("1", "31"): 1}
    assert [s.value for s in families["DCGM_FI_DEV_XID_ERRORS"]] == [0, 31]
    assert [s.value for s in families["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]] == [5, 0]
    faults.xid(host, 13, gpu=1)
    faults.fall_off_bus(host, 0)  # Xid 79 (and its bare line, one event): GPU 0's series are gone
    families = scrapes.scrape()
    assert {(s.labels["gpu"], s.labels["xid"]): s.value for s in families["DCGM_EXP_XID_ERRORS_TOTAL"]} == \
        {("1", "13"): 3, ("1", "31"): 1}
    assert [s.labels["gpu"] for s in families["DCGM_FI_PROF_SM_ACTIVE"]] == ["1"]


def test_no_driver_no_gpu_series(tmp_path):
    lab = make_lab(tmp_path, loaded=None)
    families = Scrapes(lab).scrape()
    assert all(samples == [] for samples in families.values())


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed")
def test_promtool_accepts_the_scrape_configuration(tmp_path):
    lab = make_lab(tmp_path, names=("h100-01", "l40s-01"))
    path = tmp_path / "prometheus.yml"
    path.write_text(prometheus.scrape_config(prometheus.targets(lab)))
    check = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "10.213.0.11:9400" in path.read_text() and "instance: l40s-01" in path.read_text()


def query(port: int, promql: str) -> list[dict]:
    address = prometheus.url(port) + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(address, timeout=5) as answer:
        return json.load(answer)["data"]["result"]


def wait_for(what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)
    return found


@pytest.mark.skipif(not os.path.exists(prometheus.PROGRAM), reason="Debian's prometheus is not installed")
def test_a_real_prometheus_scrapes_the_exporter_and_sees_a_metric_fault(tmp_path):
    """The exporter as a process on localhost, Debian's prometheus started and stopped as `lab up --prometheus`
    and `lab prometheus stop` do; PromQL sees the hosts by name (instance and Hostname) and a fault within seconds."""
    lab = make_lab(tmp_path)
    host = faults.Host(lab, "h100-01")
    listen = prometheus.free_port()
    process = subprocess.Popen([sys.executable, "-m", "fleetctl_lab.exporter", str(lab.host_dir("h100-01")),
                                "--listen", f"127.0.0.1:{listen}"], stdout=subprocess.DEVNULL)
    port = prometheus.free_port()
    try:
        prometheus.launch(tmp_path, port, {"h100-01": f"127.0.0.1:{listen}"})
        promql = "avg by (instance, Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)"
        series = wait_for(lambda: query(port, promql))
        assert series[0]["metric"] == {"instance": "h100-01", "Hostname": "h100-01"}
        assert float(series[0]["value"][1]) == pytest.approx(0.45, rel=0.1)
        faults.metric(host, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.5)
        wait_for(lambda: float(query(port, promql)[0]["value"][1]) < 0.3, timeout=15)
        assert prometheus.pids(tmp_path)
    finally:
        stopped = prometheus.stop(tmp_path)
        process.terminate()
        process.wait(timeout=10)
    assert stopped and prometheus.pids(tmp_path) == [] and not prometheus.ready(port)
