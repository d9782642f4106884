#!/usr/bin/python
# -*- coding: utf-8 -*-
"""What a driver activation decides on, read in one remote process: the boot id, the boot id at which a reboot was
asked for (a marker on /run), the loaded nvidia module's version, whether nouveau is loaded, which of the given
daemons are not running, and where nvidia-ctk is. Read-only: the role reads it before and after the reboot."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvidia_driver_state
short_description: Read the boot id, the loaded NVIDIA driver and its daemons in one call
version_added: "0.1.0"
description:
  - Reads what loading a driver decides on, in one remote process - the boot id, the boot id kept in
    I(reboot_marker) (where a reboot was asked for, on a tmpfs a reboot clears), the version of the loaded nvidia
    kernel module, whether nouveau is loaded, which of I(units) are not active, and the path of nvidia-ctk.
  - Changes nothing.
options:
  reboot_marker:
    description:
      - A file holding the boot id at which a reboot was asked for; its content is returned as RV(reboot_asked).
      - Not read when not given.
    type: path
  units:
    description: systemd units that must run; those not active are returned in RV(units_inactive).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Reads the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  platform:
    platforms: posix
    description: Linux hosts (procfs, sysfs; systemctl when I(units) are given).
extends_documentation_fragment:
  - action_common_attributes
notes:
  - A unit name that is not one (spaces, a leading dash) fails the module before anything runs, and so do I(units)
    on a host without systemctl (a container, a host whose init is not systemd).
seealso:
  - module: fleetctl.gpu.nvidia_module_reload
  - module: fleetctl.gpu.gpu_facts
author:
  - fleetctl maintainers (@fleetctl)
"""

EXAMPLES = r"""
- name: Read the boot id and the loaded driver before deciding on a reboot
  fleetctl.gpu.nvidia_driver_state:
    reboot_marker: /run/fleetctl-driver-reboot
  register: before

- name: Reboot when the driver on disk is not the one loaded, and no reboot was asked for in this boot
  ansible.builtin.reboot:
  when:
    - before.loaded != '570.86.15'
    - before.reboot_asked != before.boot_id

- name: Read the driver and the daemons after the reboot
  fleetctl.gpu.nvidia_driver_state:
    units: [nvidia-persistenced.service, nvidia-fabricmanager.service]
  register: after

- name: Start the daemons that do not run
  ansible.builtin.command:
    argv: [systemctl, start, "{{ item }}"]
  loop: "{{ after.units_inactive }}"
  changed_when: true
"""

RETURN = r"""
boot_id:
  description: The host's boot id (C(/proc/sys/kernel/random/boot_id)); a reboot changes it.
  returned: always
  type: str
  sample: 3b0c1f8e-5f55-4c6a-9c1e-0d4f3b7b2a11
reboot_asked:
  description: The content of I(reboot_marker) (a boot id); null when it was not given or there is no such file.
  returned: always
  type: str
  sample: 3b0c1f8e-5f55-4c6a-9c1e-0d4f3b7b2a11
loaded:
  description: The loaded nvidia kernel module's version (C(/sys/module/nvidia/version)); null when none is loaded.
  returned: always
  type: str
  sample: 570.86.15
nouveau:
  description: Whether the nouveau module is loaded (it takes the GPUs and the nvidia module cannot load).
  returned: always
  type: bool
  sample: false
units_inactive:
  description: The units of I(units) that are not active, in the order given.
  returned: always
  type: list
  elements: str
  sample: ["nvidia-fabricmanager.service"]
nvidia_ctk:
  description: The path of the container toolkit's nvidia-ctk; null when it is not installed.
  returned: always
  type: str
  sample: /usr/bin/nvidia-ctk
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_boot import (
    SYS_MODULE, boot_id, loaded_nvidia_version, read_value)

UNIT = re.compile(r"^[A-Za-z0-9@_:][A-Za-z0-9@._:-]*$")


def main():
    module = AnsibleModule(argument_spec=dict(reboot_marker=dict(type="path"),
                                              units=dict(type="list", elements="str", default=[])),
                           supports_check_mode=True)
    marker, units = module.params["reboot_marker"], module.params["units"]
    bad = [u for u in units if not UNIT.match(u)]
    if bad:
        module.fail_json(msg="not a unit name: %r" % bad[0])
    systemctl = module.get_bin_path("systemctl") if units else None
    if units and not systemctl:
        module.fail_json(msg="no systemctl on this host: cannot tell whether %s run" % ", ".join(units))
    inactive = [u for u in units if module.run_command([systemctl, "is-active", "--quiet", u])[0] != 0]
    module.exit_json(changed=False, boot_id=boot_id(), reboot_asked=read_value(marker) if marker else None,
                     loaded=loaded_nvidia_version(), nouveau=os.path.isdir(os.path.join(SYS_MODULE, "nouveau")),
                     units_inactive=inactive,
                     nvidia_ctk=module.get_bin_path("nvidia-ctk"))


if __name__ == "__main__":
    main()
