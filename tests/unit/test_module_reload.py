"""Activation by module reload: the unload order the role computes from /sys/module, the lab kernel's rules it is
tested against in the lab, and what a campaign records of an activation."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from orchestrator import baseline
from orchestrator.campaign.steps import activation_detail
from orchestrator.errors import InputError
from orchestrator.lab.kernel import Modules

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ("570.86.15", "open")


def reload_module():
    spec = importlib.util.spec_from_file_location(
        "nvidia_module_reload", ROOT / "roles/nvidia_driver/library/nvidia_module_reload.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def kernel(tmp_path):
    modules = Modules(tmp_path, nvswitch=True)
    for name in ("nvidia_drm", "nvidia_uvm"):
        modules.load(name, DRIVER)
    return modules


def test_every_module_is_unloaded_after_the_modules_holding_it(kernel):
    # A third-party module holding nvidia (GPUDirect's gdrdrv) must go first too.
    (kernel.sys_module / "gdrdrv/holders").mkdir(parents=True)
    (kernel.sys_module / "gdrdrv/initstate").write_text("live\n")
    os.symlink("../../gdrdrv", kernel.sys_module / "nvidia/holders/gdrdrv")
    order = reload_module().unload_order(str(kernel.sys_module))
    assert order == ["gdrdrv", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]
    for name in order:
        assert all(order.index(h) < order.index(name) for h in kernel.holders(name)), name
    # ... which the emulated kernel accepts, one rmmod each (gdrdrv is not one of its modules: removed by hand).
    os.unlink(kernel.sys_module / "nvidia/holders/gdrdrv")
    for name in order[1:]:
        assert kernel.unload(name, lambda _n: []) == (0, "")
    assert not kernel.loaded("nvidia") and not (kernel.proc_driver / "nvidia").exists()


def test_a_holder_cycle_is_an_error_not_a_hang(tmp_path):
    for a, b in (("nvidia", "nvidia_x"), ("nvidia_x", "nvidia")):
        (tmp_path / a / "holders").mkdir(parents=True, exist_ok=True)
        (tmp_path / a / "initstate").write_text("live\n")
        os.symlink(f"../../{b}", tmp_path / a / "holders" / b)
    with pytest.raises(ValueError, match="cycle"):
        reload_module().unload_order(str(tmp_path))


def test_nothing_loaded_means_nothing_to_unload(tmp_path):
    assert reload_module().unload_order(str(tmp_path)) == []
    assert reload_module().unload_order(str(tmp_path / "absent")) == []


def test_the_lab_kernel_refuses_what_the_real_one_refuses(kernel):
    assert kernel.unload("nvidia", lambda _n: []) == (1, "rmmod: ERROR: Module nvidia is in use by: nvidia_modeset nvidia_uvm")
    assert kernel.unload("nvidia_drm", lambda n: ["fbcon"]) == (1, "rmmod: ERROR: Module nvidia_drm is in use")
    assert kernel.loaded("nvidia_drm")
    assert kernel.unload("nouveau", lambda _n: []) == (1, "rmmod: ERROR: Module nouveau is not currently loaded")
    with pytest.raises(OSError, match="not found"):
        Modules(kernel.kernel, False).load("nvidia", None)  # no driver installed


def test_loading_brings_the_installed_version_with_its_dependencies_and_logs_it(tmp_path):
    modules = Modules(tmp_path, nvswitch=True)
    (tmp_path / "kmsg").write_text("6,0,0,-;Linux version\n6,1,5,-;booted\n")
    from orchestrator.lab.kernel import append_kmsg
    append_kmsg(tmp_path, modules.load("nvidia_drm", ("580.95.05", "open")))
    assert (tmp_path / "sys-module/nvidia/version").read_text() == "580.95.05\n"
    assert "580.95.05" in (tmp_path / "proc-driver/nvidia/version").read_text()
    assert sorted(os.listdir(tmp_path / "proc-driver/nvidia-nvswitch/devices")) == [
        "0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
    records = (tmp_path / "kmsg").read_text().splitlines()
    assert [int(r.split(",")[1]) for r in records] == list(range(len(records)))
    assert any("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05" in r for r in records)
    assert modules.load("nvidia_drm", ("580.95.05", "open")) == []  # already loaded: nothing happens


@pytest.mark.parametrize("results, detail", [
    ({"ansible.builtin.reboot": {"changed": True}}, {"rebooted": True, "reloaded": False}),
    ({"ansible.builtin.reboot": {"skipped": True}, "nvidia_module_reload": {"changed": True, "loaded": "570.86.15"}},
     {"rebooted": False, "reloaded": True}),
    ({"nvidia_module_reload": {"changed": False, "loaded": "570.86.15"}}, {"rebooted": False, "reloaded": False}),
    ({"nvidia_module_reload": {"changed": True, "msg": "unloading nvidia_drm: rmmod: ERROR: Module nvidia_drm is in use",
                               "failed_when_result": False},
      "ansible.builtin.reboot": {"changed": True}},
     {"rebooted": True, "reloaded": False,
      "reload_refused": "unloading nvidia_drm: rmmod: ERROR: Module nvidia_drm is in use"}),
])
def test_the_campaign_records_how_the_driver_was_loaded(results, detail):
    assert activation_detail(results) == detail


def test_activation_is_a_baseline_choice(tmp_path):
    good = tmp_path / "good.yml"
    good.write_text("schema_version: 1\nname: x\ngroups:\n  all:\n    campaign: {activation: reload}\n"
                    "  training:\n    campaign: {activation: reboot}\n")
    b = baseline.load(good)
    assert b.policy_for([])["campaign"]["activation"] == "reload"
    assert b.policy_for(["training"])["campaign"]["activation"] == "reboot"
    bad = tmp_path / "bad.yml"
    bad.write_text("schema_version: 1\nname: x\ngroups:\n  all:\n    campaign: {activation: kexec}\n")
    with pytest.raises(InputError, match="activation"):
        baseline.load(bad)
