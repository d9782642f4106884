"""The controls registry (orchestrator/controls/): every role the campaign asks for holds exactly the controls that had
it when the roles were tuples in plan.py and campaign/steps.py, each family module declares its own controls, no
tuple of control ids lives outside the registry, and the README's control table lists the registry."""

from __future__ import annotations

import ast
import re

import pytest

from orchestrator import controls, resources

GPU = {"gpu.count", "gpu.ecc", "gpu.ecc_errors", "gpu.remapped_rows", "gpu.retired_pages", "gpu.mig", "gpu.pcie",
       "gpu.clocks", "gpu.xid", "gpu.recovery_action", "gpu.pcie_errors", "gpu.memory_leak", "gpu.firmware_uniform"}
INTERCONNECT = {"gpu.fabric", "gpu.topology", "gpu.nvlink", "nvswitch.sxid"}  # was steps.INTERCONNECT_CONTROLS
IB = {"ib.ports", "ib.rate"}
DRIVER = {"driver.installed", "driver.loaded", "driver.version_match", "driver.version_allowed", "driver.flavor",
          "driver.held", "driver.cuda_support", "driver.next_boot"}
# Each role as it was before the registry (hard-coded here so that a role lost on the way shows).
ROLES = {
    # plan.HEALTH_CONTROLS and "every gpu.* control"
    "health": {"driver.loaded", "driver.version_match"} | GPU | INTERCONNECT | IB,
    # plan.BOOT_RISK_CONTROLS
    "boot_risk": {"nouveau.not_loaded", "nouveau.blacklisted", "driver.next_boot"},
    # policy's roles=("target",)
    "target": {"driver.version_allowed", "driver.flavor", "driver.cuda_support", "fabricmanager.version"},
    "interconnect": INTERCONNECT,
    # steps.RESTORED_CONTROLS: the prefixes driver., nouveau., persistence., runtime., fabricmanager.
    "restored_on_rollback": DRIVER | {"nouveau.not_loaded", "nouveau.blacklisted", "nouveau.initramfs",
                                      "persistence.mode", "persistence.daemon", "runtime.nvidia", "runtime.default",
                                      "runtime.toolkit", "runtime.cdi", "fabricmanager.version"},
    # steps.JUDGED_BY_VERIFY
    "judged_by_verify": {"driver.installed", "driver.loaded", "driver.version_match", "driver.held",
                         "driver.next_boot", "gpu.count"} | INTERCONNECT,
    # steps.not_restored's exclusion ("driver.held", "driver.next_boot")
    "verify_always": {"driver.held", "driver.next_boot"},
}
FAMILIES = {"driver": "driver.", "nouveau": "nouveau.", "persistence": "persistence.", "runtime": "runtime.",
            "fabric": "fabricmanager.", "gpu": "gpu.", "interconnect": ("gpu.nvlink", "gpu.fabric", "gpu.topology",
                                                                        "gpudirect.", "nvswitch.", "ib.")}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_role_the_campaign_uses_holds_its_controls(role):
    assert controls.with_role(role), role
    assert set(controls.with_role(role)) == ROLES[role]


def test_every_declared_role_is_used_and_known():
    assert set(controls.ROLES) == set(ROLES)
    assert {r for c in controls.CONTROLS for r in c.roles} <= set(controls.ROLES)
    with pytest.raises(KeyError):
        controls.with_role("healthy")


def test_roles_the_code_asks_for_are_declared():
    """Every with_role("...") in the package names a role of the registry."""
    asked = set()
    for path in (resources.root() / "orchestrator").rglob("*.py"):
        asked |= set(re.findall(r"with_role\(\"([a-z_]+)\"\)", path.read_text()))
    assert {"health", "boot_risk", "target", "interconnect", "restored_on_rollback", "judged_by_verify",
            "verify_always"} <= asked <= set(controls.ROLES)


def test_reference_controls():
    assert controls.reference_controls() == ["gpu.nvlink", "gpu.topology"]


def test_each_family_module_declares_its_own_controls():
    by_module = {}
    for c in controls.CONTROLS:
        by_module.setdefault(c.evaluate.__module__.rsplit(".", 1)[-1], []).append(c.id)
    assert set(by_module) == set(FAMILIES)
    for family, ids in by_module.items():
        assert all(i.startswith(FAMILIES[family]) for i in ids), (family, ids)
    assert len(controls.CONTROLS) == len({c.id for c in controls.CONTROLS})


def test_no_tuple_of_control_ids_outside_the_registry():
    """A collection literal of two or more control ids (or control-id prefixes) outside orchestrator/controls/ is a
    role kept away from its controls: declare the role on the controls instead."""
    ids = {c.id for c in controls.CONTROLS}
    prefixes = {i.split(".")[0] + "." for i in ids}
    found = []
    for path in sorted((resources.root() / "orchestrator").rglob("*.py")):
        if "controls" in path.relative_to(resources.root() / "orchestrator").parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                named = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in ids | prefixes]
                if len(named) >= 2:
                    found.append(f"{path.name}:{node.lineno}: {named}")
    assert found == []


def readme_table() -> dict[str, str]:
    text = (resources.root() / "README.md").read_text()
    section = text.split("## What the audit checks", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([^`]+)` \| ([a-z]+) \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_the_readme_table_lists_every_control_with_its_severity():
    rows = readme_table()
    assert rows == {c.id: c.severity for c in controls.CONTROLS}
    assert list(rows) == [c.id for c in controls.CONTROLS]  # in the order findings are listed
