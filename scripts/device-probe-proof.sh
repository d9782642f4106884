#!/usr/bin/env bash
# Run fleetctl probe --throughput (builtin engine: torch bf16 GEMM + device-to-device copy) on a real GPU host
# from a source checkout (wheels in .whl/), time it, and keep the results. Usage: scripts/device-probe-proof.sh OUTDIR
set -u
out=${1:?usage: device-probe-proof.sh OUTDIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH FLEETCTL_HOME=/tmp/fleetctl-home
python3 -c 'import torch, scipy; print("torch", torch.__version__, "scipy", scipy.__version__, torch.cuda.get_device_name(0))'
nvidia-smi -q -x >"$out/nvidia-smi-q-x.xml"
# 1. The default protocol: 10 s warm-up, 10 samples of 0.5 s per metric.
/usr/bin/time -f "probe-default wall=%e s" python3 -m orchestrator.cli probe --throughput --format json -o "$out/probe-default.json"; echo "exit=$?"
# 2. A longer series for the gate's replay benchmark: 40 samples per metric.
/usr/bin/time -f "probe-series wall=%e s" python3 -m orchestrator.cli probe --throughput --samples 40 --format json -o "$out/probe-series.json"; echo "exit=$?"
python3 -m orchestrator.cli probe --throughput --samples 5 --warmup 5 | tee "$out/probe-table.txt"
python3 - "$out" <<'PY'
import json, statistics, sys
for name in ("probe-default.json", "probe-series.json"):
    r = json.load(open(f"{sys.argv[1]}/{name}"))
    h = r["hosts"][0]
    p = h["probe"]
    print(name, "exit", r["summary"]["exit_code"], "health", h["health"], "errors", p and p["errors"])
    t = p and p["throughput"]
    if t:
        print(" engine", t["engine"], t["device"], "wall_s", t["wall_s"])
        for m in t["metrics"]:
            v = [s["value"] for s in t["samples"] if s["metric"] == m and s["value"] is not None]
            print(f"  {m}: n={len(v)} median={statistics.median(v):.1f} mean={statistics.fmean(v):.1f} "
                  f"cv={statistics.stdev(v) / statistics.fmean(v) * 100:.3f}% min={min(v):.1f} max={max(v):.1f}")
        print("  first sample conditions:", {k: t["samples"][0].get(k) for k in ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "clock_event_reasons")})
PY
