"""The fabric manager: present, running and at the driver's version where NVSwitches are."""

from __future__ import annotations

from .base import failed, not_applicable, passed, running_version
from .registry import control


@control("fabricmanager.version", "Fabric manager matches the driver", "critical", ("fabric_manager",),
         "install nvidia-fabricmanager of exactly the driver's version and enable it",
         roles=("target", "restored_on_rollback"))
def fabricmanager_version(facts, policy):
    """Fails when NVSwitches are present and the fabric manager is missing, not running, or not the driver's version."""
    mode = policy.get("fabric_manager", {}).get("required")
    fm = facts["fabric_manager"]
    if mode is None or mode == "never" or (mode == "auto" and not fm["nvswitch_present"]):
        return not_applicable("no NVSwitch on this host" if mode == "auto" else "not required by the baseline")
    version = running_version(facts)
    package = fm["package_version"]
    if package is None:
        return failed("NVSwitch system without nvidia-fabricmanager: GPUs will not initialize (CUDA error 802)")
    if version and package.split("-", 1)[0] != version:
        return failed(f"fabric manager {package} does not match driver {version}", package=package, driver=version)
    if not fm["running"]:
        return failed("nv-fabricmanager is not running", package=package)
    return passed(f"fabric manager {package} running", package=package)
