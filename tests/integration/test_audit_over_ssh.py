"""fleetctl audit over real SSH: an sshd of the test's own on 127.0.0.1 (see conftest.py), Ansible's ssh connection,
paramiko's pre-flight, host key checking, exit codes and the SQLite history.

This machine has no NVIDIA driver, so the audited host (this machine, reached through sshd) reports
driver.state == not_installed and the audit exits 1 (driver.installed is a critical failure).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import orchestrator
from orchestrator import schemas
from orchestrator.history.store import Store

from tests.helpers.sshd import SSHD, Fleetctl, free_port, keygen

pytestmark = pytest.mark.skipif(not SSHD.is_file(), reason=f"{SSHD} not found: install openssh-server to run the "
                                                          "SSH integration tests")

BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture(scope="module")
def single_host(sshd, tmp_path_factory):
    """One audit of gpu-a over SSH, shared by the tests that look at its report, history and sshd log."""
    f = Fleetctl(sshd, tmp_path_factory.mktemp("single-host"))
    inv = f.inventory(f.host_line("gpu-a", f.known_hosts()))
    log_offset = sshd.log.stat().st_size
    try:
        result = f.run("audit", "-i", str(inv), "--format", "json")
    finally:
        f.cleanup()
    with open(sshd.log, "rb") as fh:
        fh.seek(log_offset)
        log = fh.read().decode(errors="replace")
    return f, result, log


def test_audit_one_host_over_ssh(single_host):
    _, result, _ = single_host
    assert result.rc == 1, f"rc={result.rc}\nstderr: {result.stderr[-3000:]}"
    report = result.report
    problem = schemas.first_error("audit-report", report)
    assert problem is None, f"{schemas.json_path(problem)}: {problem.message}"
    host = result.host("gpu-a")
    assert host["reachable"] is True and host["error"] is None
    assert host["facts"] is not None
    assert host["facts"]["driver"]["state"] == "not_installed"
    # The facts come from the host the SSH session reached (this machine), not from a stale or local source.
    assert host["facts"]["host"]["boot_id"] == BOOT_ID
    findings = {f["control"]: f for f in host["findings"]}
    assert findings["driver.installed"]["status"] == "fail"
    assert report["summary"]["exit_code"] == 1
    assert report["summary"]["unreachable"] == 0


def test_history_records_the_run(single_host):
    f, result, _ = single_host
    report = result.report
    with Store(f.home / "history.sqlite3") as store:
        runs = store.runs()
        assert len(runs) == 1
        run = runs[0]
        assert run["id"] == report["run"]["id"] and run["uuid"] == report["run"]["uuid"]
        assert run["kind"] == "audit"
        assert run["status"] == "done"
        assert run["exit_code"] == result.rc == 1
        assert run["operator"]
        assert run["tool_version"] == orchestrator.__version__
        assert run["baseline_digest"].startswith("sha256:")
        assert run["finished_at"]
        hosts = store.host_results(run["id"])
        assert [h["host"] for h in hosts] == ["gpu-a"]
        assert hosts[0]["reachable"] == 1 and hosts[0]["facts"]
        findings = {r["control"]: r for r in store.findings(run["id"])}
        assert findings["driver.installed"]["status"] == "fail"
        assert findings["driver.installed"]["host"] == "gpu-a"
        assert len(findings) == len(result.host("gpu-a")["findings"])


def test_one_login_and_one_remote_command_per_host(single_host, sshd):
    """Pipelining and one module call per host: the sshd log shows one authentication (the ControlMaster) and one
    command session for the whole audit. The pre-flight only reaches the key exchange (no login)."""
    _, result, log = single_host
    assert result.rc == 1
    logins = re.findall(r"Accepted publickey for \S+ from 127\.0\.0\.1", log)
    sessions = re.findall(r"Starting session: (\S+)", log)
    assert len(logins) == 1, log
    assert sessions == ["command"], log  # no sftp/scp subsystem: the module was piped, not copied


def test_one_host_down(fleetctl: Fleetctl):
    known = fleetctl.known_hosts()
    closed = free_port()
    inv = fleetctl.inventory(fleetctl.host_line("gpu-a", known), fleetctl.host_line("gpu-down", known, port=closed))
    result = fleetctl.run("audit", "-i", str(inv), "--format", "json")
    assert result.rc == 3, f"rc={result.rc}\nstderr: {result.stderr[-3000:]}"
    assert schemas.first_error("audit-report", result.report) is None
    down = result.host("gpu-down")
    assert down["reachable"] is False and down["facts"] is None
    assert f"127.0.0.1:{closed}" in down["error"] and down["error"].startswith("pre-flight:"), down["error"]
    up = result.host("gpu-a")
    assert up["reachable"] is True and up["facts"]["host"]["boot_id"] == BOOT_ID
    assert result.report["summary"]["unreachable"] == 1 and result.report["summary"]["reachable"] == 1


def test_changed_host_key_is_refused(fleetctl: Fleetctl, sshd):
    impostor = keygen(fleetctl.workdir / "impostor_ed25519", "impostor")
    assert impostor != sshd.host_key_line
    known = fleetctl.known_hosts(f"[127.0.0.1]:{sshd.port} {impostor}\n")
    inv = fleetctl.inventory(fleetctl.host_line("gpu-a", known))

    result = fleetctl.run("audit", "-i", str(inv), "--format", "json")
    assert result.rc == 3, f"rc={result.rc}\nstderr: {result.stderr[-3000:]}"
    host = result.host("gpu-a")
    assert host["reachable"] is False and host["facts"] is None
    assert "HOST KEY CHANGED" in host["error"], host["error"]

    # Without the pre-flight, OpenSSH (through Ansible) refuses the host: host key checking is never turned off.
    result = fleetctl.run("audit", "-i", str(inv), "--format", "json", "--no-preflight")
    assert result.rc == 3, f"rc={result.rc}\nstderr: {result.stderr[-3000:]}"
    host = result.host("gpu-a")
    assert host["reachable"] is False and host["facts"] is None
    assert not host["error"].startswith("pre-flight:")
    assert re.search(r"(?i)host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED", host["error"]), \
        host["error"]


def test_unknown_host_key_is_refused(fleetctl: Fleetctl, sshd):
    known = fleetctl.known_hosts("")
    inv = fleetctl.inventory(fleetctl.host_line("gpu-a", known))
    result = fleetctl.run("audit", "-i", str(inv), "--format", "json")
    assert result.rc == 3, f"rc={result.rc}\nstderr: {result.stderr[-3000:]}"
    host = result.host("gpu-a")
    assert host["reachable"] is False and host["facts"] is None
    assert f"[127.0.0.1]:{sshd.port}" in host["error"] and "is not in" in host["error"], host["error"]
    assert str(known) in host["error"], host["error"]
    # Without the pre-flight, OpenSSH refuses it too (no accept-new, no StrictHostKeyChecking=no).
    result = fleetctl.run("audit", "-i", str(inv), "--format", "json", "--no-preflight")
    assert result.rc == 3, f"rc={result.rc}\nstderr: {result.stderr[-3000:]}"
    host = result.host("gpu-a")
    assert host["reachable"] is False and host["facts"] is None
    assert "Host key verification failed" in host["error"], host["error"]
    # Nothing was appended to known_hosts behind the operator's back.
    assert known.read_text() == ""
