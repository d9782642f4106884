#!/usr/bin/python
# -*- coding: utf-8 -*-
# fleetctl: collect every fact the audit needs from one GPU host, in one remote process.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: NVIDIA driver, nouveau, persistence, container runtime, fabric manager, GPU health and interconnect facts
version_added: "0.1.0"
description:
  - Gathers in one process everything C(fleetctl audit) evaluates, as JSON valid against
    schemas/host-facts.schema.json (returned under C(facts)).
  - GPU facts come from NVML through pynvml when the host's Python can import it, else from
    C(nvidia-smi -q -x), else only from kernel files. Each fact says where it came from (C(sources)),
    and a fact that could not be read gets an entry in C(errors) instead of failing the module.
  - Multi-GPU interconnect (C(facts.interconnect), docs/interconnect.md) is read in the same NVML session, else from
    C(nvidia-smi nvlink -s), C(nvidia-smi nvlink -e), C(nvidia-smi topo -m) and the fabric elements of
    C(nvidia-smi -q -x); these extra nvidia-smi commands run only when pynvml cannot be imported.
  - IMEX (C(facts.imex) - C(nvidia-imex --version), C(nvidia-imex-ctl -N -j -H), /etc/nvidia-imex, the IMEX
    channels) is read only on a host whose GPUs report a multi-node NVLink domain (GB200/GB300 NVL72).
  - Read-only; never changes the host.
options:
  xid_catalog:
    description: Xid classification table (code, name, class, severity, action, source).
    type: list
    elements: dict
    default: []
  xid_overrides:
    description: Per-code changes laid over I(xid_catalog).
    type: dict
    default: {}
  kmsg_since_seq:
    description: Only report Xid events after this kernel-log sequence number; -1 for all since boot.
    type: int
    default: -1
  check_initramfs:
    description: List the initramfs of the running kernel to see whether it holds nouveau.
    type: bool
    default: true
  as_json:
    description:
      - Return the facts as one JSON text, I(facts_json), instead of the I(facts) dictionary.
      - For a controller that decodes them itself, as fleetctl does; Ansible then handles one string per host instead
        of every node of a result of 50 KB or more (its per-host cost in an audit falls by about a third).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same facts.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to diff.
  platform:
    platforms: posix
    description: Linux hosts (reads /proc, /sys, /dev/kmsg and the package database).
extends_documentation_fragment:
  - action_common_attributes
requirements:
  - Python package nvidia-ml-py (imported as C(pynvml)) on the managed host for the full GPU and interconnect facts;
    without it they are read from C(nvidia-smi) when installed.
  - Root (become) to read C(/dev/kmsg) on hosts that restrict it; otherwise Xids come from C(journalctl -k) or
    C(dmesg).
notes:
  - A fact that cannot be read is null and named in C(facts.errors); the module fails only on invalid options.
  - C(facts.xid.last_seq) can be passed back as I(kmsg_since_seq) to report only newer Xid events.
seealso:
  - module: fleetctl.gpu.gpu_probe
author:
  - fleetctl maintainers (@fleetctl)
"""

EXAMPLES = r"""
- name: Collect the GPU host facts
  fleetctl.gpu.gpu_facts:
  register: gpu

- name: Show driver state and GPU count
  ansible.builtin.debug:
    msg: >-
      driver {{ gpu.facts.driver.module_version | default('none', true) }}
      ({{ gpu.facts.driver.state }}), {{ gpu.facts.gpus | length }} GPUs,
      nouveau loaded: {{ gpu.facts.nouveau.loaded }}

- name: Fail when the kernel module and the user-space libraries disagree
  ansible.builtin.assert:
    that:
      - gpu.facts.driver.state != 'version_mismatch'
    fail_msg: "Reboot pending: module {{ gpu.facts.driver.module_version }}, libraries {{ gpu.facts.driver.userspace_version }}"

- name: Classify Xid events with a catalog, only those newer than the last run, without listing the initramfs
  fleetctl.gpu.gpu_facts:
    xid_catalog:
      - code: 13
        name: Graphics Engine Exception
        class: application
        severity: medium
        action: check the application; reset only if it recurs across jobs
        source: NVIDIA Xid catalog r580
      - code: 79
        name: GPU has fallen off the bus
        class: critical
        severity: critical
        action: drain; reboot or power-cycle the node
        source: NVIDIA Xid catalog r580
    xid_overrides:
      "13":
        class: critical
        severity: high
    kmsg_since_seq: "{{ last_xid_seq | default(-1) }}"
    check_initramfs: false
  become: true
  register: gpu_xid

- name: Remember where the kernel log was read up to
  ansible.builtin.set_fact:
    last_xid_seq: "{{ gpu_xid.facts.xid.last_seq if gpu_xid.facts.xid.last_seq is not none else -1 }}"

- name: Report facts that could not be read
  ansible.builtin.debug:
    var: gpu_xid.facts.errors
  when: gpu_xid.facts.errors | length > 0
"""

RETURN = r"""
facts_json:
  description: The facts below as one JSON text.
  returned: when I(as_json) is true
  type: str
  sample: '{"schema_version": 1, "collector": {"name": "gpu_facts", "version": "1.0.0"}}'
facts:
  description: The host's facts (schemas/host-facts.schema.json).
  returned: unless I(as_json) is true
  type: dict
  contains:
    schema_version:
      description: Version of this facts format.
      returned: always
      type: int
      sample: 1
    collector:
      description: The collector that produced the facts (C(name) gpu_facts, C(version)).
      returned: always
      type: dict
      sample: {"name": "gpu_facts", "version": "1.0.0"}
    collected_at:
      description: UTC time the collection started on the host.
      returned: always
      type: str
      sample: "2025-01-31T12:00:00Z"
    collect_seconds:
      description: Wall time the collection took on the host.
      returned: always
      type: float
      sample: 0.412
    host:
      description: The host itself.
      returned: always
      type: dict
      contains:
        hostname:
          description: Host name.
          returned: always
          type: str
          sample: gpu-node-01
        kernel:
          description: Running kernel release (uname -r).
          returned: always
          type: str
          sample: 6.8.0-45-generic
        arch:
          description: Machine architecture (uname -m).
          returned: always
          type: str
          sample: x86_64
        os:
          description: C(id), C(version_id) and C(pretty_name) from /etc/os-release; each null where the file lacks it.
          returned: always
          type: dict
          sample: {"id": "ubuntu", "version_id": "24.04", "pretty_name": "Ubuntu 24.04.1 LTS"}
        boot_id:
          description: Kernel boot id, changes on every reboot; null when unreadable.
          returned: always
          type: str
          sample: 3f1c9d2e-6a0b-4c55-9d0e-1b2a3c4d5e6f
        uptime_s:
          description: Seconds since boot; null when unreadable.
          returned: always
          type: float
          sample: 86400.12
        secure_boot:
          description: UEFI Secure Boot state; C(unsupported) on BIOS boot, C(unknown) when the EFI variable is unreadable.
          returned: always
          type: str
          choices: [enabled, disabled, unsupported, unknown]
          sample: disabled
        python:
          description: Version of the Python that ran the module on the host.
          returned: always
          type: str
          sample: 3.12.3
        pci_gpus:
          description: PCI bus ids of the NVIDIA GPUs on the PCI bus (what the driver should see), from /sys/bus/pci/devices.
          returned: always
          type: list
          elements: str
          sample: ["00000000:00:06.0"]
    driver:
      description: The NVIDIA driver.
      returned: always
      type: dict
      contains:
        state:
          description:
            - C(loaded) (kernel module up and matching user space), C(version_mismatch) (module and libnvidia-ml
              differ, or NVML says so; usually a reboot pending after an upgrade), C(not_loaded) (installed, module not
              loaded) or C(not_installed).
          returned: always
          type: str
          choices: [loaded, version_mismatch, not_loaded, not_installed]
          sample: loaded
        module_version:
          description: Loaded kernel module version (/sys/module/nvidia/version, else /proc/driver/nvidia/version); null when not loaded.
          returned: always
          type: str
          sample: 570.86.15
        module_flavor:
          description: C(open) or C(proprietary) kernel module, from /proc/driver/nvidia/version; null when not loaded.
          returned: always
          type: str
          sample: open
        userspace_version:
          description: Version of the installed libnvidia-ml.so.1 (from its real file name, else from NVML); null when absent.
          returned: always
          type: str
          sample: 570.86.15
        nvml_version:
          description: NVML's own version string; null unless read through NVML.
          returned: always
          type: str
          sample: 12.570.86.15
        cuda_driver_version:
          description: Highest CUDA version the driver supports; null when unread.
          returned: always
          type: str
          sample: "12.8"
        branch:
          description: Driver branch (major version); null without a driver.
          returned: always
          type: str
          sample: "570"
        packages:
          description:
            - Installed NVIDIA packages fleetctl knows about, each with C(name), C(version) (distro version string),
              C(manager) (dpkg or rpm), C(role) (driver, persistenced, container_toolkit, fabricmanager or imex) and
              C(held) (apt-mark hold, or in the dnf/yum versionlock list).
          returned: always
          type: list
          elements: dict
          sample: [{"name": "nvidia-driver-570-open", "version": "570.86.15-0ubuntu1", "manager": "dpkg",
                    "role": "driver", "held": true}]
        held:
          description: Every driver package is held; null when no driver package is installed.
          returned: always
          type: bool
          sample: true
    nouveau:
      description: The nouveau driver, which must not claim the GPUs.
      returned: always
      type: dict
      contains:
        loaded:
          description: The nouveau kernel module is loaded.
          returned: always
          type: bool
          sample: false
        blacklisted:
          description: A modprobe.d file or the kernel command line keeps nouveau from loading.
          returned: always
          type: bool
          sample: true
        blacklist_files:
          description: The modprobe.d files (and /proc/cmdline) that blacklist nouveau.
          returned: always
          type: list
          elements: str
          sample: ["/etc/modprobe.d/blacklist-nouveau.conf"]
        initramfs:
          description: Initramfs image of the running kernel; null when not checked or not found.
          returned: always
          type: str
          sample: /boot/initrd.img-6.8.0-45-generic
        in_initramfs:
          description: The initramfs holds nouveau.ko; null when not checked (I(check_initramfs)) or not listable.
          returned: always
          type: bool
          sample: false
    boot:
      description:
        - The kernel the host boots next (C(next_kernel), and C(next_kernel_source) grubenv, grub.cfg, loader or
          newest), the kernels with an image in /boot, and for the running and the next kernel the nvidia module
          files under /lib/modules, the version modinfo reads from the first and its dkms status lines
          (module_utils/fleetctl_boot.py). C(next_kernel) is null where no kernel image is under /boot.
        - Null when reading it failed (C(errors.boot)).
      returned: always
      type: dict
      sample: {"running_kernel": "6.8.0-45-generic", "kernels": ["6.8.0-45-generic", "6.8.0-47-generic"],
               "next_kernel": "6.8.0-47-generic", "next_kernel_source": "grub.cfg",
               "modules": [{"kernel": "6.8.0-45-generic", "version": "570.86.15", "dkms": null,
                            "files": ["/lib/modules/6.8.0-45-generic/updates/dkms/nvidia.ko.zst"]},
                           {"kernel": "6.8.0-47-generic", "files": [], "version": null, "dkms": null}]}
      contains:
        running_kernel:
          description: The running kernel release.
          returned: success
          type: str
          sample: 6.8.0-45-generic
        kernels:
          description: Kernel releases with an image in /boot, oldest first.
          returned: success
          type: list
          elements: str
          sample: ["6.8.0-45-generic", "6.8.0-47-generic"]
        next_kernel:
          description: The kernel the boot loader starts next; null when no kernel image is under /boot.
          returned: success
          type: str
          sample: 6.8.0-47-generic
        next_kernel_source:
          description: Where C(next_kernel) was read; null with it.
          returned: success
          type: str
          choices: [grubenv, grub.cfg, loader, newest]
          sample: grub.cfg
        modules:
          description:
            - Per kernel (the running one, and the next one when it differs) its C(kernel), the nvidia module
              C(files), the C(version) modinfo reads from the first file (null without one) and its C(dkms) status
              lines (module, version, kernel, state, note; null without dkms).
          returned: success
          type: list
          elements: dict
          sample: [{"kernel": "6.8.0-45-generic", "version": "570.86.15", "dkms": null,
                    "files": ["/lib/modules/6.8.0-45-generic/updates/dkms/nvidia.ko.zst"]}]
    persistence:
      description: The persistence daemon.
      returned: always
      type: dict
      contains:
        daemon_running:
          description: nvidia-persistenced is running.
          returned: always
          type: bool
          sample: true
        daemon_enabled:
          description: nvidia-persistenced.service is enabled; null on a host without systemd unit directories.
          returned: always
          type: bool
          sample: true
    container_runtime:
      description: Container engines and the NVIDIA container toolkit.
      returned: always
      type: dict
      contains:
        engines:
          description:
            - docker, containerd and crio, always in that order, each with C(name), C(installed), C(running),
              C(nvidia_runtime) (a config file defines the nvidia runtime), C(nvidia_default) (a config file makes it
              the default) and C(config_files) (those that exist and were read).
          returned: always
          type: list
          elements: dict
          sample: [{"name": "docker", "installed": true, "running": true, "nvidia_runtime": true,
                    "nvidia_default": false, "config_files": ["/etc/docker/daemon.json"]}]
        toolkit_version:
          description: nvidia-container-toolkit version (package version, else C(nvidia-ctk --version)); null when absent.
          returned: always
          type: str
          sample: 1.17.4-1
        cdi_specs:
          description:
            - CDI specs under /etc/cdi and /var/run/cdi naming nvidia.com/ devices, each with its C(path) and the
              C(driver_version) it was generated for (null when it names none); stale when it differs from the driver.
          returned: always
          type: list
          elements: dict
          sample: [{"path": "/etc/cdi/nvidia.yaml", "driver_version": "570.86.15"}]
    fabric_manager:
      description: NVIDIA Fabric Manager (required where NVSwitches are present).
      returned: always
      type: dict
      contains:
        nvswitch_present:
          description: NVSwitch devices exist (HGX/DGX baseboards).
          returned: always
          type: bool
          sample: false
        package_version:
          description: Installed fabric manager package version; null when not installed.
          returned: always
          type: str
          sample: 570.86.15-1
        running:
          description: nv-fabricmanager is running.
          returned: always
          type: bool
          sample: false
        enabled:
          description: nvidia-fabricmanager.service is enabled; null without systemd unit directories.
          returned: always
          type: bool
          sample: false
    gpus:
      description:
        - One entry per GPU, from NVML or C(nvidia-smi -q -x) (C(sources.gpus)); empty when neither could be read.
        - A GPU NVML counts but cannot open (fallen off the bus, or lost) has only C(index) and C(lost).
        - Each value is null where the GPU does not support it or it could not be read (then named in C(errors)).
      returned: always
      type: list
      elements: dict
      sample: [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-5e0a7f3c-0000-0000-0000-000000000000",
                "serial": "1650123456789", "pci_bus_id": "00000000:00:06.0", "vbios": "96.00.99.00.01",
                "persistence_mode": false,
                "ecc": {"enabled": true, "pending": true, "uncorrected_volatile": 0, "uncorrected_aggregate": 0},
                "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
                "retired_pages": null, "mig": {"current": false, "pending": false},
                "pcie": {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16, "replay_count": 0,
                         "aer": {"correctable": {"total": 2, "errors": {"Receiver Error": 2}},
                                 "nonfatal": {"total": 0, "errors": {}}, "fatal": {"total": 0, "errors": {}}}},
                "clock_event_reasons": {"mask": 1, "active": ["gpu_idle"]},
                "temperature_c": 31, "power_w": 71.2, "recovery_action": "None", "inforom_image": "G520.0200.00.05",
                "memory": {"total_bytes": 85520809984, "reserved_bytes": 503316480, "used_bytes": 0, "processes": 0}}]
      contains:
        index:
          description: NVML / nvidia-smi index.
          returned: always
          type: int
          sample: 0
        lost:
          description: The GPU fell off the bus or is lost; no other key but C(index) is then present.
          returned: when the GPU is lost
          type: bool
          sample: true
        name:
          description: Product name.
          returned: unless lost
          type: str
          sample: NVIDIA H100 80GB HBM3
        uuid:
          description: GPU UUID.
          returned: unless lost
          type: str
          sample: GPU-5e0a7f3c-0000-0000-0000-000000000000
        serial:
          description: Board serial number.
          returned: unless lost
          type: str
          sample: "1650123456789"
        pci_bus_id:
          description: PCI bus id in NVML form, lower case (matches the Xid events').
          returned: unless lost
          type: str
          sample: "00000000:00:06.0"
        vbios:
          description: VBIOS version.
          returned: unless lost
          type: str
          sample: 96.00.99.00.01
        persistence_mode:
          description: Legacy per-GPU persistence mode (nvidia-smi -pm).
          returned: unless lost
          type: bool
          sample: false
        ecc:
          description:
            - ECC mode now (C(enabled)) and after the next reset (C(pending)), and the uncorrectable ECC errors since
              the driver loaded (C(uncorrected_volatile)) and over the GPU's life (C(uncorrected_aggregate)), null when
              ECC is off.
          returned: unless lost
          type: dict
          sample: {"enabled": true, "pending": true, "uncorrected_volatile": 0, "uncorrected_aggregate": 0}
        remapped_rows:
          description: HBM row remapping (C(correctable), C(uncorrectable), C(pending), C(failure)); null where unsupported.
          returned: unless lost
          type: dict
          sample: {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false}
        retired_pages:
          description: Dynamic page retirement (C(single_bit), C(double_bit), C(pending)); null where unsupported.
          returned: unless lost
          type: dict
          sample: {"single_bit": 0, "double_bit": 0, "pending": false}
        mig:
          description: MIG mode (C(current), C(pending)); null on GPUs without MIG.
          returned: unless lost
          type: dict
          sample: {"current": false, "pending": false}
        pcie:
          description:
            - PCIe link generation and width now and at most (C(gen), C(gen_max), C(width), C(width_max)).
            - C(replay_count), the link's replays since the GPU's last reset (NVML, or nvidia-smi's replay_counter),
              null where unread.
            - C(aer), the kernel's AER counters of the GPU's PCI device (C(correctable), C(nonfatal), C(fatal), from the
              files aer_dev_correctable, aer_dev_nonfatal and aer_dev_fatal under /sys/bus/pci/devices/DEV, each as its
              C(total) and the non-zero C(errors) by name, null where the file is absent); null where the device has
              none of them (not AER capable, or a VM's virtual port). An unreadable file is named in C(errors)
              (C(gpus[I].pcie.aer)).
            - C(replay_count) and C(aer) are absent in facts recorded before they were collected.
          returned: unless lost
          type: dict
          sample: {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16, "replay_count": 0, "aer": null}
        clock_event_reasons:
          description: Why clocks are held down now, as the NVML bit C(mask) and the C(active) reason names.
          returned: unless lost
          type: dict
          sample: {"mask": 1, "active": ["gpu_idle"]}
        temperature_c:
          description: GPU core temperature in degrees C.
          returned: unless lost
          type: int
          sample: 31
        power_w:
          description: Power draw in watts.
          returned: unless lost
          type: float
          sample: 71.2
        recovery_action:
          description: The driver's GPU recovery action (None, Reset, Reboot, Drain P2P, Drain and Reset, or 0xN).
          returned: unless lost
          type: str
          sample: "None"
        inforom_image:
          description:
            - InfoROM image version (NVML, or nvidia-smi's inforom_version/img_version); null where unread.
            - Absent in facts recorded before it was collected.
          returned: unless lost
          type: str
          sample: G520.0200.00.05
        memory:
          description:
            - GPU memory from NVML's v2 memory info (or nvidia-smi's fb_memory_usage where it shows C(reserved)) -
              C(total_bytes), C(reserved_bytes) (the driver's own, 480 MiB on an idle H100), C(used_bytes) (beyond
              the reserved memory, 0 on an idle GPU) and C(processes), how many compute and graphics processes are
              listed on the GPU (null when the lists could not be read).
            - Null where the v2 figures are unavailable (v1's used counts the reserved memory). Absent in facts recorded
              before it was collected.
          returned: unless lost
          type: dict
          sample: {"total_bytes": 85520809984, "reserved_bytes": 503316480, "used_bytes": 0, "processes": 0}
    interconnect:
      description:
        - NVLink, NVSwitch fabric, GPU pair topology and GPUDirect RDMA (docs/interconnect.md); null when no driver
          answers. C(sources.interconnect) says whether it came from C(nvml) or C(nvidia-smi).
      returned: always
      type: dict
      contains:
        gpus:
          description:
            - Per GPU (index, pci_bus_id) its C(nvlink) (supported, up, total, links each with its C(link) number,
              state, version, remote type and PCI id, error counters replay, recovery, crc (as nvidia-smi nvlink -e
              shows them), crc_flit, crc_data, ecc_data (the legacy counters), recovery_failed, symbol, effective) and
              C(fabric) (state, status, clique_id, cluster_uuid, health_mask).
            - A part that could not be read is null, with an entry in C(errors) (C(interconnect.gpus[I].nvlink),
              C(interconnect.gpus[I].fabric)); a counter the driver does not support is null.
            - A GPU NVML cannot open (as in C(gpus)) has C(lost) true, and null C(pci_bus_id), C(nvlink) and C(fabric).
          returned: always
          type: list
          elements: dict
          sample: [{"index": 0, "pci_bus_id": "00000000:00:06.0",
                    "nvlink": {"supported": true, "up": 18, "total": 18,
                               "links": [{"link": 0, "state": "up", "version": "4.0",
                                          "remote": {"type": "switch", "pci_bus_id": null},
                                          "errors": {"replay": 0, "recovery": 0, "crc": 0, "crc_flit": 0,
                                                     "crc_data": 10, "ecc_data": 18, "recovery_failed": null,
                                                     "symbol": null, "effective": null}}]},
                    "fabric": {"state": "completed", "status": "success", "clique_id": 0,
                               "cluster_uuid": "00000000-0000-0000-0000-000000000000", "health_mask": 0}}]
        topology:
          description:
            - Each unordered GPU pair once, as nvidia-smi topo -m shows it (NV<n>, PIX, PXB, PHB, NODE, SYS) with its
              number of bonded NVLinks; empty with fewer than 2 GPUs, null when unread (C(interconnect.topology) in
              C(errors)).
          returned: always
          type: list
          elements: dict
          sample: [{"gpus": [0, 1], "link": "NV18", "nvlinks": 18}]
        peermem_loaded:
          description: The nvidia_peermem (or nv_peermem) kernel module is loaded (GPUDirect RDMA).
          returned: always
          type: bool
          sample: false
    xid:
      description: Xid events in the kernel log.
      returned: always
      type: dict
      contains:
        events:
          description:
            - Xid events since boot (or after I(kmsg_since_seq)), classified by I(xid_catalog) and I(xid_overrides).
            - Each has the driver's C(code), C(pci_bus_id), C(gpu_instance), C(pid), C(process), C(message),
              C(recovery_action) (Xid 154), the kernel log C(seq) (null from journalctl/dmesg), C(uptime_s) and C(raw)
              message, and the catalog's C(name), C(class) (application, critical, informational, recovery or
              unknown), C(severity), C(action) and C(source).
          returned: always
          type: list
          elements: dict
          sample: [{"code": 79, "pci_bus_id": "00000000:00:06.0", "gpu_instance": null, "pid": null, "process": null,
                    "message": "GPU has fallen off the bus.", "recovery_action": null, "seq": 1532,
                    "uptime_s": 8123.45, "raw": "NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.",
                    "name": "GPU has fallen off the bus", "class": "critical", "severity": "critical",
                    "action": "drain; reboot or power-cycle the node", "source": "NVIDIA Xid catalog r580"}]
        last_seq:
          description:
            - Highest /dev/kmsg sequence number read; pass it back as I(kmsg_since_seq) for only newer events.
            - Null when the log was read through journalctl or dmesg, or was unreadable.
          returned: always
          type: int
          sample: 1532
    sxid:
      description:
        - NVSwitch SXid errors in the kernel log (the records C(xid) read, after I(kmsg_since_seq)); empty events and
          C(errors.sxid) when the log was unreadable. Absent from facts of older collectors.
      returned: always
      type: dict
      contains:
        events:
          description:
            - One per error (module_utils/fleetctl_kernel_log.py sxid_events) - its headline with its Severity and
              Data lines folded in - with the switch's C(device) and C(pci), the C(link) (NVSwitch port, null when not
              named), C(message) (null when only Severity/Data lines were logged), the kernel log C(seq) (null from
              journalctl/dmesg), C(uptime_s) and C(raw) line.
            - Classified by SXID_TABLE (C(name), C(mnemonic) null for a code not in it, C(class) non_fatal, fatal,
              always_fatal, notable or unknown, C(source)); C(fatal) is the driver's word (Fatal / Non-fatal /
              Correctable, Severity 1 / 0) else the table's (C(fatal_from) log or table, null when neither says);
              C(severity) critical when fatal, medium when not, high when unknown.
          returned: always
          type: list
          elements: dict
          sample: [{"code": 20034, "device": "nvswitch1", "pci": "0000:06:00.0", "link": 48,
                    "name": "LTSSM fault up: the link went down from active", "mnemonic": "NVSWITCH_ERR_HW_DLPL_LTSSM_FAULT_UP",
                    "class": "fatal", "message": "LTSSM Fault Up", "fatal": true, "fatal_from": "log",
                    "severity": "critical", "source": "NVIDIA Fabric Manager User Guide DU-09883-001 v1.3",
                    "seq": 2204, "uptime_s": 6781753.400584,
                    "raw": "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"}]
    infiniband:
      description:
        - InfiniBand / RoCE ports from /sys/class/infiniband (module_utils/fleetctl_infiniband.py); null when that
          directory is absent or holds no device, or could not be listed (C(errors.infiniband)). Absent from facts of
          older collectors.
      returned: always
      type: dict
      contains:
        ports:
          description:
            - Every port of every RDMA device (C(device), C(port)) with C(state) and C(state_code) (4 ACTIVE),
              C(phys_state) and C(phys_state_code) (5 LinkUp, 3 Disabled), the C(rate) file, its C(rate_gbps),
              C(width) (lanes) and C(speed) (NDR), C(link_layer) (InfiniBand, Ethernet for RoCE; null without the
              file) and C(counters) (link_downed, symbol_error, link_error_recovery, port_rcv_errors; a counter
              missing or unreadable is null).
            - A port whose state, phys_state or rate could not be read keeps nulls, with C(errors)
              C(infiniband.ports[I]); C(port) is null when a device's ports could not be listed.
          returned: always
          type: list
          elements: dict
          sample: [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "state_code": 4, "phys_state": "LinkUp",
                    "phys_state_code": 5, "rate": "400 Gb/sec (4X NDR)", "rate_gbps": 400.0, "width": 4,
                    "speed": "NDR", "link_layer": "InfiniBand",
                    "counters": {"link_downed": 0, "symbol_error": 0, "link_error_recovery": 0, "port_rcv_errors": 0}}]
    imex:
      description:
        - NVIDIA IMEX on a host in a multi-node NVLink domain (module_utils/fleetctl_imex.py, docs/interconnect.md).
        - Null when no live GPU reports a fabric cluster UUID other than the zero one of an HGX board; then nothing
          IMEX is run or read. A part that could not be read is null, with C(errors) C(imex.version), C(imex.nodes),
          C(imex.channels), C(imex.domain) or C(imex.config_file). Absent from facts of older collectors.
      returned: always
      type: dict
      contains:
        package:
          description: The installed IMEX package (role imex); null when none.
          returned: always
          type: str
          sample: nvidia-imex-570
        package_version:
          description: Its distro version string; null without the package.
          returned: always
          type: str
          sample: 570.86.15-1
        version:
          description:
            - "The binary's version, from C(nvidia-imex --version) (C(IMEX version is: 570.86.15)); null when not
              installed or unread."
          returned: always
          type: str
          sample: 570.86.15
        running:
          description: An nvidia-imex process runs.
          returned: always
          type: bool
          sample: true
        enabled:
          description: nvidia-imex.service is enabled; null without systemd unit directories.
          returned: always
          type: bool
          sample: true
        config_file:
          description: The IMEX configuration read.
          returned: always
          type: str
          sample: /etc/nvidia-imex/config.cfg
        nodes_config_file:
          description:
            - IMEX_NODE_CONFIG_FILE of the configuration, its default where the key is absent or empty; null when
              the configuration is absent or unreadable.
          returned: always
          type: str
          sample: /etc/nvidia-imex/nodes_config.cfg
        nodes:
          description: The members the node list names (IP addresses, file order); null when it is absent or unreadable.
          returned: always
          type: list
          elements: str
          sample: ["10.213.0.2", "10.213.0.3", "10.213.0.4"]
        channels:
          description:
            - The IMEX channels - C(major), the character device's major number in /proc/devices
              (nvidia-caps-imex-channels; null when the driver has not registered it), and C(count), how many
              /dev/nvidia-caps-imex-channels/channelN nodes exist.
          returned: always
          type: dict
          sample: {"major": 234, "count": 1}
        domain:
          description:
            - C(nvidia-imex-ctl -N -j -H) as parsed - the domain's C(status) (UP, DEGRADED, DOWN as printed) and
              every configured member's C(address), C(hostname), C(status) (READY, UNAVAILABLE...), C(version) and
              C(connection), this host's connection to it (CONNECTED, INVALID...; null when this host is not found
              among the members, C(errors.imex.domain)).
            - Null when the command is not installed, could not run or printed what does not parse.
          returned: always
          type: dict
          sample: {"status": "UP", "nodes": [{"address": "10.213.0.2", "hostname": "gb200-01", "status": "READY",
                                             "version": "570.86.15", "connection": "CONNECTED"}]}
    sources:
      description:
        - Where facts came from (C(packages), C(driver.module_version), C(driver.module_flavor),
          C(driver.userspace_version), C(gpus), C(xid), C(interconnect)); a key is absent when the fact had no source.
      returned: always
      type: dict
      sample: {"packages": "dpkg", "driver.module_version": "/sys/module/nvidia/version", "gpus": "nvml",
               "interconnect": "nvml", "xid": "/dev/kmsg"}
    errors:
      description: Fact name -> why it could not be read. Empty on a clean run.
      returned: always
      type: dict
      sample: {"gpus[0].ecc": "NVML: Unknown Error"}
"""

import glob
import json
import os
import platform
import re
import socket
import struct
import time

from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_gpus import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NvmlReader,
    SmiParseError,
    add_aer,
    parse_smi_xml,
)
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_interconnect import NvmlInterconnect, from_smi
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_boot import boot_facts
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_infiniband import read_infiniband
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_imex import (
    CHANNELS_DIR, CONFIG_FILE, ImexOutputError, local_addresses, nodes_config_file, nvlink_domains, parse_channels,
    parse_config, parse_domain, parse_nodes, parse_version)
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_packaging import moves_with_driver, role as packaging_role
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_kernel_log import (
    KernelLogUnreadable, catalog_index, read_kernel_log, sxid_events, xid_events)

FACTS_SCHEMA_VERSION = 1
COLLECTOR_VERSION = "1.0.0"

SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e98032b8c8e5"
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64",
            "/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64")
BIN_DIRS = ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/usr/local/nvidia/bin", "/bin", "/sbin"]
MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/lib/modprobe.d", "/lib/modprobe.d")
DPKG_STATUS = "/var/lib/dpkg/status"
DPKG_UPDATES = "/var/lib/dpkg/updates"  # dpkg's journal: records not yet folded into the status file
RPM_DB_DIRS = ("/var/lib/rpm", "/usr/lib/sysimage/rpm")  # where EL, Fedora and SUSE keep the system's rpm database
LD_CACHE = "/etc/ld.so.cache"
# ldconfig's format (alone since glibc 2.32, after the old one before): a header of 48 bytes, entries of 24
_LD_CACHE_MAGIC = b"glibc-ld.so.cache1.1"
IMEX_CTL_TIMEOUT_S = 10  # nvidia-imex-ctl -N asks the domain's daemons over the network (`fleetctl check`: 10 s too)

_VERSION = r"(\d{1,9}\.\d{1,9}(?:\.\d{1,9})?)"  # bounded: int() refuses a part of thousands of digits
_PROC_VERSION = re.compile(r"NVRM version: NVIDIA UNIX (?P<open>Open )?Kernel Module(?: for \S+)?\s+" + _VERSION)
_PROC_VERSION_OLD = re.compile(r"NVRM version: NVIDIA UNIX \S+ Kernel Module\s+" + _VERSION)
_LIB_VERSION = re.compile(r"\.so\." + _VERSION + r"$")


def read_text(path, limit=1 << 20):
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def nvidia_pci_gpus(sysfs="/sys/bus/pci/devices"):
    """PCI bus ids of NVIDIA display/3D controllers, as NVML writes them: what the driver should see."""
    found = []
    for dev in sorted(glob.glob(os.path.join(sysfs, "*"))):
        try:
            vendor = read_text(os.path.join(dev, "vendor"), 64).strip()
            pci_class = read_text(os.path.join(dev, "class"), 64).strip()
        except (IOError, OSError):
            continue
        if vendor == "0x10de" and pci_class[:6] in ("0x0300", "0x0302"):
            domain, rest = os.path.basename(dev).split(":", 1)
            found.append(domain.rjust(8, "0") + ":" + rest)
    return found


def package_role(name):
    """driver, persistenced, fabricmanager, imex, container_toolkit or None: every packaging family's names
    (module_utils/fleetctl_packaging.py)."""
    return packaging_role(name)


def parse_dpkg_query(text):
    """Output of dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n' -> fleetctl's packages."""
    packages = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        name, version, status = parts
        role = package_role(name)
        if role is None or not status.endswith(" installed"):
            continue
        packages.append({"name": name, "version": version, "manager": "dpkg", "role": role,
                         "held": status.split(" ")[0] == "hold"})
    return packages


def dpkg_status_lines(*texts):
    """The lines `dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n'` prints, from dpkg's status file and its
    journal's records (TEXTS, in the order dpkg applies them: a later record of a package replaces the earlier), without
    running dpkg-query."""
    records = {}
    for text in texts:
        for stanza in text.split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                key, colon, value = line.partition(": ")
                if colon and key in ("Package", "Version", "Status", "Architecture"):
                    fields[key] = value.strip()
            if "Package" in fields:
                records[(fields["Package"], fields.get("Architecture"))] = fields
    return "".join("%s\t%s\t%s\n" % (f["Package"], f.get("Version", ""), f.get("Status", "")) for f in records.values())


def parse_rpm_query(text, versionlock):
    """Output of rpm -qa --qf '%{NAME}\\t%{VERSION}-%{RELEASE}\\n', with the dnf/yum versionlock list."""
    locked = set()
    for line in versionlock.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.startswith("!"):  # "!" entries exclude a version; they hold nothing
            continue
        m = re.match(r"^(?:\d+:)?(.+?)-[^-]+-[^-]+$", line)
        if m:
            locked.add(m.group(1))
    packages = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 2 or package_role(parts[0]) is None:
            continue
        packages.append({"name": parts[0], "version": parts[1], "manager": "rpm", "role": package_role(parts[0]),
                         "held": parts[0] in locked})
    return packages


def ld_cache_entries(data):
    """[(soname, path)] of the dynamic linker's cache DATA (/etc/ld.so.cache), in its order: what `ldconfig -p` lists,
    without running it. None where DATA is not in glibc's format 1.1 or is cut short."""
    start = data.find(_LD_CACHE_MAGIC)
    try:
        count = struct.unpack_from("=I", data, start + 20)[0] if start >= 0 else 0
        table = data[start + 48:start + 48 + 24 * count]
        if start < 0 or len(table) != 24 * count:
            return None

        def string(offset):  # offsets count from the header's start
            return data[start + offset:data.index(b"\0", start + offset)].decode("utf-8", "replace")
        entries = struct.iter_unpack("=iIIIQ", table)  # flags, key, value, os version, hwcap
        return [(string(entry[1]), string(entry[2])) for entry in entries]
    except (struct.error, ValueError):
        return None


def parse_proc_driver_version(text):
    """(module version, flavor) from /proc/driver/nvidia/version."""
    m = _PROC_VERSION.search(text)
    if m:
        return m.group(2), "open" if m.group("open") else "proprietary"
    m = _PROC_VERSION_OLD.search(text)
    if m:
        return m.group(1), "proprietary"
    return None, None


def driver_state(module_version, userspace_version, installed, nvml_mismatch=False):
    """loaded | version_mismatch | not_loaded | not_installed."""
    if module_version is None:
        return "not_loaded" if installed else "not_installed"
    if nvml_mismatch or (userspace_version and userspace_version != module_version):
        return "version_mismatch"
    return "loaded"


def modprobe_blacklists(files_text, cmdline):
    """Files (and the kernel command line) that keep nouveau from loading."""
    found = []
    for path, text in files_text:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if re.match(r"^blacklist\s+nouveau$", line) or re.match(r"^install\s+nouveau\s+/bin/(false|true)\b", line):
                found.append(path)
                break
    if re.search(r"(^|\s)(modprobe\.blacklist|rd\.driver\.blacklist)=\S*\bnouveau\b", cmdline):
        found.append("/proc/cmdline")
    return found


def toml_has_nvidia_runtime(text, engine):
    if engine == "crio":
        return (bool(re.search(r"^\s*\[crio\.runtime\.runtimes\.\"?nvidia\"?\]", text, re.M)),
                bool(re.search(r"^\s*default_runtime\s*=\s*\"nvidia\"", text, re.M)))
    return (bool(re.search(r"^\s*\[[^#\n]*runtimes\.[\"']?nvidia[\"']?\]", text, re.M)),
            bool(re.search(r"^\s*default_runtime_name\s*=\s*[\"']nvidia[\"']", text, re.M)))


def cdi_driver_version(text):
    """The driver version a CDI spec was generated for, from the versioned driver libraries it mounts."""
    versions = set(re.findall(r"lib(?:cuda|nvidia-ml|nvidia-ptxjitcompiler)\.so\." + _VERSION, text))
    return max(versions, key=lambda v: tuple(int(x) for x in v.split("."))) if versions else None


class Collector:
    def __init__(self, module):
        self.module = module
        self.errors = {}
        self.sources = {}
        self.processes = None
        self.smi_xml = None  # the `nvidia-smi -q -x` output parsed for the GPU facts, when that was the source
        self.interconnect = None
        self.interconnect_options = {}  # NvmlInterconnect's evidence and cache (collect's params)

    # -- helpers ---------------------------------------------------------------------------------
    def run(self, argv, fact, timeout=None):
        """(rc, stdout) of a command; a missing command is (None, ''). With TIMEOUT (s) it runs under coreutils'
        timeout where installed: AnsibleModule.run_command waits for ever (`fleetctl check`'s runner has its own)."""
        path = self.module.get_bin_path(argv[0], opt_dirs=BIN_DIRS)
        if path is None:
            return None, ""
        wrapper = self.module.get_bin_path("timeout", opt_dirs=BIN_DIRS) if timeout else None
        command = ([wrapper, "-k", "5", str(timeout)] if wrapper else []) + [path] + argv[1:]
        rc, out, err = self.module.run_command(command, environ_update={"LC_ALL": "C"})
        if wrapper and rc in (124, 137):
            self.errors[fact] = "%s: no answer in %d s" % (" ".join(argv), timeout)
        elif rc != 0:
            self.errors[fact] = "%s exited %d: %s" % (" ".join(argv), rc, " ".join((err or out).split())[:300])
        return rc, out

    def read(self, path, fact):
        try:
            return read_text(path)
        except (IOError, OSError) as e:
            if getattr(e, "errno", None) != 2:  # absent files are facts in themselves, not errors
                self.errors[fact] = "%s: %s" % (path, e.strerror or e)
            return None

    @staticmethod
    def listing(path):
        """The names in directory PATH; none where it is absent or unreadable."""
        try:
            return os.listdir(path)
        except (IOError, OSError):
            return []

    def running(self, name):
        if self.processes is None:
            self.processes = set()
            for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
                try:
                    argv0 = read_text(cmdline, 4096).split("\0", 1)[0]
                except (IOError, OSError):
                    continue
                if argv0:
                    self.processes.add(os.path.basename(argv0.split(" ", 1)[0]))
        return name in self.processes

    @staticmethod
    def unit_enabled(unit):
        """True/False from systemd's wants links; None on a host without systemd unit directories."""
        if not any(os.path.isdir(d) for d in ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")):
            return None
        return bool(glob.glob("/etc/systemd/system/*.wants/" + unit) or glob.glob("/usr/lib/systemd/system/*.wants/" + unit)
                    or glob.glob("/lib/systemd/system/*.wants/" + unit))

    # -- sections --------------------------------------------------------------------------------
    def host(self):
        os_release = {}
        text = self.read("/etc/os-release", "host.os") or self.read("/usr/lib/os-release", "host.os") or ""
        for line in text.splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                os_release[k.strip()] = v.strip().strip('"')
        if not os.path.isdir("/sys/firmware/efi"):
            secure_boot = "unsupported"
        else:
            try:
                with open(SECURE_BOOT_VAR, "rb") as f:
                    data = f.read()
                secure_boot = "enabled" if data[-1:] == b"\x01" else "disabled"
            except (IOError, OSError):
                secure_boot = "unknown"
        uptime = self.read("/proc/uptime", "host.uptime_s")
        return {
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
            "arch": platform.machine(),
            "os": {"id": os_release.get("ID"), "version_id": os_release.get("VERSION_ID"),
                   "pretty_name": os_release.get("PRETTY_NAME")},
            "boot_id": (self.read("/proc/sys/kernel/random/boot_id", "host.boot_id") or "").strip() or None,
            "uptime_s": float(uptime.split()[0]) if uptime else None,
            "secure_boot": secure_boot,
            "python": platform.python_version(),
            "pci_gpus": nvidia_pci_gpus(),
        }

    def packages(self):
        """The NVIDIA packages of the host's package databases: dpkg's, read from its files (no dpkg-query), where
        it has a status file; rpm's where the system keeps one (RPM_DB_DIRS): an rpm tool on a Debian host keeps a
        database of its own, not the system's, and is not asked."""
        packages = []
        status = self.read(DPKG_STATUS, "driver.packages")
        if status is not None:
            journal = sorted((n for n in self.listing(DPKG_UPDATES) if n.isdigit()), key=int)
            records = [self.read(os.path.join(DPKG_UPDATES, n), "driver.packages") or "" for n in journal]
            packages += parse_dpkg_query(dpkg_status_lines(status, *records))
            self.sources["packages"] = "dpkg"
        if not any(self.listing(d) for d in RPM_DB_DIRS):
            return packages
        rc, out = self.run(["rpm", "-qa", "--qf", "%{NAME}\t%{VERSION}-%{RELEASE}\n"], "driver.packages")
        if rc == 0:
            lock = (self.read("/etc/dnf/plugins/versionlock.list", "driver.packages") or "") + \
                   (self.read("/etc/yum/pluginconf.d/versionlock.list", "driver.packages") or "")
            packages += parse_rpm_query(out, lock)
            self.sources["packages"] = "rpm" if "packages" not in self.sources else "dpkg+rpm"
        return packages

    def userspace_library(self):
        """(version, path) of the installed libnvidia-ml.so.1: where the dynamic linker's cache says (read from
        /etc/ld.so.cache, else asked of `ldconfig -p`), else in LIB_DIRS."""
        candidates = []
        try:
            with open(LD_CACHE, "rb") as f:
                entries = ld_cache_entries(f.read(16 << 20))
        except (IOError, OSError):
            entries = None
        if entries is not None:
            candidates += [path for soname, path in entries if soname == "libnvidia-ml.so.1"]
        else:
            rc, out = self.run(["ldconfig", "-p"], "driver.userspace_version")
            for line in out.splitlines() if rc == 0 else []:
                if line.strip().startswith("libnvidia-ml.so.1 ") and "=>" in line:
                    candidates.append(line.split("=>", 1)[1].strip())
        candidates += [os.path.join(d, "libnvidia-ml.so.1") for d in LIB_DIRS]
        for path in candidates:
            if os.path.exists(path):
                real = os.path.realpath(path)
                m = _LIB_VERSION.search(real)
                if m:
                    return m.group(1), real
        return None, None

    def nvml(self):
        """(system, gpus, error code) through pynvml, or None when pynvml is not importable."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            # No library, no loaded driver, or a library/module mismatch are facts the driver state reports;
            # any other failure is an error of this fact.
            if e.value not in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH):
                self.errors["nvml"] = "NVML: %s" % e
            return {}, [], e.value
        try:
            reader = NvmlReader(pynvml, self.errors)
            system, gpus = reader.system(), reader.gpus()
            interconnect = NvmlInterconnect(pynvml, self.errors, **self.interconnect_options)
            self.interconnect = self.guarded(interconnect.read)  # same NVML session
            if self.interconnect is not None:
                self.sources["interconnect"] = "nvml"
            return system, gpus, None
        finally:
            pynvml.nvmlShutdown()

    def guarded(self, read, fact="interconnect"):
        """One part's reader failing in a way nobody foresaw costs that part (an errors entry), not the host's facts."""
        try:
            return read()
        except Exception as e:  # the other facts must still be returned
            self.errors[fact] = "reading the %s failed: %s: %s" % (fact, type(e).__name__, e)
            return None

    def smi_interconnect(self, gpus):
        """facts.interconnect from nvidia-smi (no pynvml): nvlink -s, nvlink -e, topo -m (2+ GPUs), and the <fabric>
        elements of the -q -x output already read."""
        outputs = {}
        for name, argv in (("status", ["nvidia-smi", "nvlink", "-s"]), ("counters", ["nvidia-smi", "nvlink", "-e"]),
                           ("topo", ["nvidia-smi", "topo", "-m"])):
            if not gpus or (name == "topo" and len(gpus) < 2):
                outputs[name] = None if name == "topo" else ("", None)
                continue
            path = self.module.get_bin_path(argv[0], opt_dirs=BIN_DIRS)
            if path is None:
                outputs[name] = ("", "nvidia-smi is not installed")
                continue
            rc, out, err = self.module.run_command([path] + argv[1:], environ_update={"LC_ALL": "C"})
            outputs[name] = (out, None) if rc == 0 else \
                ("", "%s exited %d: %s" % (" ".join(argv), rc, " ".join((err or out or "").split())[:300]))
        interconnect = self.guarded(lambda: from_smi(gpus, self.smi_xml, outputs["status"], outputs["counters"],
                                                     outputs["topo"], self.errors))
        if interconnect is not None:
            self.sources["interconnect"] = "nvidia-smi"
        return interconnect

    def nvidia_smi(self):
        rc, out = self.run(["nvidia-smi", "-q", "-x"], "gpus")
        if rc is None:
            return None
        if rc != 0:
            said = self.errors.get("gpus", "").lower()
            # nvidia-smi exits with the NVML return code; a mismatch or an unloaded driver is the driver state
            # this module reports, not a failure to read facts.
            if rc == NVML_ERROR_LIB_RM_VERSION_MISMATCH or "version mismatch" in said:
                del self.errors["gpus"]
                return {}, [], NVML_ERROR_LIB_RM_VERSION_MISMATCH
            if rc == NVML_ERROR_DRIVER_NOT_LOADED or "couldn't communicate with the nvidia driver" in said:
                del self.errors["gpus"]
                return {}, [], NVML_ERROR_DRIVER_NOT_LOADED
            return {}, [], None
        try:
            system, gpus = parse_smi_xml(out)
        except SmiParseError as e:
            self.errors["gpus"] = str(e)
            return {}, [], None
        self.smi_xml = out
        return system, gpus, None

    def driver_and_gpus(self, packages):
        module_version = (self.read("/sys/module/nvidia/version", "driver.module_version") or "").strip() or None
        proc_text = self.read("/proc/driver/nvidia/version", "driver.module_flavor") or ""
        proc_version, flavor = parse_proc_driver_version(proc_text)
        if module_version:
            self.sources["driver.module_version"] = "/sys/module/nvidia/version"
        elif proc_version:
            module_version = proc_version
            self.sources["driver.module_version"] = "/proc/driver/nvidia/version"
        if flavor:
            self.sources["driver.module_flavor"] = "/proc/driver/nvidia/version"
        if module_version and not re.match("^" + _VERSION + "$", module_version):
            self.errors["driver.module_version"] = "unexpected module version %r" % module_version[:80]
            module_version = None
            flavor = None
        userspace, lib_path = self.userspace_library()
        if userspace:
            self.sources["driver.userspace_version"] = lib_path

        gpu_source = "nvml"
        result = self.nvml()
        if result is None:
            gpu_source = "nvidia-smi -q -x"
            result = self.nvidia_smi()
            if result is not None and self.smi_xml is not None:
                self.interconnect = self.smi_interconnect(result[1])
        if result is None:
            gpu_source, result = None, ({}, [], None)
        system, gpus, error_code = result
        if gpu_source and (gpus or system):
            self.sources["gpus"] = gpu_source
        if not userspace and system.get("nvml_version"):  # "13.580.159.04" -> "580.159.04"
            userspace = system["nvml_version"].split(".", 1)[1] if system["nvml_version"].count(".") >= 2 else None
            self.sources["driver.userspace_version"] = "nvml"

        cuda = system.get("cuda_driver_version")
        if cuda and not re.match(r"^\d{1,2}\.\d{1,2}$", cuda):
            self.errors["driver.cuda_driver_version"] = "unexpected CUDA version %r" % cuda[:80]
            system["cuda_driver_version"] = None
        driver_packages = [p for p in packages if p["role"] == "driver"]
        installed = bool(driver_packages or userspace)
        state = driver_state(module_version, userspace, installed, error_code == NVML_ERROR_LIB_RM_VERSION_MISMATCH)
        if error_code == NVML_ERROR_DRIVER_NOT_LOADED and state == "loaded":
            state = "not_loaded"
        version = module_version or userspace
        driver = {
            "state": state,
            "module_version": module_version,
            "module_flavor": flavor,
            "userspace_version": userspace,
            "nvml_version": system.get("nvml_version"),
            "cuda_driver_version": system.get("cuda_driver_version"),
            "branch": version.split(".", 1)[0] if version else None,
            "packages": packages,
            "held": all(p["held"] for p in moves_with_driver(driver_packages, {module_version, userspace})
                        or driver_packages) if driver_packages else None,
        }
        return driver, gpus

    def nouveau(self, check_initramfs):
        files = []
        for d in MODPROBE_DIRS:
            for path in sorted(glob.glob(os.path.join(d, "*.conf"))):
                text = self.read(path, "nouveau.blacklisted")
                if text is not None:
                    files.append((path, text))
        blacklist_files = modprobe_blacklists(files, self.read("/proc/cmdline", "nouveau.blacklisted") or "")
        facts = {"loaded": os.path.isdir("/sys/module/nouveau"), "blacklisted": bool(blacklist_files),
                 "blacklist_files": blacklist_files, "initramfs": None, "in_initramfs": None}
        if not check_initramfs:
            return facts
        release = platform.release()
        for image, lister in (("/boot/initrd.img-" + release, "lsinitramfs"), ("/boot/initramfs-%s.img" % release, "lsinitrd")):
            if os.path.exists(image):
                facts["initramfs"] = image
                rc, out = self.run([lister, image], "nouveau.in_initramfs")
                if rc == 0:
                    facts["in_initramfs"] = bool(re.search(r"/nouveau\.ko", out))
                elif rc is None:
                    self.errors["nouveau.in_initramfs"] = "%s is not installed; cannot list %s" % (lister, image)
                break
        return facts

    def boot(self):
        """The kernel the host boots next and the nvidia module of the running and the next kernel
        (module_utils/fleetctl_boot.py says where each comes from)."""
        rc, dkms = self.run(["dkms", "status"], "boot.dkms")
        return boot_facts(platform.release(), dkms if rc == 0 else None, self.modinfo_version)

    def modinfo_version(self, path):
        rc, out = self.run(["modinfo", "-F", "version", path], "boot.modules")
        if rc is None:
            self.errors["boot.modules"] = "modinfo is not installed: cannot read the version of %s" % path
        return out.strip().splitlines()[0] if rc == 0 and out.strip() else None

    def persistence(self):
        return {"daemon_running": self.running("nvidia-persistenced"), "daemon_enabled": self.unit_enabled("nvidia-persistenced.service")}

    def container_runtime(self, packages):
        engines = []
        docker_installed = self.module.get_bin_path("dockerd", opt_dirs=BIN_DIRS) is not None
        docker = {"name": "docker", "installed": docker_installed, "running": self.running("dockerd"),
                  "nvidia_runtime": False, "nvidia_default": False, "config_files": []}
        text = self.read("/etc/docker/daemon.json", "container_runtime.docker")
        if text is not None:
            docker["config_files"].append("/etc/docker/daemon.json")
            try:
                conf = json.loads(text) if text.strip() else {}
                docker["nvidia_runtime"] = "nvidia" in (conf.get("runtimes") or {})
                docker["nvidia_default"] = conf.get("default-runtime") == "nvidia"
            except (ValueError, AttributeError) as e:
                self.errors["container_runtime.docker"] = "/etc/docker/daemon.json is not valid JSON: %s" % e
        engines.append(docker)
        for name, binary, paths in (
                ("containerd", "containerd", ["/etc/containerd/config.toml"] + sorted(glob.glob("/etc/containerd/conf.d/*.toml"))),
                ("crio", "crio", ["/etc/crio/crio.conf"] + sorted(glob.glob("/etc/crio/crio.conf.d/*")))):
            engine = {"name": name, "installed": self.module.get_bin_path(binary, opt_dirs=BIN_DIRS) is not None,
                      "running": self.running(binary), "nvidia_runtime": False, "nvidia_default": False, "config_files": []}
            for path in paths:
                text = self.read(path, "container_runtime." + name)
                if text is None:
                    continue
                engine["config_files"].append(path)
                has_runtime, is_default = toml_has_nvidia_runtime(text, name)
                engine["nvidia_runtime"] = engine["nvidia_runtime"] or has_runtime
                engine["nvidia_default"] = engine["nvidia_default"] or is_default
            engines.append(engine)

        toolkit = [p for p in packages if p["name"] in ("nvidia-container-toolkit", "nvidia-container-toolkit-base")]
        toolkit_version = toolkit[0]["version"] if toolkit else None
        if toolkit_version is None:
            rc, out = self.run(["nvidia-ctk", "--version"], "container_runtime.toolkit_version")
            m = re.search(r"version\s+" + r"(\d+\.\d+\.\d+)", out or "")
            toolkit_version = m.group(1) if rc == 0 and m else None
        specs = []
        for path in sorted(glob.glob("/etc/cdi/*.yaml") + glob.glob("/etc/cdi/*.json")
                           + glob.glob("/var/run/cdi/*.yaml") + glob.glob("/var/run/cdi/*.json")):
            text = self.read(path, "container_runtime.cdi_specs") or ""
            if "nvidia.com/" in text:
                specs.append({"path": path, "driver_version": cdi_driver_version(text)})
        return {"engines": engines, "toolkit_version": toolkit_version, "cdi_specs": specs}

    def fabric_manager(self, packages):
        nvswitch = bool(glob.glob("/dev/nvidia-nvswitch[0-9]*")) or bool(glob.glob("/proc/driver/nvidia-nvswitch/devices/*"))
        fm = [p for p in packages if p["role"] == "fabricmanager" and "nscq" not in p["name"]]
        return {"nvswitch_present": nvswitch, "package_version": fm[0]["version"] if fm else None,
                "running": self.running("nv-fabricmanager"), "enabled": self.unit_enabled("nvidia-fabricmanager.service")}

    def imex(self, packages):
        """facts.imex (module_utils/fleetctl_imex.py): None unless a live GPU reports a multi-node NVLink domain, and
        then nothing IMEX is run or read."""
        if not nvlink_domains(self.interconnect):
            return None
        package = next((p for p in packages if p["role"] == "imex"), None)
        rc, out = self.run(["nvidia-imex", "--version"], "imex.version")
        version = parse_version(out) if rc == 0 else None
        if rc == 0 and version is None:
            self.errors["imex.version"] = "nvidia-imex --version: unexpected output %r" % out.strip()[:80]
        config_text = self.read(CONFIG_FILE, "imex.config_file")
        config = parse_config(config_text or "")
        nodes_file = nodes_config_file(config) if config_text is not None else None
        nodes_text = self.read(nodes_file, "imex.nodes") if nodes_file else None
        nodes, problems = parse_nodes(nodes_text) if nodes_text is not None else (None, [])
        if problems:
            self.errors["imex.nodes"] = "%s: %s" % (nodes_file, "; ".join(problems)[:300])
        try:
            names = os.listdir(CHANNELS_DIR)
        except (IOError, OSError) as e:
            names = []
            if e.errno != 2:
                self.errors["imex.channels"] = "%s: %s" % (CHANNELS_DIR, e.strerror or e)
        channels = parse_channels(self.read("/proc/devices", "imex.channels") or "", names)
        return {"package": package["name"] if package else None,
                "package_version": package["version"] if package else None, "version": version,
                "running": self.running("nvidia-imex"), "enabled": self.unit_enabled("nvidia-imex.service"),
                "config_file": CONFIG_FILE, "nodes_config_file": nodes_file, "nodes": nodes, "channels": channels,
                "domain": self.imex_domain(config)}

    def imex_domain(self, config):
        """`nvidia-imex-ctl -N -j -H`, with this host's connection to each member (its own entry: the member at
        BIND_INTERFACE_IP, else at one of this host's addresses)."""
        rc, out = self.run(["nvidia-imex-ctl", "-N", "-j", "-H"], "imex.domain", IMEX_CTL_TIMEOUT_S)
        if rc != 0:
            return None
        own = [config["BIND_INTERFACE_IP"]] if config.get("BIND_INTERFACE_IP") else local_addresses(
            self.read("/proc/net/fib_trie", "imex.domain"), self.read("/proc/net/if_inet6", "imex.domain"))
        try:
            domain, problem = parse_domain(out, own)
        except ImexOutputError as e:
            domain, problem = None, str(e)
        if problem:
            self.errors["imex.domain"] = problem
        return domain

    def xid(self, catalog, overrides, since_seq):
        try:
            records, source = read_kernel_log()
        except KernelLogUnreadable as e:
            self.errors["xid"] = "kernel log unreadable: %s" % e
            return {"events": [], "last_seq": None}
        self.sources["xid"] = source
        self.kernel_records = records  # read once: sxid() parses the same records
        events = xid_events(records, catalog_index(catalog, overrides), since_seq if since_seq >= 0 else None)
        seqs = [r["seq"] for r in records if r["seq"] is not None]
        return {"events": events, "last_seq": max(seqs) if seqs else None}

    def sxid(self, since_seq):
        """NVSwitch SXid errors from the records xid() read (module_utils/fleetctl_kernel_log.py)."""
        records = getattr(self, "kernel_records", None)
        if records is None:
            self.errors["sxid"] = self.errors.get("xid", "kernel log not read")
            return {"events": []}
        return {"events": sxid_events(records, since_seq if since_seq >= 0 else None)}

    def collect(self, params):
        """The facts. PARAMS: the module's, and (from `fleetctl check`) nvlink_evidence, False to leave the NVLink
        counters no control judges unread, and nvlink_cache, the file keeping the links' versions and remote ends
        for this boot (module_utils/fleetctl_interconnect.py)."""
        started = time.time()
        self.interconnect_options = {"evidence": params.get("nvlink_evidence", True),
                                     "cache": params.get("nvlink_cache")}
        packages = self.packages()
        driver, gpus = self.driver_and_gpus(packages)
        add_aer(gpus, self.errors)
        facts = {
            "schema_version": FACTS_SCHEMA_VERSION,
            "collector": {"name": "gpu_facts", "version": COLLECTOR_VERSION},
            "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": self.host(),
            "driver": driver,
            "nouveau": self.nouveau(params["check_initramfs"]),
            "boot": self.guarded(self.boot, "boot"),
            "persistence": self.persistence(),
            "container_runtime": self.container_runtime(packages),
            "fabric_manager": self.fabric_manager(packages),
            "gpus": gpus,
            "interconnect": self.interconnect,
            "xid": self.xid(params["xid_catalog"], params["xid_overrides"], params["kmsg_since_seq"]),
        }
        facts["sxid"] = self.sxid(params["kmsg_since_seq"])
        facts["infiniband"] = self.guarded(lambda: read_infiniband(self.errors), "infiniband")
        facts["imex"] = self.guarded(lambda: self.imex(packages), "imex")
        facts["sources"] = self.sources
        facts["errors"] = self.errors
        facts["collect_seconds"] = round(time.time() - started, 3)
        return facts


def main():
    # Imported here: `fleetctl check` runs this module's Collector in-process with a module of its own
    # (orchestrator/check.py) and must not pay for importing Ansible.
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            xid_catalog=dict(type="list", elements="dict", default=[]),
            xid_overrides=dict(type="dict", default={}),
            kmsg_since_seq=dict(type="int", default=-1),
            check_initramfs=dict(type="bool", default=True),
            as_json=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    facts = Collector(module).collect(module.params)
    if module.params["as_json"]:
        module.exit_json(changed=False, facts_json=json.dumps(facts, separators=(",", ":")))
    module.exit_json(changed=False, facts=facts)


if __name__ == "__main__":
    main()
