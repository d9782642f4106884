"""The fleetctl.gpu collection as Ansible users meet it: one copy of each module, used by FQCN everywhere, versioned
with fleetctl, built and installed by ansible-galaxy, documented for ansible-doc, and ansible-test sanity clean."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator import __version__

REPO = Path(__file__).resolve().parents[2]
COLLECTION = REPO / "collections/ansible_collections/fleetctl/gpu"
BIN = Path(sys.executable).parent
MODULES = sorted(p.stem for p in (COLLECTION / "plugins/modules").glob("*.py"))
ENV = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_NOCOLOR="1")


def test_the_collection_is_versioned_with_fleetctl_and_names_its_ansible_floor():
    galaxy = yaml.safe_load((COLLECTION / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"], galaxy["version"]) == ("fleetctl", "gpu", __version__)
    floor = re.search(r'"ansible-core>=([\d.]+)', (REPO / "pyproject.toml").read_text()).group(1)
    runtime = yaml.safe_load((COLLECTION / "meta/runtime.yml").read_text())
    assert runtime["requires_ansible"] == f">={floor}.0"


def test_one_copy_of_each_module_and_every_task_uses_it_by_fqcn():
    assert not list(REPO.glob("roles")) and not list(COLLECTION.glob("roles/*/library"))
    assert not list(COLLECTION.glob("roles/*/module_utils")) and not [p for p in REPO.rglob("*.py") if p.is_symlink()]
    tasks = [task for p in (COLLECTION / "roles").glob("*/tasks/*.yml") for task in yaml.safe_load(p.read_text())]
    assert {key for task in tasks for key in task if key.startswith("fleetctl.")} == {f"fleetctl.gpu.{m}" for m in MODULES}
    roles = {r for p in REPO.glob("playbooks/*.yml") for r in re.findall(r"(?:role|name): (fleetctl\.\S+)", p.read_text())}
    assert roles == {"fleetctl.gpu.gpu_facts", "fleetctl.gpu.gpu_probe", "fleetctl.gpu.nvidia_driver"}


def test_ansible_doc_shows_options_examples_and_return_values_for_every_module():
    proc = subprocess.run([str(BIN / "ansible-doc"), "--json", *(f"fleetctl.gpu.{m}" for m in MODULES)],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    docs = json.loads(proc.stdout)
    assert sorted(docs) == [f"fleetctl.gpu.{m}" for m in MODULES]
    for name, doc in docs.items():
        assert doc["doc"]["short_description"] and doc["doc"]["description"], name
        assert doc["examples"] and f"{name}:" in doc["examples"], name
        assert doc["return"], name
        for option, spec in (doc["doc"].get("options") or {}).items():
            assert spec.get("description") and spec.get("type"), f"{name}: {option}"


def module_argument_spec(name: str, monkeypatch) -> dict:
    """The argument_spec NAME's main() gives AnsibleModule."""
    path = COLLECTION / "plugins/modules" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"fleetctl_test_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    given = {}

    def recording(**kwargs):
        given.update(kwargs)
        raise SystemExit

    monkeypatch.setattr(module, "AnsibleModule", recording)
    with pytest.raises(SystemExit):
        module.main()
    return given["argument_spec"]


def test_the_roles_defaults_are_the_controllers(monkeypatch):
    """The collection ships on its own with its own defaults: each the same as fleetctl's one declaration of it (the
    probe's samples, warm-up and trial; the idle wait), in the role defaults, the argument specs, and the gpu_probe
    module's DOCUMENTATION and argument_spec."""
    from orchestrator import settings
    from orchestrator.campaign.options import IdleOptions

    def role(name):
        defaults = yaml.safe_load((COLLECTION / "roles" / name / "defaults/main.yml").read_text())
        specs = yaml.safe_load((COLLECTION / "roles" / name / "meta/argument_specs.yml").read_text())["argument_specs"]
        return defaults, {k: v for entry in specs.values() for k, v in entry["options"].items()}

    source = (COLLECTION / "plugins/modules/gpu_probe.py").read_text()
    documented = yaml.safe_load(re.search(r'DOCUMENTATION = r"""(.*?)"""', source, re.S).group(1))["options"]
    argument_spec = module_argument_spec("gpu_probe", monkeypatch)
    defaults, specs = role("gpu_probe")
    for option, setting in (("samples", settings.SAMPLES), ("warmup_s", settings.WARMUP), ("trial_s", settings.TRIAL)):
        want = setting.value
        assert defaults[f"gpu_probe_{option}"] == specs[f"gpu_probe_{option}"]["default"] == want, option
        assert documented[option]["default"] == argument_spec[option]["default"] == want, option
    defaults, specs = role("nvidia_driver")
    # the role's own wait (fleetctl looks once per poll, its wait is the engine's): a campaign's default before it
    for option, want in (("timeout_s", IdleOptions.timeout_s), ("poll_s", IdleOptions.poll_s)):
        assert defaults[f"nvidia_driver_idle_{option}"] == specs[f"nvidia_driver_idle_{option}"]["default"] == want


def test_ansible_galaxy_builds_and_installs_it(tmp_path):
    galaxy = [str(BIN / "ansible-galaxy"), "collection"]
    built = subprocess.run([*galaxy, "build", str(COLLECTION), "--output-path", str(tmp_path)], capture_output=True,
                           text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    tarball = tmp_path / f"fleetctl-gpu-{__version__}.tar.gz"
    target = tmp_path / "collections"
    installed = subprocess.run([*galaxy, "install", str(tarball), "-p", str(target)], capture_output=True, text=True,
                               timeout=120)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    root = target / "ansible_collections/fleetctl/gpu"
    assert (root / "plugins/modules/gpu_facts.py").is_file() and (root / "roles/nvidia_driver/tasks/activate.yml").is_file()
    assert not list(root.glob("roles/*/molecule"))  # test scenarios stay out of what users install
    listed = subprocess.run([*galaxy, "list", "-p", str(target), "--format", "json"], capture_output=True, text=True,
                            env=dict(ENV, ANSIBLE_COLLECTIONS_PATH=str(target)), timeout=60)
    assert json.loads(listed.stdout)[str(target / "ansible_collections")]["fleetctl.gpu"]["version"] == __version__


@pytest.mark.skipif(not (BIN / "ansible-test").exists(), reason="ansible-test comes with ansible-core")
def test_ansible_test_sanity_is_clean():
    proc = subprocess.run([str(REPO / "scripts/ansible-test-sanity")], capture_output=True, text=True, timeout=1500,
                          env=dict(os.environ, FLEETCTL_VENV_BIN=str(BIN)))
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith(("ERROR", "FATAL"))]
    assert proc.returncode == 0 and not errors, "\n".join(errors[:60]) or proc.stdout[-3000:]
