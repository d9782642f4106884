#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Load the installed NVIDIA kernel module without a reboot: stop the driver's daemons, unload every nvidia module
(holders first), load the same set again, start the daemons (those active or enabled before).

Idempotent and safe to run again after an interruption: nothing happens when the loaded module already is the
wanted version; the daemons it stopped are remembered in /run (cleared by a reboot, when they start anyway), so a
run that died with the modules unloaded starts them on the next run.

Fails, changing nothing more, when a module cannot be unloaded (still in use: a display on nvidia_drm, a process
holding /dev/nvidia*). Whoever called it decides what then (the role reboots instead).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: nvidia_module_reload
short_description: Reload the NVIDIA kernel modules so the installed driver runs
description:
  - Stops the given systemd units when active, unloads the loaded nvidia modules (each after the modules that
    hold it), loads the same modules again (the installed version), checks the loaded version and starts the
    units again.
options:
  version:
    description: The driver version that must be loaded afterwards; nothing is done when it already is.
    type: str
    required: true
  units:
    description: Units holding the driver open, stopped before and started after (when active or enabled).
    type: list
    elements: str
    default: [nvidia-persistenced.service, nvidia-fabricmanager.service]
author: fleetctl
"""

RETURN = r"""
before: {description: The module version loaded before (null when none), type: str, returned: always}
loaded: {description: The module version loaded after, type: str, returned: always}
unloaded: {description: Modules unloaded, in order, type: list, returned: always}
reloaded: {description: Modules loaded, in order, type: list, returned: always}
units: {description: Units stopped (when active) and started after, type: list, returned: always}
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule

SYS_MODULE = "/sys/module"
MARKER = "/run/fleetctl/nvidia-module-reload.json"
NVIDIA_MODULE = re.compile(r"^nvidia(_[a-z0-9_]+)?$")
UNIT = re.compile(r"^[A-Za-z0-9@._:-]+$")


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except (IOError, OSError):
        return None


def loaded_version(sys_module=SYS_MODULE):
    return read(os.path.join(sys_module, "nvidia", "version"))


def holders(sys_module, name):
    try:
        return sorted(os.listdir(os.path.join(sys_module, name, "holders")))
    except OSError:
        return []


def unload_order(sys_module=SYS_MODULE):
    """The loaded nvidia modules and every module holding one, each listed after all modules holding it."""
    try:
        names = os.listdir(sys_module)
    except OSError:
        return []
    roots = sorted(n for n in names if NVIDIA_MODULE.match(n) and os.path.exists(os.path.join(sys_module, n, "initstate")))
    order, seen = [], set()

    def visit(name, path):
        if name in seen:
            return
        if name in path:
            raise ValueError("module holders form a cycle: %s" % " -> ".join(path + [name]))
        for holder in holders(sys_module, name):
            visit(holder, path + [name])
        seen.add(name)
        order.append(name)
    for root in roots:
        visit(root, [])
    return order


def remembered():
    try:
        with open(MARKER) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (IOError, OSError, ValueError):
        return {}


def remember(data):
    os.makedirs(os.path.dirname(MARKER), exist_ok=True)
    tmp = MARKER + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.rename(tmp, MARKER)


def run(module, argv, what):
    rc, out, err = module.run_command(argv)
    if rc != 0:
        text = " | ".join(line.strip() for line in (err or out).strip().splitlines()[-2:]) or "exit %d" % rc
        return "%s: %s" % (what, text)
    return None


def restore(module, state):
    """An unload refused: put back what was unloaded and started what was stopped, as it was before."""
    for name in state["modules"]:
        module.run_command(["modprobe", name])
    for unit in state["units"]:
        module.run_command(["systemctl", "start", unit])
    os.unlink(MARKER)


def main():
    module = AnsibleModule(argument_spec=dict(version=dict(type="str", required=True),
                                              units=dict(type="list", elements="str",
                                                         default=["nvidia-persistenced.service",
                                                                  "nvidia-fabricmanager.service"])),
                           supports_check_mode=True)
    want, units = module.params["version"], module.params["units"]
    for unit in units:
        if not UNIT.match(unit):
            module.fail_json(msg="not a unit name: %r" % unit)
    before = loaded_version()
    result = dict(before=before, loaded=before, unloaded=[], reloaded=[], units=[])
    state = remembered()
    if before == want and not state:
        module.exit_json(changed=False, **result)
    if module.check_mode:
        module.exit_json(changed=True, **result)

    # What to put back: the modules and units loaded/active before the first attempt, even if it was interrupted.
    try:
        order = unload_order()
    except ValueError as e:
        module.fail_json(msg=str(e), **result)
    state.setdefault("modules", list(reversed(order)) or ["nvidia"])
    state.setdefault("units", [])
    for unit in units:
        # Enabled counts too: a package upgrade restarts fabric manager, which fails against the old module.
        if unit not in state["units"] and any(module.run_command(["systemctl", verb, "--quiet", unit])[0] == 0
                                              for verb in ("is-active", "is-enabled")):
            state["units"].append(unit)
    remember(state)
    result["units"] = state["units"]

    if before != want:
        for unit in reversed(state["units"]):
            problem = run(module, ["systemctl", "stop", unit], "stopping %s" % unit)
            if problem:
                module.fail_json(msg=problem, **result)
        for name in order:
            problem = run(module, ["rmmod", name], "unloading %s" % name)
            if problem:
                restore(module, state)
                module.fail_json(msg=problem, **result)
            result["unloaded"].append(name)
        for name in state["modules"]:
            problem = run(module, ["modprobe", name], "loading %s" % name)
            if problem:
                module.fail_json(msg=problem, **result)
            result["reloaded"].append(name)
    result["loaded"] = loaded_version()
    if result["loaded"] != want:
        module.fail_json(msg="after the reload the loaded module is %s, not %s (is the installed kernel module %s?)"
                         % (result["loaded"] or "none", want, want), **result)
    for unit in state["units"]:
        problem = run(module, ["systemctl", "start", unit], "starting %s" % unit)
        if problem:
            module.fail_json(msg=problem, **result)
    os.unlink(MARKER)
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
