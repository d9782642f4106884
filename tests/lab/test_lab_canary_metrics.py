"""The canary judged by the fleet's own metrics (issue 35): a real Prometheus (Debian's) scraping the lab hosts'
DCGM-named exporters, the soak judging the canary cohort against the hosts not changed yet over the same time."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest

from tests.lab.conftest import fleetctl_lab
from tests.lab.test_lab_upgrade import FROM, TO, assert_on, show

pytestmark = pytest.mark.lab

HOSTS = ["h100-01", "h100-02", "h100-03", "h100-04"]
TENSOR = 'avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"{hosts}"})'


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("canary")
    with fleetctl_lab(workdir, (f"4xh100-sxm/2@{FROM}",), prometheus=True) as handle:
        baseline = workdir / "b.yml"
        baseline.write_text("schema_version: 1\nname: canary-metrics\ngroups:\n  all:\n"
                            "    driver: {branches: ['550', '570']}\n"
                            "    canary:\n      min_samples: 4\n      metrics:\n"
                            f"        - {{name: tensor_active, query: '{TENSOR}', host_label: Hostname, good: higher, "
                            "max_change: 3%}\n")
        handle.baseline = str(baseline)
        wait_for_series(handle.env["FLEETCTL_LAB_PROMETHEUS"], len(HOSTS))
        yield handle


def wait_for_series(url: str, hosts: int, within: float = 60) -> None:
    """Until Prometheus has scraped every host's exporter (the lab's first scrapes come a few seconds after up)."""
    query = urllib.parse.quote("count(count by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE))")
    deadline = time.monotonic() + within
    while True:
        with urllib.request.urlopen(f"{url}/api/v1/query?query={query}", timeout=5) as r:
            result = json.load(r)["data"]["result"]
        if result and int(float(result[0]["value"][1])) >= hosts:
            return
        assert time.monotonic() < deadline, f"Prometheus at {url} has not scraped the {hosts} hosts in {within:g}s"
        time.sleep(1)


def test_a_canary_whose_tensor_activity_drops_6_percent_against_its_controls_is_rolled_back(lab):
    lab.inject("h100-01", "metric", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.94", "--driver", TO)
    proc = lab.fleetctl("upgrade", "--to", TO, "-i", lab.inventory, "-b", lab.baseline, "--yes", "--warmup", "0",
                        "--trial", "0.02", "--samples", "10", "--idle-timeout", "20", "--waves", "1,100%",
                        "--soak", "90s", "--soak-interval", "30", "--prometheus-url",
                        lab.env["FLEETCTL_LAB_PROMETHEUS"], timeout=900)
    assert proc.returncode not in (1, 2, 69), proc.stdout + proc.stderr
    doc = show(lab)
    assert proc.returncode == 4, proc.stdout + proc.stderr + json.dumps(doc["soak"])[:3000]
    hosts = {h["name"]: h for h in doc["hosts"]}
    print("\nh100-01:", hosts["h100-01"]["reason"])
    assert hosts["h100-01"]["state"] == "rolled_back" and "tensor_active: canary" in hosts["h100-01"]["reason"]
    assert {h: hosts[h]["state"] for h in HOSTS[1:]} == dict.fromkeys(HOSTS[1:], "not_started")
    for host in HOSTS:
        assert_on(lab, host, FROM)
