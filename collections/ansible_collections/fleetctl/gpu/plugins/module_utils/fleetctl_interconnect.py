# -*- coding: utf-8 -*-
# Multi-GPU interconnect facts (docs/interconnect.md): NVLink links and their error counters, the NVSwitch fabric,
# the GPU pair topology and GPUDirect RDMA (nvidia_peermem). From NVML (pynvml, passed in, inside the caller's
# NVML session) or, without it, from `nvidia-smi nvlink -s`, `nvidia-smi nvlink -e`, `nvidia-smi topo -m` and the
# <fabric> elements of `nvidia-smi -q -x`. Standard library only: it runs on the managed host.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import json
import os
import re
import xml.etree.ElementTree as ET

# nvml.h return codes fleetctl tells apart here.
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
# nvmlReturn_t -> name (nvml.h), for the fabric's status.
NVML_ERROR_NAMES = {
    1: "NVML_ERROR_UNINITIALIZED", 2: "NVML_ERROR_INVALID_ARGUMENT", 3: "NVML_ERROR_NOT_SUPPORTED",
    4: "NVML_ERROR_NO_PERMISSION", 5: "NVML_ERROR_ALREADY_INITIALIZED", 6: "NVML_ERROR_NOT_FOUND",
    7: "NVML_ERROR_INSUFFICIENT_SIZE", 8: "NVML_ERROR_INSUFFICIENT_POWER", 9: "NVML_ERROR_DRIVER_NOT_LOADED",
    10: "NVML_ERROR_TIMEOUT", 11: "NVML_ERROR_IRQ_ISSUE", 12: "NVML_ERROR_LIBRARY_NOT_FOUND",
    13: "NVML_ERROR_FUNCTION_NOT_FOUND", 14: "NVML_ERROR_CORRUPTED_INFOROM", 15: "NVML_ERROR_GPU_IS_LOST",
    16: "NVML_ERROR_RESET_REQUIRED", 17: "NVML_ERROR_OPERATING_SYSTEM", 18: "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    19: "NVML_ERROR_IN_USE", 20: "NVML_ERROR_MEMORY", 21: "NVML_ERROR_NO_DATA", 22: "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
    23: "NVML_ERROR_INSUFFICIENT_RESOURCES", 24: "NVML_ERROR_FREQ_NOT_SUPPORTED",
    25: "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 26: "NVML_ERROR_DEPRECATED", 27: "NVML_ERROR_NOT_READY",
    28: "NVML_ERROR_GPU_NOT_FOUND", 29: "NVML_ERROR_INVALID_STATE", 30: "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED",
    999: "NVML_ERROR_UNKNOWN",
}

NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of bindings too old to say (newer ones say 36)
# nvmlNvlinkVersion_t -> NVLink version.
NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
# nvmlIntNvLinkDeviceType_t -> remote end; IBM NPU (1) and unknown (0xFF) are "other".
REMOTE_TYPES = {0: "gpu", 2: "switch"}
# nvmlNvLinkErrorCounter_t (NVML_NVLINK_ERROR_DL_*) -> counter name: the raw legacy counters.
ERROR_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3), ("ecc_data", 4))
# Per-link field values (nvmlDeviceGetFieldValues, scopeId = link). The first three are what `nvidia-smi nvlink -e`
# shows (replay, recovery, crc; else from the legacy DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT counters): on a real H200 the
# legacy DL_CRC_DATA / DL_ECC_DATA read 0-36 on healthy links where these say 0 (docs/interconnect.md).
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY = 161
NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY = 162
NVML_FI_DEV_NVLINK_ERROR_DL_CRC = 163
NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS = 214
NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS = 219
NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS = 221
FIELD_COUNTERS = (("replay", NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY), ("recovery", NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY),
                  ("crc", NVML_FI_DEV_NVLINK_ERROR_DL_CRC),
                  ("recovery_failed", NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS),
                  ("symbol", NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS),
                  ("effective", NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS))
# The judged counters a field value gives, and the legacy counter that stands in where it cannot.
FIELD_FALLBACKS = (("replay", "replay"), ("recovery", "recovery"), ("crc", "crc_flit"))
COUNTER_NAMES = ("replay", "recovery", "crc", "crc_flit", "crc_data", "ecc_data", "recovery_failed", "symbol",
                 "effective")
# nvmlValueType_t -> the c_nvmlValue_t member that holds it.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# nvmlGpuFabricState_t
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
# nvmlGpuTopologyLevel_t -> what `nvidia-smi topo -m` shows.
TOPOLOGY_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
PCIE_RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")

_MESSAGE_LIMIT = 600  # one errors entry, however many links failed
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# What a link's per-boot cache entry holds (NvmlInterconnect's cache): name -> (the call, what an error calls it).
LINK_CONSTANTS = {"version": ("nvmlDeviceGetNvLinkVersion", "version"),
                  "remote_type": ("nvmlDeviceGetNvLinkRemoteDeviceType", "remote type"),
                  "remote_pci": ("nvmlDeviceGetNvLinkRemotePciInfo", "remote PCI id")}
_CACHE_LIMIT = 1 << 20  # bytes of the per-boot cache read: 8 GPUs x 36 links take 30 kB
_UNKNOWN_PCI = re.compile(r"^f{4,8}:ff:ff\.[0-9a-f]$")  # what NVML reports for a remote end it cannot see


_text_type = type(u"")  # what json gives back for a string, on Python 2 and 3


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _add_error(errors, key, message):
    """errors[key], one line; several problems of one part are joined, up to a bound."""
    message = " ".join(str(message).split())
    old = errors.get(key)
    if old:
        if len(old) >= _MESSAGE_LIMIT or message in old:
            return
        message = old + "; " + message
    errors[key] = message[:_MESSAGE_LIMIT]


def _key(index, part):
    return "interconnect.gpus[%d].%s" % (index, part)


def remote_pci(bus_id):
    """A remote end's PCI id as fleetctl writes PCI ids (lower case), None when NVML cannot see it."""
    bus_id = (_text(bus_id) or "").strip().lower()
    if not bus_id or _UNKNOWN_PCI.match(bus_id):
        return None
    return bus_id


def cluster_uuid(raw):
    """16 bytes of nvmlGpuFabricInfo*.clusterUuid -> 8-4-4-4-12 text."""
    h = "".join("%02x" % (b & 0xFF) for b in bytearray(raw))
    if len(h) != 32:
        return None
    return "%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def peermem_loaded(sys_module="/sys/module"):
    """GPUDirect RDMA: the nvidia_peermem module (or the older nv_peermem) is loaded."""
    return any(os.path.isdir(os.path.join(sys_module, name)) for name in ("nvidia_peermem", "nv_peermem"))


def _nvlink_facts(links):
    if links is None:
        return None
    return {"supported": bool(links), "up": sum(1 for link in links if link["state"] == "up"), "total": len(links),
            "links": links}


def _empty_counters():
    return dict((name, None) for name in COUNTER_NAMES)


def nvlinks_between(a, pci_a, b, pci_b):
    """NVLinks bonded between two GPUs from their link facts: links whose remote is the peer GPU (direct), else the
    links both have up to NVSwitches (min of the two). None when an up link cannot be attributed: to a GPU without
    a PCI id, or to an unknown far end (NVML could not say): counting it as PCIe would be a guess."""
    for nvlink in (a, b):
        for link in nvlink["links"]:
            remote = link["remote"]
            if link["state"] == "up" and (remote["type"] is None or
                                          (remote["type"] == "gpu" and remote["pci_bus_id"] is None)):
                return None

    def direct(nvlink, peer):
        return sum(1 for link in nvlink["links"] if link["state"] == "up" and link["remote"]["type"] == "gpu"
                   and peer is not None and link["remote"]["pci_bus_id"] == peer)

    n = min(direct(a, pci_b), direct(b, pci_a))
    if n:
        return n
    switched = [sum(1 for link in nvlink["links"] if link["state"] == "up" and link["remote"]["type"] == "switch")
                for nvlink in (a, b)]
    return min(switched)


# ---- NVML ----------------------------------------------------------------------------------------------------

class NvmlInterconnect:
    """Reads facts.interconnect through pynvml, inside the caller's NVML session (no nvmlInit/nvmlShutdown here)."""

    def __init__(self, pynvml, errors, sys_module="/sys/module", evidence=True, cache=None, boot_id_path=BOOT_ID):
        """evidence: also read the legacy counters no control judges (crc_flit, crc_data, ecc_data: one call each
        per link); without it they are null, but where crc_flit stands in for crc. cache: a file where each link's
        version and remote end (which do not change while the host is up) are kept for the boot BOOT_ID_PATH names,
        read instead of asking NVML again; None: asked every time."""
        self.n = pynvml
        self.errors = errors
        self.sys_module = sys_module
        self.evidence = evidence
        self.cache = cache
        self.boot_id_path = boot_id_path
        self.known = {}  # the per-boot cache: GPU PCI id -> link (str) -> {LINK_CONSTANTS name: raw answer}

    def _call(self, name, *args):
        """fn(*args); AttributeError when this pynvml lacks the wrapper (the caller tells it apart)."""
        return getattr(self.n, name)(*args)

    def read(self):
        n = self.n
        try:
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as e:
            _add_error(self.errors, "interconnect", "NVML: %s" % e)
            return None
        boot_id = self._boot_id()
        self.known = self._load_cache(boot_id)
        before = json.dumps(self.known, sort_keys=True)
        handles, gpus = [], []
        for i in range(count):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
            except n.NVMLError as e:
                handles.append(None)
                if e.value == NVML_ERROR_GPU_IS_LOST:  # a fact (gpus[i].lost, gpu.count), not an unread link
                    gpus.append({"index": i, "pci_bus_id": None, "lost": True, "nvlink": None, "fabric": None})
                    continue
                gpus.append({"index": i, "pci_bus_id": None, "nvlink": None, "fabric": None})
                _add_error(self.errors, _key(i, "nvlink"), "NVML: %s" % e)
                _add_error(self.errors, _key(i, "fabric"), "NVML: %s" % e)
                continue
            handles.append(h)
            try:
                pci = remote_pci(n.nvmlDeviceGetPciInfo(h).busId)
            except n.NVMLError:
                pci = None  # gpus[i].pci_bus_id already says why
            gpus.append({"index": i, "pci_bus_id": pci, "nvlink": _nvlink_facts(self.links(h, i, pci)),
                         "fabric": self.fabric(h, i)})
        if boot_id and json.dumps(self.known, sort_keys=True) != before:
            self._save_cache(boot_id)
        return {"gpus": gpus, "topology": self.topology(handles, gpus),
                "peermem_loaded": peermem_loaded(self.sys_module)}

    # -- the per-boot cache --------------------------------------------------------------------------------------
    def _boot_id(self):
        """This boot's id, None without a cache (or where the kernel does not say)."""
        if not self.cache:
            return None
        try:
            with open(self.boot_id_path) as f:
                return f.read(100).strip() or None
        except (IOError, OSError):
            return None

    def _load_cache(self, boot_id):
        """The cache's links if it is of this boot; {} when there is none, or it is of another boot, unreadable or
        not what this code writes (then everything is read again, and the cache written anew)."""
        if not boot_id:
            return {}
        try:
            with open(self.cache) as f:
                doc = json.loads(f.read(_CACHE_LIMIT))
        except (IOError, OSError, ValueError):
            return {}
        if not isinstance(doc, dict) or doc.get("boot_id") != boot_id or not isinstance(doc.get("gpus"), dict):
            return {}
        for gpu in doc["gpus"].values():
            if not isinstance(gpu, dict):
                return {}
            for link in gpu.values():
                if not isinstance(link, dict) or any(k not in LINK_CONSTANTS or not isinstance(
                        v, _text_type if k == "remote_pci" else int) for k, v in link.items()):
                    return {}
        return doc["gpus"]

    def _save_cache(self, boot_id):
        """Write the cache whole (a check running beside this one reads the old file or the new one); a cache that
        cannot be written is asked again next time, nothing else."""
        temporary = "%s.%d.tmp" % (self.cache, os.getpid())
        try:
            directory = os.path.dirname(self.cache)
            if directory and not os.path.isdir(directory):
                os.makedirs(directory, 0o700)
            with open(temporary, "w") as f:
                json.dump({"boot_id": boot_id, "gpus": self.known}, f, sort_keys=True)
            os.rename(temporary, self.cache)
        except (IOError, OSError):
            try:
                os.unlink(temporary)
            except (IOError, OSError):
                pass

    # -- NVLink --------------------------------------------------------------------------------------------------
    def links(self, h, i, pci=None):
        """The GPU's links, [] for a GPU without NVLink, None (and an errors entry) when they cannot be read. pci: the
        GPU's PCI id, its key in the per-boot cache (None: not cached)."""
        n, key = self.n, _key(i, "nvlink")
        count = self._link_count(h)
        links = []
        last = getattr(n, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS)
        for link in range(last if count is None else min(count, last)):  # past the count NVML gives: no links
            try:
                state = self._call("nvmlDeviceGetNvLinkState", h, link)
            except AttributeError:
                _add_error(self.errors, key, "this pynvml has no nvmlDeviceGetNvLinkState")
                return None
            except n.NVMLError as e:
                # NOT_SUPPORTED: no NVLink (link 0) or no such link; INVALID_ARGUMENT: beyond the GPU's links (the
                # binding's NVML_NVLINK_MAX_LINKS may exceed the driver's); past the count NVML gives, any answer.
                if e.value in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT) \
                        or (count is not None and link >= count):
                    continue
                if e.value == NVML_ERROR_FUNCTION_NOT_FOUND:
                    _add_error(self.errors, key, "this driver's NVML has no nvmlDeviceGetNvLinkState")
                else:
                    _add_error(self.errors, key, "link %d state: NVML: %s" % (link, e))
                return None
            links.append({"link": link, "state": "up" if state else "down", "version": None,
                          "remote": {"type": None, "pci_bus_id": None}, "errors": _empty_counters()})
        fields = self._field_counters(h, links, key)
        known = self.known.setdefault(pci, {}) if pci else {}
        for entry, values in zip(links, fields):
            self._link_details(h, entry, key, values, known.setdefault(str(entry["link"]), {}))
        if pci and not any(known.values()):
            del self.known[pci]
        return links

    def _link_count(self, h):
        """NVML_FI_DEV_NVLINK_LINK_COUNT (18 on the real H200), None where NVML does not say."""
        try:
            value = self._call("nvmlDeviceGetFieldValues", h, [NVML_FI_DEV_NVLINK_LINK_COUNT])[0]
        except (AttributeError, TypeError, IndexError, self.n.NVMLError):
            return None
        member = _VALUE_MEMBERS.get(getattr(value, "valueType", None))
        if getattr(value, "nvmlReturn", None) != NVML_SUCCESS or member is None:
            return None
        return int(getattr(value.value, member))

    def _read(self, key, entry, what, name, *args):
        """A per-link value: None when unsupported (or on a down link, whatever failed); other failures of an up
        link are recorded under KEY (None: evidence only, not recorded)."""
        try:
            return self._call(name, *args)
        except AttributeError:
            return None
        except self.n.NVMLError as e:
            if key and entry["state"] == "up" and e.value not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                _add_error(self.errors, key, "link %d %s: NVML: %s" % (entry["link"], what, e))
            return None

    def _constant(self, h, entry, key, known, name):
        """A link's version, remote type or remote PCI id (LINK_CONSTANTS), as NVML answers it: from KNOWN (the
        link's entry in the per-boot cache), else asked and kept there (what NVML does not say is asked again)."""
        if name not in known:
            call, what = LINK_CONSTANTS[name]
            value = self._read(key, entry, what, call, h, entry["link"])
            if name == "remote_pci":
                value = _text(getattr(value, "busId", None))
            if value is not None:
                known[name] = value if name == "remote_pci" else int(value)
        return known.get(name)

    def _link_details(self, h, entry, key, fields, known=None):
        """Version, remote end and error counters of one link; fields: its field values (name -> int or None); known:
        the link's entry in the per-boot cache."""
        link, known = entry["link"], {} if known is None else known
        entry["version"] = NVLINK_VERSIONS.get(self._constant(h, entry, key, known, "version"))
        if entry["state"] == "up":
            remote = self._constant(h, entry, key, known, "remote_type")
            if remote is not None:
                entry["remote"]["type"] = REMOTE_TYPES.get(remote, "other")
            pci = self._constant(h, entry, key, known, "remote_pci")
            if pci is not None:
                entry["remote"]["pci_bus_id"] = remote_pci(pci)
        counters = entry["errors"]
        counters.update(fields)
        for name, counter in ERROR_COUNTERS:
            if name in ("replay", "recovery") and counters[name] is not None:
                continue  # the field value said it; the legacy counter is not asked
            # A legacy counter that is evidence only (the judged ones came from the field values) may fail quietly:
            # a driver that deprecates the old call must not make the whole link unread.
            judged_source = name in ("replay", "recovery") or (name == "crc_flit" and counters["crc"] is None)
            if not judged_source and not self.evidence:
                continue  # shown only (the audit's facts, check's JSON): not asked where nobody sees it
            value = self._read(key if judged_source else None, entry, name + " errors",
                               "nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
            counters[name] = int(value) if value is not None else None
        for judged, legacy in FIELD_FALLBACKS:
            if counters[judged] is None:
                counters[judged] = counters[legacy]

    def _field_counters(self, h, links, key):
        """The field values of every link in one nvmlDeviceGetFieldValues call (scopeId = link): per link, name ->
        int, or None where NVML does not have it. Failures of recovery_failed / symbol / effective on an up link are
        recorded; the judged counters fall back to the legacy ones instead."""
        found = [dict((name, None) for name, dummy in FIELD_COUNTERS) for dummy in links]
        if not links:
            return found
        n = self.n
        ids = [(field, entry["link"]) for entry in links for dummy, field in FIELD_COUNTERS]
        try:
            values = self._call("nvmlDeviceGetFieldValues", h, ids)
        except (AttributeError, TypeError):  # no binding, or one without scopeId: legacy counters, nulls
            return found
        except n.NVMLError as e:
            if e.value not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND) \
                    and any(entry["state"] == "up" for entry in links):
                _add_error(self.errors, key, "field values: NVML: %s" % e)
            return found
        slots = [(position, entry, name) for position, entry in enumerate(links) for name, dummy in FIELD_COUNTERS]
        fallback = set(judged for judged, dummy in FIELD_FALLBACKS)
        for (position, entry, name), value in zip(slots, values):
            ret = getattr(value, "nvmlReturn", None)
            if ret == NVML_SUCCESS:
                member = _VALUE_MEMBERS.get(getattr(value, "valueType", None))
                raw = getattr(value.value, member, None) if member else None
                if raw is not None:
                    found[position][name] = int(raw)
                    continue
                problem = "value type %r unknown" % (getattr(value, "valueType", None),)
            elif ret in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                continue
            else:
                problem = "NVML return %s" % NVML_ERROR_NAMES.get(ret, ret)
            if entry["state"] == "up" and name not in fallback:
                _add_error(self.errors, key, "link %d %s: %s" % (entry["link"], name, problem))
        return found

    # -- fabric --------------------------------------------------------------------------------------------------
    def fabric(self, h, i):
        """nvmlDeviceGetGpuFabricInfoV, else nvmlDeviceGetGpuFabricInfo; the struct always by reference (by value,
        the real library reads the struct as a pointer and the process dies: tests/testdata/h200x2-580.159.04)."""
        n, key = self.n, _key(i, "fabric")
        driver_lacks = False
        calls = (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t", True),
                 ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t", False))
        for fn_name, struct_name, versioned in calls:
            fn, struct = getattr(n, fn_name, None), getattr(n, struct_name, None)
            if fn is None or struct is None:
                continue
            info = struct()
            if versioned and not getattr(info, "version", 0):
                if not getattr(n, "nvmlGpuFabricInfo_v2", None):
                    continue  # a versioned struct this binding cannot version: NVML would refuse it
                info.version = n.nvmlGpuFabricInfo_v2
            try:
                fn(h, ctypes.byref(info))
            except n.NVMLError as e:
                if e.value in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                    driver_lacks = driver_lacks or e.value == NVML_ERROR_FUNCTION_NOT_FOUND
                    continue  # this driver's NVML lacks the call (or this struct version): try the older call
                if e.value == NVML_ERROR_NOT_SUPPORTED:  # no fabric on this GPU (pre-Hopper drivers answer so)
                    return {"state": "not_supported", "status": None, "clique_id": None, "cluster_uuid": None,
                            "health_mask": None}
                _add_error(self.errors, key, "%s: NVML: %s" % (fn_name, e))
                return None
            return self._fabric_facts(info, versioned, key)
        if driver_lacks:  # a driver from before fabric registration (R525): no fabric state, as NOT_SUPPORTED says
            return {"state": "not_supported", "status": None, "clique_id": None, "cluster_uuid": None,
                    "health_mask": None}
        _add_error(self.errors, key, "this pynvml has no fabric call (nvmlDeviceGetGpuFabricInfoV, "
                                     "nvmlDeviceGetGpuFabricInfo): install nvidia-ml-py >= 12.535 on the host")
        return None

    def _fabric_facts(self, info, versioned, key):
        state = FABRIC_STATES.get(info.state)
        if state is None:
            _add_error(self.errors, key, "unknown fabric state %r" % info.state)
            return None
        facts = {"state": state, "status": None, "clique_id": None, "cluster_uuid": None,
                 "health_mask": int(info.healthMask) if versioned and state != "not_supported" else None}
        if state == "completed":
            if info.status == NVML_SUCCESS:
                facts["status"] = "success"
            elif info.status in NVML_ERROR_NAMES:
                facts["status"] = NVML_ERROR_NAMES[info.status]
            else:
                _add_error(self.errors, key, "fabric status: unknown NVML return code %r" % info.status)
            facts["clique_id"] = int(info.cliqueId)
            facts["cluster_uuid"] = cluster_uuid(info.clusterUuid)
        return facts

    # -- topology ------------------------------------------------------------------------------------------------
    def topology(self, handles, gpus):
        n, key = self.n, "interconnect.topology"
        pairs = []
        for i in range(len(gpus)):
            for j in range(i + 1, len(gpus)):
                a, b = gpus[i], gpus[j]
                if a.get("lost") or b.get("lost"):
                    continue  # a GPU off the bus has no pairs (gpu.count says it is gone)
                if handles[i] is None or handles[j] is None or a["nvlink"] is None or b["nvlink"] is None:
                    _add_error(self.errors, key, "GPU %d or GPU %d: NVLink not read" % (i, j))
                    return None
                links = nvlinks_between(a["nvlink"], a["pci_bus_id"], b["nvlink"], b["pci_bus_id"])
                if links is None:
                    _add_error(self.errors, key, "GPU %d / GPU %d: an NVLink whose far end NVML does not name "
                                                 "(type or PCI id)" % (i, j))
                    return None
                if links:
                    pairs.append({"gpus": [i, j], "link": "NV%d" % links, "nvlinks": links})
                    continue
                try:
                    level = self._call("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
                except AttributeError:
                    _add_error(self.errors, key, "this pynvml has no nvmlDeviceGetTopologyCommonAncestor")
                    return None
                except n.NVMLError as e:
                    _add_error(self.errors, key, "GPU %d / GPU %d common ancestor: NVML: %s" % (i, j, e))
                    return None
                if level not in TOPOLOGY_LEVELS:
                    _add_error(self.errors, key, "GPU %d / GPU %d: unknown topology level %r" % (i, j, level))
                    return None
                pairs.append({"gpus": [i, j], "link": TOPOLOGY_LEVELS[level], "nvlinks": 0})
        return pairs


# ---- nvidia-smi ----------------------------------------------------------------------------------------------

class SmiOutputError(ValueError):
    pass


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_HEADER = re.compile(r"^GPU (\d{1,4}): ")
_LINK_STATUS = re.compile(r"^Link (\d{1,3}): (?:(\d{1,7}(?:\.\d{1,6})?) GB/s|<inactive>)$")
_LINK_COUNTER = re.compile(r"^Link (\d{1,3}): ([A-Za-z][A-Za-z ]{0,40}?): (\S.{0,40})$")
# `nvidia-smi nvlink -e` counter names -> fleetctl's ("CRC Errors" is the judged `crc`, as NVML's DL_CRC field).
SMI_COUNTERS = {"replay errors": "replay", "recovery errors": "recovery", "crc errors": "crc",
                "crc flit errors": "crc_flit", "crc data errors": "crc_data", "ecc data errors": "ecc_data"}
_NOT_AVAILABLE = ("n/a", "[n/a]", "not supported", "[not supported]")


def _per_gpu_lines(text, what):
    """`nvidia-smi nvlink ...` output -> {gpu index: [link lines]}; problems -> SmiOutputError (whole output) or
    {gpu index: message} (one GPU)."""
    gpus, problems, current = {}, {}, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _GPU_HEADER.match(line)
        if m:
            current = int(m.group(1))
            if current in gpus:
                problems[current] = "%s lists GPU %d twice" % (what, current)
            gpus[current] = []
            continue
        if current is None:
            raise SmiOutputError("%s output is not per-GPU link lines: %r" % (what, line[:80]))
        gpus[current].append(line)
    return gpus, problems


# Printed under a GPU's header when NVML lists its links but none is active (a PCIe board without bridges).
_ALL_INACTIVE = re.compile(r"unable to retrieve nvlink information as all links are inactive", re.I)


def parse_nvlink_status(text):
    """`nvidia-smi nvlink -s` -> ({gpu index: [{"link", "state", "gbps"}]}, {gpu index: problem})."""
    gpus, problems = _per_gpu_lines(text, "nvidia-smi nvlink -s")
    parsed = {}
    for index, lines in gpus.items():
        links = {}
        for line in lines:
            m = _LINK_STATUS.match(line)
            if not m and _ALL_INACTIVE.search(line):
                continue  # no link is listed: a GPU without NVLink wired, or one that lost every link
            if not m:
                problems.setdefault(index, "nvidia-smi nvlink -s: unexpected line %r" % line[:80])
                continue
            link = int(m.group(1))
            entry = {"link": link, "state": "up" if m.group(2) else "down",
                     "gbps": float(m.group(2)) if m.group(2) else None}
            if links.get(link, entry) != entry:
                problems.setdefault(index, "nvidia-smi nvlink -s: link %d printed twice, differently" % link)
            links[link] = entry
        parsed[index] = [links[k] for k in sorted(links)]
    return parsed, problems


def parse_nvlink_errors(text):
    """`nvidia-smi nvlink -e` -> ({gpu index: {link: {counter: int or None}}}, {gpu index: problem}). A counter line
    printed twice with the same value (real output does that) is one; twice with different values is a problem."""
    gpus, problems = _per_gpu_lines(text, "nvidia-smi nvlink -e")
    parsed = {}
    for index, lines in gpus.items():
        links = {}
        for line in lines:
            m = _LINK_COUNTER.match(line)
            if not m:
                problems.setdefault(index, "nvidia-smi nvlink -e: unexpected line %r" % line[:80])
                continue
            link, name, value = int(m.group(1)), m.group(2).strip().lower(), m.group(3).strip()
            counters = links.setdefault(link, {})
            name = SMI_COUNTERS.get(name)
            if name is None:
                continue  # a counter fleetctl does not report
            if re.match(r"^\d{1,20}$", value):
                number = int(value)
            elif value.lower() in _NOT_AVAILABLE:
                number = None
            else:
                problems.setdefault(index, "nvidia-smi nvlink -e: link %d: unexpected value %r" % (link, value[:40]))
                continue
            if name in counters and counters[name] != number:
                problems.setdefault(index, "nvidia-smi nvlink -e: link %d %s printed twice, differently" % (
                    link, name))
            counters[name] = number
        parsed[index] = links
    return parsed, problems


def parse_topo_matrix(text):
    """`nvidia-smi topo -m` -> [{"gpus": [i, j], "link", "nvlinks"}], each unordered GPU pair once.
    SmiOutputError when the matrix is not one fleetctl can read whole."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header, rows = None, {}
    for line in lines:
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0].rstrip(":") == "Legend":
            break
        if header is None:
            if not re.match(r"^GPU\d{1,4}$", tokens[0]):
                raise SmiOutputError("nvidia-smi topo -m: no header row of GPU columns: %r" % line.strip()[:80])
            header = []
            for token in tokens:
                if not re.match(r"^GPU\d{1,4}$", token):
                    break
                header.append(token)
            continue
        if re.match(r"^GPU\d{1,4}$", tokens[0]):
            if tokens[0] in rows:
                raise SmiOutputError("nvidia-smi topo -m: row %s twice" % tokens[0])
            rows[tokens[0]] = tokens[1:1 + len(header)]
    if header is None:
        raise SmiOutputError("nvidia-smi topo -m printed no matrix")
    if header != ["GPU%d" % i for i in range(len(header))] or sorted(rows) != sorted(header):
        raise SmiOutputError("nvidia-smi topo -m: GPU rows %s do not match the columns %s" % (
            ",".join(sorted(rows))[:80], ",".join(header)[:80]))
    cells = {}
    for i, name in enumerate(header):
        row = rows[name]
        if len(row) != len(header) or row[i] != "X":
            raise SmiOutputError("nvidia-smi topo -m: row %s is not a matrix row: %r" % (name, " ".join(row)[:80]))
        for j, cell in enumerate(row):
            if j != i:
                cell = "SYS" if cell == "SOC" else cell  # drivers before 384 wrote SOC for SYS
                if not (cell in PCIE_RELATIONS or re.match(r"^NV[1-9]\d{0,2}$", cell)):
                    raise SmiOutputError("nvidia-smi topo -m: GPU%d/GPU%d: unknown connection %r" % (i, j, cell[:20]))
                cells[(i, j)] = cell
    pairs = []
    for i in range(len(header)):
        for j in range(i + 1, len(header)):
            if cells[(i, j)] != cells[(j, i)]:
                raise SmiOutputError("nvidia-smi topo -m: GPU%d/GPU%d is %s one way and %s the other" % (
                    i, j, cells[(i, j)], cells[(j, i)]))
            cell = cells[(i, j)]
            pairs.append({"gpus": [i, j], "link": cell, "nvlinks": int(cell[2:]) if cell.startswith("NV") else 0})
    return pairs


_FABRIC_STATES_SMI = {"completed": "completed", "in progress": "in_progress", "not started": "not_started",
                      "not supported": "not_supported", "n/a": "not_supported"}


def _status_name(text):
    """nvidia-smi's fabric status (NVML's error string) -> "success" or the NVML error name; None if unknown."""
    norm = re.sub(r"[^A-Z0-9]+", "_", text.upper()).strip("_")
    if norm == "SUCCESS":
        return "success"
    if norm == "UNKNOWN_ERROR":
        return "NVML_ERROR_UNKNOWN"
    names = set(NVML_ERROR_NAMES.values())
    return "NVML_ERROR_" + norm if "NVML_ERROR_" + norm in names else None


def parse_smi_fabric(xml_text):
    """The <fabric> of each <gpu> of `nvidia-smi -q -x`, in order: [(fabric facts or None, problem or None)]."""
    try:
        root = ET.fromstring(xml_text)
    except (ET.ParseError, ValueError) as e:
        raise SmiOutputError("nvidia-smi -q -x output is not XML: %s" % e)
    result = []
    for gpu in root.findall("gpu"):
        fabric = gpu.find("fabric")
        if fabric is None:
            result.append((None, "nvidia-smi -q -x has no <fabric> for this GPU (a driver without fabric info)"))
            continue

        def text(tag):
            el = fabric.find(tag)
            return (el.text or "").strip() if el is not None and el.text is not None else None

        state_text = text("state")
        state = _FABRIC_STATES_SMI.get((state_text or "").lower())
        if state is None:
            result.append((None, "nvidia-smi -q -x: unknown fabric state %r" % (state_text or "")[:40]))
            continue
        facts = {"state": state, "status": None, "clique_id": None, "cluster_uuid": None, "health_mask": None}
        problem = None
        if state == "completed":
            status_text = text("status") or ""
            facts["status"] = _status_name(status_text)
            if facts["status"] is None:
                problem = "nvidia-smi -q -x: unknown fabric status %r" % status_text[:40]
            clique = text("cliqueId") or ""
            facts["clique_id"] = int(clique) if re.match(r"^\d{1,10}$", clique) else None
            uuid = (text("clusterUuid") or "").lower()
            facts["cluster_uuid"] = uuid if re.match(r"^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$", uuid) else None
        result.append((facts, problem))
    return result


def from_smi(gpus, xml_text, status, counters, topo, errors, sys_module="/sys/module"):
    """facts.interconnect from nvidia-smi. gpus: parse_smi_xml's GPUs; status, counters, topo: (output, failure) of
    `nvidia-smi nvlink -s`, `nvidia-smi nvlink -e`, `nvidia-smi topo -m` (failure None when it ran fine; topo None
    when not run: fewer than 2 GPUs)."""
    try:
        fabrics = parse_smi_fabric(xml_text)
    except SmiOutputError as e:
        fabrics = [(None, str(e))] * len(gpus)
    links, link_problems = {}, {}
    if status[1] is not None:
        link_problems = dict((g["index"], status[1]) for g in gpus)
    else:
        try:
            links, link_problems = parse_nvlink_status(status[0])
        except SmiOutputError as e:
            link_problems = dict((g["index"], str(e)) for g in gpus)
    counts, count_problems = {}, {}
    if counters[1] is not None:
        count_problems = dict((g["index"], counters[1]) for g in gpus)
    else:
        try:
            counts, count_problems = parse_nvlink_errors(counters[0])
        except SmiOutputError as e:
            count_problems = dict((g["index"], str(e)) for g in gpus)

    topology = []
    if topo is not None:
        if topo[1] is not None:
            topology = None
            _add_error(errors, "interconnect.topology", topo[1])
        else:
            try:
                topology = parse_topo_matrix(topo[0])
            except SmiOutputError as e:
                topology = None
                _add_error(errors, "interconnect.topology", str(e))
            if topology is not None and len(topology) != len(gpus) * (len(gpus) - 1) // 2:
                _add_error(errors, "interconnect.topology", "nvidia-smi topo -m shows %d pairs for %d GPUs" % (
                    len(topology), len(gpus)))
                topology = None
    elif len(gpus) >= 2:
        topology = None
        _add_error(errors, "interconnect.topology", "nvidia-smi topo -m was not run")

    # `nvidia-smi nvlink -s` printing no GPU at all (exit 0) is a host whose GPUs have no NVLink: a single H100 or
    # H200 in a VM prints nothing (tests/testdata/h100-580.159.04-health), as NVML says of it. Unless the topology
    # matrix shows NVLinks (or could not be read): a GPU left out, or all of them, is then a reading fleetctl cannot
    # trust.
    topology_nvlinks = topology is None or any(pair.get("nvlinks") for pair in topology)
    no_nvlink_here = status[1] is None and not links and not link_problems and not topology_nvlinks
    entries = []
    for position, gpu in enumerate(gpus):
        i = gpu["index"]
        nvlink = None
        if i in link_problems:
            _add_error(errors, _key(i, "nvlink"), link_problems[i])
        elif no_nvlink_here:
            nvlink = _nvlink_facts([])
        elif i not in links:
            _add_error(errors, _key(i, "nvlink"), "nvidia-smi nvlink -s does not list GPU %d" % i)
        else:
            entries_links = []
            gpu_counts = counts.get(i, {})
            if links[i] and i in count_problems:
                _add_error(errors, _key(i, "nvlink"), count_problems[i])
            elif links[i] and i not in counts:
                _add_error(errors, _key(i, "nvlink"), "nvidia-smi nvlink -e does not list GPU %d" % i)
            for link in links[i]:
                counters_of_link = _empty_counters()
                if i not in count_problems:
                    counters_of_link.update(gpu_counts.get(link["link"], {}))
                entries_links.append({"link": link["link"], "state": link["state"], "version": None,
                                      "remote": {"type": None, "pci_bus_id": None}, "errors": counters_of_link})
            nvlink = _nvlink_facts(entries_links)
        fabric, problem = fabrics[position] if position < len(fabrics) else (None, "nvidia-smi -q -x: GPU missing")
        if problem:
            _add_error(errors, _key(i, "fabric"), problem)
        entries.append({"index": i, "pci_bus_id": gpu.get("pci_bus_id"), "nvlink": nvlink, "fabric": fabric})

    return {"gpus": entries, "topology": topology, "peermem_loaded": peermem_loaded(sys_module)}
