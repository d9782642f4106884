"""The Prometheus client (orchestrator/judge/promql.py) against a real Prometheus (Debian's /usr/bin/prometheus) on a
free port of 127.0.0.1 with a storage directory of its own, scraping an exporter served here with prometheus_client:
dcgm-exporter's metric names and labels for three hosts, two GPUs each. Both are stopped at the end of the module,
whatever happened."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from orchestrator.judge import promql
from orchestrator.errors import InputError
from orchestrator.fleet.inventory import Host
from tests.helpers.cli import fleetctl, runs

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
TENSOR = 'avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"{hosts}"})'
# Hostname -> tensor activity; gpu-01xlab is what an unescaped `gpu-01.lab` would match too
LEVELS = {"gpu-01.lab": 0.45, "gpu-01xlab": 0.40, "node-7": 0.30, "localhost": 0.5}  # localhost: fleetctl plan's
SCRAPES = urllib.parse.quote("min(count_over_time(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE[1m])) >= 2")  # every series twice
FLEET = [Host("gpu-01.lab", ("all",)), Host("gpu-01xlab", ("all",)),
         Host("gpu-02", ("all",), {promql.NAME_VAR: "node-7"})]  # its exporter calls it node-7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """The server's URL, once it has scraped every host twice."""
    if not shutil.which(PROMETHEUS):
        pytest.skip(f"{PROMETHEUS} not found: install Debian's prometheus (scripts/setup --test)")
    tmp = tmp_path_factory.mktemp("prometheus")
    registry = CollectorRegistry()
    tensor = Gauge("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.",
                   ["gpu", "UUID", "Hostname", "modelName"], registry=registry)
    for host, level in LEVELS.items():
        for gpu in ("0", "1"):
            tensor.labels(gpu, f"GPU-{host}-{gpu}", host, "NVIDIA H100 80GB HBM3").set(level)
    exporter, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n  - job_name: dcgm\n"
                      f"    static_configs: [{{targets: ['127.0.0.1:{exporter.server_address[1]}']}}]\n")
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/api/v1/query?query={SCRAPES}", timeout=2) as r:
                    if json.load(r)["data"]["result"]:
                        break
            except OSError:
                pass
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        exporter.shutdown()
        exporter.server_close()


def test_a_query_that_does_not_parse_is_refused_in_one_line(prometheus):
    client = promql.Client(prometheus, {}, 5)
    client.check(promql.render(TENSOR, FLEET))  # a good one passes
    with pytest.raises(InputError) as e:
        client.check('avg by (Hostname (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"gpu-01"})')
    assert str(e.value).startswith("not a valid query: 1:") and "parse error" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="not a valid query: .*range vector"):  # parses, but no range of it
        client.check("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE[5m]")


def test_a_range_is_each_hosts_series_and_only_the_cohorts(prometheus):
    client = promql.Client(prometheus, {}, 5)
    end = time.time()
    cohort = [FLEET[0], FLEET[2]]  # gpu-01.lab, gpu-02 (node-7 to its exporter)
    series = client.range(promql.render(TENSOR, cohort), end - 30, end, 1, host_label="Hostname")
    assert set(series) == {"gpu-01.lab", "node-7"}  # the dot matched a dot: gpu-01xlab left out
    assert promql.by_host(series, cohort).keys() == {"gpu-01.lab", "gpu-02"}
    for host, points in series.items():
        assert len(points) >= 2 and {v for _, v in points} == {LEVELS[host]}
        assert all(end - 31 <= t <= end + 1 for t, _ in points) and points == sorted(points)


def test_a_query_not_aggregated_by_host_is_refused(prometheus):
    client = promql.Client(prometheus, {}, 5)
    end = time.time()
    with pytest.raises(promql.PrometheusError, match=r"several series for Hostname='gpu-01\.lab': aggregate the "
                                                     r"query by \(Hostname\)$"):
        client.range('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname="gpu-01.lab"}', end - 10, end, 1,
                     host_label="Hostname")


def canary_baseline(path, query: str) -> str:
    path.write_text("schema_version: 1\nname: canary\ngroups:\n  all:\n    canary:\n      metrics:\n"
                    f"        - {{name: tensor_active, query: '{query}', host_label: Hostname, good: higher, "
                    "max_change: 5%}\n")
    return str(path)


def test_plan_checks_the_canary_metrics_and_refuses_a_query_that_does_not_parse_before_touching_a_host(
        prometheus, tmp_path):
    home = tmp_path / "home"
    good = canary_baseline(tmp_path / "good.yml", TENSOR)
    proc = fleetctl("plan", "--to", "570.86.15", "-b", good, "--prometheus-url", prometheus, "--format", "json",
                    home=home)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["canary"]["metrics"] == [{"group": "ungrouped", "metric": "tensor_active", "kind": "level",
                                            "good": "higher", "max_change": 0.05, "checked": True,
                                            "without_series": []}]
    assert report["canary"]["judged_by_soak"] is True
    text = fleetctl("plan", "--to", "570.86.15", "-b", good, "--prometheus-url", prometheus, home=home).stdout
    assert "canary metrics, judged by the soak against the control cohort: tensor_active (group ungrouped, level, " \
           "higher is good, 5% tolerated): series for every host" in text
    recorded = len(runs(home))
    broken = canary_baseline(tmp_path / "broken.yml", TENSOR.replace(")", "", 1))
    proc = fleetctl("plan", "--to", "570.86.15", "-b", broken, "--prometheus-url", prometheus, home=home)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.count("\n") == 1 and "baseline canary metric tensor_active (group ungrouped): " in proc.stderr
    assert len(runs(home)) == recorded  # refused before anything ran or was recorded
    nothing = canary_baseline(tmp_path / "nothing.yml", TENSOR.replace("TENSOR", "TENSORS"))
    proc = fleetctl("plan", "--to", "570.86.15", "-b", nothing, "--prometheus-url", prometheus, home=home)
    assert proc.returncode == 2 and "no series for any of its 1 hosts" in proc.stderr, proc.stderr
