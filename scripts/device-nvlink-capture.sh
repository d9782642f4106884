#!/usr/bin/env bash
# Raw captures of a real multi-GPU host's interconnect (nvidia-smi, NVML) and the NCCL/P2P series.
# Usage: scripts/device-nvlink-capture.sh OUTDIR   (on the GPU host, from a checkout)
set -u
out=${1:?usage: device-nvlink-capture.sh OUTDIR}; shift
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  for args in "-q" "nvlink -s" "nvlink -e" "nvlink -c" "nvlink -p" "topo -m" "topo -p2p n" "-q -d FABRIC"; do
    echo "===== nvidia-smi $args"; nvidia-smi $args 2>&1; echo "rc=$?"
  done
  echo "===== modules"; grep -E '^(nvidia|nv_peermem|nvidia_peermem)' /proc/modules; ls -d /sys/module/nv*peermem* 2>&1
  echo "===== uname"; uname -a; nvidia-smi --version
} >"$out/nvidia-smi-interconnect.txt" 2>&1
nvidia-smi -q -x >"$out/nvidia-smi-q-x.xml"
python3 scripts/device-nvlink-capture.py "$out" --phases nvml >"$out/capture.log" 2>"$out/nvml-calls.log"; echo "nvml dump rc=$?"
[ "${NVLINK_CAPTURE_SERIES:-1}" = 1 ] || exit 0
python3 scripts/device-nvlink-capture.py "$out" --phases sweep,allreduce,p2p "$@" 2>&1 | tee -a "$out/capture.log"
