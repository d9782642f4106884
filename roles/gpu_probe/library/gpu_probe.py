#!/usr/bin/python
# -*- coding: utf-8 -*-
# fleetctl: GPU health snapshot and throughput samples of one host, for the gate between upgrade waves.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_probe
short_description: GPU health snapshot (NVML, kernel-log Xids since a marker) and throughput samples
description:
  - Returns C(probe), valid against schemas/probe-result.schema.json.
  - Health comes from NVML through pynvml (GPUs, and NVLink links, fabric state and GPU pair topology as in
    gpu_facts' C(interconnect)); Xid events from the kernel log after I(kmsg_since_seq), plus the critical Xid
    events NVML delivers while the probe waits I(nvml_event_wait_ms).
  - On hosts with 2+ GPUs the builtin engine also samples NCCL all-reduce bus bandwidth and GPU-to-GPU copy
    bandwidth (docs/interconnect.md).
  - With I(throughput), takes I(samples) samples per metric and GPU after a warm-up, with the engine named.
  - Read-only; never changes the host.
options:
  kmsg_since_seq:
    description: Only Xid events after this kernel-log sequence number; -1 for all since boot.
    type: int
    default: -1
  kmsg_since_boot_id:
    description: The boot I(kmsg_since_seq) was read in; after a reboot the marker is ignored (sequence numbers restart).
    type: str
    default: ""
  xid_catalog:
    description: Xid classification table.
    type: list
    elements: dict
    default: []
  xid_overrides:
    description: Per-code changes laid over I(xid_catalog).
    type: dict
    default: {}
  nvml_event_wait_ms:
    description: How long to listen for NVML Xid events.
    type: int
    default: 200
  throughput:
    description: Take throughput samples.
    type: bool
    default: false
  engine:
    description: builtin (torch GEMM and copy) or command (an operator's canary workload; the lab runs nvidia-lab-bench).
    type: str
    choices: [builtin, command]
    default: builtin
  command:
    description: The canary command for the command engine; its last stdout line is JSON {"metrics": {...}}.
    type: str
  samples:
    description: Samples per metric and GPU.
    type: int
    default: 10
  warmup_s:
    description: Warm-up seconds before sampling.
    type: float
    default: 20
  trial_s:
    description: Seconds of sustained work per sample (1 s averages out power-cap clock dithering).
    type: float
    default: 1.0
author: fleetctl
"""

RETURN = r"""
probe:
  description: The probe result (schemas/probe-result.schema.json).
  returned: always
  type: dict
"""

import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fleetctl_gpus import NVML_ERROR_LIB_RM_VERSION_MISMATCH, NVML_ERROR_LIBRARY_NOT_FOUND, NvmlReader
from ansible.module_utils.fleetctl_interconnect import NvmlInterconnect
from ansible.module_utils.fleetctl_kernel_log import KernelLogUnreadable, catalog_index, read_kernel_log, xid_events
from ansible.module_utils.fleetctl_throughput import EngineError, measure

NVML_ERROR_TIMEOUT = 10


def read(path):
    try:
        with open(path) as f:
            return f.read().strip() or None
    except (IOError, OSError):
        return None


def nvml_xid_events(pynvml, wait_ms):
    """Critical Xid events NVML delivers while we listen (nvmlDeviceRegisterEvents + nvmlEventSetWait_v2)."""
    events = []
    if wait_ms <= 0:
        return events
    event_set = pynvml.nvmlEventSetCreate()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError:
                continue  # not supported on this GPU (or lost): the kernel log still has its Xids
        deadline = time.time() + wait_ms / 1000.0
        while time.time() < deadline:
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, max(1, int((deadline - time.time()) * 1000)))
            except pynvml.NVMLError as e:
                if e.value == NVML_ERROR_TIMEOUT:
                    break
                raise
            try:
                uuid = pynvml.nvmlDeviceGetUUID(data.device)
            except pynvml.NVMLError:
                uuid = None
            events.append({"gpu_uuid": uuid.decode() if isinstance(uuid, bytes) else uuid, "code": int(data.eventData)})
    finally:
        pynvml.nvmlEventSetFree(event_set)
    return events


def probe(params):
    errors, sources = {}, {}
    module_version = read("/sys/module/nvidia/version")
    boot_id = read("/proc/sys/kernel/random/boot_id")
    since = params["kmsg_since_seq"] if params["kmsg_since_seq"] >= 0 else None
    if params["kmsg_since_boot_id"] and params["kmsg_since_boot_id"] != boot_id:
        since = None  # the host rebooted since the marker was taken: every event of this boot is new
    health = {"gpu_count": 0, "gpus": [], "nvml_xid_events": [],
              "xid": {"since_seq": since, "last_seq": None, "events": []}}
    state = "loaded" if module_version else "not_loaded"
    pynvml = None
    try:
        import pynvml as _pynvml
        _pynvml.nvmlInit()
        pynvml = _pynvml
        sources["gpus"] = "nvml"
    except ImportError:
        errors["nvml"] = "pynvml is not importable by this Python: no GPU health"
    except Exception as e:
        errors["nvml"] = "NVML: %s" % e
        code = getattr(e, "value", None)
        if code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            state = "version_mismatch"
        elif code == NVML_ERROR_LIBRARY_NOT_FOUND and not module_version:
            state = "not_installed"
    try:
        # The load first, then the health: Xids and ECC errors that the stress itself causes must show.
        throughput = None
        if params["throughput"]:
            indices = list(range(pynvml.nvmlDeviceGetCount())) if pynvml is not None else []
            try:
                throughput, failures = measure(params["engine"], params["samples"], params["warmup_s"],
                                               params["trial_s"], indices, params.get("command"), pynvml)
                errors.update(failures)
                sources["throughput"] = params["engine"]
            except EngineError as e:
                errors["throughput"] = str(e)
        if pynvml is not None:
            reader = NvmlReader(pynvml, errors)
            health["gpus"] = reader.gpus()
            health["gpu_count"] = sum(1 for g in health["gpus"] if not g.get("lost"))
            # After the load: a link that dropped or a fabric that fell apart under it shows here.
            try:
                health["interconnect"] = NvmlInterconnect(pynvml, errors).read()
            except Exception as e:  # an odd answer costs the interconnect facts, never the probe
                errors["interconnect"] = "interconnect not read: %s: %s" % (type(e).__name__, e)
            try:
                health["nvml_xid_events"] = nvml_xid_events(pynvml, params["nvml_event_wait_ms"])
            except Exception as e:
                errors["nvml_xid_events"] = "NVML events: %s" % e
        try:
            records, source = read_kernel_log()
            sources["xid"] = source
            index = catalog_index(params["xid_catalog"], params["xid_overrides"])
            health["xid"]["events"] = xid_events(records, index, health["xid"]["since_seq"])
            seqs = [r["seq"] for r in records if r["seq"] is not None]
            health["xid"]["last_seq"] = max(seqs) if seqs else None
        except KernelLogUnreadable as e:
            errors["xid"] = "kernel log unreadable: %s" % e

    finally:
        if pynvml is not None:
            pynvml.nvmlShutdown()
    return {
        "schema_version": 1,
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"hostname": socket.gethostname(), "boot_id": boot_id},
        "driver": {"state": state, "module_version": module_version},
        "health": health,
        "throughput": throughput,
        "errors": errors,
        "sources": sources,
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            kmsg_since_seq=dict(type="int", default=-1),
            kmsg_since_boot_id=dict(type="str", default=""),
            xid_catalog=dict(type="list", elements="dict", default=[]),
            xid_overrides=dict(type="dict", default={}),
            nvml_event_wait_ms=dict(type="int", default=200),
            throughput=dict(type="bool", default=False),
            engine=dict(type="str", default="builtin", choices=["builtin", "command"]),
            command=dict(type="str"),
            samples=dict(type="int", default=10),
            warmup_s=dict(type="float", default=20.0),
            trial_s=dict(type="float", default=1.0),
        ),
        required_if=[("engine", "command", ["command"])],
        supports_check_mode=True,
    )
    if module.params["samples"] < 1:
        module.fail_json(msg="samples must be at least 1")
    module.exit_json(changed=False, probe=probe(module.params))


if __name__ == "__main__":
    main()
