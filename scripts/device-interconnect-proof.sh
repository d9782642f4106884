#!/usr/bin/env bash
# fleetctl on a real multi-GPU host, from a source checkout (wheels in .whl/): the raw NVML interconnect dump, the
# audit's interconnect facts (NVML and nvidia-smi paths), the probe with its all-reduce/P2P metrics, and a P2P
# series; `imex`: the collector's run recorded (collector-run.json: no IMEX command or file without a multi-node
# NVLink domain). Usage: scripts/device-interconnect-proof.sh OUTDIR [audit] [probe] [p2p] [imex]
set -u
out=${1:?usage: device-interconnect-proof.sh OUTDIR [audit] [probe] [p2p] [imex]}; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH FLEETCTL_HOME=/tmp/fleetctl-home PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NVLINK_CAPTURE_SERIES=0 bash scripts/device-nvlink-capture.sh "$out"  # nvidia-smi texts, -q -x, the NVML dump
rm -f "$out/capture.log" "$out/nvml-calls.log"  # at most 8 files come back from the device tool
for part in "$@"; do
  case $part in
    audit)
      /usr/bin/time -f "audit-nvml wall=%e s" python3 -m orchestrator.cli audit --format json -o "$out/audit-nvml.json"; echo "exit=$?"
      printf 'gpuhost ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n' >/tmp/inv.ini
      /usr/bin/python3 -c 'import pynvml' 2>/dev/null && echo "WARNING: /usr/bin/python3 has pynvml"
      /usr/bin/time -f "audit-smi wall=%e s" python3 -m orchestrator.cli audit -i /tmp/inv.ini --format json -o "$out/audit-smi.json"; echo "exit=$?"
      python3 -m orchestrator.cli audit -a --fail-on never ;;
    probe)
      /usr/bin/time -f "probe wall=%e s" python3 -m orchestrator.cli probe --throughput --format json -o "$out/probe-default.json"; echo "exit=$?"
      python3 -m orchestrator.cli probe --throughput --samples 5 --warmup 5 ;;
    p2p)
      python3 scripts/device-nvlink-capture.py "$out" --phases p2p --repeats 14 --name p2p-series.json ;;
    imex)
      python3 scripts/device-nvlink-capture.py "$out" --phases facts; echo "facts exit=$?" ;;
  esac
done
