#!/usr/bin/python
# -*- coding: utf-8 -*-
# fleetctl: GPU health snapshot and throughput samples of one host, for the gate between upgrade waves.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_probe
short_description: GPU health snapshot (NVML, kernel-log Xids since a marker) and throughput samples
version_added: "0.1.0"
description:
  - Returns C(probe), valid against schemas/probe-result.schema.json.
  - Health comes from NVML through pynvml (GPUs, and NVLink links, fabric state and GPU pair topology as in
    gpu_facts' C(interconnect)); Xid events from the kernel log after I(kmsg_since_seq), plus the critical Xid
    events NVML delivers while the probe waits I(nvml_event_wait_ms).
  - On hosts with 2+ GPUs the builtin engine also samples NCCL all-reduce bus bandwidth and GPU-to-GPU copy
    bandwidth (docs/interconnect.md).
  - With I(throughput), takes I(samples) samples per metric and GPU after a warm-up, with the engine named.
    The load runs before the health is read, so Xids and ECC errors the load itself causes show.
  - Read-only; never changes the host.
options:
  kmsg_since_seq:
    description: Only Xid events after this kernel-log sequence number; -1 for all since boot.
    type: int
    default: -1
  kmsg_since_boot_id:
    description:
      - The boot I(kmsg_since_seq) was read in; after a reboot the marker is ignored (sequence numbers restart).
      - Empty to always apply I(kmsg_since_seq).
    type: str
    default: ""
  xid_catalog:
    description: Xid classification table (code, name, class, severity, action, source), as for fleetctl.gpu.gpu_facts.
    type: list
    elements: dict
    default: []
  xid_overrides:
    description: Per-code changes laid over I(xid_catalog).
    type: dict
    default: {}
  nvml_event_wait_ms:
    description: How long to listen for NVML Xid events; 0 or less not to listen.
    type: int
    default: 200
  throughput:
    description: Take throughput samples.
    type: bool
    default: false
  engine:
    description:
      - C(builtin) (torch GEMM and copy, and on 2+ GPUs NCCL all-reduce and GPU-to-GPU copy) or C(command) (an
        operator's canary workload; the lab runs nvidia-lab-bench).
      - Only used with I(throughput=true).
    type: str
    choices: [builtin, command]
    default: builtin
  command:
    description:
      - "The canary command for the command engine; its last stdout line is JSON: C({\"metrics\": {...}})."
      - It gets the protocol in the environment variables C(FLEETCTL_PROBE_SAMPLES), C(FLEETCTL_PROBE_WARMUP_S) and
        C(FLEETCTL_PROBE_TRIAL_S). Its arguments are not reported (they may hold secrets).
      - Required when I(engine=command).
    type: str
  samples:
    description: Samples per metric and GPU; at least 1.
    type: int
    default: 10
  warmup_s:
    description: Warm-up seconds before sampling.
    type: float
    default: 20.0
  trial_s:
    description: Seconds of sustained work per sample (1 s averages out power-cap clock dithering).
    type: float
    default: 1.0
attributes:
  check_mode:
    support: full
    description: The module changes nothing; check mode runs the same probe (and the same load with I(throughput)).
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to diff.
  platform:
    platforms: posix
    description: Linux hosts with NVIDIA GPUs.
extends_documentation_fragment:
  - action_common_attributes
requirements:
  - Python package nvidia-ml-py (imported as C(pynvml)) on the managed host for GPU health; without it the probe
    returns only the driver state and kernel-log Xids, and names the gap in C(probe.errors.nvml).
  - For the builtin throughput engine, PyTorch with CUDA on the managed host (and NCCL for the all-reduce figure on
    2+ GPUs).
notes:
  - Throughput samples put a sustained load on every GPU of the host; run them only on a host drained of jobs.
  - The builtin engine pins 1 GiB of host memory per GPU for its host<->device copies (h2d_gbs, d2h_gbs).
  - Pass C(probe.health.xid.last_seq) and C(probe.host.boot_id) back as I(kmsg_since_seq) and I(kmsg_since_boot_id)
    so that the next probe reports only newer Xid events.
  - A part that cannot be read is named in C(probe.errors); the module fails only on invalid options.
seealso:
  - module: fleetctl.gpu.gpu_facts
author:
  - fleetctl maintainers (@fleetctl)
"""

EXAMPLES = r"""
- name: Take a health snapshot and remember the kernel-log marker
  fleetctl.gpu.gpu_probe:
  become: true
  register: before

- name: Probe health and throughput after the change, with only Xid events newer than the marker
  fleetctl.gpu.gpu_probe:
    kmsg_since_seq: "{{ before.probe.health.xid.last_seq if before.probe.health.xid.last_seq is not none else -1 }}"
    kmsg_since_boot_id: "{{ before.probe.host.boot_id | default('', true) }}"
    throughput: true
    samples: 5
    warmup_s: 10
    trial_s: 1.0
  become: true
  register: after

- name: Gate on the probe
  ansible.builtin.assert:
    that:
      - after.probe.driver.state == 'loaded'
      - after.probe.health.gpu_count == before.probe.health.gpu_count
      - after.probe.health.xid.events | selectattr('class', 'equalto', 'critical') | list | length == 0
      - after.probe.health.nvml_xid_events | length == 0
    fail_msg: "GPU health regressed: {{ after.probe.errors }}"

- name: Show GPU 0's GEMM samples
  ansible.builtin.debug:
    msg: >-
      {{ after.probe.throughput.samples | selectattr('gpu', 'equalto', 0)
         | selectattr('metric', 'equalto', 'gemm_tflops') | map(attribute='value') | list }}
  when: after.probe.throughput is not none

- name: Sample an operator's canary workload instead of the builtin engine
  fleetctl.gpu.gpu_probe:
    throughput: true
    engine: command
    command: nvidia-lab-bench
    samples: 3
  register: canary
"""

RETURN = r"""
probe:
  description: The probe result (schemas/probe-result.schema.json).
  returned: always
  type: dict
  contains:
    schema_version:
      description: Version of this result format.
      returned: always
      type: int
      sample: 1
    collected_at:
      description: UTC time the probe finished on the host.
      returned: always
      type: str
      sample: "2025-01-31T12:00:00Z"
    host:
      description: C(hostname) and C(boot_id) (null when unreadable) of the host.
      returned: always
      type: dict
      sample: {"hostname": "gpu-node-01", "boot_id": "3f1c9d2e-6a0b-4c55-9d0e-1b2a3c4d5e6f"}
    driver:
      description:
        - C(state) (loaded, version_mismatch, not_loaded or not_installed) and the loaded kernel C(module_version)
          (null when not loaded).
      returned: always
      type: dict
      sample: {"state": "loaded", "module_version": "570.86.15"}
    health:
      description: The GPU health snapshot, read after any throughput load.
      returned: always
      type: dict
      contains:
        gpu_count:
          description: GPUs that answer NVML (lost ones not counted); 0 without NVML.
          returned: always
          type: int
          sample: 8
        gpus:
          description:
            - Per GPU the same health facts as fleetctl.gpu.gpu_facts' C(facts.gpus) (ECC, remapped rows, retired
              pages, MIG, PCIe link, clock event reasons, temperature, power, recovery action), or
              C(index) and C(lost) for a lost GPU; empty without NVML.
          returned: always
          type: list
          elements: dict
          sample: [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:00:06.0",
                    "ecc": {"enabled": true, "pending": true, "uncorrected_volatile": 0, "uncorrected_aggregate": 0},
                    "temperature_c": 45, "power_w": 310.5}]
        interconnect:
          description:
            - NVLink links, NVSwitch fabric state, GPU pair topology and GPUDirect RDMA (C(gpus), C(topology),
              C(peermem_loaded)), as fleetctl.gpu.gpu_facts' C(facts.interconnect), read after any load.
          returned: when NVML could be initialised and the interconnect was read (else named in C(errors.interconnect))
          type: dict
          sample: {"gpus": [{"index": 0, "pci_bus_id": "00000000:00:06.0",
                             "nvlink": {"supported": true, "up": 18, "total": 18, "links": []},
                             "fabric": {"state": "completed", "status": "success", "clique_id": 0,
                                        "cluster_uuid": "00000000-0000-0000-0000-000000000000", "health_mask": 0}}],
                   "topology": [], "peermem_loaded": false}
        nvml_xid_events:
          description: Critical Xid events NVML delivered while the probe listened, each C(gpu_uuid) and C(code).
          returned: always
          type: list
          elements: dict
          sample: [{"gpu_uuid": "GPU-5e0a7f3c-0000-0000-0000-000000000000", "code": 79}]
        xid:
          description: Xid events in the kernel log.
          returned: always
          type: dict
          contains:
            since_seq:
              description: The marker applied (I(kmsg_since_seq)); null for all since boot, or after a reboot.
              returned: always
              type: int
              sample: 1500
            last_seq:
              description: Highest /dev/kmsg sequence number read; pass it back as the next probe's I(kmsg_since_seq).
              returned: always
              type: int
              sample: 1532
            events:
              description: Classified Xid events after the marker, as in fleetctl.gpu.gpu_facts' C(facts.xid.events).
              returned: always
              type: list
              elements: dict
              sample: [{"code": 79, "pci_bus_id": "00000000:00:06.0", "gpu_instance": null, "pid": null,
                        "process": null, "message": "GPU has fallen off the bus.", "recovery_action": null,
                        "seq": 1532, "uptime_s": 8123.45,
                        "raw": "NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.",
                        "name": "GPU has fallen off the bus", "class": "critical", "severity": "critical",
                        "action": "drain; reboot or power-cycle the node", "source": "NVIDIA Xid catalog r580"}]
    throughput:
      description: The throughput samples; null without I(throughput), or when the engine failed (C(errors.throughput)).
      returned: always
      type: dict
      contains:
        engine:
          description: The engine that ran (I(engine)).
          returned: success
          type: str
          sample: builtin
        device:
          description: What ran the samples (the torch version and GPU, or the canary command's program name).
          returned: success
          type: str
          sample: torch 2.5.1+cu124 on NVIDIA H100 80GB HBM3
        warmup_s:
          description: Warm-up seconds asked for.
          returned: success
          type: float
          sample: 20.0
        trial_s:
          description: Seconds per sample asked for.
          returned: success
          type: float
          sample: 1.0
        wall_s:
          description: Seconds the sampling took.
          returned: success
          type: float
          sample: 93.41
        metrics:
          description: Each metric's C(unit) and C(higher_is_better).
          returned: success
          type: dict
          sample: {"gemm_tflops": {"unit": "TFLOP/s", "higher_is_better": true},
                   "bandwidth_gbs": {"unit": "GB/s", "higher_is_better": true},
                   "h2d_gbs": {"unit": "GB/s", "higher_is_better": true},
                   "d2h_gbs": {"unit": "GB/s", "higher_is_better": true},
                   "gemm_median_ms": {"unit": "ms", "higher_is_better": false},
                   "gemm_p99_ms": {"unit": "ms", "higher_is_better": false}}
        samples:
          description:
            - One row per sample, metric and GPU - C(gpu) (null for a host-wide metric), C(peer) (for p2p_gbs),
              C(metric), C(value) (null when the trial failed) and, for the builtin engine, the conditions right after
              the trial (C(sm_clock_mhz), C(mem_clock_mhz), C(temperature_c), C(power_w), C(clock_event_reasons)).
          returned: success
          type: list
          elements: dict
          sample: [{"gpu": 0, "metric": "gemm_tflops", "value": 712.345, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
                    "temperature_c": 58, "power_w": 690.1, "clock_event_reasons": 0}]
    errors:
      description: Part name (e.g. C(nvml), C(xid), C(interconnect), C(throughput)) -> why it could not be read.
      returned: always
      type: dict
      sample: {}
    sources:
      description: Where the parts came from (C(gpus), C(xid), C(throughput)).
      returned: always
      type: dict
      sample: {"gpus": "nvml", "xid": "/dev/kmsg", "throughput": "builtin"}
"""

import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_boot import boot_id as read_boot_id
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_boot import loaded_nvidia_version
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_gpus import (
    NVML_ERROR_LIB_RM_VERSION_MISMATCH, NVML_ERROR_LIBRARY_NOT_FOUND, NvmlReader, add_aer)
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_interconnect import NvmlInterconnect
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_kernel_log import KernelLogUnreadable, catalog_index, read_kernel_log, xid_events
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_throughput import EngineError, measure

NVML_ERROR_TIMEOUT = 10


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
    module_version = loaded_nvidia_version()
    boot_id = read_boot_id()
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
            health["gpus"] = add_aer(reader.gpus(), errors)  # PCIe replays and AER counts: the gate compares them
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
