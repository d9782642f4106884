#!/usr/bin/env bash
# What a driver activation reads (module nvidia_driver_state, role nvidia_driver's activate.yml) on a real GPU host,
# from a source checkout (wheels in .whl/), beside what the driver itself says: the module's JSON, nvidia-smi's
# driver version, the kernel's boot id and the daemons' states.
# Usage: scripts/device-driver-state-proof.sh OUTDIR
set -u
out=${1:?usage: device-driver-state-proof.sh OUTDIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/collections
marker=/run/fleetctl-driver-reboot-proof
cat /proc/sys/kernel/random/boot_id > "$marker"  # as the role's reboot command leaves it
state() {  # one module call, as the role's task makes it
  echo "== $1"; python3 -m ansible adhoc localhost -c local -e ansible_python_interpreter=python3 \
    -m fleetctl.gpu.nvidia_driver_state -a "$2" -o 2>&1 | grep '^localhost'
}
{ state "before the reboot" "{\"reboot_marker\": \"$marker\"}"
  state "after it, with the daemons that ran" '{"units": ["nvidia-persistenced.service"]}'; } > "$out/nvidia_driver_state.log"
rm -f "$marker"
nvidia-smi --query-gpu=driver_version,name --format=csv,noheader > "$out/nvidia-smi.csv"
{ echo "boot_id $(cat /proc/sys/kernel/random/boot_id)"; echo "module $(cat /sys/module/nvidia/version)"
  for u in nvidia-persistenced.service nvidia-fabricmanager.service; do echo "$u $(systemctl is-active "$u" 2>&1 | head -1)"; done
  echo "nvidia-ctk $(command -v nvidia-ctk || echo none)"; } > "$out/host.txt"
cat "$out/nvidia_driver_state.log" "$out/nvidia-smi.csv" "$out/host.txt"
