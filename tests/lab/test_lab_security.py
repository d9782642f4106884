"""Security on a lab fleet: host keys are checked everywhere, and secrets never reach what fleetctl writes.

- A lab host whose SSH host key changed (a re-imaged or impersonated host) is refused by `audit` (with and
  without fleetctl's pre-flight: then OpenSSH itself refuses, host key checking is never off), by `probe`, by
  `upgrade` (left out of the plan, its driver untouched), and through the streaming worker; known_hosts is not
  rewritten.
- An inventory carrying a become password and the SSH private key path: after audit, probe, an upgrade campaign and
  every report format, neither the password nor any line of the key appears in fleetctl's output, its history
  database, its event logs or its reports.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.lab import FAST, FROM, TO, assert_on, fleetctl_lab, hosts_of, show, write_baseline

pytestmark = pytest.mark.lab

BECOME_PASSWORD = "canary-become-7f3a9c"   # noqa: S105 - a test canary, not a secret
RUNNER = Path(sys.executable).parent / "ansible-runner"


def rekey(lab, host: str) -> None:
    """Give HOST a new SSH host key, as a re-install would, and reboot it so that its sshd offers that key."""
    lab.ssh(host, "rm -f /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub && "
                  f"ssh-keygen -q -t ed25519 -N '' -C root@{host} -f /etc/ssh/ssh_host_ed25519_key")
    boots = lab_status(lab, host)["boots"]
    lab.fleetctl("lab", "reboot", host)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = lab_status(lab, host)
        if status["boots"] > boots and status["running"]:
            probe = lab.ssh(host, "true", check=False)
            if "REMOTE HOST IDENTIFICATION HAS CHANGED" in probe.stderr:
                return
        time.sleep(0.5)
    raise AssertionError(f"{host} never came back with its new key")


def lab_status(lab, host: str) -> dict:
    rows = json.loads(lab.fleetctl("lab", "status", "--format", "json").stdout)
    return next(r for r in rows if r["name"] == host)


def host_of(report: dict, name: str) -> dict:
    return next(h for h in report["hosts"] if h["name"] == name)


def test_a_changed_host_key_is_refused_everywhere(tmp_path):
    with fleetctl_lab(tmp_path, (f"2xh100-sxm/2@{FROM}",)) as lab:
        known_hosts = Path(lab.env["FLEETCTL_LAB_DIR"]) / "ssh" / "known_hosts"
        rekey(lab, "h100-02")
        before = known_hosts.read_bytes()

        rc, report = lab.audit()
        assert rc == 3 and host_of(report, "h100-01")["reachable"]
        assert "HOST KEY CHANGED" in host_of(report, "h100-02")["error"]
        rc, report = lab.audit("--no-preflight")     # OpenSSH, through Ansible, refuses it as well
        assert rc == 3 and "host key verification failed" in host_of(report, "h100-02")["error"].lower()
        streamed = subprocess.run([sys.executable, "-m", "orchestrator.cli", "audit", "-i", lab.inventory,
                                   "--no-preflight", "--format", "json"], capture_output=True, text=True,
                                  env=dict(lab.env, FLEETCTL_WORKER=f"{RUNNER} worker"), timeout=300)
        assert streamed.returncode == 3, streamed.stderr
        assert "host key verification failed" in host_of(json.loads(streamed.stdout), "h100-02")["error"].lower()

        probe = lab.fleetctl("probe", "-i", lab.inventory, "--format", "json", "--warmup", "0", "--trial", "0.02",
                             "--samples", "3")
        assert "HOST KEY CHANGED" in json.dumps(host_of(json.loads(probe.stdout), "h100-02"))

        proc = lab.fleetctl("upgrade", "--to", TO, "-i", lab.inventory, *FAST, "--waves", "1,100%", timeout=900)
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr  # done, but h100-02 is off the target
        assert "left out at plan, not on the target: h100-02: " in proc.stdout
        doc = show(lab)
        assert list(hosts_of(doc)) == ["h100-01"]
        excluded = {e["name"]: e for e in doc["plan"]["excluded"]}
        assert excluded["h100-02"]["code"] == "unreachable" and "HOST KEY CHANGED" in excluded["h100-02"]["reason"]
        assert_on(lab, "h100-01", TO)
        assert known_hosts.read_bytes() == before   # nothing accepted the new key behind the operator's back


def test_no_secret_reaches_output_history_logs_or_reports(tmp_path):
    with fleetctl_lab(tmp_path, (f"2xh100-sxm/2@{FROM}",)) as lab:
        key_file = Path(lab.env["FLEETCTL_LAB_DIR"]) / "ssh" / "id_ed25519"
        inventory = tmp_path / "inventory-with-secrets.ini"
        inventory.write_text(Path(lab.inventory).read_text()
                             + f"ansible_become_password={BECOME_PASSWORD}\nansible_become_pass={BECOME_PASSWORD}\n")
        key_lines = [line for line in key_file.read_text().splitlines() if line and "PRIVATE KEY" not in line]
        outputs = []

        def run(*args: str) -> subprocess.CompletedProcess:
            proc = lab.fleetctl(*args, timeout=900)
            outputs.append(proc.stdout + proc.stderr)
            return proc

        assert run("audit", "-i", str(inventory), "--format", "json").returncode in (0, 1)
        run("probe", "-i", str(inventory), "--warmup", "0", "--trial", "0.02", "--samples", "3")
        lab.inject("h100-02", "install-failure", TO)    # a failed task's message is kept in the history
        assert run("upgrade", "--to", TO, "-i", str(inventory), *FAST, "--waves", "1,100%",
                   "-b", write_baseline(tmp_path / "baseline.yml", 5)).returncode in (1, 4)  # h100-02 failed
        run("campaign", "show", "1", "--format", "json")
        for fmt in ("json", "csv", "html", "oscal"):
            assert run("report", "--format", fmt, "-o", str(tmp_path / f"report.{fmt}")).returncode == 0
        assert run("report", "verify").returncode == 0

        home = Path(lab.env["FLEETCTL_HOME"])
        written = [p for p in home.rglob("*") if p.is_file()] + list(tmp_path.glob("report.*"))
        assert any(p.name.startswith("history.sqlite3") for p in written)
        assert any(p.suffix == ".jsonl" for p in written)
        for secret in [BECOME_PASSWORD, "PRIVATE KEY", *key_lines]:
            assert not any(secret in text for text in outputs), f"{secret[:12]}... in fleetctl's output"
            leaks = [p.name for p in written if secret.encode() in p.read_bytes()]
            assert not leaks, f"{secret[:12]}... written to {leaks}"
        failed = hosts_of(show(lab))["h100-02"]
        assert "lab fault install_fail" in json.dumps(failed)     # the failure's reason itself was kept

