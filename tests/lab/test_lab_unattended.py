"""Unattended maintenance windows on one lab (issue 15): what a 03:00 run must get right with nobody watching.

Three 550.163.01 H100 hosts and a fourth whose nouveau is not blacklisted (h100-04):
- the plan keeps the fourth out of every wave, with its reason (its next boot is at risk);
- the lab boots as a real host does: an un-blacklisted nouveau holds the GPUs after a driver change, and an
  activation resumed while the reboot it asked for is still on its way waits for that reboot instead of asking
  for a second one;
- the window's process tree killed with SIGKILL mid-campaign (the control node crashed): the unit's first command,
  `campaign resume --interrupted`, started twice at once, finishes the campaign once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.exitcodes import Exit
from tests.helpers.lab import FAST, FROM, REPO_ROOT, TO, assert_on, boots, fleetctl_lab, kill_tree, show

pytestmark = pytest.mark.lab

SPECS = (f"3xh100-sxm/2@{FROM}", f"1xh100-sxm/2@{FROM}+nouveau")
RISKY = "h100-04"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with fleetctl_lab(tmp_path_factory.mktemp("unattended"), SPECS) as handle:
        yield handle


def test_the_plan_keeps_a_host_whose_next_boot_is_at_risk_out_of_every_wave(lab):
    proc = lab.fleetctl("plan", "--to", TO, "-i", lab.inventory, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    waved = sorted(h["name"] for w in plan["waves"] for h in w["hosts"])
    assert waved == ["h100-01", "h100-02", "h100-03"]
    (excluded,) = plan["excluded"]
    assert (excluded["name"], excluded["code"]) == (RISKY, "boot_at_risk")
    assert excluded["reason"].startswith("next boot at risk: nouveau.blacklisted: "), excluded["reason"]


def activate(lab, host: str, version: str, boot_id: str) -> subprocess.CompletedProcess:
    """fleetctl's own activation playbook for HOST, as the campaign's activate step runs it."""
    env = dict(lab.env, ANSIBLE_COLLECTIONS_PATH=str(REPO_ROOT / "collections"), ANSIBLE_NOCOLOR="1")
    extra = {"fleetctl_boot_ids": {host: boot_id}, "fleetctl_versions": {host: version},
             "fleetctl_activation": {host: "reboot"}, "fleetctl_running_units": {host: []}}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", lab.inventory, "-l", host, "-e", json.dumps(extra),
                           str(REPO_ROOT / "playbooks/driver_activate.yml")], capture_output=True, text=True,
                          env=env, cwd=lab.workdir, timeout=300, stdin=subprocess.DEVNULL)


def test_a_resumed_activation_waits_for_the_reboot_already_asked_and_nouveau_wins_that_boot(lab):
    """The crash window between asking for a reboot and the host going down: the resumed activation finds the
    boot id its predecessor wrote and waits for the boot instead of rebooting twice. That boot, the first into
    570.86.15 with nouveau not blacklisted, gives the GPUs to nouveau, as on a real host whose initramfs does not
    load nvidia first; blacklisting it brings the driver back at the next boot."""
    lab.ssh(RISKY, "apt-mark unhold $(apt-mark showhold) >/dev/null && "
                   f"apt-get install -y -q nvidia-driver-570-open={TO}-0lab1 "
                   f"nvidia-persistenced={TO}-0lab1 nvidia-fabricmanager-570={TO}-0lab1 >/dev/null")
    boot_id = lab.ssh(RISKY, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    before = boots(lab)[RISKY]
    # What the killed run left: the marker, and its reboot still on its way (the host is up for a few seconds).
    lab.ssh(RISKY, f"echo {boot_id} > /run/fleetctl-driver-reboot && "
                   "(setsid sh -c 'sleep 12; shutdown -r 0 lab-delayed' </dev/null >/dev/null 2>&1 &)")
    proc = activate(lab, RISKY, TO, boot_id)
    assert "TASK [fleetctl.gpu.nvidia_driver : Wait for the reboot an interrupted run already asked for" in proc.stdout
    assert boots(lab)[RISKY] == before + 1  # one reboot, not two
    # ... into a boot where nouveau took the GPUs: the activation says so, in one message
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"after the activation the nvidia module is not loaded, not {TO}: nouveau is loaded and holds the GPUs" \
        in proc.stdout, proc.stdout[-3000:]
    facts = lab.facts(RISKY)
    assert facts["nouveau"]["loaded"] and facts["driver"]["state"] == "not_loaded", facts["driver"]
    assert lab.drift("-l", RISKY)[RISKY]["nouveau.not_loaded"] == "fail"

    lab.ssh(RISKY, "mkdir -p /etc/modprobe.d && echo 'blacklist nouveau' > /etc/modprobe.d/blacklist-nouveau.conf")
    lab.reboot(RISKY)
    facts = lab.facts(RISKY)
    assert not facts["nouveau"]["loaded"] and facts["driver"]["module_version"] == TO


def test_kill_9_of_the_window_then_two_resumes_at_once_finish_the_campaign_once(lab):
    hosts = ["h100-01", "h100-02", "h100-03"]
    log = Path(lab.env["FLEETCTL_HOME"]) / "campaigns" / "1.jsonl"
    window = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "upgrade", "--to", TO, "-i", lab.inventory,
                               *FAST, "--waves", "1,100%", "-l", ",".join(hosts)], env=lab.env, cwd=REPO_ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and window.poll() is None:
            events = [json.loads(line) for line in (log.read_text().splitlines() if log.exists() else [])]
            if any(e["event"] == "step_started" and e.get("step") == "activate" for e in events):
                break  # the canary is changed and mid-activation: the crash a resume must finish
            time.sleep(0.05)
        assert window.poll() is None, "the campaign ended before it could be killed"
    finally:
        kill_tree(window.pid)
        window.wait()
    assert show(lab)["campaign"]["state"] == "running"

    resume = [sys.executable, "-m", "orchestrator.cli", "campaign", "resume", "--interrupted"]
    both = [subprocess.Popen(resume, env=lab.env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, stdin=subprocess.DEVNULL) for _ in range(2)]
    results = [(p.wait(timeout=900), *p.communicate()) for p in both]
    codes = sorted(rc for rc, _, _ in results)
    acted = [r for r in results if "no interrupted campaign" not in r[1] and r[0] == 0]
    assert len(acted) == 1, results
    other = next(r for r in results if r is not acted[0])
    refused = other[0] == Exit.UNAVAILABLE and other[2].strip().count("\n") == 0 and "is being driven by pid" in other[2]
    assert refused or (other[0] == 0 and other[1] == "no interrupted campaign\n"), results
    assert codes[0] == 0
    doc = show(lab)
    assert doc["campaign"]["state"] == "done", doc["campaign"]
    for name in hosts:
        assert_on(lab, name, TO)
    finished = [(e["host"], e["step"]) for e in map(json.loads, log.read_text().splitlines())
                if e["event"] == "step_finished"]
    assert len(finished) == len(set(finished))  # no step done twice by the two resumes
