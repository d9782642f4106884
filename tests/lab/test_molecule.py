"""Every role's molecule scenario (the collection's roles/*/molecule/default: converge, idempotence, verify), each run against a
real lab of its own. Molecule creates nothing: this test brings the lab up and down, and hands molecule the lab's
inventory through FLEETCTL_LAB_INVENTORY.
- gpu_facts: an H100 host with driver 570.86.15 and an A100 host without a driver, nouveau loaded;
- gpu_probe: an H100 host with 2 GPUs on 570.86.15 and an Xid 79 planted on GPU 1;
- nvidia_driver: an H100 host with 2 GPUs on 550.163.01, moved to 570.86.15 (packages, hold, reboot)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tests.helpers.lab import kill_processes_mentioning


REPO_ROOT = Path(__file__).resolve().parents[2]
ROLES = REPO_ROOT / "collections/ansible_collections/fleetctl/gpu/roles"
VENV_BIN = Path(sys.executable).parent
# role -> (lab specs, `fleetctl lab` commands run before molecule, whether its converge changes the hosts)
SCENARIOS = {
    "gpu_facts": (("1xh100-sxm@570.86.15", "1xa100-sxm+nouveau"),
                  (("inject", "h100-01", "nvlink-down", "--gpu", "3", "--link", "7"),
                   ("inject", "h100-01", "nvlink-errors", "--gpu", "0", "--count", "50"),
                   ("inject", "h100-01", "fabric-stuck")), False),
    "gpu_probe": (("1xh100-sxm/2@570.86.15",), (("inject", "h100-01", "xid", "79", "--gpu", "1"),
                                                ("inject", "h100-01", "nvlink-down", "--gpu", "1", "--link", "5")), False),
    "nvidia_driver": (("1xh100-sxm/2@550.163.01",), (), True),
}
LAB_TIMEOUT_S = 900           # builds the apt repo and installs the driver inside the host
MOLECULE_TIMEOUT_S = 600
DOWN_TIMEOUT_S = 120


def _fleetctl(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_every_role_has_a_scenario_here():
    assert sorted(p.parent.parent.parent.name for p in ROLES.glob("*/molecule/default/molecule.yml")) \
        == sorted(p.name for p in ROLES.iterdir() if p.is_dir()) == sorted(SCENARIOS)


@pytest.mark.lab
@pytest.mark.parametrize("role", sorted(SCENARIOS))
def test_molecule_scenario_against_the_lab(role, tmp_path):
    specs, setup, converge_changes = SCENARIOS[role]
    lab_dir = tmp_path / "lab"
    # OpenSSH's ControlPath is a unix socket (108 bytes at most): under xdist's popen-gwN/ a path in tmp_path is
    # too long for Ansible's %h-%p-%r, so the sockets get a short directory of their own.
    control_dir = Path(tempfile.mkdtemp(prefix="fl-cp-"))
    (tmp_path / "ansible-tmp").mkdir()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    base_env.update(FLEETCTL_LAB_DIR=str(lab_dir), PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        spec_args = [a for spec in specs for a in ("--spec", spec)]
        up = _fleetctl(base_env, "lab", "up", *spec_args, timeout=LAB_TIMEOUT_S)
        assert up.returncode == 0, f"fleetctl lab up: rc={up.returncode}\n{up.stdout}\n{up.stderr}"
        for command in setup:
            done = _fleetctl(base_env, "lab", *command, timeout=60)
            assert done.returncode == 0, done.stderr
        inventory = lab_dir / "inventory.ini"
        assert inventory.is_file(), up.stdout

        env = dict(base_env,
                   FLEETCTL_LAB_INVENTORY=str(inventory),
                   ANSIBLE_SSH_CONTROL_PATH_DIR=str(control_dir),
                   ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
                   MOLECULE_EPHEMERAL_DIRECTORY=str(tmp_path / "molecule"),
                   ANSIBLE_FORCE_COLOR="false", NO_COLOR="1", PY_COLORS="0")
        proc = subprocess.run([str(VENV_BIN / "molecule"), "test", "--scenario-name", "default"], cwd=ROLES / role,
                              env=env, capture_output=True, text=True, timeout=MOLECULE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        output = proc.stdout + proc.stderr
        (tmp_path / "molecule.log").write_text(output)
        assert proc.returncode == 0, f"molecule test: rc={proc.returncode}\n{output[-12000:]}"
        # Each step ran and succeeded (converge twice: the idempotence step fails on any changed=N), on both hosts.
        for step in ("syntax", "converge", "idempotence", "verify"):
            assert f"[default > {step}] Executed: Successful" in output, f"no successful {step} step:\n{output[-6000:]}"
        recap = re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output, re.M)
        hosts = {"h100-01", "a100-01"} if role == "gpu_facts" else {"h100-01"}
        assert {host for host, *_ in recap} == hosts, output[-6000:]
        assert len(recap) == 3 * len(hosts), recap   # converge, idempotence (the second converge) and verify
        assert all(r[2:] == ("0", "0") for r in recap), recap                    # nothing unreachable or failed
        converge, again, verify = recap[:len(hosts)], recap[len(hosts):-len(hosts)], recap[-len(hosts):]
        assert all(r[1] == "0" for r in again + verify), recap                    # idempotent; verify changes nothing
        assert all((r[1] != "0") == converge_changes for r in converge), recap
    finally:
        # Only when our `up` got as far as making hosts (a `down` of nothing has nothing to do; other labs on the
        # machine, in slots of their own, are never touched by it).
        down = None
        if (lab_dir / "hosts").exists() or (lab_dir / "lab.json").exists():
            down = _fleetctl(base_env, "lab", "down", timeout=DOWN_TIMEOUT_S)
        kill_processes_mentioning(str(control_dir))
        shutil.rmtree(control_dir, ignore_errors=True)
        if down is not None:
            assert down.returncode == 0, f"fleetctl lab down: rc={down.returncode}\n{down.stdout}\n{down.stderr}"
