# -*- coding: utf-8 -*-
# Interconnect samples for fleetctl's probe on hosts with 2+ GPUs (the builtin engine):
#   allreduce_busbw_gbs  NCCL all-reduce bus bandwidth over all the host's GPUs (torch.distributed, one process per
#                        GPU, NVLS/multicast off), busbw = bytes x 2(n-1)/n / time per all-reduce (nccl-tests' formula)
#   p2p_gbs              GPU-to-GPU copy bandwidth around a ring (GPU i -> GPU i+1, one pair at a time), per source GPU
# Same protocol as the GEMM/copy metrics: warm-up, then N sustained trials, each with the GPU's conditions.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ALLREDUCE_BYTES = 1 << 30  # fp32 elements; measured on 2x H200: the busbw plateau (README, Measured)
P2P_BYTES = 1 << 28
METRICS = {
    "allreduce_busbw_gbs": {"unit": "GB/s", "higher_is_better": True},
    "p2p_gbs": {"unit": "GB/s", "higher_is_better": True},
}
# NVLink SHARP (multicast) stays off: a program using it can take a shared host's GPUs out of service. CUDA numbers
# the GPUs in PCI order, as NVML does (its default, fastest first, may not).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

# One rank of the all-reduce. Every rank runs the same number of iterations; a trial's time is the slowest rank's.
WORKER = r"""
import datetime, json, math, os, sys
import torch
import torch.distributed as dist

env = os.environ
rank, world, gpu = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["FLEETCTL_GPU"])
nbytes, samples = int(env["FLEETCTL_BYTES"]), int(env["FLEETCTL_SAMPLES"])
warmup_s, trial_s = float(env["FLEETCTL_WARMUP_S"]), float(env["FLEETCTL_TRIAL_S"])
torch.cuda.set_device(gpu)
dist.init_process_group("nccl", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=float(env["FLEETCTL_NCCL_TIMEOUT_S"])))
x = torch.randn(nbytes // 4, device="cuda", generator=torch.Generator(device="cuda").manual_seed(rank))
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

def timed(iters):
    torch.cuda.synchronize()
    dist.barrier()
    start.record()
    for _ in range(iters):
        dist.all_reduce(x)
    end.record()
    end.synchronize()
    t = torch.tensor([start.elapsed_time(end) / 1000.0], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()

per_iter = timed(5) / 5
timed(max(1, int(math.ceil(warmup_s / per_iter))))
iters = max(1, int(math.ceil(trial_s / timed(5) * 5)))
factor = 2.0 * (world - 1) / world
nvml = None
try:
    import pynvml
    pynvml.nvmlInit()
    nvml = pynvml.nvmlDeviceGetHandleByIndex(gpu)
except Exception:
    pass
for i in range(samples):
    seconds = timed(iters)
    if rank == 0:
        row = {"metric": "allreduce_busbw_gbs", "value": round(nbytes * factor * iters / seconds / 1e9, 3),
               "iterations": iters}
        if nvml is not None:
            try:
                row.update(sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(nvml, pynvml.NVML_CLOCK_SM),
                           temperature_c=pynvml.nvmlDeviceGetTemperature(nvml, pynvml.NVML_TEMPERATURE_GPU),
                           power_w=round(pynvml.nvmlDeviceGetPowerUsage(nvml) / 1000.0, 1))
            except Exception:
                pass
        print(json.dumps(row), flush=True)
dist.destroy_process_group()
"""


class CollectiveError(Exception):
    pass


def _free_port():
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def _last_line(f):
    f.seek(0)
    lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    return (lines or ["no output"])[-1][-300:]


def allreduce(samples, warmup_s, trial_s, gpu_indices, nbytes=ALLREDUCE_BYTES, timeout_s=600):
    """Samples of NCCL all-reduce bus bandwidth over GPU_INDICES, one worker process per GPU (this Python).
    The workers are watched together: the first to fail ends the others (which would wait in NCCL) and names why."""
    if len(gpu_indices) < 2:
        return []
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(len(gpu_indices)),
               FLEETCTL_BYTES=str(nbytes), FLEETCTL_SAMPLES=str(samples), FLEETCTL_WARMUP_S=str(warmup_s),
               FLEETCTL_TRIAL_S=str(trial_s), FLEETCTL_NCCL_TIMEOUT_S=str(timeout_s), **SAFE_ENV)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs, outs, errs = [], [], []
    deadline = time.time() + timeout_s
    try:
        for rank, gpu in enumerate(gpu_indices):
            outs.append(tempfile.TemporaryFile())
            errs.append(tempfile.TemporaryFile())
            procs.append(subprocess.Popen([sys.executable, "-c", WORKER], stdout=outs[-1], stderr=errs[-1],
                                          env=dict(env, RANK=str(rank), FLEETCTL_GPU=str(gpu))))
        while any(p.poll() is None for p in procs):
            failed = next((i for i, p in enumerate(procs) if p.returncode not in (None, 0)), None)
            if failed is not None:
                raise CollectiveError("NCCL all-reduce worker exited %d: %s"
                                      % (procs[failed].returncode, _last_line(errs[failed])))
            if time.time() > deadline:
                raise CollectiveError("NCCL all-reduce did not finish in %d s" % timeout_s)
            time.sleep(0.1)
        failed = next((i for i, p in enumerate(procs) if p.returncode != 0), None)
        if failed is not None:
            raise CollectiveError("NCCL all-reduce worker exited %d: %s"
                                  % (procs[failed].returncode, _last_line(errs[failed])))
        outs[0].seek(0)
        text = outs[0].read().decode("utf-8", "replace")
    except OSError as e:
        raise CollectiveError("NCCL all-reduce workers could not start: %s" % e)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in outs + errs:
            f.close()
    rows = []
    for line in text.splitlines():  # NCCL_DEBUG=INFO, say, prints to stdout too: only the sample lines count
        try:
            row = json.loads(line) if line.startswith("{") else None
        except ValueError:
            row = None
        if isinstance(row, dict) and row.get("metric") == "allreduce_busbw_gbs":
            row.pop("iterations", None)
            row["gpu"] = None  # one figure for the whole host
            rows.append(row)
    if len(rows) != samples:
        raise CollectiveError("NCCL all-reduce printed %d samples, expected %d" % (len(rows), samples))
    return rows


def p2p(torch, samples, warmup_s, trial_s, gpu_indices, conditions, nbytes=P2P_BYTES):
    """Copy bandwidth GPU i -> GPU i+1 around a ring, one pair at a time: (rows, failures by source GPU).

    One pair at a time: on the real 2x H200 both directions copied at once shared a constant ~401 GB/s unevenly
    (193 vs 208 GB/s, the split flipping between runs), far too noisy for a 3% gate."""
    if len(gpu_indices) < 2:
        return [], {}
    ring = list(zip(gpu_indices, gpu_indices[1:] + gpu_indices[:1]))
    rows, failures = [], {}
    for src, dst in ring:
        try:
            a = torch.randn(nbytes // 2, device=torch.device("cuda", src), dtype=torch.bfloat16)
            b = torch.empty_like(a, device=torch.device("cuda", dst))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

            def trial(seconds):
                iters, batch, elapsed = 0, 1, 0.0
                with torch.cuda.device(src):
                    torch.cuda.synchronize(src)
                    start.record()
                    while elapsed < seconds:
                        for dummy in range(batch):
                            b.copy_(a, non_blocking=True)
                        iters += batch
                        end.record()
                        end.synchronize()
                        elapsed = start.elapsed_time(end) / 1000.0
                        batch = min(batch * 2, 64)
                return nbytes * iters / elapsed / 1e9

            trial(warmup_s)
            for dummy in range(samples):
                row = {"gpu": src, "peer": dst, "metric": "p2p_gbs", "value": round(trial(trial_s), 3)}
                row.update(conditions(src))
                rows.append(row)
            del a, b
        except Exception as e:  # one pair failing must not hide the others
            failures[src] = "%s: %s" % (type(e).__name__, e)
    return rows, failures


def interconnect(torch, samples, warmup_s, trial_s, gpu_indices, conditions):
    """(rows, errors) of both interconnect metrics; a host with fewer than 2 GPUs has none."""
    if len(gpu_indices) < 2:
        return [], {}
    rows, errors = [], {}
    try:
        if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
            raise CollectiveError("this torch has no NCCL: no all-reduce figure")
        rows += allreduce(samples, warmup_s, trial_s, gpu_indices)
    except CollectiveError as e:
        errors["throughput.allreduce"] = str(e)
    pair_rows, failures = p2p(torch, samples, warmup_s, trial_s, gpu_indices, conditions)
    rows += pair_rows
    for src, message in failures.items():
        errors["throughput.p2p.gpu%d" % src] = message
    return rows, errors
