"""The builtin engine's figures, computed from CUDA event times: a fake torch whose GPU runs on a virtual clock
(per thread, as each GPU has its own thread) gives the real H100's GEMM iteration times and 1 GiB copy times
(tests/testdata/h100-580.159.04-health/bench.json), so every figure has a known right answer."""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_throughput as tp

BENCH = json.loads((Path(__file__).parents[1] / "testdata" / "h100-580.159.04-health" / "bench.json").read_text())
GEMM_MS = BENCH["gemm"]["0"]["ms"]  # 300 real per-iteration times
H2D_GBS, D2H_GBS, D2D_GBS = 54.8, 55.1, 3000.0
LAUNCH_MS = 0.5  # an op queued on an idle GPU starts this late (the host's launch after a synchronize)


class Clock(threading.local):
    def __init__(self):
        self.now = 0.0  # ms of this thread's GPU
        self.idle = True


class FakeTensor:
    def __init__(self, where):
        self.where = where  # "device" or "pinned"

    def copy_(self, src, non_blocking=False):
        gbs = {("device", "pinned"): H2D_GBS, ("pinned", "device"): D2H_GBS, ("device", "device"): D2D_GBS / 2}
        FakeTorch.current.run(tp.COPY_BYTES / (gbs[(self.where, src.where)] * 1e9) * 1e3)
        return self


class FakeTorch:
    """torch.cuda events, tensors and matmul, on a virtual clock."""
    bfloat16 = "bf16"
    current = None

    def __init__(self, gemm_ms=GEMM_MS):
        self.clock = Clock()
        self.gemm_ms = itertools.cycle(gemm_ms)
        self.lock = threading.Lock()
        self.cuda = self.Cuda(self)
        FakeTorch.current = self

    def run(self, ms):
        self.clock.now += (LAUNCH_MS if self.clock.idle else 0.0) + ms
        self.clock.idle = False

    def device(self, kind, index):
        return (kind, index)

    def Generator(self, device):  # noqa: N802 (torch's name)
        class Gen:
            def manual_seed(self, seed):
                return self
        return Gen()

    def randn(self, *shape, device=None, dtype=None, generator=None):
        return FakeTensor("device")

    def empty(self, *shape, device=None, dtype=None, pin_memory=False):
        return FakeTensor("pinned" if pin_memory else "device")

    def empty_like(self, t):
        return FakeTensor(t.where)

    def matmul(self, a, b, out):
        with self.lock:
            ms = next(self.gemm_ms)
        self.run(ms)
        return out

    class Cuda:
        def __init__(self, torch):
            self.torch = torch
            outer = self

            class Event:
                def __init__(self, enable_timing):
                    self.at = None

                def record(self):
                    self.at = outer.torch.clock.now

                def synchronize(self):
                    outer.torch.clock.idle = True

                def elapsed_time(self, other):
                    return other.at - self.at
            self.Event = Event

        def device(self, dev):
            class Ctx:
                def __enter__(self):
                    return self

                def __exit__(self, *a):
                    return False
            return Ctx()

        def synchronize(self, dev=None):
            self.torch.clock.idle = True


def test_host_copies_count_the_bytes_once_and_the_device_copy_twice():
    gpu = tp.TorchGpu(FakeTorch(), 0)
    assert gpu.h2d(0.5) == pytest.approx(H2D_GBS, rel=0.01)  # 1 GiB over the link per copy
    assert gpu.d2h(0.5) == pytest.approx(D2H_GBS, rel=0.01)
    assert gpu.copy(0.5) == pytest.approx(D2D_GBS, rel=0.03)  # read + written, as before
    # The launch after each synchronize (about 10 over a trial) costs a little of the sustained figure, never more.
    assert gpu.h2d(0.5) < H2D_GBS


def test_a_gemm_trial_gives_the_real_iteration_times_median_and_p99():
    gpu = tp.TorchGpu(FakeTorch(), 0)
    fig = gpu.gemm_trial(0.48)  # ~300 iterations of the real series
    real = BENCH["gemm"]["0"]
    assert fig["gemm_median_ms"] == pytest.approx(real["median_ms"], rel=0.005)  # 1.610 ms
    assert fig["gemm_p99_ms"] == pytest.approx(real["p99_ms"], rel=0.03)  # 1.737 ms
    # The launch gap after a synchronize (0.5 ms here, at ~10 batch starts of ~300 iterations: over 1%) is not an
    # iteration's time: counted, p99 would read ~2.1 ms, over the slowest real iteration (1.81 ms).
    assert fig["gemm_p99_ms"] < max(GEMM_MS)
    sustained = 2 * tp.GEMM_N ** 3 / (statistics.mean(GEMM_MS) * 1e-3) / 1e12
    assert fig["gemm_tflops"] == pytest.approx(sustained, rel=0.015)


def test_percentile_is_the_lower_nearest_rank_of_the_real_capture():
    assert tp.percentile(GEMM_MS, tp.P99) == BENCH["gemm"]["0"]["p99_ms"]
    assert tp.median(GEMM_MS) == BENCH["gemm"]["0"]["median_ms"]
    assert tp.percentile([], 0.99) is None and tp.median([]) is None


class ScriptedGpu:
    """sample_gpu's view of a GPU: figures given, start times of the copy trials kept."""

    def __init__(self, index, gemm_s):
        self.index, self.gemm_s, self.copy_starts = index, gemm_s, []

    def gemm_trial(self, seconds):
        time.sleep(self.gemm_s)
        return {"gemm_tflops": 712.34567, "gemm_median_ms": 1.60981, "gemm_p99_ms": 1.73693}

    def copy(self, seconds):
        return 2999.9

    def warm_up(self, seconds):
        pass

    def h2d(self, seconds):
        self.copy_starts.append(time.monotonic())
        return 54.76

    def d2h(self, seconds):
        self.copy_starts.append(time.monotonic())
        return 55.11


def test_every_gpu_copies_at_once_and_each_sample_has_every_metric_with_its_conditions():
    """GPU 1's GEMM trials take 0.1 s longer: its copies still start with GPU 0's (the figure gated is all at once)."""
    gpus = [ScriptedGpu(0, 0.0), ScriptedGpu(1, 0.1)]
    together, rows = tp.Rendezvous(2), {}

    def run(gpu):
        try:
            rows[gpu.index] = tp.sample_gpu(gpu, 2, 0, 0.5, together, lambda: {"temperature_c": 40})
        finally:
            together.leave()
    threads = [threading.Thread(target=run, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(gpus[0].copy_starts) == len(gpus[1].copy_starts) == 2 + 2 * 2  # warm-up + 2 samples, both ways
    assert max(abs(a - b) for a, b in zip(gpus[0].copy_starts, gpus[1].copy_starts)) < 0.05
    assert [(r["metric"], r["value"]) for r in rows[1][:6]] == [
        ("gemm_tflops", 712.346), ("gemm_median_ms", 1.6098), ("gemm_p99_ms", 1.7369), ("bandwidth_gbs", 2999.9),
        ("h2d_gbs", 54.76), ("d2h_gbs", 55.11)]
    assert len(rows[0]) == 12 and all(r["temperature_c"] == 40 and r["gpu"] == 0 for r in rows[0])
    assert set(r["metric"] for r in rows[0]) == set(tp.METRICS)


def test_a_gpu_that_fails_does_not_hold_the_others_at_the_copies():
    together, done = tp.Rendezvous(2), []

    def healthy():
        rows = tp.sample_gpu(ScriptedGpu(0, 0.0), 3, 0, 0.5, together, dict)
        together.leave()
        done.append(len(rows))
    t = threading.Thread(target=healthy)
    t.start()
    time.sleep(0.05)
    together.leave()  # GPU 1's thread failed before its first copy
    t.join(5)
    assert done == [18]


def load_script(path, name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_device_series_capture_runs_the_probes_code_and_gate_replay_reads_it(tmp_path, monkeypatch):
    """scripts/device-probe-series.py with a 1-GPU fake torch (2+ would add the NCCL interconnect) and no pynvml: its JSON is what bench/gate_replay.py
    reads, every probe a run of its own with every metric, the 'alone' copies a reference series."""
    fake = FakeTorch()
    fake.__version__ = "2.11.0+fake"
    fake.cuda.is_available = lambda: True
    fake.cuda.device_count = lambda: 1
    fake.cuda.get_device_name = lambda i: "NVIDIA H100 80GB HBM3"
    fake.cuda.empty_cache = lambda: None
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    out = tmp_path / "h100-probe-series.json"
    capture = load_script("scripts/device-probe-series.py", "device_probe_series")
    monkeypatch.setattr(sys, "argv", ["x", str(out), "--probes", "2", "--samples", "3", "--warmup", "0",
                                      "--trial", "0.05"])
    capture.main()
    doc = json.loads(out.read_text())
    assert doc["device"] == "torch 2.11.0+fake on NVIDIA H100 80GB HBM3" and set(doc["metrics"]) == set(tp.METRICS)
    assert [len(p["samples"]) for p in doc["probes"]] == [3 * len(tp.METRICS)] * 2
    replay = load_script("bench/gate_replay.py", "gate_replay")
    runs = replay.load_docs([out], None)
    assert sorted(runs) == [f"{out.name}#{family}{k}" for family in ("alone", "probes") for k in (0, 1)]
    series = replay.load_series(runs)
    h2d = [s for s in series if s["metric"] == "h2d_gbs"]
    assert len(h2d) == 4 and all(statistics.median(s["values"]) == pytest.approx(H2D_GBS, rel=0.02) for s in h2d)
    assert [s["counted"] for s in h2d] == [True, True, False, False]  # the probes, then alone: a reference
    assert not any(s["counted"] for s in series if s["metric"] == "gemm_p99_ms")  # not gated (yet)
