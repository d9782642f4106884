#!/usr/bin/env bash
# `fleetctl check` latency on a real GPU node (issue 37): this checkout and, when BEFORE_TAR names an archive of an
# earlier one, that one too, alternately, with bench/check_latency.py (this checkout's) on both; fleetctl's
# dependencies installed from the wheels in .whl/ as pip installs them on a node (compiled to bytecode).
# Usage: [BEFORE_TAR=before.tar] scripts/device-check-latency.sh OUTDIR
set -u
out=${1:?usage: device-check-latency.sh OUTDIR}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 --version; nproc; uptime; } > "$out/machine.txt"
trees=("$PWD")
if [ -n "${BEFORE_TAR:-}" ]; then
  mkdir -p /tmp/before && tar -xf "$BEFORE_TAR" -C /tmp/before && cp bench/check_latency.py /tmp/before/bench/
  trees+=(/tmp/before)
fi
for round in 1 2; do
  for tree in "${trees[@]}"; do
    name=$([ "$tree" = "$PWD" ] && echo after || echo before)
    for mode in bytecode no-bytecode; do
      flag=$([ $mode = no-bytecode ] && echo --no-bytecode)
      (cd "$tree" && python3 bench/check_latency.py --runs 21 $flag) > "$out/latency-$name-$mode-$round.txt" 2>&1
    done
  done
done
python3 -X importtime -m orchestrator.cli check > /dev/null 2> "$out/importtime-after.txt"
python3 -m orchestrator.cli check --format json > "$out/check.json"; echo "exit $?" >> "$out/machine.txt"
