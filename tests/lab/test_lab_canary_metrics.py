"""The canary judged by the fleet's own metrics (issue 35): a real Prometheus (Debian's) scraping the lab hosts'
DCGM-named exporters, the soak judging the canary cohort against the hosts not changed yet over the same time.

One lab of 4 hosts (2 GPUs each), the campaigns one after the other, `--waves 1,100%`: h100-01 is the canary, the
other three its control cohort. 1. a query that does not parse: refused before any host is touched; 2. Xid 13s on
the canary during the soak (below the soak's own Xid threshold): more Xids per GPU-hour than the controls, rolled
back; 3. the canary's tensor activity 6% lower on the new driver, and the whole fleet 6% slower from its first soak
check on: rolled back, the rollback's probe excused the drift; 4. Prometheus stopped during the soak: the campaign
holds, resumed with Prometheus back it completes; 5. the whole fleet 6% slower from the next campaign's first soak
check on, a canary command running: its self-comparisons fail, its canary against the controls passes: no rollback;
6. h100-03 logs Xid 79 in three boots, each audited: the next plan leaves it out as a repeat offender (issue 44),
out of the control cohort.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from tests.helpers.lab import FROM, REPO_ROOT, TO, assert_on, events, fleetctl_lab, next_campaign, show, wait_for

pytestmark = pytest.mark.lab

HOSTS = ["h100-01", "h100-02", "h100-03", "h100-04"]
LATER = "570.124.06"  # the last campaign's target, from TO
HISTORY_S = 45  # Prometheus's history before a drift campaign, for canary.MOVED_POINTS of 5 s before its drain
DRIFT = "0.94"  # the fleet's drift: every host's workload 6% lower (issue 42)
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
        # The drift campaign: the default gate, and tensor activity tolerated at 5% (docs/baseline.md's figure), not
        # the 3% of the others. Under a fleet-wide drift CI once judged the canary 4.1% below its controls (an 8%
        # drift, a 90 s soak), past 3%, with no fault on it: a spread of the canary-against-controls verdict
        # (canary.judge_level). The estimator fixed since is the controls' movement the gate takes out
        # (canary.control_moved), which that verdict does not use; the verdict is unchanged and has not been measured
        # at 3% since, so 5% stays: a canary whose fault is only the drift must pass.
        handle.drift_baseline = str(workdir / "drift.yml")
        for path, query, tolerated in ((handle.baseline, TENSOR, "3%"), (handle.drift_baseline, TENSOR, "5%"),
                                       (handle.bad_baseline, TENSOR.replace("avg by", "avg bye"), "3%")):
            with open(path, "w") as f:
                f.write("schema_version: 1\nname: canary-metrics\ngroups:\n  all:\n"
                        "    driver: {branches: ['550', '570']}\n"
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


def upgrade(lab, to: str, soak: str, baseline: str | None = None, *args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", "upgrade", "--to", to, "-i", lab.inventory,
            "-b", baseline or lab.baseline, *PROBE, "--soak", soak, "--prometheus-url", lab.prometheus, *args]


def wave_passed(event: dict) -> bool:
    return event["event"] == "wave_passed"


def first_check(event: dict) -> bool:
    """The soak's first check is in the journal: the canary's first run and metrics are before what comes next."""
    return event["event"] == "soak_check" and event["kind"] == "check"


def during_the_soak(lab, to: str, soak: str, act, baseline: str | None = None, when=wave_passed,
                    args: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, int]:
    """A campaign to TO (with ARGS) whose canary soaks for SOAK; ACT() once its event WHEN is in the log (by default
    its wave has passed: the soak has begun)."""
    cid = next_campaign(lab)
    proc = subprocess.Popen(upgrade(lab, to, soak, baseline, *args), env=lab.env, cwd=REPO_ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lab, cid, proc, when)
        act()
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), cid


def with_history(lab) -> None:
    """The controls' movement is read from their latest points before the change: Prometheus must have scraped a
    while before it (a test run alone comes right after the lab's first scrape; in the module's order, later)."""
    time.sleep(max(0.0, HISTORY_S - (time.monotonic() - lab.scraped_since)))


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
    # the check that failed it may have come before the sixth (a check reads the audit's facts too: issue 42)
    assert judged["xid"]["verdict"] == "fail" and judged["xid"]["samples"]["control"] == 0
    assert 1 <= judged["xid"]["samples"]["canary"] <= 6, judged["xid"]["samples"]
    for host in HOSTS:
        assert_on(lab, host, FROM)


def test_a_canary_whose_tensor_activity_drops_6_percent_against_its_controls_is_rolled_back(lab):
    """While the whole fleet runs 6% slower from the soak's first check on (`lab drift 0.94`): the canary fails
    against its controls, and its rollback's probe, 6% below its probe before the change like every host's, is
    judged less the controls' movement since: rolled back (exit 4), not a failed rollback (6)."""
    with_history(lab)
    lab.inject("h100-01", "metric", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.94", "--driver", TO)
    try:
        proc, cid = during_the_soak(lab, TO, "90s", lambda: lab.fleetctl("lab", "drift", DRIFT), when=first_check)
    finally:
        lab.fleetctl("lab", "drift", "--restore")
        lab.inject("h100-01", "metric", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "1", "--driver", TO)
    assert proc.returncode not in (1, 2, 69), proc.stdout + proc.stderr
    doc = show(lab, cid)
    assert proc.returncode == 4, proc.stdout + proc.stderr + json.dumps(doc["soak"])[:3000]
    hosts = hosts_of(doc)
    print("\nh100-01:", hosts["h100-01"]["reason"])
    assert hosts["h100-01"]["state"] == "rolled_back" and "tensor_active: canary" in hosts["h100-01"]["reason"]
    assert {h: hosts[h]["state"] for h in HOSTS[1:]} == dict.fromkeys(HOSTS[1:], "not_started")
    [probe] = [s for s in hosts["h100-01"]["steps"] if s["step"] == "rollback_probe"]
    print("h100-01 rollback_probe:", probe["detail"]["reasons"][-1])
    assert probe["status"] == "ok" and probe["detail"]["less_drift"]["status"] == "pass"
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
    resumed = lab.fleetctl("campaign", "judge", str(cid), "--promote", "--reason", "Prometheus was down for its "
                           "upgrade", "--prometheus-url", lab.prometheus, timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    doc = show(lab, cid)
    assert doc["campaign"]["state"] == "done"
    judged = [e for e in events(lab, cid) if e["event"] == "judged"]
    assert [(e["decision"], e["reason"], e["answers"]) for e in judged] == [
        ("promote", "Prometheus was down for its upgrade", reason)] and judged[0]["by"].startswith("root"), judged
    for host in HOSTS:
        assert_on(lab, host, TO)


def test_a_fleet_wide_drift_during_the_soak_is_no_regression(lab):
    """Every host 6% slower from the canary's first soak check on (`lab drift 0.94`), the default gate (tensor
    activity tolerated at 5%: the lab fixture says why), a canary command running at each check (issue 42): against
    itself the canary fails its end-of-soak gate and its last run against its first; against its controls, which
    moved as much, it passes, and that decides: every host on the target, exit 0."""
    with_history(lab)
    try:
        proc, cid = during_the_soak(lab, LATER, "120s", lambda: lab.fleetctl("lab", "drift", DRIFT),
                                    lab.drift_baseline, when=first_check, args=("--canary", "nvidia-lab-bench"))
    finally:
        lab.fleetctl("lab", "drift", "--restore")
    doc = show(lab, cid)
    assert proc.returncode == 0, proc.stdout + proc.stderr + json.dumps(doc["soak"])[:3000]
    canary = doc["soak"]["hosts"]["h100-01"]
    print("\nh100-01 at the end of the soak:", canary["last"]["seen"])
    [gate] = canary["gate_verdicts"]
    assert canary["last"]["kind"] == "gate" and gate["status"] == "ok"
    assert gate["gate"]["status"] == "fail" and gate["canary_gate"]["status"] == "fail"  # the self-comparisons alone
    for key in ("gate_less_drift", "canary_gate_less_drift"):
        assert gate[key]["status"] == "pass" and gate[key]["metric"] == "tensor_active"
        assert gate[key]["moved"] == pytest.approx(-0.06, abs=0.03)
    assert sum("control cohort moved" in line for line in canary["last"]["seen"]) == 2
    assert {m["name"]: m["verdict"] for m in doc["soak"]["canary_metrics"]["metrics"]} == {"tensor_active": "pass",
                                                                                          "xid": "pass"}
    for host in HOSTS:
        assert_on(lab, host, LATER)


def test_a_host_that_logs_xid_79_three_times_across_audits_is_left_out_of_the_next_plan_and_its_control_cohort(
        lab, tmp_path):
    """Issue 44: h100-03 falls off the bus (Xid 79) in three boots, each seen by an audit (one incident each: a
    reboot clears the kernel log); by the baseline's incidents.repeat_offender (3 within 14 days) the next plan
    leaves it out, named with its evidence, and the canary's control cohort is the other hosts of later waves."""
    for _ in range(3):
        lab.inject("h100-03", "xid", "79", "--gpu", "0")
        lab.audit("-l", "h100-03")
        lab.reboot("h100-03")
    policy = tmp_path / "offenders.yml"
    policy.write_text(open(lab.baseline).read() + "    incidents:\n      repeat_offender: {count: 3, within: 14d}\n")
    proc = lab.fleetctl("plan", "--to", TO, "-i", lab.inventory, "-b", str(policy), "--waves", "1,100%",
                        "--format", "json")
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    [left] = [h for h in made["excluded"] if h["name"] == "h100-03"]
    assert (left["code"], left["reason"]) == ("repeat_offender", "repeat offender: 3 incidents in 14 days: Xid 79 x3")
    assert [[h["name"] for h in w["hosts"]] for w in made["waves"]] == [["h100-01"], ["h100-02", "h100-04"]]
    [controls] = made["canary"]["control"]["1"].values()
    assert controls == ["h100-02", "h100-04"]
    listed = lab.fleetctl("hosts", "--repeat-offenders", "-b", str(policy), "--format", "json")
    assert [h["host"] for h in json.loads(listed.stdout)["hosts"]] == ["h100-03"], listed.stderr
