#!/usr/bin/env python3
"""K builtin probes back to back on a real GPU host, through the probe's own code, for bench/gate_replay.py's
run-to-run figures (issue 24: h2d_gbs, d2h_gbs, gemm_p99_ms): every probe's samples of every metric, plus each GPU's
host copies measured alone (a reference: the probe gates them all GPUs at once).

    python3 scripts/device-probe-series.py OUT.json [--probes 10] [--samples 10] [--warmup 10] [--trial 0.5]

Needs only python3, torch (CUDA), pynvml (optional: the samples' conditions) and this checkout: the collection's
module_utils are imported from collections/ as a namespace package, without ansible. Writes (bench/gate_replay.py
documents the format): {"format": "fleetctl-probe-series/1", "device", "host", "driver", "trial_s", "warmup_s",
"samples", "metrics", "probes": [{"probe": k, "wall_s", "errors", "samples": [...]}], "alone": [...]}.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "collections"))
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_throughput as tp  # noqa: E402


def alone(torch, indices, samples, trial_s):
    """Each GPU by itself, one after the other: the copies warmed up as in the probe, then SAMPLES of each."""
    rows = []
    for i in indices:
        gpu = tp.TorchGpu(torch, i)
        for trial in (gpu.h2d, gpu.d2h):
            trial(tp.COPY_WARMUP_S)
        for dummy in range(samples):
            for metric, trial in (("h2d_gbs", gpu.h2d), ("d2h_gbs", gpu.d2h)):
                rows.append({"gpu": i, "metric": metric, "value": round(trial(trial_s), 3)})
        del gpu
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--probes", type=int, default=10)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--trial", type=float, default=0.5)
    args = ap.parse_args()
    import torch
    try:
        import pynvml
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except Exception as e:  # the samples lose their conditions, nothing else
        print("pynvml: %s" % e, file=sys.stderr)
        pynvml, driver = None, None
    indices = list(range(torch.cuda.device_count()))
    doc = {"format": "fleetctl-probe-series/1", "host": os.uname().nodename, "driver": driver,
           "trial_s": args.trial, "warmup_s": args.warmup, "samples": args.samples, "metrics": {}, "probes": [],
           "alone": []}
    for k in range(args.probes):
        started = time.time()
        rows, spec, device, failures = tp.builtin(args.samples, args.warmup, args.trial, indices, pynvml)
        doc["device"], doc["metrics"] = device, spec
        doc["probes"].append({"probe": k, "wall_s": round(time.time() - started, 2),
                              "errors": {str(key): v for key, v in failures.items()}, "samples": rows})
        summary = {}
        for r in rows:
            if r["value"] is not None and r["gpu"] == 0:
                summary.setdefault(r["metric"], []).append(r["value"])
        print("probe %d: %.1f s, GPU 0 medians %s%s" % (
            k, time.time() - started, {m: tp.median(v) for m, v in sorted(summary.items())},
            " errors %s" % failures if failures else ""), file=sys.stderr, flush=True)
        with open(args.out, "w") as f:  # after every probe: a run cut short still leaves its probes
            json.dump(doc, f, indent=1)
    for k in range(min(args.probes, 3)):
        doc["alone"].append({"probe": k, "samples": alone(torch, indices, args.samples, args.trial)})
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print("wrote %s" % args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
