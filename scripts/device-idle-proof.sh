#!/usr/bin/env bash
# The upgrade's "no process holds a GPU" check (role nvidia_driver, module gpu_users) on a real GPU host, from a
# source checkout (wheels in .whl/): idle, then with a CUDA process running, then after it exits.
# Usage: scripts/device-idle-proof.sh OUTDIR
set -u
out=${1:?usage: device-idle-proof.sh OUTDIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/collections
check() {  # one module call, as the playbook's task makes it
  python3 -m ansible adhoc localhost -c local -e ansible_python_interpreter=python3 -m fleetctl.gpu.gpu_users -o 2>&1 | tee -a "$out/gpu_users.log"
}
echo "== idle" | tee "$out/gpu_users.log"; check
python3 -c 'import torch, time; x = torch.ones(1 << 20, device="cuda"); print("busy", flush=True); time.sleep(60)' &
busy=$!
for _ in $(seq 60); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break; sleep 1; done
echo "== busy (pid $busy)" | tee -a "$out/gpu_users.log"; check
nvidia-smi --query-compute-apps=pid,process_name --format=csv | tee -a "$out/gpu_users.log"
kill "$busy"; wait "$busy" 2>/dev/null
echo "== after the process exited" | tee -a "$out/gpu_users.log"; check
pgrep -a nvidia-persist | tee -a "$out/gpu_users.log"
