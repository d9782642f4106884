"""Quality gates on the on-host parts: ansible-lint's production profile, argument specs, read-only audit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COLLECTION = REPO / "collections/ansible_collections/fleetctl/gpu"
ROLES = sorted(p for p in (COLLECTION / "roles").iterdir() if p.is_dir())


def test_ansible_lint_production_profile_is_clean():
    lint = shutil.which("ansible-lint", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("ansible-lint is not installed (pip install -e '.[test]')")
    paths = ["playbooks/", "examples/", str(COLLECTION.relative_to(REPO))]
    proc = subprocess.run([lint, "--profile", "production", "--nocolor", *paths],
                          cwd=REPO, env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections")),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_role_declares_its_arguments(role):
    entry_points = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    specs = {name: spec for entry in entry_points.values() for name, spec in entry["options"].items()}
    assert set(entry_points) == {p.stem for p in (role / "tasks").glob("*.yml")}  # every tasks file is an entry point
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    assert set(defaults) <= set(specs), f"defaults without a spec: {set(defaults) - set(specs)}"
    assert all(name.startswith(role.name + "_") for name in specs)
