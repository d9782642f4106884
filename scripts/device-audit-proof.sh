#!/usr/bin/env bash
# Run fleetctl audit on a real GPU host from a source checkout (wheels in .whl/), once through pynvml and
# once through the nvidia-smi -q -x fallback, and keep what it saw. Usage: scripts/device-audit-proof.sh OUTDIR
set -u
out=${1:?usage: device-audit-proof.sh OUTDIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH FLEETCTL_HOME=/tmp/fleetctl-home
nvidia-smi -q -x >"$out/nvidia-smi-q-x.xml"
python3 -c 'import sys; print(sys.executable)'
# 1. NVML path: the local connection uses this Python, which has nvidia-ml-py.
/usr/bin/time -f "audit-nvml wall=%e s user=%U s sys=%S s maxrss=%M KB" python3 -m orchestrator.cli audit --format json -o "$out/audit-nvml.json"; echo "exit=$?"
python3 -m orchestrator.cli audit -a --fail-on never | tee "$out/audit-table.txt"
# 2. nvidia-smi path: a Python that cannot import pynvml.
nopy=/usr/bin/python3; $nopy -c 'import pynvml' 2>/dev/null && echo "WARNING: $nopy has pynvml"
printf 'gpuhost ansible_connection=local ansible_python_interpreter=%s\n' "$nopy" >/tmp/inv.ini
/usr/bin/time -f "audit-smi wall=%e s user=%U s sys=%S s" python3 -m orchestrator.cli audit -i /tmp/inv.ini --format json -o "$out/audit-smi.json"; echo "exit=$?"
for i in 1 2 3; do /usr/bin/time -f "audit-nvml-repeat wall=%e s user=%U s sys=%S s" python3 -m orchestrator.cli audit --format json -o /dev/null; done
python3 - "$out" <<'PY'
import json, sys
for name in ("audit-nvml.json", "audit-smi.json"):
    r = json.load(open(f"{sys.argv[1]}/{name}"))
    h = r["hosts"][0]
    print(name, "exit", r["summary"]["exit_code"], "error", h["error"])
    if h["facts"]:
        f = h["facts"]
        print(" sources", f["sources"], "errors", f["errors"], "collect_s", f["collect_seconds"])
        print(" driver", {k: f["driver"][k] for k in ("state", "module_version", "module_flavor", "userspace_version", "cuda_driver_version")})
        print(" gpus", json.dumps(f["gpus"])[:600])
    for x in h["findings"]:
        if x["status"] not in ("pass", "not_applicable"):
            print("  ", x["control"], x["status"], x["message"][:150])
PY
