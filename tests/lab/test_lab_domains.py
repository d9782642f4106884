"""Rack-scale NVLink domains on a lab of GB200 trays (issue 34): the domain, not the host, is the unit of change.

One lab for the file: racks A and B of three trays on 570.86.15 and rack C of two trays whose drivers differ (a mixed
domain, the audit's case), two GPUs a tray to keep it lean. Each tray runs the lab's IMEX daemon, talking to its
rack's other trays over the lab network; campaigns are limited to racks A and B. The tests run in file order: the
plan with a tray cut off, the canary domain that fails after its reboot and goes back whole, the canary domain whose
IMEX degrades during its soak and goes back whole, then the campaign that moves both racks across a kill -9 in the
canary domain's activation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.lab import REPO_ROOT, assert_on, fleetctl_lab, kill_tree, show, wait_for

pytestmark = pytest.mark.lab

FROM, TO = "570.86.15", "580.95.05"
RACK_A, RACK_B, RACK_C = ["gb200-01", "gb200-02", "gb200-03"], ["gb200-04", "gb200-05", "gb200-06"], \
    ["gb200-07", "gb200-08"]
RACKS = ",".join(RACK_A + RACK_B)
FAST = ("--yes", "--soak", "0", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--idle-timeout", "20",
        "--waves", "1,100%", "--limit", RACKS)
IMEX_CONTROLS = ("imex.service", "imex.version", "imex.domain", "nvlink.domain_uniform")


@pytest.fixture(scope="module")
def racks(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("racks")
    with fleetctl_lab(workdir, (f"3xgb200-nvl/2@{FROM}+domain=rack-a", f"3xgb200-nvl/2@{FROM}+domain=rack-b",
                                f"1xgb200-nvl/2@{FROM}+domain=rack-c", f"1xgb200-nvl/2@{TO}+domain=rack-c")) as lab:
        baseline = workdir / "b.yml"
        baseline.write_text("schema_version: 1\nname: racks\ngroups:\n  all:\n"
                            "    driver: {branches: ['570', '580'], held: true}\n"
                            "    campaign: {budget_hosts: 1, budget_percent: 10, fabric_wait_s: 20}\n")
        lab.baseline = str(baseline)
        yield lab


def findings(report: dict, host: str) -> dict[str, tuple[str, str]]:
    entry = next(h for h in report["hosts"] if h["name"] == host)
    return {f["control"]: (f["status"], f["message"]) for f in entry["findings"]}


def test_a_mixed_domain_fails_uniformity_and_imex_naming_the_odd_tray_and_hgx_controls_stay_quiet(racks):
    rc, report = racks.audit("-l", ",".join(RACK_A + RACK_C))
    assert rc == 1
    odd = findings(report, "gb200-08")                                   # rack C's tray on 580.95.05
    status, message = findings(report, "gb200-07")["nvlink.domain_uniform"]
    assert status == "fail" and "gb200-08 runs 580.95.05" in message, message
    assert odd["nvlink.domain_uniform"][0] == "fail"
    status, message = findings(report, "gb200-07")["imex.domain"]
    assert status == "fail" and "(gb200-08)" in message, message        # its IMEX does not join 570's
    for host in RACK_A:                                                  # a healthy rack passes them all
        got = findings(report, host)
        assert {c: got[c][0] for c in IMEX_CONTROLS} == dict.fromkeys(IMEX_CONTROLS, "pass"), (host, got)


def test_a_domain_with_one_unreachable_tray_is_left_out_whole_naming_it(racks):
    racks.inject("gb200-05", "unreachable")
    try:
        proc = racks.fleetctl("plan", "--to", TO, "-i", racks.inventory, "-b", racks.baseline, "--waves", "1,100%",
                              "-l", RACKS, "--format", "json")
    finally:
        racks.inject("gb200-05", "unreachable", "--restore")
    assert proc.returncode == 3, proc.stderr                             # a host unreachable
    plan = json.loads(proc.stdout)
    assert [[h["name"] for h in w["hosts"]] for w in plan["waves"]] == [RACK_A]
    assert plan["waves"][0]["budget"]["unit"] == "domain"
    left = {h["name"]: (h["code"], h["reason"]) for h in plan["excluded"]}
    assert left["gb200-05"][0] == "unreachable"
    for tray in ("gb200-04", "gb200-06"):
        code, reason = left[tray]
        assert code == "domain_left_out" and "left out whole: gb200-05: unreachable" in reason, reason


def batches(lab, cid: int) -> list[tuple[str, tuple[str, ...]]]:
    log = os.path.join(lab.env["FLEETCTL_HOME"], "campaigns", f"{cid}.jsonl")
    with open(log) as f:
        return [(e["step"], tuple(sorted(e["batch"]))) for e in map(json.loads, f) if e["event"] == "batch_finished"]


def test_a_tray_whose_imex_does_not_come_up_after_the_reboot_rolls_its_whole_domain_back(racks):
    racks.inject("gb200-02", "imex-down", "--next-boot")  # for that one boot: the rollback's comes up
    proc = racks.fleetctl("upgrade", "--to", TO, "-i", racks.inventory, "-b", racks.baseline, *FAST, timeout=900)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    doc = show(racks, 1)
    states = {h["name"]: h["state"] for h in doc["hosts"]}
    assert {h: states[h] for h in RACK_A} == dict.fromkeys(RACK_A, "rolled_back")
    assert {h: states[h] for h in RACK_B} == dict.fromkeys(RACK_B, "not_started")  # never touched
    # the domains as the GPUs report them (the lab declares none): "<cluster UUID>/<clique id>", one per rack
    domain = {h["name"]: h["domain"] for h in doc["hosts"]}
    assert len({domain[h] for h in RACK_A}) == len({domain[h] for h in RACK_B}) == 1
    assert domain["gb200-01"] != domain["gb200-04"] and domain["gb200-01"].endswith("/32766")
    reasons = {h["name"]: h["reason"] for h in doc["hosts"]}
    assert "imex" in reasons["gb200-02"].lower(), reasons
    # the domain was never mixed: every step of rack A, forward and back, ran for its three trays at once
    for step, batch in batches(racks, 1):
        assert set(batch) & set(RACK_A) in (set(), set(RACK_A)), (step, batch)
    for host in RACK_A + RACK_B:
        assert_on(racks, host, FROM)
    _, report = racks.audit("-l", RACKS)
    assert all(findings(report, h)["nvlink.domain_uniform"][0] == "pass" for h in RACK_A + RACK_B)


def test_an_imex_domain_degraded_during_the_canary_racks_soak_rolls_it_back_and_spares_the_other(racks):
    """After the canary rack's first soak check, one tray loses a peer from its IMEX node list: no Xid, no GPU lost,
    but imex.domain, which passed at the pre-check, fails on the rack's trays. The soak judges the controls as the
    verify does: the rack goes back whole (the node list restored meanwhile, so its rollback can re-form it), and
    rack B is never touched."""
    cid = next_campaign(racks)
    args = ["upgrade", "--to", TO, "-i", racks.inventory, "-b", racks.baseline, *FAST]
    args[args.index("--soak") + 1] = "60s"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args, "--soak-interval", "3"], env=racks.env,
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True)
    try:
        wait_for(racks, cid, proc, lambda e: e["event"] == "soak_check" and e["gap"] == 1, within=600)
        racks.inject("gb200-02", "imex-node-missing", "gb200-03")
        try:
            wait_for(racks, cid, proc, lambda e: e["event"] == "soak_check_failed", within=120)
        finally:
            racks.inject("gb200-02", "imex-node-missing", "--restore")
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 4, out
    doc = show(racks, cid)
    states = {h["name"]: h["state"] for h in doc["hosts"]}
    assert {h: states[h] for h in RACK_A} == dict.fromkeys(RACK_A, "rolled_back"), states
    assert {h: states[h] for h in RACK_B} == dict.fromkeys(RACK_B, "not_started")
    assert "imex.domain: IMEX domain DEGRADED" in doc["campaign"]["reason"], doc["campaign"]["reason"]
    for host in RACK_A:
        assert_on(racks, host, FROM)


def next_campaign(lab) -> int:
    """The id the next campaign will get (each test can run alone)."""
    return len(list((Path(lab.env["FLEETCTL_HOME"]) / "campaigns").glob("*.jsonl"))) + 1


def test_both_domains_move_whole_across_a_kill_9_in_the_canary_domains_activation(racks):
    cid = next_campaign(racks)
    args = ["upgrade", "--to", TO, "-i", racks.inventory, "-b", racks.baseline, *FAST]
    log = os.path.join(racks.env["FLEETCTL_HOME"], "campaigns", f"{cid}.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=racks.env, cwd=REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(log) and '"step": "activate"' in open(log).read():
                time.sleep(1.5)  # inside the activation: the trays are rebooting
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the campaign ended before its activation"
    finally:
        kill_tree(proc.pid)  # fleetctl, its ansible-playbook and their ssh clients, as the crash suite kills them
        proc.wait()
    resumed = racks.fleetctl("campaign", "resume", str(cid), timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    doc = show(racks, cid)
    assert [[h["name"] for h in w["hosts"]] for w in doc["plan"]["waves"]] == [RACK_A, RACK_B]
    assert {h["name"]: h["state"] for h in doc["hosts"]} == dict.fromkeys(RACK_A + RACK_B, "done")
    started = Counter(e["host"] for e in map(json.loads, open(log)) if e["event"] == "step_finished"
                      and e["step"] == "activate")
    assert set(started.values()) == {1}, started  # each tray's activation finished once, across the kill
    for host in RACK_A + RACK_B:
        assert_on(racks, host, TO)
    rc, report = racks.audit("-l", RACKS)
    for host in RACK_A + RACK_B:
        got = findings(report, host)
        assert {c: got[c][0] for c in IMEX_CONTROLS} == dict.fromkeys(IMEX_CONTROLS, "pass"), (host, got)
