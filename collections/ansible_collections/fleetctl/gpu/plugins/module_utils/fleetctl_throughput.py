# -*- coding: utf-8 -*-
# Throughput samples for fleetctl's probe: the builtin engine (torch), or an operator's canary command.
# Protocol (README "Probes and the gate" and "Measured", on H100/H200): warm up >= 10 s, sustained trials >= 0.5 s on random data,
# N samples per metric, each with the clocks, temperature, power and clock-event reasons seen right after it.
# Host<->device copies (h2d_gbs, d2h_gbs) run on every GPU AT ONCE, each trial started together: what a job's data
# loading does, and what a shared PCIe switch, the host's memory or the IOMMU/NUMA path limits. Measured on a real
# H100 (tests/testdata/h100-580.159.04-health): 1 GiB pinned copies, H2D 54.5 GB/s CV 0.21% and D2H 55.0 GB/s CV 0.79%
# at once after a warm-up, but the GPU alone from cold gave CV 12.9% / 12.5% (first samples 27-50 GB/s): so the copies
# are warmed up (COPY_WARMUP_S) and the at-once figure is the one measured and gated. A link trained at x8 halves it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import math
import os
import shlex
import subprocess
import threading
import time

from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_collective import METRICS as INTERCONNECT_METRICS
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_collective import interconnect

GEMM_N = 8192
COPY_BYTES = 1 << 30  # 1 GiB source, 1 GiB destination
# The interconnect runs after the GEMM phase on warm GPUs: 5 s of all-reduce gave a within-probe CV of 0.04-0.10%
# on 2x H200 (tests/testdata/probe/h200x2-580.159.04-allreduce-series.json).
INTERCONNECT_WARMUP_S = 5.0
COPY_WARMUP_S = 1.0  # per direction, before the first copy sample (the cold copies above)
P99 = 0.99
METRICS = {
    "gemm_tflops": {"unit": "TFLOP/s", "higher_is_better": True},
    "bandwidth_gbs": {"unit": "GB/s", "higher_is_better": True},
    # Per-iteration times of the GEMM trial's iterations (CUDA events around each): the trial's median and p99.
    "gemm_median_ms": {"unit": "ms", "higher_is_better": False},
    "gemm_p99_ms": {"unit": "ms", "higher_is_better": False},
    "h2d_gbs": {"unit": "GB/s", "higher_is_better": True},  # pinned host -> device, 1 GiB copies
    "d2h_gbs": {"unit": "GB/s", "higher_is_better": True},  # device -> pinned host
}


def percentile(values, q):
    """The lower nearest-rank percentile (sorted[int(q * (n - 1))]), as scripts/device-health-capture.py took the
    real H100's p99; None for no values."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else None


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return None
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2.0


class Rendezvous:
    """A barrier the GPU threads meet at before each copy trial, so that every GPU copies at once; a thread that
    fails leaves it, so that the others do not wait for it."""

    def __init__(self, parties):
        self.parties = parties
        self.waiting = 0
        self.generation = 0
        self.cond = threading.Condition()

    def wait(self):
        with self.cond:
            generation = self.generation
            self.waiting += 1
            if self.waiting >= self.parties:
                self._release()
                return
            while generation == self.generation:
                self.cond.wait()

    def leave(self):
        with self.cond:
            self.parties -= 1
            if self.parties > 0 and self.waiting >= self.parties:
                self._release()

    def _release(self):
        self.waiting = 0
        self.generation += 1
        self.cond.notify_all()


class EngineError(Exception):
    pass


def conditions(pynvml, handle):
    """What the GPU was doing right after a trial: a sample is only comparable with its conditions."""
    out = {"sm_clock_mhz": None, "mem_clock_mhz": None, "temperature_c": None, "power_w": None,
           "clock_event_reasons": None}
    if pynvml is None or handle is None:
        return out
    for key, call in (("sm_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                      ("mem_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
                      ("temperature_c", lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                      ("power_w", lambda: round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1)),
                      ("clock_event_reasons", lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))):
        try:
            out[key] = call()
        except Exception:
            pass
    return out


class TorchGpu:
    """One GPU's sustained trials. CUDA calls release the GIL, so one thread per GPU runs them all at once."""

    def __init__(self, torch, index):
        self.torch = torch
        self.index = index
        self.device = torch.device("cuda", index)
        with torch.cuda.device(self.device):
            gen = torch.Generator(device=self.device).manual_seed(1234 + index)
            # Random operands: all-zero inputs read ~22% high on an H100 (README "Measured").
            self.a = torch.randn(GEMM_N, GEMM_N, device=self.device, dtype=torch.bfloat16, generator=gen)
            self.b = torch.randn(GEMM_N, GEMM_N, device=self.device, dtype=torch.bfloat16, generator=gen)
            self.c = torch.empty(GEMM_N, GEMM_N, device=self.device, dtype=torch.bfloat16)
            self.src = torch.randn(COPY_BYTES // 2, device=self.device, dtype=torch.bfloat16, generator=gen)
            self.dst = torch.empty_like(self.src)
        # The host side of the H2D / D2H copies: page-locked, as a data loader's pin_memory buffers are.
        self.pinned = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, pin_memory=True)

    def _timed(self, op, seconds, each=None):
        """Run OP back to back for at least SECONDS of GPU time; (iterations, seconds) from CUDA events. With EACH
        (a list), every iteration also runs between two events of its own, and the milliseconds of those queued
        behind another are appended to EACH: a batch's first iteration starts on an idle GPU after the host's
        synchronize, and its time would hold the launch latency too."""
        torch = self.torch

        def event():
            return torch.cuda.Event(enable_timing=True)
        start, end = event(), event()
        iters, batch, elapsed = 0, 1, 0.0
        with torch.cuda.device(self.device):
            torch.cuda.synchronize(self.device)
            start.record()
            while elapsed < seconds:
                pairs = []
                for dummy in range(batch):
                    if each is None:
                        op()
                        continue
                    pair = (event(), event())
                    pair[0].record()
                    op()
                    pair[1].record()
                    pairs.append(pair)
                iters += batch
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end) / 1000.0
                if each is not None:
                    each.extend(a.elapsed_time(b) for a, b in pairs[1:])
                batch = min(batch * 2, 64)
        return iters, elapsed

    def gemm_trial(self, seconds):
        """One GEMM trial: its throughput and the median and p99 of its iterations' times."""
        times = []
        iters, elapsed = self._timed(lambda: self.torch.matmul(self.a, self.b, out=self.c), seconds, times)
        return {"gemm_tflops": 2.0 * GEMM_N ** 3 * iters / elapsed / 1e12,
                "gemm_median_ms": median(times), "gemm_p99_ms": percentile(times, P99)}

    def copy(self, seconds):
        iters, elapsed = self._timed(lambda: self.dst.copy_(self.src), seconds)
        return 2.0 * COPY_BYTES * iters / elapsed / 1e9  # bytes read + bytes written

    def h2d(self, seconds):
        iters, elapsed = self._timed(lambda: self.dst.copy_(self.pinned, non_blocking=True), seconds)
        return COPY_BYTES * iters / elapsed / 1e9  # bytes over the link

    def d2h(self, seconds):
        iters, elapsed = self._timed(lambda: self.pinned.copy_(self.src, non_blocking=True), seconds)
        return COPY_BYTES * iters / elapsed / 1e9

    def warm_up(self, seconds):
        self._timed(lambda: self.torch.matmul(self.a, self.b, out=self.c), seconds)


def sample_gpu(gpu, samples, warmup_s, trial_s, together, sample_conditions):
    """One GPU's rows: copy warm-up and GEMM warm-up, then SAMPLES rounds of every metric. TOGETHER (a Rendezvous)
    is met before every copy trial, so that all GPUs copy to and from the host at once."""
    for trial in (gpu.h2d, gpu.d2h):
        together.wait()
        trial(COPY_WARMUP_S)
    gpu.warm_up(warmup_s)
    rows = []

    def add(metric, value):
        digits = 4 if metric.endswith("_ms") else 3
        row = {"gpu": gpu.index, "metric": metric, "value": None if value is None else round(value, digits)}
        row.update(sample_conditions())
        rows.append(row)
    for dummy in range(samples):
        figures = gpu.gemm_trial(trial_s)
        for metric in ("gemm_tflops", "gemm_median_ms", "gemm_p99_ms"):
            add(metric, figures[metric])
        add("bandwidth_gbs", gpu.copy(trial_s))
        for metric, trial in (("h2d_gbs", gpu.h2d), ("d2h_gbs", gpu.d2h)):
            together.wait()
            add(metric, trial(trial_s))
    return rows


def builtin(samples, warmup_s, trial_s, gpu_indices, pynvml=None):
    """bf16 GEMM, device-to-device and host<->device copy samples on every GPU at once, through torch."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA's GPU i is NVML's GPU i
    try:
        import torch
    except ImportError:
        raise EngineError("the builtin engine needs torch on the host's Python (or use the command engine)")
    if not torch.cuda.is_available():
        raise EngineError("torch cannot use CUDA on this host")
    handles = {}
    if pynvml is not None:
        for i in gpu_indices:
            try:
                handles[i] = pynvml.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                handles[i] = None
    results, failures = {}, {}
    together = Rendezvous(len(gpu_indices))

    def run(i):
        try:
            results[i] = sample_gpu(TorchGpu(torch, i), samples, warmup_s, trial_s, together,
                                    lambda: conditions(pynvml, handles.get(i)))
        except Exception as e:  # one GPU failing must not hide the others' samples
            failures[i] = "%s: %s" % (type(e).__name__, e)
        finally:
            together.leave()

    threads = [threading.Thread(target=run, args=(i,)) for i in gpu_indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = [row for i in gpu_indices for row in results.get(i, [])]
    spec = dict(METRICS)
    if len(gpu_indices) >= 2:
        more, errors = interconnect(torch, samples, min(warmup_s, INTERCONNECT_WARMUP_S), trial_s, gpu_indices,
                                    lambda i: conditions(pynvml, handles.get(i)))
        rows += more
        spec.update(INTERCONNECT_METRICS)
        failures.update(errors)
    device = "torch %s on %s" % (torch.__version__, torch.cuda.get_device_name(gpu_indices[0]) if gpu_indices else "no GPU")
    return rows, spec, device, failures


def parse_command_output(text):
    """A canary's JSON: the whole stdout, else its last line that parses. It carries "metrics" (NAME: {value, unit,
    higher_is_better}: one sample per run) or "metrics" (NAME: {unit, higher_is_better}) plus "samples" (a series it
    measured itself: [{"gpu": i, NAME: value, ...}] or [{"gpu": i, "metric": NAME, "value": v}])."""
    candidates = [text] + [line for line in reversed(text.strip().splitlines()) if line.strip().startswith("{")]
    for candidate in candidates:
        try:
            doc = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("metrics"), dict) and doc["metrics"]:
            samples = doc.get("samples")
            if samples is not None and not (isinstance(samples, list) and all(isinstance(s, dict) for s in samples)):
                raise EngineError("the command's 'samples' is not a list of objects")
            return doc
    raise EngineError("the command printed no JSON object with a 'metrics' object")


def _spec(metrics):
    return dict((name, {"unit": str(m.get("unit", "")) if isinstance(m, dict) else "",
                        "higher_is_better": bool(m.get("higher_is_better", True)) if isinstance(m, dict) else True})
                for name, m in metrics.items())


def _number(value):
    """A sample's value: a finite number, else None (JSON may carry 1e999, NaN, or an int too big for a float)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _series_rows(doc):
    """Rows of a canary that measured a series itself, in either sample shape (a p2p sample may name its "peer")."""
    rows = []
    for s in doc.get("samples") or []:
        gpu = s.get("gpu") if isinstance(s.get("gpu"), int) and not isinstance(s.get("gpu"), bool) else None
        where = {"gpu": gpu}
        if isinstance(s.get("peer"), int) and not isinstance(s.get("peer"), bool):
            where["peer"] = s["peer"]
        if "metric" in s:
            rows.append(dict(where, metric=str(s["metric"]), value=_number(s.get("value"))))
        else:
            rows += [dict(where, metric=name, value=_number(s.get(name))) for name in doc["metrics"] if name in s]
    return rows


def command(cmd, samples, warmup_s=0.0, trial_s=0.0, timeout_s=600):
    """An operator's canary workload. It gets the protocol in FLEETCTL_PROBE_SAMPLES / _WARMUP_S / _TRIAL_S.
    A canary that prints a series ("samples") is run once; one that prints a single value per metric is run once
    to warm up, then SAMPLES times, each run one sample per metric."""
    argv = shlex.split(cmd)
    env = dict(os.environ, FLEETCTL_PROBE_SAMPLES=str(samples), FLEETCTL_PROBE_WARMUP_S=str(warmup_s),
               FLEETCTL_PROBE_TRIAL_S=str(trial_s))

    def run_once():
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout_s, env=env,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EngineError("%s: %s" % (argv[0], e))
        if proc.returncode != 0:
            raise EngineError("%s exited %d: %s" % (argv[0], proc.returncode,
                                                    proc.stderr.decode("utf-8", "replace")[-300:]))
        return parse_command_output(proc.stdout.decode("utf-8", "replace"))

    device = "command: %s" % os.path.basename(argv[0])  # its arguments may hold secrets: not reported
    first = run_once()
    if first.get("samples"):
        return _series_rows(first), _spec(first["metrics"]), device
    rows, spec = [], {}
    for dummy in range(samples):  # the first run was the warm-up
        doc = run_once()
        spec.update(_spec(doc["metrics"]))
        rows += [{"gpu": None, "metric": name, "value": _number(m.get("value") if isinstance(m, dict) else m)}
                 for name, m in sorted(doc["metrics"].items())]
    return rows, spec, device


def measure(engine, samples, warmup_s, trial_s, gpu_indices, cmd=None, pynvml=None):
    """(throughput object for probe-result, errors)."""
    started = time.time()
    errors = {}
    if engine == "builtin":
        rows, spec, device, failures = builtin(samples, warmup_s, trial_s, gpu_indices, pynvml)
        for key, message in failures.items():
            errors[key if isinstance(key, str) else "throughput.gpu%d" % key] = message
    elif engine == "command":
        if not cmd:
            raise EngineError("the command engine needs a command")
        rows, spec, device = command(cmd, samples, warmup_s, trial_s)
    else:
        raise EngineError("unknown engine %r" % engine)
    return {"engine": engine, "device": device, "warmup_s": warmup_s, "trial_s": trial_s,
            "wall_s": round(time.time() - started, 2), "metrics": spec, "samples": rows}, errors
