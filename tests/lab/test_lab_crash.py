"""Crash suite: `kill -9` of fleetctl and everything it started, at every kind of step of two lab campaigns.

The control node "crashes": fleetctl, its ansible-playbook runs and their SSH clients all get SIGKILL, at each
point of KILLS in turn, then `campaign resume` runs until the next point. The points cover every kind of step once at
least, each a seeded random moment (FLEETCTL_CRASH_SEED, printed) after the step is written ahead: a campaign
550 -> 570 killed in planning, in each step of its canary wave (the activation while the host reboots), in wave 2's
activation and after its last record; then one to 570.124.06, whose throughput regresses, killed in the gate that
fails and in each step of the rollback. After each campaign:
- every host is on exactly one version (all driver packages at it and held, the module running it), the version
  its final state says;
- no step was done twice: one `step_finished` per host and step, no step started again after it finished, each step
  run once more for each kill that found it under way (and every step that runs a playbook was found so), at most
  one reboot per activation;
- nothing lost: the campaign's events are numbered without a gap, the JSONL log holds each of them once, and the
  whole history's hash chain verifies; `campaign resume` of the finished campaign answers with its code.
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

from tests.helpers.lab import (FAST, FROM, REPO_ROOT, ROLLBACK_STEPS, TO, UPGRADE_STEPS, assert_on, boots,
                               fleetctl_lab, hosts_of, kill_tree, show, steps_of, write_baseline)

pytestmark = pytest.mark.lab

SEED = int(os.environ.get("FLEETCTL_CRASH_SEED", "20261121"))
SLOW = "570.124.06"       # the version whose throughput regresses: its campaign rolls back
# A kill point: (event, step or None, seconds after it; None: a seeded random 0-JITTER_S). A step that runs a playbook
# takes longer than JITTER_S (ansible-playbook's start alone, a no-op play, takes ~1.8 s on an idle machine), so its
# kill lands in it (checked: PLAYBOOK_STEPS); drain and undrain (no hooks here) are over at once: their kill comes
# between steps. PLANNING: from fleetctl's start, before or just after the campaign is recorded.
JITTER_S = 1.5
PLANNING = ("planning", None, None)
UPGRADE_KILLS = [PLANNING,
                 *[("step_started", step, 5.0 if step == "activate" else None) for step in UPGRADE_STEPS],
                 ("step_started", "activate", 4.0),         # wave 2: its two hosts' reboots
                 ("last_wave_passed", None, 0.0)]           # after the last record: resume answers the campaign's code
ROLLBACK_KILLS = [("step_started", "probe_after", None),   # the gate that fails
                  *[("step_started", step, 4.0 if step == "rollback_activate" else None) for step in ROLLBACK_STEPS],
                  ("rollback_finished", None, 0.0)]
ENDS = ("last_wave_passed", "rollback_finished")  # a campaign's last records: fleetctl may exit before the kill
LAST_STEP = ("step_started", "rollback_undrain")  # no hook: over at once, and the campaign with it (as ENDS)
PLAYBOOK_STEPS = set(UPGRADE_STEPS + ROLLBACK_STEPS) - {"drain", "undrain", "rollback_drain", "rollback_undrain"}


def events(lab, cid: int) -> list[dict]:
    log = Path(lab.env["FLEETCTL_HOME"]) / "campaigns" / f"{cid}.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def kill_at(lab, args: list[str], cid: int, point: tuple, delay: float) -> int | None:
    """Run fleetctl ARGS; SIGKILL its whole process tree DELAY s after POINT's event (one logged after this start) or,
    for PLANNING, after its start. None if killed; its exit code if it ended first."""
    event, step, _ = point
    seen = len(events(lab, cid))
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=lab.env, cwd=REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    try:
        while point != PLANNING and not any(e["event"] == event and e.get("step") == step
                                            for e in events(lab, cid)[seen:]):
            assert time.monotonic() < deadline, f"campaign {cid}: no {event} {step or ''} within 600 s"
            if proc.poll() is not None:
                return proc.returncode
            time.sleep(0.05)
        return proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        return None
    finally:
        if proc.poll() is None:  # an assertion above: nothing of this run is left
            proc.kill()
        proc.wait()


def under_way(lab, cid: int) -> list[tuple[str, str]] | None:
    """(host, step) of the steps written ahead and not finished; None: the campaign is not recorded."""
    proc = lab.fleetctl("campaign", "show", str(cid), "--format", "json")
    if proc.returncode != 0:
        return None
    return [(h["name"], s["step"]) for h in json.loads(proc.stdout)["hosts"] for s in h["steps"]
            if s["status"] == "started"]


def campaign(lab, rng, args: list[str], cid: int, kills: list[tuple], points: list[str]) -> Counter:
    """Campaign CID (fleetctl ARGS starts or resumes it) killed at each of KILLS in turn, resumed after each. Returns
    how many kills found each (host, step) under way (written ahead, not finished)."""
    interrupted: Counter = Counter()
    for point in kills:
        delay = point[2] if point[2] is not None else rng.uniform(0, JITTER_S)
        while (rc := kill_at(lab, args, cid, point, delay)) == 5:  # halted (an inconclusive gate): a person accepts
            args = ["campaign", "resume", str(cid)]
        assert rc is None or point[0] in ENDS or point[:2] == LAST_STEP, \
            f"campaign {cid} ended (exit {rc}) before {point[:2]}"
        found = under_way(lab, cid)
        if found is not None:
            args = ["campaign", "resume", str(cid)]  # else killed before the campaign was recorded: start it again
            interrupted.update(found)
        points.append(f"campaign {cid} {point[1] or point[0]} +{delay:.1f}s: {sorted(found or [])}")
    return interrupted


def finish(lab, cid: int) -> int:
    """`campaign resume CID` to its end; a run that hangs fails with what the hosts and the campaign were doing."""
    try:
        return lab.fleetctl("campaign", "resume", str(cid), timeout=900).returncode
    except subprocess.TimeoutExpired as e:
        hosts_dir = Path(lab.env["FLEETCTL_LAB_DIR"]) / "hosts"
        tails = {p.parent.name: p.read_text(errors="replace").splitlines()[-15:]
                 for p in sorted(hosts_dir.glob("*/supervisor.log"))}
        pytest.fail(f"campaign resume {cid} ran past 900 s\noutput: {e.stdout!r}\ncampaign log tail: "
                    f"{[json.dumps(x) for x in events(lab, cid)[-5:]]}\nsupervisor logs: {tails}")


def check_campaign(lab, cid: int, boots_before: dict[str, int], versions: dict[str, str],
                   interrupted: Counter) -> dict:
    """The campaign's invariants; VERSIONS (host -> version it is on) follows the hosts that moved; INTERRUPTED:
    the kills that found each (host, step) under way, each of which runs it once more."""
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
        attempts = {s["step"]: s["attempts"] for s in host["steps"]}
        assert attempts == {s: 1 + interrupted[(host["name"], s)] for s in steps}, (cid, host["name"], interrupted)
    log = events(lab, cid)
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


def test_kill_9_at_every_kind_of_step_then_resume(tmp_path):
    rng = random.Random(SEED)
    print(f"\ncrash suite seed {SEED} (FLEETCTL_CRASH_SEED)")
    hosts = ["h100-01", "h100-02", "h100-03"]
    with fleetctl_lab(tmp_path, (f"3xh100-sxm/2@{FROM}",)) as lab:
        versions = dict.fromkeys(hosts, FROM)
        baseline = write_baseline(tmp_path / "b.yml", 1)
        for name in hosts:
            lab.inject(name, "throughput", "0.9", "--driver", SLOW)
        points: list[str] = []

        def upgrade(to: str) -> list[str]:
            return ["upgrade", "--to", to, "-i", lab.inventory, "-b", baseline, *FAST, "--waves", "1,100%"]

        # 1. 550 -> 570: the canary down ~5 s from its reboot (~4 s into its activation), so that the kill 5 s into
        # its activation lands while it reboots
        before = boots(lab)
        lab.inject("h100-01", "slow-reboot", "4")
        activated = UPGRADE_KILLS.index(("step_started", "activate", 5.0)) + 1
        interrupted = campaign(lab, rng, upgrade(TO), 1, UPGRADE_KILLS[:activated], points)
        lab.inject("h100-01", "slow-reboot", "0")
        interrupted += campaign(lab, rng, ["campaign", "resume", "1"], 1, UPGRADE_KILLS[activated:], points)
        assert finish(lab, 1) == 0
        doc = check_campaign(lab, 1, before, versions, interrupted)
        assert [h["state"] for h in doc["hosts"]] == ["done"] * 3
        assert all(steps_of(h) == UPGRADE_STEPS for h in doc["hosts"])
        killed_in = {step for _, step in interrupted}

        # 2. 570 -> 570.124.06, whose throughput regresses: the canary's gate fails and it rolls back
        before = boots(lab)
        interrupted = campaign(lab, rng, upgrade(SLOW), 2, ROLLBACK_KILLS, points)
        assert finish(lab, 2) == 4
        doc = check_campaign(lab, 2, before, versions, interrupted)
        canary = hosts_of(doc)["h100-01"]
        assert canary["state"] == "rolled_back" and steps_of(canary) == UPGRADE_STEPS[:-1] + ROLLBACK_STEPS
        assert [hosts_of(doc)[h]["steps"] for h in hosts[1:]] == [[], []]
        killed_in |= {step for _, step in interrupted}
        print("killed at: " + "; ".join(points))
        assert PLAYBOOK_STEPS <= killed_in, sorted(PLAYBOOK_STEPS - killed_in)
        for name in hosts:
            assert_on(lab, name, TO)
