#!/usr/bin/env bash
# Issue 24's checks on a real GPU host, from a source checkout (wheels in .whl/): fleetctl audit through NVML and
# through nvidia-smi -q -x (the new facts: memory v2, PCIe replays and AER, InfoROM, SXid, InfiniBand), gpu_users
# idle and with a bare CUDA context held (the smallest memory a process holds, NVML's and nvidia-smi's view of it),
# then K builtin probes back to back (scripts/device-probe-series.py) and bench/gate_replay.py on them.
# Usage: scripts/device-health-proof.sh OUTDIR [PROBES]
set -u
out=${1:?usage: device-health-proof.sh OUTDIR [PROBES]}
probes=${2:-8}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH FLEETCTL_HOME=/tmp/fleetctl-home \
  ANSIBLE_COLLECTIONS_PATH=$PWD/collections
nvidia-smi -q -x >"$out/nvidia-smi-q-x.xml"
python3 -m orchestrator.cli audit --format json -o "$out/audit-nvml.json"; echo "audit nvml exit=$?"
nopy=/usr/bin/python3; $nopy -c 'import pynvml' 2>/dev/null && echo "WARNING: $nopy has pynvml"
printf 'gpuhost ansible_connection=local ansible_python_interpreter=%s\n' "$nopy" >/tmp/inv.ini
python3 -m orchestrator.cli audit -i /tmp/inv.ini --format json -o "$out/audit-smi.json"; echo "audit smi exit=$?"
users() { python3 -m ansible adhoc localhost -c local -e ansible_python_interpreter=python3 -m fleetctl.gpu.gpu_users -o 2>&1 | tee -a "$out/gpu_users.log"; }
echo "== idle" | tee "$out/gpu_users.log"; users
python3 -c 'import torch, time; torch.cuda.init(); x = torch.zeros(1, device="cuda"); print("context", flush=True); time.sleep(120)' &
ctx=$!
for _ in $(seq 60); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break; sleep 1; done
echo "== a bare CUDA context held (pid $ctx)" | tee -a "$out/gpu_users.log"; users
nvidia-smi -q -x >"$out/nvidia-smi-q-x-context.xml"
python3 - >"$out/nvml-context.json" <<'PY'
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    m = pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)
    out.append({"index": i, "memory_v2": {k: getattr(m, k) for k in ("total", "reserved", "free", "used")},
                "compute_processes": [{"pid": p.pid, "used": p.usedGpuMemory}
                                      for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]})
print(json.dumps(out, indent=1))
PY
python3 -m orchestrator.cli audit --format json -o "$out/audit-context.json"; echo "audit with a context exit=$?"
kill "$ctx"; wait "$ctx" 2>/dev/null
echo "== after the process exited" | tee -a "$out/gpu_users.log"; users
python3 scripts/device-probe-series.py "$out/probe-series.json" --probes "$probes" >"$out/probe-series.log" 2>&1
echo "probe series exit=$?"; tail -3 "$out/probe-series.log"
python3 bench/gate_replay.py "$out/probe-series.json" >"$out/gate-replay.txt" 2>&1; echo "gate replay exit=$?"
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
for name in ("audit-nvml.json", "audit-smi.json", "audit-context.json"):
    r = json.load(open(f"{d}/{name}"))
    h = r["hosts"][0]
    print(name, "exit", r["summary"]["exit_code"], "error", h["error"])
    f = h["facts"] or {}
    print(" sources", f.get("sources"), "errors", f.get("errors"))
    for g in f.get("gpus", []):
        print(" gpu", g.get("index"), "memory", g.get("memory"), "pcie", g.get("pcie"), "inforom", g.get("inforom_image"),
              "vbios", g.get("vbios"))
    print(" sxid", f.get("sxid"), "infiniband", f.get("infiniband"))
    for x in h["findings"]:
        if x["control"].split(".")[0] in ("gpu", "ib", "nvswitch") or x["status"] not in ("pass", "not_applicable"):
            print("  ", x["control"], x["status"], x["message"][:160])
PY
