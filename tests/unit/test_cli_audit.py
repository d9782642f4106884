"""`fleetctl audit` end to end on this machine (localhost, local connection): exit codes, outputs, history.

This machine has no NVIDIA GPU, so the embedded baseline finds a real, critical drift: no driver installed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import __version__, schemas

from tests.helpers.cli import REPO, fleetctl, runs


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("fleetctl-home")


@pytest.fixture(scope="module")
def json_run(home, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "audit.json"
    proc = fleetctl("audit", "--format", "json", "-o", str(out), home=home)
    return proc, json.loads(out.read_text())


def test_json_report_of_localhost(json_run):
    proc, report = json_run
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""  # -o FILE: the report went to the file
    assert schemas.first_error("audit-report", report) is None
    (host,) = report["hosts"]
    assert host["name"] == "localhost" and host["reachable"] and host["error"] is None
    assert host["facts"]["driver"]["state"] == "not_installed"
    assert host["facts"]["host"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    driver = {f["control"]: f for f in host["findings"]}["driver.installed"]
    assert (driver["status"], driver["severity"]) == ("fail", "critical")
    assert driver["remediation"]
    assert report["summary"]["exit_code"] == 1 and report["summary"]["noncompliant"] == 1
    assert report["run"]["baseline"]["name"] == "fleetctl-default"


def test_every_run_is_recorded_with_who_when_what(json_run, home):
    _, report = json_run
    row = next(r for r in runs(home) if r["id"] == report["run"]["id"])
    assert (row["kind"], row["status"], row["exit_code"], row["tool_version"]) == ("audit", "done", 1, __version__)
    assert row["operator"] and row["control_node"] and row["baseline_digest"] == report["run"]["baseline"]["digest"]
    with sqlite3.connect(home / "history.sqlite3") as c:
        facts = json.loads(c.execute("SELECT facts FROM host_results WHERE run_id=?", (row["id"],)).fetchone()[0])
        controls = {r[0]: r[1] for r in c.execute("SELECT control, status FROM findings WHERE run_id=?", (row["id"],))}
    assert facts == report["hosts"][0]["facts"]
    assert controls["driver.installed"] == "fail" and len(controls) == len(report["hosts"][0]["findings"])


def test_table_output_and_fail_on(home):
    proc = fleetctl("audit", home=home)
    assert proc.returncode == 1
    assert "driver.installed" in proc.stdout and "critical" in proc.stdout
    assert "1 host: 0 compliant - 1 not compliant" in proc.stdout and "exit 1" in proc.stdout
    assert fleetctl("audit", "--fail-on", "never", "--format", "json", home=home).returncode == 0
    assert fleetctl("audit", "--fail-on", "critical", "--format", "json", home=home).returncode == 1


@pytest.mark.parametrize("args,expected", [
    (["audit", "--format", "xml"], "'xml' is not one of 'table', 'json'"),
    (["audit", "--forks", "0"], "--forks"),
    (["audit", "--bogus"], "--bogus"),
    (["audit", "--fail-on", "sometimes"], "--fail-on"),
    (["audit", "-i", "/nonexistent/hosts.ini"], "/nonexistent/hosts.ini: inventory not found"),
    (["audit", "-l", "gpu-*"], "--limit 'gpu-*' matches no host"),
    (["audit", "-b", "inventory/hosts.example.ini"], "inventory/hosts.example.ini: line 3 column 1: not valid YAML"),
    (["audit", "-i", "inventory/hosts.example.ini", "-b", "tests/testdata/baselines/unknown-group.yml"],
     "$.groups.a100: group 'a100' is not in the inventory"),
    (["audit", "-b", "tests/testdata/baselines/bad-version.yml"], "$.groups.all.driver.versions[0]: '570.x' does not match"),
])
def test_bad_input_is_one_line_exit_2_and_loses_nothing(home, json_run, args, expected):
    before = [tuple(r) for r in runs(home)]
    proc = fleetctl(*args, home=home, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("fleetctl: error: ") and expected in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert [tuple(r) for r in runs(home)] == before  # nothing recorded, nothing lost


def test_a_host_returning_garbage_is_an_error_finding_and_the_rest_carries_on(tmp_path, home):
    garbage = tmp_path / "garbage-python"
    garbage.write_text("#!/bin/sh\ncat >/dev/null\necho 'Segmentation fault (core dumped)'\nexit 139\n")
    liar = tmp_path / "liar-python"
    liar.write_text('#!/bin/sh\ncat >/dev/null\necho \'{"changed": false, "facts": {"schema_version": 1, "gpus": "many"}}\'\n')
    for f in (garbage, liar):
        f.chmod(0o755)
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"good ansible_connection=local ansible_python_interpreter={sys.executable}\n"
                   f"crashing ansible_connection=local ansible_python_interpreter={garbage}\n"
                   f"lying ansible_connection=local ansible_python_interpreter={liar}\n")
    out = tmp_path / "r.json"
    proc = fleetctl("audit", "-i", str(inv), "--format", "json", "-o", str(out), home=home)
    report = json.loads(out.read_text())
    assert proc.returncode == 1 and schemas.first_error("audit-report", report) is None
    hosts = {h["name"]: h for h in report["hosts"]}
    assert hosts["good"]["facts"]["driver"]["state"] == "not_installed"
    for name in ("crashing", "lying"):
        (finding,) = hosts[name]["findings"]
        assert (finding["control"], finding["status"]) == ("facts.collected", "error")
        assert hosts[name]["facts"] is None and hosts[name]["reachable"]
    assert "cannot trust" in hosts["lying"]["error"] and "$" in hosts["lying"]["error"]


@pytest.mark.parametrize("args,env,expected,code", [
    (["audit", "-o", "/nonexistent/dir/out.txt"], {}, "/nonexistent/dir/out.txt: cannot write the report there", 2),
    (["probe", "--engine", "command", "--command", "echo {{ lookup('pipe', 'id') }}"], {}, "may not contain", 2),
    (["audit"], {"FLEETCTL_HOME": "/proc/nope"}, "/proc/nope/history.sqlite3: the history: ", 74),
])
def test_refused_before_anything_runs_or_is_recorded(tmp_path, args, env, expected, code):
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FLEETCTL_HOME": str(home), **env}, cwd=REPO)
    assert proc.returncode == code and expected in proc.stderr and proc.stderr.count("\n") == 1
    assert not (home / "history.sqlite3").exists()


def test_a_canary_commands_arguments_stay_out_of_the_history(tmp_path, monkeypatch):
    from orchestrator import cli

    monkeypatch.setattr(sys, "argv", ["fleetctl", "probe", "--engine", "command", "--command", "train.sh --token s3cr3t"])
    assert cli.stored_argv() == ["probe", "--engine", "command", "--command", "train.sh [arguments not recorded]"]
