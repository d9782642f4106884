"""Two execution nodes on a lab fleet (issue 37): local `ansible-runner worker`s, each serving half the hosts. An audit
through them finds what an in-process one finds; a campaign across them journals what an in-process one does; its
wait_idle step's worker on one node killed mid-run (the second wave: h100-01, node a's, is the canary) fails that
node's hosts (unreachable, naming the node; within the wave's budget of 3), nothing changed on them, while the other
node's hosts finish the campaign."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import REPO
from tests.helpers.lab import FAST, FROM, TO, UPGRADE_STEPS, assert_on, fleetctl_lab, hosts_of, show, steps_of

pytestmark = pytest.mark.lab

RUNNER = Path(sys.executable).parent / "ansible-runner"
SERVED = {"a": ["h100-01", "h100-02"], "b": ["h100-03", "h100-04"]}


def node(tmp_path: Path, name: str) -> dict[str, str]:
    """Execution node NAME: a local worker keeping its jobs in tmp_path/NAME, its pid in tmp_path/NAME.pid."""
    script = tmp_path / f"worker-{name}"
    script.write_text(f'#!/bin/sh\necho $$ > "{tmp_path}/{name}.pid"\n'
                      f'exec {RUNNER} worker --private-data-dir "{tmp_path}/{name}"\n')
    script.chmod(0o755)
    return {"name": name, "worker": str(script), "hosts": f"h100-0[{''.join(h[-1] for h in SERVED[name])}]"}


def findings(report: dict) -> dict[str, dict[str, str]]:
    return {h["name"]: {f["control"]: f["status"] for f in h["findings"]} for h in report["hosts"]}


def limits(node_dir: Path) -> set[str]:
    """The --limit of every job NODE_DIR's worker ran."""
    commands = [json.loads(p.read_text())["command"] for p in node_dir.glob("artifacts/*/command")]
    return {c[c.index("--limit") + 1] for c in commands}


def test_an_audit_and_a_campaign_across_two_execution_nodes_and_a_killed_worker(tmp_path):
    with fleetctl_lab(tmp_path, (f"4xh100-sxm/2@{FROM}",)) as lab:
        code, in_process = lab.audit()
        config = tmp_path / "config.yml"
        config.write_text(json.dumps({"execution_nodes": [node(tmp_path, "a"), node(tmp_path, "b")]}))
        lab.env["FLEETCTL_CONFIG"] = str(config)
        fanned_code, fanned = lab.audit()
        assert fanned_code == code and findings(fanned) == findings(in_process)
        assert limits(tmp_path / "a") == {"h100-01,h100-02"} and limits(tmp_path / "b") == {"h100-03,h100-04"}

        lab.inject("h100-04", "gpu-in-use", "--gpu", "1")  # node b's wait_idle holds for --idle-timeout (20 s)
        baseline = tmp_path / "reload.yml"
        baseline.write_text("schema_version: 1\nname: lab-nodes\ngroups:\n  all:\n"
                            "    driver: {branches: ['550', '570'], held: true}\n"
                            "    campaign: {budget_hosts: 3, activation: reload}\n")
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "upgrade", "--to", TO, "-i", lab.inventory,
                                 *FAST, "--waves", "1,100%", "-b", str(baseline)], env=lab.env, cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            while not (tmp_path / "b" / "project" / "gpu_idle.yml").exists():  # b's worker took the wait_idle job
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.05)
            os.kill(int((tmp_path / "b.pid").read_text()), signal.SIGKILL)
            out, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 1, out[-3000:] + err  # done, node b's hosts off the target
        doc = show(lab)
        hosts = hosts_of(doc)
        assert doc["campaign"]["state"] == "done"
        for name in SERVED["a"]:  # the journal of an in-process campaign
            assert hosts[name]["state"] == "done" and steps_of(hosts[name]) == UPGRADE_STEPS, hosts[name]
            assert all(s["status"] == "ok" and s["attempts"] == 1 for s in hosts[name]["steps"])
            assert_on(lab, name, TO)
        for name in SERVED["b"]:
            host = hosts[name]
            assert host["state"] == "failed" and not host["changed"] and steps_of(host)[-2:] == ["wait_idle", "release"]
            assert f"unreachable: execution node b ({tmp_path / 'worker-b'}): exited -9" in host["reason"], host
            assert_on(lab, name, FROM)
        assert limits(tmp_path / "a") <= {"h100-01,h100-02", "h100-01", "h100-02"}  # each node its own hosts only
        assert limits(tmp_path / "b") <= {"h100-03,h100-04", "h100-03", "h100-04"}
