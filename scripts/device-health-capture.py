#!/usr/bin/env python3
"""Raw readings for the node-health checks of issue 24, from a real GPU host (read-only but for the benchmarks):
NVML's PCIe replay counter, link generation/width, VBIOS and InfoROM versions, memory in use against the processes
NVML lists; the GPU's PCI device in sysfs (AER counters, link speed); /sys/class/infiniband; pinned host<->device
copy bandwidth (each GPU alone, then all at once) and the per-iteration times of a bf16 GEMM (torch).

Usage: python3 scripts/device-health-capture.py DEST [RUNS]
  writes DEST/nvml.json, DEST/sysfs.json, DEST/bench.json; with RUNS > 1 also DEST/series.json: RUNS probes back to
  back (warmed copies and a 300-iteration GEMM per GPU, all GPUs at once and each alone), each probe's medians and
  p99, for the run-to-run spread the gate needs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
from pathlib import Path


def nvml_readings() -> list[dict]:
    import pynvml
    pynvml.nvmlInit()
    out = []

    def call(name, *args):
        try:
            value = getattr(pynvml, name)(*args)
            return value.decode() if isinstance(value, bytes) else value
        except pynvml.NVMLError as e:
            return {"nvml_error": str(e)}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = call("nvmlDeviceGetMemoryInfo", h)
        mem2 = call("nvmlDeviceGetMemoryInfo", h, getattr(pynvml, "nvmlMemory_v2", 0))
        graphics = call("nvmlDeviceGetGraphicsRunningProcesses", h)
        procs = call("nvmlDeviceGetComputeRunningProcesses", h)
        pci = call("nvmlDeviceGetPciInfo", h)
        bus = None if isinstance(pci, dict) else pci.busId
        out.append({
            "index": i, "pci_bus_id": bus.decode() if isinstance(bus, bytes) else bus,
            "pcie_replay_counter": call("nvmlDeviceGetPcieReplayCounter", h),
            "pcie_link_gen": call("nvmlDeviceGetCurrPcieLinkGeneration", h),
            "pcie_link_gen_max": call("nvmlDeviceGetMaxPcieLinkGeneration", h),
            "pcie_link_width": call("nvmlDeviceGetCurrPcieLinkWidth", h),
            "pcie_link_width_max": call("nvmlDeviceGetMaxPcieLinkWidth", h),
            "vbios": call("nvmlDeviceGetVbiosVersion", h),
            "inforom_image": call("nvmlDeviceGetInforomImageVersion", h),
            "memory_used_bytes": mem.used if not isinstance(mem, dict) else mem,
            "memory_total_bytes": mem.total if not isinstance(mem, dict) else None,
            "compute_processes": [{"pid": p.pid, "used": p.usedGpuMemory} for p in procs]
            if isinstance(procs, list) else procs,
            "graphics_processes": [{"pid": p.pid, "used": p.usedGpuMemory} for p in graphics]
            if isinstance(graphics, list) else graphics,
            "memory_v2": {k: getattr(mem2, k, None) for k in ("total", "reserved", "free", "used")}
            if not isinstance(mem2, dict) else mem2,
            "inforom_oem": call("nvmlDeviceGetInforomVersion", h, 0),
            "inforom_ecc": call("nvmlDeviceGetInforomVersion", h, 1),
            "inforom_power": call("nvmlDeviceGetInforomVersion", h, 2),
        })
    pynvml.nvmlShutdown()
    return out


def sysfs_readings(gpus: list[dict]) -> dict:
    out = {"pci": {}, "infiniband": {}}
    for g in gpus:
        bdf = (g.get("pci_bus_id") or "").lower()
        bdf = bdf[4:] if len(bdf) == 16 else bdf  # NVML's 00000000:00:06.0 -> sysfs' 0000:00:06.0
        dev = Path("/sys/bus/pci/devices") / bdf
        entry = {}
        for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal", "current_link_speed",
                     "current_link_width", "max_link_speed", "max_link_width"):
            try:
                entry[name] = (dev / name).read_text()
            except OSError as e:
                entry[name] = {"error": e.strerror}
        # the AER counters of each bridge above the GPU too (a root port reports what the GPU's link saw)
        upstream = {}
        for parent in Path(os.path.realpath(dev)).parents:
            if (parent / "aer_dev_correctable").exists():
                upstream[parent.name] = {n: (parent / n).read_text() for n in
                                         ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")}
        entry["upstream_aer"] = upstream
        entry["sysfs_path"] = os.path.realpath(dev)
        out["pci"][bdf] = entry
    ib = Path("/sys/class/infiniband")
    out["infiniband"] = sorted(p.name for p in ib.iterdir()) if ib.is_dir() else {"error": "no /sys/class/infiniband"}
    return out


def copy_bandwidth(torch, device: int, size: int, samples: int) -> dict:
    """Pinned 1 GiB copies, H2D and D2H, CUDA-event timed: GB/s per sample."""
    torch.cuda.set_device(device)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
    result = {}
    for name, copy in (("h2d", lambda: dev.copy_(host, non_blocking=True)),
                       ("d2h", lambda: host.copy_(dev, non_blocking=True))):
        copy()
        torch.cuda.synchronize(device)
        rates = []
        for _ in range(samples):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            rates.append(size / (start.elapsed_time(end) / 1000) / 1e9)
        result[name] = {"samples_gbps": rates, "median": statistics.median(rates),
                        "cv": statistics.pstdev(rates) / statistics.mean(rates)}
    return result


def gemm_iterations(torch, device: int, n: int = 8192, iterations: int = 300) -> dict:
    torch.cuda.set_device(device)  # the events time the current device's stream
    a = torch.randn(n, n, dtype=torch.bfloat16, device=f"cuda:{device}")
    b = torch.randn(n, n, dtype=torch.bfloat16, device=f"cuda:{device}")
    for _ in range(20):
        a @ b
    torch.cuda.synchronize(device)
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    ordered = sorted(times)
    return {"n": n, "iterations": iterations, "ms": times, "median_ms": statistics.median(times),
            "p99_ms": ordered[int(0.99 * (len(ordered) - 1))], "max_ms": ordered[-1],
            "p99_over_median": ordered[int(0.99 * (len(ordered) - 1))] / statistics.median(times)}


def main() -> None:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    gpus = nvml_readings()
    (dest / "nvml.json").write_text(json.dumps(gpus, indent=2) + "\n")
    (dest / "sysfs.json").write_text(json.dumps(sysfs_readings(gpus), indent=2) + "\n")
    import torch
    size, samples = 1 << 30, 15
    alone = {str(d): copy_bandwidth(torch, d, size, samples) for d in range(torch.cuda.device_count())}
    together: dict[str, dict] = {}
    threads = [threading.Thread(target=lambda d=d: together.__setitem__(str(d), copy_bandwidth(torch, d, size,
                                                                                                   samples)))
               for d in range(torch.cuda.device_count())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gemm = {str(d): gemm_iterations(torch, d) for d in range(torch.cuda.device_count())}
    (dest / "bench.json").write_text(json.dumps({"copy_alone": alone, "copy_all_at_once": together, "gemm": gemm,
                                                 "torch": torch.__version__, "host": os.uname().nodename},
                                                indent=2) + "\n")


def series(torch, runs: int) -> dict:
    """RUNS probes back to back: per run and GPU, the copies (warm, 15 samples of 1 GiB) and a 300-iteration GEMM,
    all GPUs at once (one thread each), then each GPU alone."""
    count = torch.cuda.device_count()
    out = []
    for run in range(runs):
        at_once: dict[str, dict] = {}

        def both(d):
            at_once[str(d)] = {"copy": copy_bandwidth(torch, d, 1 << 30, 15), "gemm": gemm_iterations(torch, d)}
        threads = [threading.Thread(target=both, args=(d,)) for d in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        alone = {str(d): copy_bandwidth(torch, d, 1 << 30, 15) for d in range(count)} if count > 1 else None
        out.append({"run": run, "at_once": {d: {"h2d_median": v["copy"]["h2d"]["median"],
                                                "h2d_cv": v["copy"]["h2d"]["cv"],
                                                "h2d_samples": v["copy"]["h2d"]["samples_gbps"],
                                                "d2h_median": v["copy"]["d2h"]["median"],
                                                "d2h_cv": v["copy"]["d2h"]["cv"],
                                                "d2h_samples": v["copy"]["d2h"]["samples_gbps"],
                                                "gemm_median_ms": v["gemm"]["median_ms"],
                                                "gemm_p99_ms": v["gemm"]["p99_ms"],
                                                "gemm_max_ms": v["gemm"]["max_ms"]} for d, v in at_once.items()},
                    "alone": {d: {"h2d_median": v["h2d"]["median"], "d2h_median": v["d2h"]["median"],
                                  "h2d_cv": v["h2d"]["cv"], "d2h_cv": v["d2h"]["cv"]} for d, v in alone.items()}
                    if alone else None})
    return {"runs": out, "gpus": count, "torch": torch.__version__, "host": os.uname().nodename}


if __name__ == "__main__":
    main()
    if len(sys.argv) > 2 and int(sys.argv[2]) > 1:
        import torch
        (Path(sys.argv[1]) / "series.json").write_text(json.dumps(series(torch, int(sys.argv[2])), indent=1) + "\n")
