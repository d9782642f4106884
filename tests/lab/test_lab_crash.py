"""Crash suite: `kill -9` of fleetctl and everything it started, at 20 random points of lab campaigns.

A seeded random delay (FLEETCTL_CRASH_SEED, printed) after each start or `campaign resume`, the control node
"crashes": fleetctl, its ansible-playbook runs and their SSH clients all get SIGKILL. Then `campaign resume`, under
the same regime, until the campaign ends. Campaigns alternate 550 -> 570 -> 550 ..., one of them with a throughput
regression so that kills also land inside rollbacks. After every campaign:
- every host is on exactly one version (all driver packages at it and held, the module running it), the version
  its final state says;
- no step was done twice: one `step_finished` per host and step, no step started again after it finished, at most
  one reboot per activation;
- nothing lost: the campaign's events are numbered without a gap, the JSONL log holds each of them once, and the
  whole history's hash chain verifies.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.lab.conftest import REPO_ROOT, fleetctl_lab
from tests.lab.test_lab_upgrade import FAST, FROM, TO, assert_on, descendants, show, write_baseline

pytestmark = pytest.mark.lab

KILLS = 20
SEED = int(os.environ.get("FLEETCTL_CRASH_SEED", "20261121"))
# A campaign of 3 hosts in 2 waves runs ~40 s on an idle machine since a lab reboot is seen at Ansible's second look
# (45-55 s before, ~80 s in an earlier lab). Each resume goes on where the kill stopped it, so delays up to 30 s
# walk through a whole campaign in 2-4 kills (every kind of step, the rollback's too, and a resumed activation, its
# reboot a few seconds, gets its share), and 20 kills take ~7 campaigns; the cap leaves room for slower machines.
DELAY_S = (2.0, 30.0)
MAX_CAMPAIGNS = 20
SLOW = "570.124.06"       # the version whose throughput regresses: its campaign rolls back


def run_until_killed(lab, args: list[str], delay: float) -> int | None:
    """Start fleetctl ARGS; SIGKILL its whole process tree after DELAY s. None if killed, else its exit code."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=lab.env, cwd=REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        pass
    for _ in range(3):  # children forked while we walk the tree are caught by the next pass
        for pid in reversed(descendants(proc.pid)):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    proc.wait()
    return None


def step_in_progress(lab, cid: int) -> str:
    """The step the campaign's log last saw start (where a kill landed), for the test's report."""
    log = Path(lab.env["FLEETCTL_HOME"]) / "campaigns" / f"{cid}.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    started = [json.loads(line)["step"] for line in lines if '"step_started"' in line]
    return started[-1] if started else "planning"


def finish(lab, args: list[str], cid: int) -> int:
    """Run fleetctl ARGS to its end; a run that hangs fails with what the hosts and the campaign were doing."""
    try:
        return lab.fleetctl(*args, timeout=900).returncode
    except subprocess.TimeoutExpired as e:
        home, hosts_dir = Path(lab.env["FLEETCTL_HOME"]), Path(lab.env["FLEETCTL_LAB_DIR"]) / "hosts"
        log = home / "campaigns" / f"{cid}.jsonl"
        tails = {p.parent.name: p.read_text(errors="replace").splitlines()[-15:]
                 for p in sorted(hosts_dir.glob("*/supervisor.log"))}
        pytest.fail(f"{' '.join(args)} ran past 900 s\noutput: {e.stdout!r}\ncampaign log tail: "
                    f"{log.read_text().splitlines()[-5:] if log.exists() else None}\nsupervisor logs: {tails}")


def boots(lab) -> dict[str, int]:
    rows = json.loads(lab.fleetctl("lab", "status", "--format", "json").stdout)
    return {r["name"]: r["boots"] for r in rows}


def check_campaign(lab, cid: int, boots_before: dict[str, int], versions: dict[str, str]) -> dict:
    """The campaign's invariants; VERSIONS (host -> version it is on) follows the hosts that moved."""
    doc = show(lab, cid)
    assert doc["campaign"]["state"] in ("done", "rolled_back"), doc["campaign"]
    target = doc["campaign"]["target"]
    for host in doc["hosts"]:
        assert host["state"] in ("done", "rolled_back", "not_started"), host
        if host["state"] == "done":
            versions[host["name"]] = target
        assert_on(lab, host["name"], versions[host["name"]])
        steps = [s["step"] for s in host["steps"]]
        assert len(steps) == len(set(steps)), (host["name"], steps)        # one history row per step
        failed = [s for s in host["steps"] if s["status"] != "ok"]
        # a kill fails nothing: the one failed step allowed is the gate that rolled the slow driver back
        allowed = [("probe_after", "fail")] if host["state"] == "rolled_back" and target == SLOW else []
        assert [(s["step"], s["status"]) for s in failed] == allowed, (cid, host["name"], host["reason"], failed)
    log_lines = (Path(lab.env["FLEETCTL_HOME"]) / "campaigns" / f"{cid}.jsonl").read_text().splitlines()
    log = [json.loads(line) for line in log_lines]
    assert [e["seq"] for e in log] == list(range(1, doc["events"] + 1))      # no gap, no duplicate
    finished = Counter((e["host"], e["step"]) for e in log if e["event"] == "step_finished")
    assert set(finished.values()) == {1}, [k for k, n in finished.items() if n > 1]
    done_at: dict[tuple[str, str], int] = {}
    for e in log:
        key = (e.get("host"), e.get("step"))
        if e["event"] == "step_finished":
            done_at[key] = e["seq"]
        elif e["event"] == "step_started":
            assert key not in done_at, f"{key} started again after it finished (event {done_at[key]})"
    activations = Counter(e["host"] for e in log if e["event"] == "step_finished"
                          and e["step"] in ("activate", "rollback_activate"))
    after = boots(lab)
    for name in versions:
        assert after[name] - boots_before[name] <= activations[name], (name, boots_before, after, activations)
    verify = lab.fleetctl("report", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    return doc


def test_kill_9_at_20_random_points_then_resume(tmp_path):
    rng = random.Random(SEED)
    print(f"\ncrash suite seed {SEED} (FLEETCTL_CRASH_SEED)")
    hosts = ["h100-01", "h100-02", "h100-03"]
    with fleetctl_lab(tmp_path, (f"3xh100-sxm/2@{FROM}",)) as lab:
        versions = dict.fromkeys(hosts, FROM)
        baseline = write_baseline(tmp_path / "b.yml", 1)
        for name in hosts:
            lab.inject(name, "throughput", "0.9", "--driver", SLOW)
        kills, cid, points = 0, 0, []
        while kills < KILLS:
            cid += 1
            assert cid <= MAX_CAMPAIGNS, f"only {kills} kills in {MAX_CAMPAIGNS} campaigns"
            on = versions[hosts[0]]
            target = SLOW if cid == 3 else (TO if on == FROM else FROM)
            before = boots(lab)
            args = ["upgrade", "--to", target, "-i", lab.inventory, "-b", baseline, *FAST, "--waves", "1,100%"]
            resume = ["campaign", "resume", str(cid)]
            while True:
                delay = rng.uniform(*DELAY_S)
                rc = run_until_killed(lab, args, delay) if kills < KILLS else finish(lab, args, cid)
                if rc == 5:        # halted for a person (an inconclusive gate): resuming is the person accepting
                    args = resume
                    continue
                if rc is not None:
                    break
                kills += 1
                points.append(f"campaign {cid} +{delay:.1f}s ({step_in_progress(lab, cid)})")
                if lab.fleetctl("campaign", "show", str(cid)).returncode == 0:
                    args = resume  # else killed before the campaign was recorded: start it again
            doc = check_campaign(lab, cid, before, versions)
            expected = 4 if target == SLOW else 0
            assert rc == expected, (cid, target, rc, doc["campaign"])
        print("killed at: " + "; ".join(points))
