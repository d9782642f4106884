"""The controls registry (orchestrator/controls/): every role the campaign asks for holds exactly the controls that had
it when the roles were tuples in plan.py and campaign/steps.py, each family module declares its own controls, no
tuple of control ids lives outside the registry, and every control says when it fails (the docs' table)."""

from __future__ import annotations

import ast
import re

import pytest

from orchestrator import controls, resources

GPU = {"gpu.count", "gpu.ecc", "gpu.ecc_errors", "gpu.remapped_rows", "gpu.retired_pages", "gpu.mig", "gpu.pcie",
       "gpu.clocks", "gpu.xid", "gpu.recovery_action", "gpu.pcie_errors", "gpu.memory_leak", "gpu.firmware_uniform"}
INTERCONNECT = {"gpu.fabric", "gpu.topology", "gpu.nvlink", "nvswitch.sxid"}  # was steps.INTERCONNECT_CONTROLS
# issue 34: the fabric clique a GPU belongs to, the IMEX service and domain of a rack-scale NVLink domain
CLIQUE, IMEX_SERVICE, IMEX_VERSION, IMEX_DOMAIN = "gpu.fabric_clique", "imex.service", "imex.version", "imex.domain"
IB = {"ib.ports", "ib.rate"}
DRIVER = {"driver.installed", "driver.loaded", "driver.version_match", "driver.version_allowed", "driver.flavor",
          "driver.held", "driver.cuda_support", "driver.next_boot"}
# Each role as it was before the registry (hard-coded here so that a role lost on the way shows).
ROLES = {
    # plan.HEALTH_CONTROLS and "every gpu.* control"
    "health": {"driver.loaded", "driver.version_match"} | GPU | INTERCONNECT | IB | {CLIQUE, IMEX_SERVICE},
    # plan.BOOT_RISK_CONTROLS
    "boot_risk": {"nouveau.not_loaded", "nouveau.blacklisted", "driver.next_boot"},
    # policy's roles=("target",)
    "target": {"driver.version_allowed", "driver.flavor", "driver.cuda_support", "fabricmanager.version", IMEX_VERSION},
    "interconnect": INTERCONNECT | {IMEX_DOMAIN},
    # steps.RESTORED_CONTROLS: the prefixes driver., nouveau., persistence., runtime., fabricmanager.
    "restored_on_rollback": DRIVER | {"nouveau.not_loaded", "nouveau.blacklisted", "nouveau.initramfs",
                                      "persistence.mode", "persistence.daemon", "runtime.nvidia", "runtime.default",
                                      "runtime.toolkit", "runtime.cdi", "fabricmanager.version", IMEX_SERVICE,
                                      IMEX_VERSION},
    # steps.JUDGED_BY_VERIFY
    "judged_by_verify": {"driver.installed", "driver.loaded", "driver.version_match", "driver.held",
                         "driver.next_boot", "gpu.count"} | INTERCONNECT | {CLIQUE, IMEX_DOMAIN},
    # steps.not_restored's exclusion ("driver.held", "driver.next_boot")
    "verify_always": {"driver.held", "driver.next_boot"},
    # steps.imex_pending: what says a domain has re-formed after its activation
    "domain_formed": {IMEX_SERVICE, IMEX_DOMAIN},
    # soak.observe: what a job starting or ending can fail for a moment
    "not_soaked": {"gpu.memory_leak"},
}
FAMILIES = {"driver": "driver.", "nouveau": "nouveau.", "persistence": "persistence.", "runtime": "runtime.",
            "fabric": "fabricmanager.", "gpu": "gpu.", "interconnect": ("gpu.nvlink", "gpu.fabric", "gpu.topology",
                                                                        "gpudirect.", "nvswitch.", "ib."),
            "imex": ("imex.", "nvlink.")}


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
            "verify_always", "domain_formed", "not_soaked"} <= asked <= set(controls.ROLES)


def test_reference_controls():
    assert controls.reference_controls() == ["gpu.nvlink", "gpu.fabric_clique", "gpu.topology"]


def test_peer_controls_and_whom_they_compare_a_host_with():
    """The inventory group for firmware; the NVLink domain (domains.group) for what a rack-scale domain must share.
    None of them is a health control: a mixed domain must stay one a campaign can repair."""
    assert {c.id: c.peers_by for c in controls.peer_controls()} == {
        "gpu.firmware_uniform": "group", "nvlink.domain_uniform": "nvlink_domain",
        "nvlink.domain_declared": "nvlink_domain"}
    assert not {"nvlink.domain_uniform", "nvlink.domain_declared"} & set(controls.with_role("health"))


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


def test_every_control_says_when_it_fails():
    """A control's docstring is its rule on the docs' controls page (docs/hooks/generate.py; tests/unit/test_docs.py
    holds the built page to the registry): it says when the control fails or warns."""
    for c in controls.CONTROLS:
        assert re.match(r"(Fails|Warns) (when|on) ", c.evaluate.__doc__ or ""), c.id
