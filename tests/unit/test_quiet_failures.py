"""Unattended logs hold one line per problem: third-party libraries must not print tracebacks into them.

A host that accepts the TCP connection but never sends an SSH banner (a hung sshd, a wrong port behind a load
balancer) made paramiko's transport thread print two full tracebacks during the pre-flight, before the audit
correctly reported the host unreachable."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.cli import fleetctl


def test_a_host_that_never_sends_a_banner_is_one_clean_line_not_a_traceback(silent_listener, tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"hung ansible_host=127.0.0.1 ansible_port={silent_listener} ansible_user=root\n")
    started = time.monotonic()
    proc = fleetctl("audit", "-i", str(inventory), "--format", "json", "-o", str(tmp_path / "r.json"), home=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert time.monotonic() - started < 60
    assert "Traceback" not in proc.stderr and "Exception (client)" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "" and proc.stdout == "", proc.stderr
    (host,) = json.loads((tmp_path / "r.json").read_text())["hosts"]
    assert not host["reachable"]
    assert f"no SSH banner from 127.0.0.1:{silent_listener} within 5 s" in host["error"], host["error"]


@pytest.mark.parametrize("silent_listener", [b"220 mail.example ESMTP\r\n"], ids=["not-ssh"], indirect=True)
def test_debug_mode_still_shows_what_paramiko_saw(silent_listener, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETCTL_DEBUG", "1")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"hung ansible_host=127.0.0.1 ansible_port={silent_listener} ansible_user=root\n")
    proc = fleetctl("audit", "-i", str(inventory), "--format", "json", home=tmp_path)
    assert proc.returncode == 3
    assert "paramiko.transport" in proc.stderr and "banner" in proc.stderr


def test_ansible_inventory_warnings_never_precede_an_input_error(tmp_path):
    """An inventory Ansible parses with warnings, then a bad baseline: the error is still the one line on stderr."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "hosts.yml").write_text("schema_version: 1\nall:\n  hosts:\n    gpu-01:\n      ansible_connection: local\n")
    proc = fleetctl("audit", f"--inventory={inputs}", f"--baseline={inputs}", home=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("fleetctl: error: ") and proc.stderr.count("\n") == 1, proc.stderr
