# -*- coding: utf-8 -*-
# Per-GPU facts from NVML (pynvml) or, without it, from `nvidia-smi -q -x`. Standard library only.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import re
import xml.etree.ElementTree as ET

# nvmlClocksEventReasons bits (nvml.h) -> names used in facts.
CLOCK_EVENT_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clocks_setting"),
)
# nvidia-smi -q -x tag suffix -> the same names.
_SMI_CLOCK_TAGS = dict((name, bit) for bit, name in CLOCK_EVENT_BITS)

# NVML return codes fleetctl tells apart (nvml.h).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230  # nvml.h; 271 is NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
RECOVERY_ACTIONS = {0: "None", 1: "Reset", 2: "Reboot", 3: "Drain P2P", 4: "Drain and Reset", 5: "Recover IMEX Domain",
                    6: "Bus Reset", 7: "System Reboot"}  # nvmlDeviceGpuRecoveryAction_t


def clock_event_names(mask):
    return [name for bit, name in CLOCK_EVENT_BITS if mask & bit]


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


# A GPU whose memory in use (beyond what the driver reserves for itself) is over this many MiB while NVML lists no
# process on it holds a leaked context (the OOM runbook's "zombie"): gpu.memory_leak fails it and gpu_users keeps a
# campaign's wait_idle from calling it idle. Idle GPUs read 0 MiB (real H100 and 2x H200, driver 580.159.04:
# tests/testdata/h100-580.159.04*/nvidia-smi-q-x.xml, h200x2-580.159.04); the smallest leak, one CUDA context with
# nothing allocated, holds hundreds of MiB. The baseline sets another limit with gpus.max_unowned_memory_mib.
LEAK_MIB = 256


def leaked_mib(memory, limit_mib=LEAK_MIB):
    """MiB a GPU holds with no process listed, when over LIMIT_MIB; else None (also when unread)."""
    if not memory or memory.get("used_bytes") is None or memory.get("processes") != 0:
        return None
    used = memory["used_bytes"] // (1 << 20)
    return used if used > limit_mib else None


def nvml_memory(n, h, errors, fact):
    """Memory in use (NVML's v2 info: C(used) leaves out what the driver reserves for itself, 480 MiB on an idle
    H100) and how many compute and graphics processes NVML lists; None without the v2 query (drivers before R510,
    or a pynvml that cannot ask for it): v1's C(used) counts the reserved memory and would read as a leak."""
    version = getattr(n, "nvmlMemory_v2", None)
    if version is None:
        return None
    try:
        mem = n.nvmlDeviceGetMemoryInfo(h, version=version)
    except TypeError:  # a pynvml without the version argument
        return None
    except n.NVMLError as e:
        if e.value not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
            errors[fact] = "NVML: %s" % e
        return None
    count = 0
    for fn in (n.nvmlDeviceGetComputeRunningProcesses, n.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            count += len(fn(h))
        except n.NVMLError as e:
            if e.value != NVML_ERROR_NOT_SUPPORTED:
                errors[fact + ".processes"] = "NVML: %s" % e
                count = None
                break
    return {"total_bytes": mem.total, "reserved_bytes": mem.reserved, "used_bytes": mem.used, "processes": count}


class NvmlReader:
    """Reads facts through pynvml. Unsupported queries give None; other failures are recorded per fact."""

    def __init__(self, pynvml, errors):
        self.n = pynvml
        self.errors = errors

    def _get(self, fact, fn, *args):
        try:
            return fn(*args)
        except self.n.NVMLError as e:
            if e.value != NVML_ERROR_NOT_SUPPORTED:
                self.errors[fact] = "NVML: %s" % e
            return None

    def system(self):
        cuda = self._get("driver.cuda_driver_version", self.n.nvmlSystemGetCudaDriverVersion_v2)
        return {
            "driver_version": _text(self._get("driver.nvml_driver_version", self.n.nvmlSystemGetDriverVersion)),
            "nvml_version": _text(self._get("driver.nvml_version", self.n.nvmlSystemGetNVMLVersion)),
            "cuda_driver_version": "%d.%d" % (cuda // 1000, (cuda % 1000) // 10) if cuda else None,
        }

    def gpus(self):
        n = self.n
        count = self._get("gpus", n.nvmlDeviceGetCount)
        return [self.gpu(i) for i in range(count or 0)]

    def gpu(self, i):
        n, g = self.n, self._get
        p = "gpus[%d]." % i
        try:
            h = n.nvmlDeviceGetHandleByIndex(i)
        except n.NVMLError as e:
            # A lost GPU is a fact about the host; any other failure to open it is also a read error
            # (reported in errors, so no control passes on it), and the GPU counts as not answering.
            if e.value != NVML_ERROR_GPU_IS_LOST:
                self.errors[p + "handle"] = "NVML: %s" % e
            return {"index": i, "lost": True}
        ecc = g(p + "ecc", n.nvmlDeviceGetEccMode, h)
        remapped = g(p + "remapped_rows", n.nvmlDeviceGetRemappedRows, h)
        mig = g(p + "mig", n.nvmlDeviceGetMigMode, h)
        reasons = g(p + "clock_event_reasons", n.nvmlDeviceGetCurrentClocksEventReasons, h)
        power = g(p + "power_w", n.nvmlDeviceGetPowerUsage, h)
        pci = g(p + "pci_bus_id", n.nvmlDeviceGetPciInfo, h)
        sbe = g(p + "retired_pages", n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = g(p + "retired_pages", n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = g(p + "retired_pages", n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        persistence = g(p + "persistence_mode", n.nvmlDeviceGetPersistenceMode, h)
        ecc_on = bool(ecc[0]) if ecc else None
        return {
            "index": i,
            "name": _text(g(p + "name", n.nvmlDeviceGetName, h)),
            "uuid": _text(g(p + "uuid", n.nvmlDeviceGetUUID, h)),
            "serial": _text(g(p + "serial", n.nvmlDeviceGetSerial, h)),
            "pci_bus_id": _text(pci.busId).lower() if pci is not None else None,
            "vbios": _text(g(p + "vbios", n.nvmlDeviceGetVbiosVersion, h)),
            "persistence_mode": bool(persistence) if persistence is not None else None,
            "ecc": {
                "enabled": ecc_on,
                "pending": bool(ecc[1]) if ecc else None,
                "uncorrected_volatile": g(p + "ecc.uncorrected_volatile", n.nvmlDeviceGetTotalEccErrors, h,
                                          n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC) if ecc_on else None,
                "uncorrected_aggregate": g(p + "ecc.uncorrected_aggregate", n.nvmlDeviceGetTotalEccErrors, h,
                                           n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC) if ecc_on else None,
            },
            "remapped_rows": None if remapped is None else {
                "correctable": remapped[0], "uncorrectable": remapped[1],
                "pending": bool(remapped[2]), "failure": bool(remapped[3])},
            "retired_pages": None if sbe is None and dbe is None else {
                "single_bit": len(sbe or []), "double_bit": len(dbe or []),
                "pending": bool(pending) if pending is not None else None},
            "mig": None if mig is None else {"current": bool(mig[0]), "pending": bool(mig[1])},
            "pcie": {
                "gen": g(p + "pcie.gen", n.nvmlDeviceGetCurrPcieLinkGeneration, h),
                "gen_max": g(p + "pcie.gen_max", n.nvmlDeviceGetMaxPcieLinkGeneration, h),
                "width": g(p + "pcie.width", n.nvmlDeviceGetCurrPcieLinkWidth, h),
                "width_max": g(p + "pcie.width_max", n.nvmlDeviceGetMaxPcieLinkWidth, h),
                "replay_count": g(p + "pcie.replay_count", n.nvmlDeviceGetPcieReplayCounter, h),
            },
            "inforom_image": _text(g(p + "inforom_image", n.nvmlDeviceGetInforomImageVersion, h)) or None,
            "memory": self._memory(h, p),
            "clock_event_reasons": None if reasons is None else {"mask": reasons, "active": clock_event_names(reasons)},
            "temperature_c": g(p + "temperature_c", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            "power_w": round(power / 1000.0, 1) if power is not None else None,
            "recovery_action": self._recovery_action(h, p),
        }

    def _memory(self, h, p):
        return nvml_memory(self.n, h, self.errors, p + "memory")

    def _recovery_action(self, h, p):
        try:
            fv = self.n.nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
        except (self.n.NVMLError, AttributeError):
            return None
        if fv.nvmlReturn != 0:
            return None
        return RECOVERY_ACTIONS.get(fv.value.uiVal, "0x%x" % fv.value.uiVal)


# ---- nvidia-smi -q -x -------------------------------------------------------------------------

def _find(el, path):
    found = el.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text in ("N/A", "", "[N/A]", "Not Supported", "[Not Supported]") else text


def _int(text, strip=""):
    if text is None:
        return None
    m = re.match(r"^\s*(-?\d+)", text.replace(strip, "") if strip else text)
    try:
        return int(m.group(1)) if m else None
    except ValueError:  # thousands of digits: int() refuses them, and no counter is that big
        return None


def _float(text):
    if text is None:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", text)
    return float(m.group(1)) if m else None


def _flag(text, on=("Enabled", "Yes", "Active"), off=("Disabled", "No", "Not Active")):
    if text in on:
        return True
    if text in off:
        return False
    return None


def _sum_counts(el, paths):
    vals = [_int(_find(el, p)) for p in paths]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


# Uncorrectable ECC counters by nvidia-smi XML generation (v12+ split SRAM/DRAM; older had double_bit/total).
_UNCORRECTED = ("dram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded", "sram_uncorrectable",
                "double_bit/total")


def _mib(text):
    n = _int(text, " MiB")
    return n * (1 << 20) if n is not None else None


def _smi_memory(gpu):
    """<fb_memory_usage> as NvmlReader._memory: nvidia-smi of R510 and later shows <reserved> apart from <used>
    (tests/testdata/h100-580.159.04/nvidia-smi-q-x.xml: 480 MiB reserved, 0 MiB used); without <reserved> its
    <used> counts the reserved memory, so there is no figure to judge (None). <processes> lists one <process_info>
    per process, compute and graphics."""
    fb = gpu.find("fb_memory_usage")
    if fb is None or _find(fb, "reserved") is None or _find(fb, "used") is None:
        return None
    procs = gpu.find("processes")
    return {"total_bytes": _mib(_find(fb, "total")), "reserved_bytes": _mib(_find(fb, "reserved")),
            "used_bytes": _mib(_find(fb, "used")),
            "processes": len(procs.findall("process_info")) if procs is not None else None}


class SmiParseError(ValueError):
    pass


def parse_smi_xml(text):
    """(system, gpus) from `nvidia-smi -q -x` output, in the same shape as NvmlReader's."""
    try:
        root = ET.fromstring(text)
    except (ET.ParseError, ValueError) as e:  # ValueError: undecodable bytes (surrogates), multi-byte encodings
        raise SmiParseError("nvidia-smi -q -x output is not XML: %s" % e)
    if root.tag != "nvidia_smi_log":
        raise SmiParseError("nvidia-smi -q -x output has root <%s>, expected <nvidia_smi_log>" % root.tag)
    system = {"driver_version": _find(root, "driver_version"), "nvml_version": None,
              "cuda_driver_version": _find(root, "cuda_version")}
    gpus = []
    for i, gpu in enumerate(root.findall("gpu")):
        reasons = gpu.find("clocks_event_reasons")
        if reasons is None:
            reasons = gpu.find("clocks_throttle_reasons")  # drivers before 535
        mask = None
        if reasons is not None:
            mask = 0
            for child in reasons:
                name = re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag)
                if (child.text or "").strip() == "Active" and name in _SMI_CLOCK_TAGS:
                    mask |= _SMI_CLOCK_TAGS[name]
        ecc_on = _flag(_find(gpu, "ecc_mode/current_ecc"))
        sbe = _int(_find(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"))
        dbe = _int(_find(gpu, "retired_pages/double_bit_retirement/retired_count"))
        remap_pending = _find(gpu, "remapped_rows/remapped_row_pending")
        mig = _find(gpu, "mig_mode/current_mig")
        power = _find(gpu, "gpu_power_readings/instant_power_draw") or _find(gpu, "gpu_power_readings/power_draw") \
            or _find(gpu, "power_readings/power_draw")
        gpus.append({
            "index": i,
            "name": _find(gpu, "product_name"),
            "uuid": _find(gpu, "uuid"),
            "serial": _find(gpu, "serial"),
            "pci_bus_id": (_find(gpu, "pci/pci_bus_id") or gpu.get("id") or "").lower() or None,
            "vbios": _find(gpu, "vbios_version"),
            "persistence_mode": _flag(_find(gpu, "persistence_mode")),
            "ecc": {
                "enabled": ecc_on,
                "pending": _flag(_find(gpu, "ecc_mode/pending_ecc")),
                "uncorrected_volatile": _sum_counts(gpu, ["ecc_errors/volatile/" + t for t in _UNCORRECTED]) if ecc_on else None,
                "uncorrected_aggregate": _sum_counts(gpu, ["ecc_errors/aggregate/" + t for t in _UNCORRECTED]) if ecc_on else None,
            },
            "remapped_rows": None if remap_pending is None else {
                "correctable": _int(_find(gpu, "remapped_rows/remapped_row_corr")),
                "uncorrectable": _int(_find(gpu, "remapped_rows/remapped_row_unc")),
                "pending": _flag(remap_pending), "failure": _flag(_find(gpu, "remapped_rows/remapped_row_failure"))},
            "retired_pages": None if sbe is None and dbe is None else {
                "single_bit": sbe or 0, "double_bit": dbe or 0,
                "pending": _flag(_find(gpu, "retired_pages/pending_retirement"))},
            "mig": None if mig is None else {"current": _flag(mig), "pending": _flag(_find(gpu, "mig_mode/pending_mig"))},
            "pcie": {
                "gen": _int(_find(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
                "gen_max": _int(_find(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
                "width": _int(_find(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
                "width_max": _int(_find(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
                "replay_count": _int(_find(gpu, "pci/replay_counter")),
            },
            "inforom_image": _find(gpu, "inforom_version/img_version"),
            "memory": _smi_memory(gpu),
            "clock_event_reasons": None if mask is None else {"mask": mask, "active": clock_event_names(mask)},
            "temperature_c": _int(_find(gpu, "temperature/gpu_temp")),
            "power_w": _float(power),
            "recovery_action": _find(gpu, "gpu_recovery_action"),
        })
    return system, gpus


# ---- PCIe AER counters from sysfs ------------------------------------------------------------------------------
# The kernel's per-device AER statistics (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats, since 4.19):
# /sys/bus/pci/devices/<dev>/aer_dev_correctable, aer_dev_nonfatal and aer_dev_fatal, each one "NAME COUNT" line per
# error bit ("Receiver Error 2", names with spaces) and a last TOTAL_ERR_COR / TOTAL_ERR_NONFATAL / TOTAL_ERR_FATAL
# line (the ERR_* messages, which may each carry several bits). Only AER-capable devices have them (the VM of
# tests/testdata/h100-580.159.04-health has none).
AER_FILES = (("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"), ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
             ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"))
SYSFS_PCI = "/sys/bus/pci/devices"


def parse_aer(text, total_key):
    """One aer_dev_* file -> {"total": N, "errors": {NAME: COUNT} of the bits counted}, or None when no line reads."""
    counts, total, read = {}, None, False
    for line in text.splitlines():
        parts = line.strip().rsplit(None, 1)
        if len(parts) != 2 or not parts[1].isdigit() or len(parts[1]) > 18:
            continue
        read = True
        if parts[0] == total_key:
            total = int(parts[1])
        elif int(parts[1]):
            counts[parts[0][:64]] = int(parts[1])
    if not read:
        return None
    return {"total": total if total is not None else sum(counts.values()), "errors": counts}


def sysfs_pci_name(pci_bus_id):
    """NVML's 00000000:18:00.0 -> sysfs's 0000:18:00.0."""
    domain, rest = pci_bus_id.split(":", 1)
    return domain[-4:].rjust(4, "0") + ":" + rest


def read_aer(pci_bus_id, errors, fact, sysfs=SYSFS_PCI):
    """The GPU's AER counters ({"correctable", "nonfatal", "fatal"}: each parse_aer's or None where its file is
    absent), or None when the device has no AER file at all. An unreadable or unparsable file is an errors entry."""
    if not pci_bus_id or pci_bus_id.count(":") != 2:
        return None
    base = os.path.join(sysfs, sysfs_pci_name(pci_bus_id))
    out = {}
    for key, name, total_key in AER_FILES:
        path = os.path.join(base, name)
        try:
            with open(path, "rb") as f:
                text = f.read(65536).decode("utf-8", "replace")
        except (IOError, OSError) as e:
            if getattr(e, "errno", None) != errno.ENOENT:
                errors[fact] = "%s: %s" % (path, e.strerror or e)
            out[key] = None
            continue
        out[key] = parse_aer(text, total_key)
        if out[key] is None:
            errors[fact] = "%s: no NAME COUNT line" % path
    return out if any(v is not None for v in out.values()) else None


def add_aer(gpus, errors, sysfs=SYSFS_PCI):
    """Each answering GPU's pcie.aer, read from sysfs beside what NVML or nvidia-smi gave."""
    for g in gpus:
        if not g.get("lost") and isinstance(g.get("pcie"), dict):
            g["pcie"]["aer"] = read_aer(g.get("pci_bus_id"), errors, "gpus[%d].pcie.aer" % g["index"], sysfs)
    return gpus
