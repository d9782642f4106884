"""driver.next_boot: the kernel a host boots next and whether it has the driver's module, read from /boot and
/lib/modules trees laid out as Ubuntu (GRUB_DEFAULT=0, DKMS), EL (BLS entries, GRUB_DEFAULT=saved) and a VM whose
kernel comes from outside leave them; dkms status in both of its real output forms."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

from orchestrator import controls, schemas

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("fleetctl_boot_under_test", ROOT / "collections/ansible_collections/fleetctl/gpu/plugins/module_utils/fleetctl_boot.py")
boot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(boot)

OLD, NEW = "6.8.0-45-generic", "6.8.0-47-generic"
# Ubuntu's generated grub.cfg: the newest kernel first (update-grub runs from the kernel's postinst).
GRUB_CFG = f"""### BEGIN /etc/grub.d/10_linux ###
menuentry 'Ubuntu' --class ubuntu --class gnu-linux --class gnu --class os $menuentry_id_option 'gnulinux-simple-4b1c' {{
	recordfail
	linux	/boot/vmlinuz-{NEW} root=UUID=4b1c ro  quiet splash $vt_handoff
	initrd	/boot/initrd.img-{NEW}
}}
submenu 'Advanced options for Ubuntu' $menuentry_id_option 'gnulinux-advanced-4b1c' {{
	menuentry 'Ubuntu, with Linux {OLD}' --class ubuntu $menuentry_id_option 'gnulinux-{OLD}-advanced-4b1c' {{
		linux	/boot/vmlinuz-{OLD} root=UUID=4b1c ro  quiet splash $vt_handoff
	}}
}}
"""


def tree(tmp_path: Path, kernels: dict[str, str | None], grub_cfg: str | None = GRUB_CFG, default: str = "0",
         grubenv: str = "# GRUB Environment Block\n") -> dict[str, str]:
    """A root with /boot (a vmlinuz per kernel), /lib/modules (an nvidia.ko.zst holding VERSION where given) and
    /etc/default/grub; the paths boot_facts takes."""
    (tmp_path / "boot/grub").mkdir(parents=True)
    for release, version in kernels.items():
        (tmp_path / f"boot/vmlinuz-{release}").write_text("kernel")
        (tmp_path / f"lib/modules/{release}/kernel").mkdir(parents=True)
        if version:
            dkms = tmp_path / f"lib/modules/{release}/updates/dkms"
            dkms.mkdir(parents=True)
            (dkms / "nvidia.ko.zst").write_text(version)
    if grub_cfg is not None:
        (tmp_path / "boot/grub/grub.cfg").write_text(grub_cfg)
    (tmp_path / "boot/grub/grubenv").write_text(grubenv)
    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/grub").write_text(f'GRUB_DEFAULT={default}\nGRUB_TIMEOUT=0\n')
    return {"boot": str(tmp_path / "boot"), "modules_root": str(tmp_path / "lib/modules"),
            "default_grub": str(tmp_path / "etc/default/grub")}


def read_version(path: str) -> str:
    return Path(path).read_text()  # stands in for modinfo -F version on the fake module


def facts_with(boot_fact: dict | None, userspace: str = "570.86.15") -> dict:
    """The real H100 capture's facts (tests/testdata/h100-580.159.04-audit) with this driver and boot state."""
    report = json.loads((ROOT / "tests/testdata/h100-580.159.04-audit/audit-nvml.json").read_text())
    facts = copy.deepcopy(report["hosts"][0]["facts"])
    facts["driver"].update(state="loaded", module_version=userspace, userspace_version=userspace)
    facts["boot"] = boot_fact
    facts["errors"] = {}
    return facts


def next_boot(facts: dict) -> dict:
    return next(f for f in controls.evaluate(facts, {}) if f["control"] == "driver.next_boot")


def test_an_unattended_kernel_update_without_its_module_is_critical_before_the_reboot(tmp_path):
    paths = tree(tmp_path, {OLD: "570.86.15", NEW: None})
    dkms = (f"nvidia/570.86.15, {OLD}, x86_64: installed\n"
            f"nvidia/570.86.15: added\n")  # the build for the new kernel never happened (no headers)
    fact = boot.boot_facts(OLD, dkms, read_version, **paths)
    assert (fact["next_kernel"], fact["next_kernel_source"]) == (NEW, "grub.cfg")
    assert fact["kernels"] == [OLD, NEW]
    assert fact["modules"][0]["version"] == "570.86.15" and fact["modules"][0]["dkms"][0]["state"] == "installed"
    assert fact["modules"][1] == {"kernel": NEW, "files": [], "version": None, "dkms": []}
    facts = facts_with(fact)
    assert schemas.first_error("host-facts", facts) is None
    finding = next_boot(facts)
    assert (finding["status"], finding["severity"]) == ("fail", "critical")
    assert f"boots {NEW} next (grub.cfg) and no nvidia module is installed for it" in finding["message"]
    assert "dkms autoinstall" in finding["remediation"]


def test_the_module_built_for_the_next_kernel_passes_and_a_stale_one_is_a_mismatch(tmp_path):
    paths = tree(tmp_path, {OLD: "570.86.15", NEW: "570.86.15"})
    good = boot.boot_facts(OLD, None, read_version, **paths)
    assert next_boot(facts_with(good))["status"] == "pass"
    stale = boot.boot_facts(OLD, None, read_version, **paths)
    finding = next_boot(facts_with(stale, userspace="570.124.06"))  # userspace moved, the module did not
    assert finding["status"] == "fail" and "nvidia module 570.86.15, but the installed driver is 570.124.06" \
        in finding["message"]


def test_grub_reboot_and_a_saved_default_decide_before_the_menu_order(tmp_path):
    paths = tree(tmp_path, {OLD: "570.86.15", NEW: None}, grubenv=f"saved_entry=gnulinux-{OLD}-advanced-4b1c\n")
    assert boot.next_kernel(paths["boot"], paths["default_grub"])[0] == NEW  # GRUB_DEFAULT=0: saved_entry unused
    Path(paths["default_grub"]).write_text("GRUB_DEFAULT=saved\n")
    assert boot.next_kernel(paths["boot"], paths["default_grub"]) == (OLD, "grubenv")
    Path(paths["boot"], "grub/grubenv").write_text(f"saved_entry=gnulinux-{OLD}-advanced-4b1c\n"
                                                   f"next_entry=Ubuntu, with Linux {NEW}\n")
    assert boot.next_kernel(paths["boot"], paths["default_grub"]) == (NEW, "grubenv")


def test_enterprise_linux_boot_loader_entries(tmp_path):
    el_old, el_new = "5.14.0-427.13.1.el9_4.x86_64", "5.14.0-503.14.1.el9_5.x86_64"
    paths = tree(tmp_path, {el_old: "570.86.15", el_new: "570.86.15"}, grub_cfg=None, default="saved",
                 grubenv=f"saved_entry=6a1f2b-{el_old}\nboot_success=1\n")
    entries = tmp_path / "boot/loader/entries"
    entries.mkdir(parents=True)
    for release in (el_old, el_new):
        (entries / f"6a1f2b-{release}.conf").write_text(
            f"title Red Hat Enterprise Linux ({release}) 9.5\nversion {release}\nlinux /vmlinuz-{release}\n"
            f"initrd /initramfs-{release}.img $tuned_initrd\noptions root=/dev/mapper/rhel-root ro\n")
    assert boot.next_kernel(paths["boot"], paths["default_grub"]) == (el_old, "grubenv")  # grubby --set-default
    Path(paths["boot"], "grub/grubenv").write_text("boot_success=1\n")
    assert boot.next_kernel(paths["boot"], paths["default_grub"]) == (el_new, "loader")


def test_a_host_whose_kernel_comes_from_outside_is_not_applicable(tmp_path):
    fact = boot.boot_facts("6.18.44-fc-v657-gpu", None, read_version, boot=str(tmp_path / "boot"),
                           modules_root=str(tmp_path / "lib/modules"), default_grub=str(tmp_path / "grub"))
    assert fact["next_kernel"] is None and fact["kernels"] == []
    finding = next_boot(facts_with(fact))
    assert finding["status"] == "not_applicable" and "kernel comes from outside" in finding["message"]
    assert next_boot(facts_with(None))["status"] == "not_applicable"


def test_an_unreadable_module_version_is_an_error_not_a_pass():
    facts = facts_with({"running_kernel": OLD, "kernels": [OLD], "next_kernel": OLD, "next_kernel_source": "newest",
                        "modules": [{"kernel": OLD, "files": ["/x/nvidia.ko"], "version": None, "dkms": None}]})
    facts["errors"] = {"boot.modules": "modinfo -F version /x/nvidia.ko exited 1: not an ELF file"}
    assert next_boot(facts)["status"] == "error"


@pytest.mark.parametrize("line, parsed", [
    ("nvidia/570.86.15, 6.8.0-47-generic, x86_64: installed",
     {"module": "nvidia", "version": "570.86.15", "kernel": "6.8.0-47-generic", "state": "installed", "note": None}),
    ("nvidia, 535.216.03, 6.1.0-27-amd64, x86_64: installed (original_module exists)",
     {"module": "nvidia", "version": "535.216.03", "kernel": "6.1.0-27-amd64", "state": "installed",
      "note": "original_module exists"}),
    ("nvidia-current/535.216.03, 6.1.0-28-amd64, x86_64: built", {"module": "nvidia-current", "version": "535.216.03",
                                                                 "kernel": "6.1.0-28-amd64", "state": "built",
                                                                 "note": None}),
    ("nvidia/570.86.15: added", None)])
def test_dkms_status_forms(line, parsed):
    assert boot.parse_dkms_status(line) == ([parsed] if parsed else [])


def test_kernel_versions_sort_numerically():
    assert sorted(["6.10.0-1-generic", "6.8.0-47-generic", "6.8.0-100-generic", "6.9.2"], key=boot.version_key) == \
        ["6.8.0-47-generic", "6.8.0-100-generic", "6.9.2", "6.10.0-1-generic"]


def test_the_campaigns_verify_fails_a_host_that_would_lose_its_driver_at_the_next_reboot(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from orchestrator.campaign import steps
    paths = tree(tmp_path, {OLD: "570.86.15", NEW: None})
    facts = facts_with(boot.boot_facts(OLD, None, read_version, **paths))
    facts["driver"]["held"] = True
    entry = {"facts": facts, "findings": controls.evaluate(facts, {}), "error": None}
    monkeypatch.setattr(steps, "facts_after_activation", lambda ctx, hosts: {"gpu-01": entry})
    ctx = SimpleNamespace(befores={"gpu-01": {"gpus": len(facts["gpus"])}})
    got = steps._verify(ctx, ["gpu-01"], lambda h: "570.86.15")["gpu-01"]
    assert got.outcome == "fail" and f"driver.next_boot: the host boots {NEW} next" in got.reason
    Path(paths["modules_root"], NEW, "updates/dkms").mkdir(parents=True)
    Path(paths["modules_root"], NEW, "updates/dkms/nvidia.ko.zst").write_text("570.86.15")  # DKMS built it
    facts["boot"] = boot.boot_facts(OLD, None, read_version, **paths)
    entry["findings"] = controls.evaluate(facts, {})
    assert steps._verify(ctx, ["gpu-01"], lambda h: "570.86.15")["gpu-01"].outcome == "ok"
