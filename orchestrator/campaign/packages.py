"""Which exact packages a host moves to (upgrade) and back (rollback), from the packages its facts list.

The driver-versioned packages are those of role driver, persistenced, fabricmanager or imex whose upstream version
is the running driver's (nvidia-driver-550-open 550.163.01-0ubuntu1, nvidia-fabricmanager-550, libnvidia-nscq-550,
nvidia-persistenced, nvidia-imex-570 ...: IMEX refuses to start against another driver). An upgrade asks for each of them at the target version, renamed to the target branch
where the name carries the branch (each packaging family's spelling: collections/ansible_collections/fleetctl/gpu/plugins/module_utils/
fleetctl_packaging.py, the same rules the hosts apply); the container toolkit and anything not versioned with the
driver is left alone. A rollback asks for exactly the recorded set, distro versions and all.
"""

from __future__ import annotations

from typing import Any

from .. import resources

DRIVER_VERSIONED_ROLES = ("driver", "persistenced", "fabricmanager", "imex")


def upstream(version: str) -> str:
    """'1:570.86.15-0ubuntu1' -> '570.86.15'."""
    return version.split(":", 1)[-1].split("-", 1)[0]


def branch(version: str) -> str:
    return upstream(version).split(".", 1)[0]


def driver_versioned(packages: list[dict[str, Any]], running: str) -> dict[str, str]:
    """name -> exact distro version of the packages that move with the driver (the rollback set)."""
    return {p["name"]: p["version"] for p in packages
            if p["role"] in DRIVER_VERSIONED_ROLES and upstream(p["version"]) == running}


def target_set(before: dict[str, str], running: str, target: str) -> dict[str, str]:
    """The upgrade's package requests: each driver-versioned package at TARGET, spelled for TARGET's branch
    (nvidia-driver-550-open -> nvidia-driver-570-open, nvidia-tesla-470-driver -> nvidia-tesla-535-driver; a host
    whose repositories hold TARGET under another of Debian's spellings gets that one: nvidia_driver_packages; a part
    the new branch no longer ships, such as libnvidia-tesla-470-cbl, is not asked for and is removed with the old
    branch)."""
    packaging = resources.module_utils("fleetctl_packaging")
    old, new = branch(running), branch(target)
    named = [packaging.on_branch(name, new) if packaging.on_name_branch(name) == old else name
             for name in before if not packaging.comes_with_dependents(name)]
    return {name: target for name in named if name}  # a part the new branch dropped goes with the old branch


def flavor_of(names: list[str], current: str | None) -> str | None:
    """The kernel module flavor a set of driver packages installs: open where a branch-named package says -open
    (nvidia-driver-570-open, nvidia-driver-570-server-open), proprietary where the same spelling has none while the
    running one had it; else (names that do not tell, as Debian's) what runs now."""
    packaging = resources.module_utils("fleetctl_packaging")
    branched = [n for n in names if packaging.on_name_branch(n)]
    if any(n.endswith("-open") for n in branched):
        return "open"
    if branched and current == "open":
        return "proprietary"
    return current


def is_fabric_manager(name: str) -> bool:
    return resources.module_utils("fleetctl_packaging").role(name) == "fabricmanager"


def is_imex(name: str) -> bool:
    return resources.module_utils("fleetctl_packaging").role(name) == "imex"


def describe(packages: dict[str, str]) -> str:
    return " ".join(f"{n}={v}" for n, v in sorted(packages.items()))
