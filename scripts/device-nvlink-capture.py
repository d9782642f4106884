#!/usr/bin/env python3
"""Raw interconnect captures of a real multi-GPU host, independent of fleetctl's own readers (so that tests can
hold fleetctl's reading against them): every NVML NVLink / fabric / P2P / topology answer, and the NCCL all-reduce
and ring P2P series (through fleetctl's own probe code) used to set the gate's default drop limits. The `facts`
phase runs the gpu_facts Collector as `fleetctl check` does and records every command it ran and every file and
directory it read (collector-run.json: what a host without a multi-node NVLink domain does for IMEX - nothing).

    python3 scripts/device-nvlink-capture.py OUTDIR [--repeats 15] [--phases nvml,facts,sweep,allreduce,p2p]
"""
import argparse
import ctypes
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def load_collective():
    path = os.path.join(HERE, "..", "collections", "ansible_collections", "fleetctl", "gpu", "plugins", "module_utils",
                        "fleetctl_collective.py")
    spec = importlib.util.spec_from_file_location("fleetctl_collective", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nvml_dump():
    import pynvml as n
    n.nvmlInit()
    out = {"driver": n.nvmlSystemGetDriverVersion(), "nvml": n.nvmlSystemGetNVMLVersion(), "gpus": [], "pairs": []}
    fields = sorted((v, k) for k, v in vars(n).items() if k.startswith("NVML_FI_DEV_NVLINK") and isinstance(v, int))

    def call(fn, *a):
        print("call", getattr(fn, "__name__", fn), a[1:] if len(a) > 1 else "", file=sys.stderr, flush=True)
        try:
            v = fn(*a)
            return v.decode() if isinstance(v, bytes) else v
        except n.NVMLError as e:
            return {"nvml_error": str(e), "code": e.value}
        except Exception as e:  # a function this library/driver lacks
            return {"error": "%s: %s" % (type(e).__name__, e)}

    count = n.nvmlDeviceGetCount()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    for i, h in enumerate(handles):
        g = {"index": i, "pci_bus_id": call(lambda: n.nvmlDeviceGetPciInfo(h).busId), "uuid": call(n.nvmlDeviceGetUUID, h),
             "name": call(n.nvmlDeviceGetName, h), "links": []}
        for fn_name in ("nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV"):
            info = n.c_nvmlGpuFabricInfo_t() if fn_name == "nvmlDeviceGetGpuFabricInfo" else n.c_nvmlGpuFabricInfoV_t()
            r = call(getattr(n, fn_name), h, ctypes.byref(info))  # by value it segfaults (README of the captures)
            g[fn_name] = r if isinstance(r, dict) else {
                "state": info.state, "status": info.status, "cliqueId": info.cliqueId,
                "clusterUuid": bytes(info.clusterUuid).hex(), "healthMask": getattr(info, "healthMask", None)}
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            state = call(n.nvmlDeviceGetNvLinkState, h, link)
            if isinstance(state, dict) and link >= 18:
                continue
            entry = {"link": link, "state": state, "version": call(n.nvmlDeviceGetNvLinkVersion, h, link),
                     "remote_type": call(n.nvmlDeviceGetNvLinkRemoteDeviceType, h, link),
                     "remote_pci": call(lambda: n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId),
                     "caps": {c: call(n.nvmlDeviceGetNvLinkCapability, h, link, c) for c in range(6)},
                     "errors": {c: call(n.nvmlDeviceGetNvLinkErrorCounter, h, link, c) for c in range(5)}}
            try:
                vals = n.nvmlDeviceGetFieldValues(h, [(f, link) for f, _ in fields])
                kinds = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
                entry["fields"] = {name: [v.nvmlReturn, getattr(v.value, kinds.get(v.valueType, "ullVal"))]
                                   for (f, name), v in zip(fields, vals)}
            except Exception as e:
                entry["fields"] = {"error": "%s: %s" % (type(e).__name__, e)}
            g["links"].append(entry)
        out["gpus"].append(g)
    for i in range(count):
        for j in range(count):
            if i != j:
                out["pairs"].append({"a": i, "b": j,
                                     "p2p": {c: call(n.nvmlDeviceGetP2PStatus, handles[i], handles[j], c) for c in range(5)},
                                     "common_ancestor": call(n.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])})
    n.nvmlShutdown()
    return out


def collector_run():
    """facts as `fleetctl check` collects them, with the commands run, the files read and the directories listed."""
    sys.path.insert(0, os.path.join(HERE, ".."))
    from orchestrator import check, resources
    collector = resources.module("gpu_facts").Collector
    ran, read, listed = [], [], []
    run_command, read_file, listdir = check.LocalModule.run_command, collector.read, os.listdir

    def recording_run(self, argv, environ_update=None):
        ran.append(list(argv))
        return run_command(self, argv, environ_update)

    def recording_read(self, path, fact):
        read.append(path)
        return read_file(self, path, fact)

    def recording_listdir(path="."):
        listed.append(str(path))
        return listdir(path)

    check.LocalModule.run_command, collector.read, os.listdir = recording_run, recording_read, recording_listdir
    try:
        facts = check.collect_facts({})
    finally:
        check.LocalModule.run_command, collector.read, os.listdir = run_command, read_file, listdir
    return {"facts": facts, "ran": ran, "read": read, "listed": listed}


def summary(values):
    return {"n": len(values), "median": round(statistics.median(values), 2), "min": min(values), "max": max(values),
            "cv_pct": round(statistics.stdev(values) / statistics.fmean(values) * 100, 3) if len(values) > 1 else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sizes", default="67108864,268435456,1073741824,4294967296")
    ap.add_argument("--phases", default="nvml,sweep,allreduce,p2p")
    ap.add_argument("--name", default="allreduce-series.json")
    args = ap.parse_args()
    import faulthandler
    faulthandler.enable()
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    t0 = time.time()
    phases = args.phases.split(",")
    if "nvml" in phases:
        dump = nvml_dump()
        with open(os.path.join(args.out, "nvml-interconnect.json"), "w") as f:
            json.dump(dump, f, indent=1, default=str)
    print("nvml dump %.1f s" % (time.time() - t0), flush=True)
    if "facts" in phases:
        with open(os.path.join(args.out, "collector-run.json"), "w") as f:
            json.dump(collector_run(), f, indent=1)
    if not set(phases) & {"sweep", "allreduce", "p2p"}:
        return
    import torch
    col = load_collective()
    gpus = list(range(torch.cuda.device_count()))
    series = {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())), "gpus": len(gpus),
              "sweep": [], "allreduce": [], "p2p": []}
    path = os.path.join(args.out, args.name)

    def save():
        with open(path, "w") as f:
            json.dump(series, f, indent=1)

    for size in [int(s) for s in args.sizes.split(",")] if "sweep" in phases else []:
        t = time.time()
        rows = col.allreduce(5, 2.0, 0.5, gpus, nbytes=size)
        series["sweep"].append({"bytes": size, "wall_s": round(time.time() - t, 2), "samples": rows,
                                "summary": summary([r["value"] for r in rows])})
        print("sweep", size, series["sweep"][-1]["wall_s"], series["sweep"][-1]["summary"], flush=True)
        save()
    for k in range(args.repeats if "allreduce" in phases else 0):
        t = time.time()
        rows = col.allreduce(10, 5.0, 0.5, gpus)
        series["allreduce"].append({"repeat": k, "wall_s": round(time.time() - t, 2), "samples": rows,
                                    "summary": summary([r["value"] for r in rows])})
        print("allreduce", k, series["allreduce"][-1]["wall_s"], series["allreduce"][-1]["summary"], flush=True)
        save()
    for k in range(max(3, args.repeats // 2) if "p2p" in phases else 0):
        t = time.time()
        rows, failures = col.p2p(torch, 10, 2.0, 0.5, gpus, lambda i: {})
        series["p2p"].append({"repeat": k, "wall_s": round(time.time() - t, 2), "samples": rows, "failures": failures,
                              "summary": {g: summary([r["value"] for r in rows if r["gpu"] == g]) for g in gpus}})
        print("p2p", k, series["p2p"][-1]["wall_s"], series["p2p"][-1]["summary"], flush=True)
    for family in ("allreduce", "p2p"):
        for g in ([None] if family == "allreduce" else gpus):
            medians = [statistics.median([r["value"] for r in probe["samples"] if r["gpu"] == g])
                       for probe in series[family]]
            if len(medians) > 1:
                series["%s_gpu%s_between_probes" % (family, g)] = summary(medians)
                print(family, "GPU", g, "medians across probes:", summary(medians), flush=True)
    save()
    print("total %.1f s" % (time.time() - t0))


if __name__ == "__main__":
    main()
