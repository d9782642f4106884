"""The watched soak (issue 20), end to end through the CLI on one shared lab of 8 hosts (550.163.01, 2 GPUs each).

The three campaigns use disjoint hosts or run one after the other, each with short soaks (seconds) and short
probes: 1 and 4, one campaign (the `sigtermed` fixture): SIGTERM mid-activation and `campaign resume`, then a clean
soak with a passing canary command; 2. fleetctl killed during the canary's soak, an Xid logged while it is down,
`campaign resume`; 3. three waves where, during the second soak, one host's GPU falls off the bus, one host's canary
command starts failing and one host's throughput drops.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.cli import tagged
from tests.helpers.lab import (FROM, REPO_ROOT, TO, assert_on, events, fleetctl_lab, hosts_of, next_campaign, show,
                               wait_for)

pytestmark = pytest.mark.lab

PROBE = ("--yes", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--idle-timeout", "20")
FAIL_FLAG = "/run/fleetctl-canary-fail"
CANARY = f"sh -c 'test ! -e {FAIL_FLAG} && exec nvidia-lab-bench'"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("soak")
    with fleetctl_lab(workdir, (f"8xh100-sxm/2@{FROM}",)) as handle:
        handle.baseline = str(workdir / "b.yml")
        Path(handle.baseline).write_text(
            "schema_version: 1\nname: lab-soak\ngroups:\n  all:\n"
            "    driver: {branches: ['550', '570'], held: true}\n"
            "    campaign: {budget_hosts: 4, budget_percent: 10, fabric_wait_s: 15}\n")
        yield handle


def upgrade(lab, to: str, hosts: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", "upgrade", "--to", to, "-i", lab.inventory, "-l", hosts,
            "-b", lab.baseline, *PROBE, *args]


def soak_records(doc: dict, host: str) -> dict:
    return doc["soak"]["hosts"][host]


@pytest.fixture(scope="module")
def sigtermed(lab):
    """One campaign for tests 1 and 4: h100-01 | h100-02 to the other version with a 20 s soak checked every 2 s and
    the canary command; SIGTERM 1 s into the canary's activation playbook (systemd stopping a window's service,
    issue 21), what is left then, and `campaign resume` to its end."""
    started, cid = time.monotonic(), next_campaign(lab)
    was = lab.facts("h100-01")["driver"]["module_version"]
    to = TO if was == FROM else FROM
    tag = f"soak-sigterm-{os.getpid()}"
    proc = subprocess.Popen(upgrade(lab, to, "h100-01,h100-02", "--waves", "1,100%", "--soak", "20s",
                                    "--soak-interval", "2", "--canary", CANARY),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                            env=dict(lab.env, FLEETCTL_TEST_TAG=tag),
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lab, cid, proc, lambda e: e["event"] == "step_started" and e["step"] == "activate")
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Nothing of the activation's playbook left: not ansible-playbook, its workers, nor their ssh (an idle
    # ControlPersist master stays its 60 s, as after any Ansible run).
    left = [p for p in tagged(tag) if "[mux]" not in p]
    stopped, stopped_events = show(lab, cid), events(lab, cid)
    resumed = lab.fleetctl("campaign", "resume", str(cid), timeout=900)
    print(f"\nsoak tests 1 and 4 (SIGTERM mid-playbook, resume, a clean soak with a canary command): "
          f"{time.monotonic() - started:.1f}s")
    return SimpleNamespace(cid=cid, to=to, proc=proc, out=out, err=err, left=left, stopped=stopped,
                           stopped_events=stopped_events, resumed=resumed)


def test_a_clean_soak_with_a_passing_canary_command_goes_on(lab, sigtermed):
    """20 s of soak (the resumed campaign's), a check every 2 s: two checks at least, with room for checks of
    several seconds each under CI's load (a 6 s soak once held only one, a 12 s one too beside another lab test)."""
    cid, resumed = sigtermed.cid, sigtermed.resumed
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr
    doc = show(lab, cid)
    assert doc["campaign"]["state"] == "done"
    canary = soak_records(doc, "h100-01")
    assert canary["checks"] >= 2 and canary["gates"] == 1 and canary["failed_canary_runs"] == 0
    assert canary["last"]["kind"] == "gate" and canary["last"]["status"] == "ok"
    assert "h100-02" not in doc["soak"]["hosts"]  # not changed before the soak: nothing to watch
    assert "soak check after wave 1: 1 ok" in resumed.stdout
    assert "end-of-soak gate after wave 1: 1 ok" in resumed.stdout
    # the canary's runs were the operator's command (its program only is recorded)
    run = next(e for e in events(lab, cid) if e["event"] == "campaign_started")
    assert run["waves"] == [["h100-01"], ["h100-02"]]
    for host in ("h100-01", "h100-02"):
        assert_on(lab, host, sigtermed.to)


def test_sigterm_mid_playbook_stops_the_campaign_between_steps_and_resume_finishes_it(lab, sigtermed):
    """systemd stopping a window's service (issue 21): SIGTERM while the canary's activation playbook runs. One line,
    exit 143, the step left `started` in the journal (no half-run's results used), then `campaign resume` runs that
    step again and the campaign ends done, no step finished twice."""
    cid, proc, out, err = sigtermed.cid, sigtermed.proc, sigtermed.out, sigtermed.err
    assert proc.returncode == 143, out[-2000:] + err
    assert sigtermed.left == []
    assert err.splitlines()[-1] == (f"fleetctl: interrupted (SIGTERM): campaign {cid} stopped between steps; "
                                    f"go on with: fleetctl campaign resume {cid}")
    doc = sigtermed.stopped
    assert doc["campaign"]["state"] == "running"
    canary = hosts_of(doc)["h100-01"]
    assert canary["state"] == "activate" and canary["steps"][-1]["status"] == "started"
    assert sigtermed.stopped_events[-1]["event"] == "interrupted"
    assert sigtermed.stopped_events[-1]["signal"] == "SIGTERM"
    resumed = sigtermed.resumed
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr
    doc = show(lab, cid)
    assert doc["campaign"]["state"] == "done"
    activate = next(s for s in hosts_of(doc)["h100-01"]["steps"] if s["step"] == "activate")
    assert activate["status"] == "ok" and activate["attempts"] == 2
    finished = [(e["host"], e["step"]) for e in events(lab, cid) if e["event"] == "step_finished"]
    assert len(finished) == len(set(finished))
    for host in ("h100-01", "h100-02"):
        assert_on(lab, host, sigtermed.to)


def test_an_xid_logged_while_fleetctl_was_down_is_seen_by_the_resumed_soak(lab):
    """Tests 1 and 4's hosts to the other version: the canary soaks for 10 minutes; fleetctl is killed after its first
    check, the canary's GPU logs Xid 79, and the resumed campaign sees it: the canary is rolled back, wave 2 never
    starts."""
    started, cid = time.monotonic(), next_campaign(lab)
    was = lab.facts("h100-01")["driver"]["module_version"]
    proc = subprocess.Popen(upgrade(lab, TO if was == FROM else FROM, "h100-01,h100-02", "--waves", "1,100%", "--soak", "10m",
                                    "--soak-interval", "2"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=lab.env, cwd=REPO_ROOT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lab, cid, proc, lambda e: e["event"] == "soak_check" and e["gap"] == 1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    lab.inject("h100-01", "xid", "79")
    resumed = lab.fleetctl("campaign", "resume", str(cid), timeout=900)
    assert resumed.returncode == 4, resumed.stdout[-3000:] + resumed.stderr
    doc = show(lab, cid)
    hosts = hosts_of(doc)
    assert doc["campaign"]["state"] == "rolled_back"
    assert "the soak after wave 1 failed" in doc["campaign"]["reason"] and "Xid 79" in doc["campaign"]["reason"]
    assert hosts["h100-01"]["state"] == "rolled_back" and "Xid 79" in hosts["h100-01"]["reason"]
    assert hosts["h100-02"]["state"] == "not_started" and hosts["h100-02"]["steps"] == []
    failed = [e for e in events(lab, cid) if e["event"] == "soak_check_failed"]
    assert [(e["host"], e["kind"]) for e in failed] == [("h100-01", "check")]
    for host in ("h100-01", "h100-02"):
        assert_on(lab, host, was)
    print(f"\nsoak test 2 (kill -9 in the soak, Xid while down, resume): {time.monotonic() - started:.1f}s")


def test_faults_during_a_later_soak_roll_back_those_hosts_within_the_budget(lab):
    """Waves h100-03 | h100-04..07 | h100-08. In the soak after wave 2: h100-04's GPU 1 falls off the bus (the
    health check; the GPU stays lost, so its rollback cannot give it back: exit 6), h100-05's throughput drops
    (the end-of-soak gate), h100-06's canary command starts failing. 3 of wave 2's 4 hosts are within its
    budget (4): each rolls back alone, wave 3 goes on."""
    started, cid = time.monotonic(), next_campaign(lab)
    hosts = ",".join(f"h100-0{i}" for i in range(3, 9))
    proc = subprocess.Popen(upgrade(lab, TO, hosts, "--waves", "1,5,100%", "--soak", "4s,30s", "--soak-interval", "3",
                                    "--canary", CANARY),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=lab.env, cwd=REPO_ROOT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lab, cid, proc, lambda e: e["event"] == "wave_passed" and e["wave"] == 3)
        lab.inject("h100-04", "fall-off-bus", "--gpu", "1")
        lab.inject("h100-05", "throughput", "0.85", "--driver", TO)
        lab.ssh("h100-06", f"touch {FAIL_FLAG}")
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 6, out[-3000:] + err  # h100-04's rollback could not bring its GPU back
    doc = show(lab, cid)
    by = hosts_of(doc)
    assert doc["campaign"]["state"] == "done"
    assert by["h100-04"]["state"] == "rollback_failed" and "1 of 2 GPUs answer NVML" in by["h100-04"]["reason"]
    assert by["h100-05"]["state"] == "rolled_back" and "end of the soak: throughput: " in by["h100-05"]["reason"]
    # Every series slower alike: the worst is a GPU's or the host's (allreduce), as the noise falls.
    assert re.search(r"series below 0\.95x their median before; worst (GPU \d+|host) ", by["h100-05"]["reason"])
    assert by["h100-06"]["state"] == "rolled_back" and "canary run failed" in by["h100-06"]["reason"]
    assert "exited 1" in by["h100-06"]["reason"]
    failed = {e["host"]: (e["kind"], e["reason"]) for e in events(lab, cid) if e["event"] == "soak_check_failed"}
    assert {h: kind for h, (kind, _) in failed.items()} == {"h100-04": "check", "h100-06": "check", "h100-05": "gate"}
    assert failed["h100-04"][1].startswith("soak: new Xid 79 ") and "more: " in failed["h100-04"][1]  # one line
    assert "GPU lost" in failed["h100-04"][1].rsplit("more: ", 1)[1]
    seen = doc["soak"]["hosts"]["h100-04"]["last"]["seen"]  # each problem in full
    assert any("GPU 1 is lost" in line for line in seen) and any("Xid 79" in line for line in seen)
    assert [by[h]["state"] for h in ("h100-03", "h100-07", "h100-08")] == ["done"] * 3
    assert "NEEDS A PERSON: the rollback failed on h100-04" in out
    for host, version in (("h100-03", TO), ("h100-05", FROM), ("h100-06", FROM), ("h100-07", TO), ("h100-08", TO)):
        assert_on(lab, host, version)
    print(f"\nsoak test 3 (three faults in a later soak): {time.monotonic() - started:.1f}s")
