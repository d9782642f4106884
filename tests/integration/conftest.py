"""Fixtures for the SSH integration tests: a real sshd on 127.0.0.1, inventories that reach it, and fleetctl run
as a subprocess with its history and Ansible's ControlPersist sockets in temporary directories."""

from __future__ import annotations

import pytest

from tests.helpers.sshd import SSHD, Fleetctl, SshServer, start_sshd, stop_sshd


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> SshServer:
    """An sshd of our own on a free port of 127.0.0.1, stopped at the end of the module whatever happened."""
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} not found: install openssh-server to run the SSH integration tests")
    server, proc = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        stop_sshd(proc)


@pytest.fixture
def fleetctl(sshd, tmp_path) -> Fleetctl:
    """A fresh fleetctl environment per test; Ansible's ControlPersist masters are killed at teardown, pass or fail
    (and so no test can reuse another's authenticated master connection)."""
    f = Fleetctl(sshd, tmp_path)
    try:
        yield f
    finally:
        f.cleanup()
