"""fleetctl.gpu.nvidia_driver_state, run as Ansible runs it (a Python process given its arguments as JSON, the
collection's module_utils importable, as AnsiballZ packs them), with a systemctl and an nvidia-ctk of the test's own
first in PATH: what the activation decides on, read in one call."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "collections/ansible_collections/fleetctl/gpu/plugins/modules/nvidia_driver_state.py"
PYTHONPATH = str(ROOT / "collections")


def run(tmp_path: Path, **args) -> dict:
    (tmp_path / "args.json").write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=PYTHONPATH)
    proc = subprocess.run([sys.executable, str(MODULE), str(tmp_path / "args.json")], capture_output=True, text=True,
                          env=env, timeout=60)
    return json.loads(proc.stdout)


def tool(tmp_path: Path, name: str, script: str) -> Path:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


def test_it_reads_the_boot_id_the_reboot_marker_the_inactive_daemons_and_the_toolkit(tmp_path):
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    marker = tmp_path / "reboot-asked"
    marker.write_text(boot_id + "\n")
    # persistenced runs, the fabric manager does not (exit 3, as systemctl says "inactive").
    tool(tmp_path, "systemctl", '[ "$3" = nvidia-persistenced.service ] && exit 0; exit 3\n')
    ctk = tool(tmp_path, "nvidia-ctk", "exit 0\n")
    out = run(tmp_path, reboot_marker=str(marker),
              units=["nvidia-fabricmanager.service", "nvidia-persistenced.service", "nvidia-dcgm.service"])
    assert out["changed"] is False and not out.get("failed"), out
    assert out["boot_id"] == boot_id and out["reboot_asked"] == boot_id
    assert out["units_inactive"] == ["nvidia-fabricmanager.service", "nvidia-dcgm.service"]
    assert out["nvidia_ctk"] == str(ctk)
    loaded = Path("/sys/module/nvidia/version")
    assert out["loaded"] == (loaded.read_text().strip() if loaded.exists() else None)
    assert out["nouveau"] is Path("/sys/module/nouveau").is_dir()


def test_no_marker_no_units_no_toolkit(tmp_path):
    tool(tmp_path, "systemctl", "echo called >&2; exit 1\n")
    out = run(tmp_path, reboot_marker=str(tmp_path / "absent"))
    assert out["reboot_asked"] is None and out["units_inactive"] == [] and not out.get("failed"), out
    # Ansible's search path: PATH, then the sbin directories.
    dirs = os.pathsep.join([str(tmp_path / "bin"), os.environ["PATH"], "/sbin", "/usr/sbin", "/usr/local/sbin"])
    assert out["nvidia_ctk"] == shutil.which("nvidia-ctk", path=dirs)


def test_a_unit_name_that_is_not_one_fails_before_anything_runs(tmp_path):
    called = tmp_path / "called"
    tool(tmp_path, "systemctl", f"touch {called}\n")
    out = run(tmp_path, units=["nvidia-persistenced.service", "--now; reboot"])
    assert out["failed"] and out["msg"] == "not a unit name: '--now; reboot'"
    assert not called.exists()


def test_units_on_a_host_without_systemctl_are_one_clear_failure(tmp_path):
    if shutil.which("systemctl", path="/sbin:/usr/sbin:/usr/local/sbin"):
        pytest.skip("systemctl in an sbin directory, where Ansible always looks")
    (tmp_path / "bin").mkdir()
    (tmp_path / "args.json").write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"units": ["nvidia-persistenced.service"]}}))
    proc = subprocess.run([sys.executable, str(MODULE), str(tmp_path / "args.json")], capture_output=True, text=True,
                          env=dict(os.environ, PATH=str(tmp_path / "bin"), PYTHONPATH=PYTHONPATH), timeout=60)
    out = json.loads(proc.stdout)
    assert out["failed"]
    assert out["msg"] == "no systemctl on this host: cannot tell whether nvidia-persistenced.service run"


def test_on_a_real_h100_it_reads_what_the_driver_and_the_kernel_say():
    """tests/testdata/h100-580.159.04-driver-state (README there): the module through Ansible on the device machine."""
    data = ROOT / "tests/testdata/h100-580.159.04-driver-state"
    calls = {}
    for block in data.joinpath("nvidia_driver_state.log").read_text().split("== ")[1:]:
        title, line = block.strip().split("\n", 1)
        status, _, doc = line.partition(" => ")
        calls[title] = (status.split(" | ")[1], json.loads(doc))
    host = dict(line.split(" ", 1) for line in data.joinpath("host.txt").read_text().splitlines())
    smi_version = data.joinpath("nvidia-smi.csv").read_text().split(",")[0]
    status, before = calls["before the reboot"]
    assert status == "SUCCESS" and before["loaded"] == host["module"] == smi_version == "580.159.04"
    assert before["boot_id"] == host["boot_id"] == before["reboot_asked"]
    assert before["nouveau"] is False and before["nvidia_ctk"] is None and host["nvidia-ctk"] == "none"
    status, after = calls["after it, with the daemons that ran"]
    assert "systemctl: command not found" in host["nvidia-persistenced.service"]
    assert status == "FAILED!"
    assert after["msg"] == "no systemctl on this host: cannot tell whether nvidia-persistenced.service run"
