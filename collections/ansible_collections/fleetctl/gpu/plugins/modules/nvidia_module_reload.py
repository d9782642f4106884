#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Load the installed NVIDIA kernel module without a reboot: stop the driver's daemons, unload nvidia and every
module holding it (holders first), load the same set again, start the daemons again.

Before anything is unloaded: the module on disk must be the wanted version (modinfo), and after the daemons are
stopped no module may be in use beyond its holders (refcnt, the rule NVIDIA's driver container uses). Otherwise
outcome "refused" (the daemons are started again, nothing else changed; the role may reboot instead) or
"not_installed". Past that point a failure is outcome "failed": the host needs a person or a reboot.

Idempotent and safe to run again after an interruption: nothing happens when the loaded module already is the
wanted version; the daemons it stopped are remembered in /run (cleared by a reboot, when they start anyway), so a
run that died with the modules unloaded starts them on the next run.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvidia_module_reload
short_description: Reload the NVIDIA kernel modules so the installed driver runs
version_added: "0.1.0"
description:
  - Checks that the installed module is the wanted version, stops the given systemd units when active, refuses
    when a module is still in use, unloads nvidia and the modules holding it (holders first), loads the same
    modules again, checks the loaded version and starts the units again.
  - Before anything is unloaded, the module on disk must be I(version) (modinfo), and after the units are stopped no
    module may be in use beyond its holders (refcnt, the rule NVIDIA's driver container uses). Otherwise the outcome
    is C(refused) (the units are started again, nothing else changed; the caller may reboot instead) or
    C(not_installed), and the module fails. Past that point a failure is outcome C(failed) - the host needs a person
    or a reboot.
  - Idempotent and safe to run again after an interruption - nothing happens when the loaded module already is
    I(version); the units it stopped are remembered in C(/run/fleetctl/nvidia-module-reload.json) (cleared by a
    reboot, when they start anyway), so a run that died with the modules unloaded starts them on the next run.
options:
  version:
    description: The driver version that must be loaded afterwards; nothing is done when it already is.
    type: str
    required: true
  units:
    description:
      - Units holding the driver open, stopped before and started after. Those active before must start again;
        those only enabled are started when they can be (fabric manager on a host without NVSwitch cannot).
    type: list
    elements: str
    default: [nvidia-persistenced.service, nvidia-fabricmanager.service, nvidia-imex.service]
attributes:
  check_mode:
    support: full
    description: Reports C(changed=true) without stopping, unloading or loading anything when a reload is due.
  diff_mode:
    support: none
    description: No diff is returned; RV(before) and RV(loaded) say what changed.
  platform:
    platforms: posix
    description: Linux hosts with systemd.
extends_documentation_fragment:
  - action_common_attributes
requirements:
  - Root on the managed host (become).
  - modinfo, rmmod, modprobe and systemctl on the managed host.
notes:
  - Any process with a GPU open keeps the modules in use; wait for them first (M(fleetctl.gpu.gpu_users)).
  - On failure the module still returns RV(outcome) and the other return values with C(msg).
seealso:
  - module: fleetctl.gpu.gpu_users
  - module: fleetctl.gpu.nvidia_driver_packages
author:
  - fleetctl maintainers (@fleetctl)
"""

EXAMPLES = r"""
- name: Load the installed driver 570.86.15 without a reboot
  fleetctl.gpu.nvidia_module_reload:
    version: 570.86.15
  become: true
  register: reload
  failed_when: false

- name: Reboot instead when the reload was refused (modules in use)
  ansible.builtin.reboot:
  become: true
  when: reload.outcome | default('') == 'refused'

- name: Stop when the reload failed half-way
  ansible.builtin.fail:
    msg: "{{ reload.msg }} (unloaded {{ reload.unloaded | default([]) | join(', ') }})"
  when: reload.outcome | default('') in ['failed', 'not_installed']

- name: Reload with DCGM stopped and started around it as well
  fleetctl.gpu.nvidia_module_reload:
    version: 570.86.15
    units:
      - nvidia-dcgm.service
      - nvidia-persistenced.service
      - nvidia-fabricmanager.service
  become: true
  register: reload

- name: Report units that were enabled but could not start
  ansible.builtin.debug:
    var: reload.not_started
  when: reload.not_started | default({}) | length > 0
"""

RETURN = r"""
outcome:
  description:
    - C(loaded) (the wanted version is loaded, or would be reloaded in check mode), C(refused) (nothing changed),
      C(not_installed) (the module on disk is not I(version)) or C(failed) (the host needs a person or a reboot).
  returned: always
  type: str
  choices: [loaded, refused, not_installed, failed]
  sample: loaded
before:
  description: The module version loaded before; null when none was.
  returned: when the unit names are valid
  type: str
  sample: 550.163.01
loaded:
  description:
    - The module version loaded after (on failure, the one loaded then); null in check mode, or when none is loaded.
  returned: when the unit names are valid
  type: str
  sample: 570.86.15
unloaded:
  description: Modules unloaded, in the order they were unloaded (holders first).
  returned: when the unit names are valid
  type: list
  elements: str
  sample: ["nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]
reloaded:
  description: Modules loaded, in the order they were loaded.
  returned: when the unit names are valid
  type: list
  elements: str
  sample: ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]
units:
  description: Units started again after the reload.
  returned: when the unit names are valid
  type: list
  elements: str
  sample: ["nvidia-persistenced.service"]
not_started:
  description: Enabled (not active) units that did not start, unit -> why.
  returned: when the unit names are valid
  type: dict
  sample: {"nvidia-fabricmanager.service": "Job for nvidia-fabricmanager.service failed."}
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_boot import (
    SYS_MODULE, loaded_nvidia_version, read_value)

MARKER = "/run/fleetctl/nvidia-module-reload.json"
UNIT = re.compile(r"^[A-Za-z0-9@._:-]+$")


def holders(sys_module, name):
    try:
        return sorted(os.listdir(os.path.join(sys_module, name, "holders")))
    except OSError:
        return []


def unload_order(sys_module):
    """nvidia and every module holding it, directly or not (nvidia_uvm, nvidia_modeset, nvidia_drm, nvidia_peermem,
    gdrdrv ...), each listed after all modules holding it. Empty when nvidia is not loaded."""
    if not os.path.exists(os.path.join(sys_module, "nvidia", "initstate")):
        return []
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
    visit("nvidia", [])
    return order


def in_use(order, sys_module):
    """Modules of ORDER used beyond their holders: 'name (refcnt N, held by M modules)'."""
    busy = []
    for name in order:
        count = read_value(os.path.join(sys_module, name, "refcnt"))
        held = len(holders(sys_module, name))
        if count is not None and count.isdigit() and int(count) > held:
            busy.append("%s (refcnt %s, %d from modules)" % (name, count, held))
    return busy


def device_users():
    """'comm (pid N)' of processes with a /dev/nvidia* file open."""
    users = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
            if any(os.readlink("/proc/%s/fd/%s" % (pid, fd)).startswith("/dev/nvidia") for fd in fds):
                users.append("%s (pid %s)" % (read_value("/proc/%s/comm" % pid) or "?", pid))
        except OSError:
            continue
    return users


def remembered():
    try:
        with open(MARKER) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (IOError, OSError, ValueError):
        return {}


def remember(data):
    if not os.path.isdir(os.path.dirname(MARKER)):
        os.makedirs(os.path.dirname(MARKER))
    tmp = MARKER + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.rename(tmp, MARKER)


def forget():
    if os.path.exists(MARKER):
        os.unlink(MARKER)


class Reload(object):
    def __init__(self, module, want):
        self.module, self.want = module, want
        self.result = dict(outcome="loaded", before=loaded_nvidia_version(SYS_MODULE), loaded=None, unloaded=[],
                           reloaded=[], units=[], not_started={})

    def run(self, argv):
        """None, or why ARGV failed (its last lines)."""
        rc, out, err = self.module.run_command(argv)
        if rc == 0:
            return None
        return " | ".join(line.strip() for line in (err or out).strip().splitlines()[-2:]) or "exit %d" % rc

    def stop(self, outcome, msg):
        self.result["outcome"] = outcome
        self.result["loaded"] = loaded_nvidia_version(SYS_MODULE)
        self.module.fail_json(msg=msg, **self.result)

    def start_units(self, state):
        """The units active before must start; the only-enabled ones are started when they can be."""
        for unit in state["active"] + state["enabled"]:
            problem = self.run(["systemctl", "start", unit])
            if problem and unit in state["active"]:
                self.stop("failed", "driver %s loaded, but starting %s failed: %s"
                          % (loaded_nvidia_version(SYS_MODULE), unit, problem))
            if problem:
                self.result["not_started"][unit] = problem
            else:
                self.result["units"].append(unit)


def main():
    module = AnsibleModule(argument_spec=dict(version=dict(type="str", required=True),
                                              units=dict(type="list", elements="str",
                                                         default=["nvidia-persistenced.service",
                                                                  "nvidia-fabricmanager.service",
                                                                  "nvidia-imex.service"])),
                           supports_check_mode=True)
    want, units = module.params["version"], module.params["units"]
    for unit in units:
        if not UNIT.match(unit):
            module.fail_json(msg="not a unit name: %r" % unit, outcome="refused")
    r = Reload(module, want)
    state = remembered()
    if r.result["before"] == want and not state:
        r.result["loaded"] = want
        module.exit_json(changed=False, **r.result)
    if module.check_mode:
        module.exit_json(changed=True, **r.result)

    if r.result["before"] != want:
        on_disk = r.module.run_command(["modinfo", "-F", "version", "nvidia"])[1].strip()
        if on_disk != want:
            r.stop("not_installed", "the nvidia module installed for this kernel is %s, not %s (a failed DKMS build, "
                   "an unsigned module under Secure Boot, another kernel?)" % (on_disk or "missing", want))
        try:
            order = unload_order(SYS_MODULE)
        except ValueError as e:
            r.stop("refused", str(e))
        # What to put back, remembered before anything changes: the modules loaded, the units running or enabled.
        state.setdefault("modules", list(reversed(order)) or ["nvidia"])
        if "active" not in state:
            active = [u for u in units if r.module.run_command(["systemctl", "is-active", "--quiet", u])[0] == 0]
            enabled = [u for u in units if u not in active
                       and r.module.run_command(["systemctl", "is-enabled", "--quiet", u])[0] == 0]
            state.update(active=active, enabled=enabled)
        remember(state)
        for unit in reversed(state["active"]):
            problem = r.run(["systemctl", "stop", unit])
            if problem:
                r.start_units(state)
                forget()
                r.stop("refused", "stopping %s failed: %s" % (unit, problem))
        busy = in_use(order, SYS_MODULE)
        if busy:
            users = device_users()
            r.start_units(state)
            forget()
            r.stop("refused", "in use: %s%s" % (", ".join(busy), "; /dev/nvidia* open by " + ", ".join(users[:5])
                                                if users else ""))
        for name in order:
            problem = r.run(["rmmod", name])
            if problem:
                r.stop("failed", "unloading %s: %s (unloaded before it: %s)"
                       % (name, problem, ", ".join(r.result["unloaded"]) or "none"))
            r.result["unloaded"].append(name)
        for name in state["modules"]:
            problem = r.run(["modprobe", name])
            if problem:
                r.stop("failed", "loading %s: %s" % (name, problem))
            r.result["reloaded"].append(name)
    if loaded_nvidia_version(SYS_MODULE) != want:
        r.stop("failed", "after the reload the loaded module is %s, not %s"
               % (loaded_nvidia_version(SYS_MODULE) or "none", want))
    r.start_units(state)
    r.result["loaded"] = want
    forget()
    module.exit_json(changed=True, **r.result)


if __name__ == "__main__":
    main()
