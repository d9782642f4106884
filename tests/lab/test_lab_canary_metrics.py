"""The canary judged by the fleet's own metrics (issue 35): a real Prometheus (Debian's) scraping the lab hosts'
DCGM-named exporters, the soak judging the canary cohort against the hosts not changed yet over the same time.

One lab of 4 hosts (2 GPUs each), the campaigns one after the other, `--waves 1,100%`: h100-01 is the canary, the
other three its control cohort. 1. a query that does not parse: refused before any host is touched; 2. the canary's
tensor activity 6% lower on the new driver: rolled back; 3. Xid 13s on the canary during the soak (below the soak's
own Xid threshold): more Xids per GPU-hour than the controls, rolled back; 4. Prometheus stopped during the soak: the
campaign holds, resumed with Prometheus back it completes; 5. the whole fleet 8% slower during the next campaign's
soak: its self-comparison fails, its canary against the controls passes: no rollback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from tests.lab.conftest import REPO_ROOT, fleetctl_lab
from tests.lab.test_lab_soak import next_campaign, wait_for
from tests.lab.test_lab_upgrade import FROM, TO, assert_on, show

pytestmark = pytest.mark.lab

HOSTS = ["h100-01", "h100-02", "h100-03", "h100-04"]
LATER = "570.124.06"  # the last campaign's target, from TO
HISTORY_S = 45  # Prometheus's history before the drift campaign, for canary.MOVED_POINTS of 5 s before its drain
TENSOR = 'avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"{hosts}"})'
XIDS = ('sum by (Hostname) (DCGM_EXP_XID_ERRORS_TOTAL{Hostname=~"{hosts}"}) '
        'or sum by (Hostname) (0 * DCGM_FI_DEV_GPU_UTIL{Hostname=~"{hosts}"})')  # docs/lab.md: a count from 0
PROBE = ("--yes", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--idle-timeout", "20", "--waves", "1,100%",
         "--soak-interval", "30")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("canary")
    with fleetctl_lab(workdir, (f"4xh100-sxm/2@{FROM}",), prometheus=True) as handle:
        handle.baseline = str(workdir / "b.yml")
        handle.bad_baseline = str(workdir / "bad.yml")
        # The drift campaign: the docs' 5% tolerance of a metric, and a gate that tolerates 4.5% (its floor stays at
        # 0.95x: the 8% drift fails the self-comparison): the control's movement is estimated within a few percent,
        # the gate's default limit is 2-3%.
        drift_gate = "    gate: {max_drop: {%s}}\n" % ", ".join(f"{m}: 0.045" for m in (
            "gemm_tflops", "bandwidth_gbs", "allreduce_busbw_gbs", "p2p_gbs", "h2d_gbs", "d2h_gbs"))
        handle.drift_baseline = str(workdir / "drift.yml")
        for path, query, tolerated, gate in ((handle.baseline, TENSOR, "3%", ""),
                                             (handle.drift_baseline, TENSOR, "5%", drift_gate),
                                             (handle.bad_baseline, TENSOR.replace("avg by", "avg bye"), "3%", "")):
            with open(path, "w") as f:
                f.write("schema_version: 1\nname: canary-metrics\ngroups:\n  all:\n"
                        "    driver: {branches: ['550', '570']}\n" + gate +
                        "    canary:\n      min_samples: 4\n      metrics:\n"
                        f"        - {{name: tensor_active, query: '{query}', host_label: Hostname, good: higher, "
                        f"max_change: {tolerated}}}\n"
                        f"        - {{name: xid, query: '{XIDS}', host_label: Hostname, good: lower, "
                        "max_change: 50%, kind: rate}\n")
        handle.prometheus = handle.env["FLEETCTL_LAB_PROMETHEUS"]
        wait_for_series(handle.prometheus, len(HOSTS))
        handle.scraped_since = time.monotonic()
        yield handle


def wait_for_series(url: str, hosts: int, within: float = 60) -> None:
    """Until Prometheus has scraped every host's exporter (the lab's first scrapes come a few seconds after up)."""
    query = urllib.parse.quote("count(count by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE))")
    deadline = time.monotonic() + within
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/query?query={query}", timeout=5) as r:
                result = json.load(r)["data"]["result"]
        except OSError:
            result = []
        if result and int(float(result[0]["value"][1])) >= hosts:
            return
        assert time.monotonic() < deadline, f"Prometheus at {url} has not scraped the {hosts} hosts in {within:g}s"
        time.sleep(1)


def upgrade(lab, to: str, soak: str, baseline: str | None = None) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", "upgrade", "--to", to, "-i", lab.inventory,
            "-b", baseline or lab.baseline, *PROBE, "--soak", soak, "--prometheus-url", lab.prometheus]


def during_the_soak(lab, to: str, soak: str, act, baseline: str | None = None) -> tuple[subprocess.CompletedProcess,
                                                                                         int]:
    """A campaign to TO whose canary soaks for SOAK; ACT() once its wave has passed (the soak has begun)."""
    cid = next_campaign(lab)
    proc = subprocess.Popen(upgrade(lab, to, soak, baseline), env=lab.env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lab, cid, proc, lambda e: e["event"] == "wave_passed")
        act()
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), cid


def hosts_of(doc: dict) -> dict[str, dict]:
    return {h["name"]: h for h in doc["hosts"]}


def test_a_query_that_does_not_parse_is_refused_before_any_host_is_touched(lab):
    cid = next_campaign(lab)
    proc = lab.fleetctl(*upgrade(lab, TO, "90s", lab.bad_baseline)[3:])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("fleetctl: error: baseline canary metric tensor_active (group h100_sxm): not a valid "
                           "query: ") and "parse error" in line
    assert next_campaign(lab) == cid  # no campaign was created


def test_a_canary_whose_tensor_activity_drops_6_percent_against_its_controls_is_rolled_back(lab):
    lab.inject("h100-01", "metric", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.94", "--driver", TO)
    proc = lab.fleetctl(*upgrade(lab, TO, "90s")[3:], timeout=900)
    lab.inject("h100-01", "metric", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "1", "--driver", TO)
    assert proc.returncode not in (1, 2, 69), proc.stdout + proc.stderr
    doc = show(lab, next_campaign(lab) - 1)
    assert proc.returncode == 4, proc.stdout + proc.stderr + json.dumps(doc["soak"])[:3000]
    hosts = hosts_of(doc)
    print("\nh100-01:", hosts["h100-01"]["reason"])
    assert hosts["h100-01"]["state"] == "rolled_back" and "tensor_active: canary" in hosts["h100-01"]["reason"]
    assert {h: hosts[h]["state"] for h in HOSTS[1:]} == dict.fromkeys(HOSTS[1:], "not_started")
    for host in HOSTS:
        assert_on(lab, host, FROM)


def test_more_xids_per_gpu_hour_on_the_canary_than_its_controls_roll_it_back(lab):
    """Xid 13 (a graphics engine exception, medium: the soak's own health check only notes it) six times on the
    canary's GPUs during the soak, none on the controls: the Xid rate fails it."""
    def xids():
        for i in range(6):
            lab.inject("h100-01", "xid", "13", "--gpu", str(i % 2))
    proc, cid = during_the_soak(lab, TO, "90s", xids)
    doc = show(lab, cid)
    assert proc.returncode == 4, proc.stdout + proc.stderr + json.dumps(doc["soak"])[:3000]
    reason = hosts_of(doc)["h100-01"]["reason"]
    print("\nh100-01:", reason)
    assert hosts_of(doc)["h100-01"]["state"] == "rolled_back" and "xid: canary" in reason and "per GPU-hour" in reason
    judged = {m["name"]: m for m in doc["soak"]["canary_metrics"]["metrics"]}
    assert judged["xid"]["verdict"] == "fail" and judged["xid"]["samples"] == {"canary": 6, "control": 0}
    for host in HOSTS:
        assert_on(lab, host, FROM)


def test_prometheus_stopped_during_the_soak_holds_the_campaign_and_resumed_it_completes(lab):
    def outage():
        assert lab.fleetctl("lab", "prometheus", "stop").returncode == 0
    try:
        proc, cid = during_the_soak(lab, TO, "60s", outage)
    finally:
        started = lab.fleetctl("lab", "prometheus", "start")
    assert started.returncode == 0, started.stderr
    assert proc.returncode == 5, proc.stdout + proc.stderr
    doc = show(lab, cid)
    reason = doc["campaign"]["reason"]
    print("\nheld:", reason)
    assert doc["campaign"]["state"] == "halted" and "canary metric not judged at the end of the soak" in reason
    assert "Prometheus" in reason and lab.prometheus.split("//")[1] in reason and "canary.on_missing: hold" in reason
    assert_on(lab, "h100-01", TO) and assert_on(lab, "h100-02", FROM)
    wait_for_series(lab.prometheus, len(HOSTS))
    resumed = lab.fleetctl("campaign", "resume", str(cid), "--prometheus-url", lab.prometheus, timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert show(lab, cid)["campaign"]["state"] == "done"
    for host in HOSTS:
        assert_on(lab, host, TO)


def test_a_fleet_wide_drift_during_the_soak_is_no_regression(lab):
    """Every host 8% slower once the canary soaks (`lab drift 0.92`): against itself the canary fails its
    end-of-soak gate; against its controls, which moved as much, it passes, and that decides: exit 0."""
    # The controls' movement is read from their latest points before the change: Prometheus must have scraped a
    # while before it (this test run alone comes right after the lab's first scrape).
    time.sleep(max(0.0, HISTORY_S - (time.monotonic() - lab.scraped_since)))
    try:
        proc, cid = during_the_soak(lab, LATER, "120s", lambda: lab.fleetctl("lab", "drift", "0.92"),
                                    lab.drift_baseline)
    finally:
        lab.fleetctl("lab", "drift", "--restore")
    doc = show(lab, cid)
    assert proc.returncode == 0, proc.stdout + proc.stderr + json.dumps(doc["soak"])[:3000]
    canary = doc["soak"]["hosts"]["h100-01"]
    print("\nh100-01 at the end of the soak:", canary["last"]["seen"])
    [gate] = canary["gate_verdicts"]
    assert canary["last"]["kind"] == "gate" and gate["status"] == "ok"
    assert gate["gate"]["status"] == "fail"  # the self-comparison alone
    assert gate["gate_less_drift"]["status"] == "pass" and gate["gate_less_drift"]["metric"] == "tensor_active"
    assert gate["gate_less_drift"]["moved"] == pytest.approx(-0.08, abs=0.03)
    assert any("control cohort moved" in line for line in canary["last"]["seen"])
    assert {m["name"]: m["verdict"] for m in doc["soak"]["canary_metrics"]["metrics"]} == {"tensor_active": "pass",
                                                                                          "xid": "pass"}
    for host in HOSTS:
        assert_on(lab, host, LATER)
