"""Scale-out path: playbooks run through ansible-runner's streaming mode (transmit -> worker -> process), the
mechanism Receptor execution nodes use. Here the worker is a local `ansible-runner worker` process; in production
FLEETCTL_WORKER is e.g. `ssh exec01 ansible-runner worker`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.exitcodes import Exit
from tests.helpers.cli import REPO, runs

RUNNER = Path(sys.executable).parent / "ansible-runner"


def audit(home: Path, worker: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FLEETCTL_WORKER"}
    env.update(FLEETCTL_HOME=str(home))
    if worker:
        env["FLEETCTL_WORKER"] = worker
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "audit", "--format", "json"], env=env,
                          capture_output=True, text=True, timeout=180, cwd=REPO)


def findings(report: dict) -> dict[str, str]:
    return {f["control"]: f["status"] for h in report["hosts"] for f in h["findings"]}


def test_an_audit_through_transmit_worker_process_matches_the_in_process_one(tmp_path):
    node = tmp_path / "execution-node"
    streamed = audit(tmp_path / "home", f"{RUNNER} worker --private-data-dir {node}")
    direct = audit(tmp_path / "home", None)
    assert streamed.returncode == direct.returncode == 1, streamed.stderr + direct.stderr
    via_worker, in_process = json.loads(streamed.stdout), json.loads(direct.stdout)
    assert findings(via_worker) == findings(in_process) and findings(via_worker)["driver.installed"] == "fail"
    (host,) = via_worker["hosts"]
    assert host["facts"]["host"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    # the job went to the worker: the playbook and the collection travelled in the stream
    assert (node / "project" / "audit.yml").is_file()
    assert (node / "project/collections/ansible_collections/fleetctl/gpu/plugins/modules/gpu_facts.py").is_file()
    assert [r["status"] for r in runs(tmp_path / "home")] == ["done", "done"]


def test_a_broken_worker_is_one_line_and_the_run_is_recorded_as_failed(tmp_path):
    """Not a finding (1): fleetctl could not carry the audit out (69), and the history says so too."""
    proc = audit(tmp_path / "home", f"{sys.executable} -c 'import sys; sys.exit(\"no route to exec01\")'")
    assert proc.returncode == Exit.UNAVAILABLE == 69 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "fleetctl: error: FLEETCTL_WORKER "
        f"{sys.executable} -c 'import sys; sys.exit(\"no route to exec01\")': exited 1: no route to exec01"]
    assert [(r["status"], r["exit_code"]) for r in runs(tmp_path / "home")] == [("failed", Exit.UNAVAILABLE)]


def test_a_worker_command_with_an_unclosed_quote_is_an_input_error(tmp_path):
    proc = audit(tmp_path / "home", "ssh 'exec01 ansible-runner worker")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "fleetctl: error: FLEETCTL_WORKER \"ssh 'exec01 ansible-runner worker\": No closing quotation"]
    assert runs(tmp_path / "home") == []   # refused before anything was recorded
