"""Fixtures the emulated-driver test modules share (their plain helpers are in tests/helpers/emu.py)."""

from __future__ import annotations

import pytest

from fleetctl_lab import packages


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("repo")
    return path, packages.build_repo(path)
