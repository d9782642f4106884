"""Which exact packages a host moves to (upgrade) and back (rollback), from the packages its facts list.

The driver-versioned packages are those of role driver, persistenced or fabricmanager whose upstream version is
the running driver's (nvidia-driver-550-open 550.163.01-0ubuntu1, nvidia-fabricmanager-550, libnvidia-nscq-550,
nvidia-persistenced ...). An upgrade asks for each of them at the target version, renamed to the target branch
where the name carries the branch; the container toolkit and anything not versioned with the driver is left alone.
A rollback asks for exactly the recorded set, distro versions and all.
"""

from __future__ import annotations

import re
from typing import Any

DRIVER_VERSIONED_ROLES = ("driver", "persistenced", "fabricmanager")
_BRANCHED = re.compile(r"^(?P<stem>((lib)?nvidia-[a-z0-9-]*?|cuda-drivers(-fabricmanager)?)-)(?P<branch>\d{3})"
                       r"(?P<flavor>-open|-server|-server-open)?$")


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
    """The upgrade's package requests: each driver-versioned package at TARGET, on TARGET's branch."""
    old, new = branch(running), branch(target)
    out = {}
    for name in before:
        m = _BRANCHED.match(name)
        if m and m["branch"] == old:
            name = m["stem"] + new + (m["flavor"] or "")
        out[name] = target
    return out


def describe(packages: dict[str, str]) -> str:
    return " ".join(f"{n}={v}" for n, v in sorted(packages.items()))
