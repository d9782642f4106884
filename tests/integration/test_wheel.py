"""The wheel a user installs with pip: it carries the collection, playbooks and schemas (not the lab), installs into
a fresh venv outside any checkout and audits localhost there; its dependency ranges resolve on every supported Python."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ASSETS = "orchestrator/_assets/"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([*PIP, "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("fleetctl-*.whl")
    return path


def test_the_wheel_carries_the_collection_playbooks_and_schemas(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    collection = ASSETS + "collections/ansible_collections/fleetctl/gpu/"
    for part in ("galaxy.yml", "meta/runtime.yml", "plugins/modules/gpu_facts.py", "plugins/modules/gpu_probe.py",
                 "plugins/module_utils/fleetctl_packaging.py", "roles/nvidia_driver/tasks/main.yml",
                 "roles/nvidia_driver/meta/argument_specs.yml"):
        assert collection + part in names, part
    for part in ("playbooks/audit.yml", "playbooks/driver_install.yml", "schemas/audit-report.schema.json"):
        assert ASSETS + part in names, part
    assert not [n for n in names if n.startswith("tests/") or "/molecule/" in n or "/tests/output/" in n
                or n.endswith(".pyc")]  # no test scenarios or ansible-test scratch files


def test_the_wheel_carries_no_lab(wheel):
    """The lab is its own distribution (lab/: fleetctl-lab, `fleetctl lab` as a plugin): users' wheels go without it."""
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith(("fleetctl_lab", "lab/", "orchestrator/lab/"))
                or "fleetctl_lab" in n or "/lab/emu/" in n or "libnvidia-ml.c" in n]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "fleetctl.commands" not in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_wheel_installs_into_a_fresh_venv_and_audits_localhost_outside_a_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    proc = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           str(wheel)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = tmp_path / "elsewhere"  # no checkout here: everything must come from the installed wheel
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(FLEETCTL_HOME=str(tmp_path / "home"), PATH=f"{venv / 'bin'}:/usr/bin:/bin")
    where = subprocess.run([str(venv / "bin/python"), "-c", "from orchestrator import resources; "
                            "print(resources.collection_dir())"], cwd=work, env=env, capture_output=True, text=True)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    audit = subprocess.run([str(venv / "bin/fleetctl"), "audit", "--format", "json", "-o", "report.json"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=300)
    if os.path.exists("/sys/module/nvidia"):
        pytest.skip("this machine has an NVIDIA driver: the finding below is for one without")
    assert audit.returncode == 1, audit.stderr
    report = json.loads((work / "report.json").read_text())
    (host,) = report["hosts"]
    assert host["name"] == "localhost" and host["reachable"] and host["error"] is None, host
    finding = next(f for f in host["findings"] if f["control"] == "driver.installed")
    assert finding["status"] == "fail" and finding["severity"] == "critical"


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_the_dependency_ranges_resolve_on_every_supported_python(wheel, python, tmp_path):
    report = tmp_path / "resolved.json"
    proc = subprocess.run([*PIP, "install", "--dry-run", "--ignore-installed", "-q", "--only-binary=:all:",
                           "--python-version", python, "--target", str(tmp_path / "t"), "--report", str(report),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    assert {"ansible-core", "ansible-runner", "scipy", "prometheus-client", "nvidia-ml-py"} <= set(resolved)
