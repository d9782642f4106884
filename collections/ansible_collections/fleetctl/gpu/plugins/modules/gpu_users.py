#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Which processes still hold a GPU: open /dev/nvidia* handles (every process, /proc/PID/fd) and NVML's
compute and graphics process lists; and which GPUs hold memory with no process listed (a leaked context).
Read-only; the caller waits and retries (the GPU Operator's most common stuck state is "driver is in use": a
driver must never be swapped under a running job)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_users
short_description: Processes holding NVIDIA GPUs (device handles and NVML process lists)
version_added: "0.1.0"
description:
  - Lists the processes that still hold a GPU, from two sources - every process's open C(/dev/nvidia*) files
    (C(/proc/PID/fd)) and NVML's compute and graphics process lists of every GPU.
  - A driver must never be swapped under a running job; the caller waits and retries until the list is empty
    (the GPU Operator's most common stuck state is "driver is in use").
  - Processes named in I(ignore) (the driver's own daemons) are left out.
  - Read-only; never changes the host.
options:
  ignore:
    description:
      - Process names that may hold the GPU during a driver change (the driver's own daemons).
      - A name matches the executable's file name, or its first 15 characters (the kernel's C(comm)).
    type: list
    elements: str
    default: [nvidia-persistenced, nv-fabricmanager]
  leak_mib:
    description:
      - A GPU holding more MiB than this (beyond the driver's reserved memory, NVML's v2 memory info) while NVML lists
        no process on it holds a leaked context, and is listed in C(leaked). Not idle, but no process to wait for.
    type: int
    default: 256
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same list.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to diff.
  platform:
    platforms: posix
    description: Linux hosts (reads /proc).
extends_documentation_fragment:
  - action_common_attributes
requirements:
  - Root on the managed host (become), to see every process's open files; the module fails otherwise.
  - Python package nvidia-ml-py (imported as C(pynvml)) for NVML's process lists; without it only device handles are
    checked, and C(nvml) says why.
seealso:
  - module: fleetctl.gpu.nvidia_driver_packages
  - module: fleetctl.gpu.nvidia_module_reload
author:
  - fleetctl maintainers (@fleetctl)
"""

EXAMPLES = r"""
- name: Wait until no process holds a GPU (up to 30 minutes)
  fleetctl.gpu.gpu_users:
  become: true
  register: holders
  until: holders.users | default(['the check failed']) | length == 0
  retries: 60
  delay: 30

- name: Wait until no process holds a GPU and no GPU holds memory without one
  fleetctl.gpu.gpu_users:
  become: true
  register: holders
  until: (holders.users | default(['failed'])) | length == 0 and (holders.leaked | default(['failed'])) | length == 0
  retries: 60
  delay: 30

- name: List what holds the GPUs, allowing DCGM to stay
  fleetctl.gpu.gpu_users:
    ignore:
      - nvidia-persistenced
      - nv-fabricmanager
      - nv-hostengine
  become: true
  register: holders

- name: Show the holders
  ansible.builtin.debug:
    msg: "{{ item.name }} (pid {{ item.pid }}) via {{ item.via | join(', ') }}"
  loop: "{{ holders.users }}"

- name: Warn when NVML's process lists could not be read
  ansible.builtin.debug:
    msg: "Only device handles were checked: {{ holders.nvml }}"
  when: holders.nvml != 'ok'
"""

RETURN = r"""
users:
  description: Processes holding a GPU (not ignored), by pid.
  returned: success
  type: list
  elements: dict
  sample: [{"pid": 4242, "name": "python3", "via": ["/dev/nvidia*", "nvml"]}]
  contains:
    pid:
      description: Process id.
      returned: always
      type: int
      sample: 4242
    name:
      description: The executable's file name, else its C(comm), else C(?).
      returned: always
      type: str
      sample: python3
    via:
      description: How it was found - C(/dev/nvidia*) (an open device file) and/or C(nvml) (an NVML process list).
      returned: always
      type: list
      elements: str
      sample: ["/dev/nvidia*", "nvml"]
leaked:
  description:
    - GPUs that hold more than I(leak_mib) MiB of memory with no process listed on them (a context leaked; only a GPU
      reset or a reboot frees it), by index; empty without pynvml or NVML's v2 memory info.
  returned: success
  type: list
  elements: dict
  sample: [{"index": 0, "pci_bus_id": "00000000:18:00.0", "used_mib": 2048}]
  contains:
    index:
      description: NVML index of the GPU.
      returned: always
      type: int
      sample: 0
    pci_bus_id:
      description: Its PCI bus id, lower case; null when unread.
      returned: always
      type: str
      sample: "00000000:18:00.0"
    used_mib:
      description: Memory in use beyond the driver's reserved memory, in MiB.
      returned: always
      type: int
      sample: 2048
nvml:
  description:
    - "C(ok), or why NVML's process lists could not be read (in full or for some GPUs), e.g. C(pynvml not installed)
      or C(NVML: Driver Not Loaded)."
  returned: success
  type: str
  sample: ok
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_gpus import LEAK_MIB, leaked_mib, nvml_memory


def process_name(pid):
    """The program's name: the executable's file name (comm is cut to 15 characters: nvidia-persiste)."""
    try:
        return os.path.basename(os.readlink("/proc/%s/exe" % pid))
    except (IOError, OSError):
        pass
    try:
        with open("/proc/%s/comm" % pid) as f:
            return f.read().strip()
    except (IOError, OSError):
        return "?"


def ignored(name, ignore):
    return name in ignore or any(name == i[:15] for i in ignore)


def device_holders():
    """pid -> name of every process with an open /dev/nvidia* file."""
    holders = {}
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        fd_dir = "/proc/%s/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except (IOError, OSError):
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except (IOError, OSError):
                continue
            if target.startswith("/dev/nvidia"):
                holders[int(pid)] = process_name(pid)
                break
    return holders


def nvml_users(leak_mib=LEAK_MIB):
    """(pid -> name, leaked GPUs, status) from NVML's compute and graphics process lists and memory of every GPU."""
    try:
        import pynvml
    except ImportError:
        return {}, [], "pynvml not installed"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError: driver not loaded, mismatch ...
        return {}, [], "NVML: %s" % e
    users, leaked, problems = {}, [], []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            except pynvml.NVMLError as e:  # a GPU that fell off the bus runs nothing: the driver may be changed
                problems.append("GPU %d: %s" % (i, e))
                continue
            for fn in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                try:
                    for proc in fn(handle):
                        users[int(proc.pid)] = process_name(proc.pid)
                except pynvml.NVMLError as e:
                    if "Not Supported" not in str(e):
                        problems.append("GPU %d: %s" % (i, e))
            errors = {}
            mib = leaked_mib(nvml_memory(pynvml, handle, errors, "memory"), leak_mib)
            problems += ["GPU %d: %s" % (i, m) for m in errors.values()]
            if mib is not None:
                try:
                    pci = pynvml.nvmlDeviceGetPciInfo(handle).busId
                    pci = (pci.decode("utf-8", "replace") if isinstance(pci, bytes) else pci).lower()
                except pynvml.NVMLError:
                    pci = None
                leaked.append({"index": i, "pci_bus_id": pci, "used_mib": mib})
    except pynvml.NVMLError as e:
        problems.append(str(e))
    finally:
        pynvml.nvmlShutdown()
    return users, leaked, "; ".join(problems) or "ok"


def main():
    module = AnsibleModule(argument_spec=dict(ignore=dict(type="list", elements="str",
                                                          default=["nvidia-persistenced", "nv-fabricmanager"]),
                                              leak_mib=dict(type="int", default=LEAK_MIB)),
                           supports_check_mode=True)
    if os.geteuid() != 0:
        module.fail_json(msg="gpu_users must run as root to see every process's open files "
                             "(log in as root or set ansible_become)")
    ignore = set(module.params["ignore"])
    found = {}
    for pid, name in device_holders().items():
        found.setdefault(pid, {"pid": pid, "name": name, "via": []})["via"].append("/dev/nvidia*")
    nvml, leaked, status = nvml_users(module.params["leak_mib"])
    for pid, name in nvml.items():
        found.setdefault(pid, {"pid": pid, "name": name, "via": []})["via"].append("nvml")
    users = [u for dummy, u in sorted(found.items()) if not ignored(u["name"], ignore)]
    module.exit_json(changed=False, users=users, leaked=leaked, nvml=status)


if __name__ == "__main__":
    main()
