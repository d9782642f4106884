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
from fleetctl_lab.kernel import Modules

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ("570.86.15", "open")


def reload_module():
    spec = importlib.util.spec_from_file_location(
        "nvidia_module_reload", ROOT / "collections/ansible_collections/fleetctl/gpu/plugins/modules/nvidia_module_reload.py")
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
    from fleetctl_lab.kernel import append_kmsg
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
    ({"ansible.builtin.reboot": {"skipped": True},
      "fleetctl.gpu.nvidia_module_reload": {"changed": True, "outcome": "loaded", "loaded": "570.86.15", "not_started": {}}},
     {"rebooted": False, "reloaded": True}),
    ({"fleetctl.gpu.nvidia_module_reload": {"changed": False, "outcome": "loaded", "loaded": "570.86.15"}},
     {"rebooted": False, "reloaded": False}),
    ({"fleetctl.gpu.nvidia_module_reload": {"changed": False, "outcome": "refused", "msg": "in use: nvidia_drm (refcnt 1, 0 from modules)",
                               "failed_when_result": False},
      "ansible.builtin.reboot": {"changed": True}},
     {"rebooted": True, "reloaded": False, "reload_refused": "in use: nvidia_drm (refcnt 1, 0 from modules)"}),
    ({"fleetctl.gpu.nvidia_module_reload": {"changed": True, "outcome": "loaded",
                               "not_started": {"nvidia-fabricmanager.service": "no NVSwitch"}}},
     {"rebooted": False, "reloaded": True, "units_not_started": {"nvidia-fabricmanager.service": "no NVSwitch"}}),
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


# ---- the module's main() against the lab's kernel rules (a stand-in AnsibleModule runs its commands) ---------

class Done(Exception):
    pass


class Host:
    """modprobe/rmmod/modinfo/systemctl of a host whose kernel is fleetctl_lab.kernel.Modules."""

    UNITS = ("nvidia-persistenced.service", "nvidia-fabricmanager.service")

    def __init__(self, tmp_path, loaded="550.163.01", installed="570.86.15"):
        self.kernel = Modules(tmp_path / "kernel", nvswitch=True)
        for name in ("nvidia_drm", "nvidia_uvm"):
            self.kernel.load(name, (loaded, "open"))
        self.installed = installed
        self.active, self.enabled, self.cannot_start = set(self.UNITS), set(self.UNITS), set()
        self.others: dict[str, list[str]] = {}  # module -> users beyond the units (a GPU process, a console)
        self.calls: list[list[str]] = []
        self.crash_after: int | None = None  # rmmods before the controller "dies"
        self.refresh()

    def users(self, name):
        daemons = ["nvidia-persistenced", "nv-fabricmanager"] if name == "nvidia" else []
        return [d for d, u in zip(daemons, self.UNITS) if u in self.active] + self.others.get(name, [])

    def refresh(self):
        self.kernel.write_refcnt(self.users)

    def run_command(self, argv):
        self.calls.append(argv)
        try:
            return self.command(argv)
        finally:
            self.refresh()

    def command(self, argv):
        tool, unit = argv[0], argv[-1]
        if tool == "modinfo":
            return 0, self.installed + "\n", ""
        if tool == "rmmod":
            if self.crash_after is not None and sum(c[0] == "rmmod" for c in self.calls) > self.crash_after:
                raise KeyboardInterrupt("the controller died")
            rc, err = self.kernel.unload(argv[1], self.users)
            return rc, "", err
        if tool == "modprobe":
            try:
                self.kernel.load(argv[1], (self.installed, "open"))
                return 0, "", ""
            except OSError as e:
                return 1, "", f"modprobe: {e}"
        verb = argv[1]
        if verb == "is-active":
            return (0 if unit in self.active else 3), "", ""
        if verb == "is-enabled":
            return (0 if unit in self.enabled else 1), "", ""
        if verb == "stop":
            self.active.discard(unit)
            return 0, "", ""
        if unit in self.cannot_start:
            return 1, "", f"Job for {unit} failed because the control process exited with error code."
        self.active.add(unit)
        return 0, "", ""


def run_module(host, monkeypatch, tmp_path, version="570.86.15"):
    module = reload_module()
    monkeypatch.setattr(module, "SYS_MODULE", str(host.kernel.sys_module))
    monkeypatch.setattr(module, "MARKER", str(tmp_path / "run/nvidia-module-reload.json"))

    class Stand(object):
        params = {"version": version, "units": list(Host.UNITS)}
        check_mode = False
        run_command = staticmethod(host.run_command)

        def exit_json(self, **kw):
            raise Done(dict(kw, failed=False))

        def fail_json(self, **kw):
            raise Done(dict(kw, failed=True))
    monkeypatch.setattr(module, "AnsibleModule", lambda **_kw: Stand())
    with pytest.raises(Done) as done:
        module.main()
    return done.value.args[0]


def versions(host):
    return {n: host.kernel.version(n) for n in ("nvidia", "nvidia_modeset", "nvidia_uvm")}


def test_reload_loads_the_installed_driver_and_the_daemons_come_back(tmp_path, monkeypatch):
    host = Host(tmp_path)
    result = run_module(host, monkeypatch, tmp_path)
    assert not result["failed"] and result["changed"] and result["outcome"] == "loaded"
    assert result["unloaded"] == ["nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]
    assert set(versions(host).values()) == {"570.86.15"} and host.kernel.loaded("nvidia_drm")
    assert host.active == set(Host.UNITS) and not (tmp_path / "run/nvidia-module-reload.json").exists()
    again = run_module(host, monkeypatch, tmp_path)
    assert not again["failed"] and not again["changed"]  # idempotent


def test_a_module_in_use_is_refused_before_anything_is_unloaded(tmp_path, monkeypatch):
    host = Host(tmp_path)
    host.others["nvidia"] = ["nv-hostengine (pid 4242)"]  # DCGM: not one of the units
    result = run_module(host, monkeypatch, tmp_path)
    assert result["failed"] and result["outcome"] == "refused"
    assert "nvidia (refcnt 3, 2 from modules)" in result["msg"]
    assert not any(c[0] == "rmmod" for c in host.calls)
    assert set(versions(host).values()) == {"550.163.01"} and host.kernel.loaded("nvidia_drm")
    assert host.active == set(Host.UNITS) and not (tmp_path / "run/nvidia-module-reload.json").exists()


def test_a_module_not_built_for_the_kernel_is_found_before_anything_stops(tmp_path, monkeypatch):
    host = Host(tmp_path, installed="550.163.01")  # the package changed, its DKMS build did not
    result = run_module(host, monkeypatch, tmp_path)
    assert result["outcome"] == "not_installed" and "installed for this kernel is 550.163.01" in result["msg"]
    assert [c[0] for c in host.calls] == ["modinfo"]


def test_a_run_killed_with_the_modules_out_is_finished_by_the_next(tmp_path, monkeypatch):
    host = Host(tmp_path)
    host.crash_after = 2
    with pytest.raises(KeyboardInterrupt):
        run_module(host, monkeypatch, tmp_path)
    assert not host.active and not host.kernel.loaded("nvidia_modeset") and host.kernel.loaded("nvidia")
    host.crash_after = None
    result = run_module(host, monkeypatch, tmp_path)
    assert result["outcome"] == "loaded" and set(versions(host).values()) == {"570.86.15"}
    assert host.kernel.loaded("nvidia_drm") and host.active == set(Host.UNITS)  # remembered across the crash


def test_units_that_were_running_must_start_only_enabled_ones_may_not(tmp_path, monkeypatch):
    host = Host(tmp_path)
    host.active.discard("nvidia-fabricmanager.service")  # enabled from an image, cannot run here
    host.cannot_start.add("nvidia-fabricmanager.service")
    result = run_module(host, monkeypatch, tmp_path)
    assert result["outcome"] == "loaded" and "nvidia-fabricmanager.service" in result["not_started"]
    host = Host(tmp_path / "second")
    host.cannot_start.add("nvidia-persistenced.service")
    result = run_module(host, monkeypatch, tmp_path)
    assert result["failed"] and result["outcome"] == "failed"
    assert "driver 570.86.15 loaded, but starting nvidia-persistenced.service failed" in result["msg"]
