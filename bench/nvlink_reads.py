#!/usr/bin/env python3
"""NVLink reads on a real GPU node: NVML's batched field values against its per-link calls (issue 45).

Usage: python3 bench/nvlink_reads.py [--repeat 5]     (needs only nvidia-ml-py; run it as the user `fleetctl
check` runs as)

For every GPU and each of its links (NVML_FI_DEV_NVLINK_LINK_COUNT), reads the DL counters (replay, recovery,
crc), the state, the speed and the version two ways: one nvmlDeviceGetFieldValues call per GPU (the
NVML_FI_DEV_NVLINK_ERROR_DL_* / GET_STATE / GET_SPEED / GET_VERSION ids, scopeId = link) and the per-link calls
(nvmlDeviceGetNvLinkErrorCounter DL_REPLAY / DL_RECOVERY / DL_CRC_FLIT, nvmlDeviceGetNvLinkState,
nvmlDeviceGetNvLinkVersion; NVML has no per-link speed call). Prints, as JSON on stdout: how many values each way
returned, how many of those both returned are equal, the first that differ, and the time of each path (ms, median
of --repeat, all GPUs); the time of the per-link calls `fleetctl check` now asks once a boot (version, remote type, remote PCI id)
and no more at all (the legacy crc_data / ecc_data counters); and fleetctl's own interconnect reading (its
module_utils file, imported by path) as the audit reads it and as `fleetctl check` reads it, the first of a boot
and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pynvml

HERE = Path(__file__).resolve().parent
INTERCONNECT = HERE.parent / "collections" / "ansible_collections" / "fleetctl" / "gpu" / "plugins" / "module_utils" / \
    "fleetctl_interconnect.py"
# name -> (field id, the per-link call's counter or None where the per-call value is the link's state / version)
FIELDS = {"replay": (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
          "recovery": (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
          "crc": (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
          "state": (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, None),
          "version": (pynvml.NVML_FI_DEV_NVLINK_GET_VERSION, None),
          "speed": (pynvml.NVML_FI_DEV_NVLINK_GET_SPEED, None)}
VALUE_MEMBERS = {pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
                 pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
                 pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
                 getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal"}


def value_of(field):
    """A c_nvmlFieldValue_t's value, or the NVML error name when it has none."""
    if field.nvmlReturn != pynvml.NVML_SUCCESS:
        return "error %d" % field.nvmlReturn
    member = VALUE_MEMBERS.get(field.valueType)
    return getattr(field.value, member) if member else "value type %d" % field.valueType


def attempt(fn, *args):
    """fn(*args), or "error N" for an NVMLError."""
    try:
        return fn(*args)
    except pynvml.NVMLError as e:
        return "error %d" % e.value


def link_count(handle):
    count = value_of(pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])[0])
    return count if isinstance(count, int) else 0


def batched(handles, counts):
    """{(gpu, link, name): value} from one field-values call per GPU."""
    out = {}
    for gpu, handle in enumerate(handles):
        ids = [(field, link) for link in range(counts[gpu]) for field, dummy in FIELDS.values()]
        if not ids:
            continue
        names = {field: name for name, (field, dummy) in FIELDS.items()}
        for (field, link), value in zip(ids, pynvml.nvmlDeviceGetFieldValues(handle, ids)):
            out[(gpu, link, names[field])] = value_of(value)
    return out


def per_call(handles, counts):
    """{(gpu, link, name): value} from the per-link calls (no speed: NVML has no per-link speed call)."""
    out = {}
    for gpu, handle in enumerate(handles):
        for link in range(counts[gpu]):
            for name, (dummy, counter) in FIELDS.items():
                if counter is not None:
                    out[(gpu, link, name)] = attempt(pynvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
            out[(gpu, link, "state")] = attempt(pynvml.nvmlDeviceGetNvLinkState, handle, link)
            out[(gpu, link, "version")] = attempt(pynvml.nvmlDeviceGetNvLinkVersion, handle, link)
    return out


def constants(handles, counts, up):
    """The per-link calls `fleetctl check` asks once a boot (the remote end of the links up, as fleetctl asks)."""
    for gpu, handle in enumerate(handles):
        for link in range(counts[gpu]):
            attempt(pynvml.nvmlDeviceGetNvLinkVersion, handle, link)
            if (gpu, link) in up:
                attempt(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
                attempt(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)


def legacy_evidence(handles, counts):
    """The legacy counters no control judges, which `fleetctl check` no longer asks (but with --format json)."""
    for handle, count in zip(handles, counts):
        for link in range(count):
            for counter in (pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA, pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA):
                attempt(pynvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)


def median_ms(repeat, fn, *args):
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def fleetctl_reads(repeat):
    """fleetctl's interconnect reading (its module_utils file), ms: the audit's, check's first of a boot, check's."""
    spec = importlib.util.spec_from_file_location("fleetctl_interconnect", INTERCONNECT)
    ic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ic)
    with tempfile.TemporaryDirectory(prefix="nvlink-reads-") as scratch:
        cache = os.path.join(scratch, "nvlink-links.json")

        def read(evidence=True, cached=False):
            errors = {}
            ic.NvmlInterconnect(pynvml, errors, evidence=evidence, cache=cache if cached else None).read()
            return errors

        def first_of_boot():
            if os.path.exists(cache):
                os.unlink(cache)
            return read(False, True)
        return {"audit": median_ms(repeat, read), "check_first_of_boot": median_ms(repeat, first_of_boot),
                "check": median_ms(repeat, read, False, True), "errors": read(False, True)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each path; the median is printed")
    opts = parser.parse_args(argv)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        sys.exit("nvlink_reads: NVML: %s (a machine with NVIDIA GPUs and their driver is needed)" % e)
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        counts = [link_count(h) for h in handles]
        fields, calls = batched(handles, counts), per_call(handles, counts)
        up = {(gpu, link) for (gpu, link, name), value in calls.items() if name == "state" and value == 1}
        compared = [key for key in calls if not isinstance(calls[key], str) and not isinstance(fields.get(key), str)]
        differ = {"gpu %d link %d %s" % key: {"field": fields[key], "call": calls[key]}
                  for key in compared if fields.get(key) != calls[key]}
        report = {
            "driver": attempt(pynvml.nvmlSystemGetDriverVersion), "nvml_bindings": getattr(pynvml, "__version__", None),
            "gpus": len(handles), "links": counts,
            "field_values": {"asked": len(fields),
                             "returned": sum(1 for v in fields.values() if not isinstance(v, str)),
                             "not_returned": sorted({"%s: %s" % (k[2], v) for k, v in fields.items()
                                                     if isinstance(v, str)})},
            "per_call": {"asked": len(calls), "returned": sum(1 for v in calls.values() if not isinstance(v, str))},
            "compared": len(compared), "equal": len(compared) - len(differ),
            "differ": dict(sorted(differ.items())[:50]),  # the first 50 where both answered, differently
            "speed_mbps": sorted({v for k, v in fields.items() if k[2] == "speed" and not isinstance(v, str)}),
            "ms": {"field_values": median_ms(opts.repeat, batched, handles, counts),
                   "per_call": median_ms(opts.repeat, per_call, handles, counts),
                   "per_call_version_remote_type_remote_pci": median_ms(opts.repeat, constants, handles, counts, up),
                   "per_call_crc_data_ecc_data": median_ms(opts.repeat, legacy_evidence, handles, counts)},
            "repeat": opts.repeat,
        }
        report["fleetctl_interconnect_ms"] = fleetctl_reads(opts.repeat)
    finally:
        pynvml.nvmlShutdown()
    json.dump(report, sys.stdout, indent=2)
    print()
    return report


if __name__ == "__main__":
    main()
