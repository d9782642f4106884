#!/usr/bin/env bash
# The fleetctl.gpu collection and the Prometheus output on a real GPU host, from a source checkout (wheels in .whl/):
# the collection built and installed with ansible-galaxy and run by a plain playbook (examples/gpu-check.yml), once
# expecting the driver the host has and once another; then audit, probe and metrics as Prometheus text.
# Usage: scripts/device-collection-proof.sh OUTDIR
set -u
out=${1:?usage: device-collection-proof.sh OUTDIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH FLEETCTL_HOME=/tmp/fleetctl-home ANSIBLE_NOCOLOR=1
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
echo "driver $driver"
ansible-galaxy collection build collections/ansible_collections/fleetctl/gpu --output-path /tmp/cb --force
ansible-galaxy collection install /tmp/cb/fleetctl-gpu-*.tar.gz -p /tmp/coll --force
printf 'gpuhost ansible_connection=local ansible_python_interpreter=%s\n' "$(command -v python3)" >/tmp/inv.ini
for expected in "$driver" 570.86.15; do
  ANSIBLE_COLLECTIONS_PATH=/tmp/coll ansible-playbook -i /tmp/inv.ini examples/gpu-check.yml -e "expected_driver=$expected" \
    >"$out/gpu-check-expect-$expected.txt" 2>&1
  echo "gpu-check expecting $expected: exit=$?"; grep -E '"msg"|fatal|gpuhost +:' "$out/gpu-check-expect-$expected.txt"
done
/usr/bin/time -f "audit wall=%e s" python3 -m orchestrator.cli audit --format prometheus -o "$out/audit.prom" --fail-on never; echo "audit exit=$?"
/usr/bin/time -f "probe wall=%e s" python3 -m orchestrator.cli probe --throughput --samples 5 --warmup 3 --trial 0.5 \
  --format prometheus -o "$out/probe.prom"; echo "probe exit=$?"
python3 -m orchestrator.cli metrics -o "$out/metrics.prom"; echo "metrics exit=$?"
python3 - "$out" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families
for name in ("audit.prom", "probe.prom", "metrics.prom"):
    families = list(text_string_to_metric_families(open(f"{sys.argv[1]}/{name}").read()))
    print(name, len(families), "families", sum(len(f.samples) for f in families), "samples")
    for f in families:
        for s in f.samples:
            if f.name in ("fleetctl_driver_info", "fleetctl_gpus", "fleetctl_probe_gpus", "fleetctl_probe_median",
                          "fleetctl_probe_status") or (f.name == "fleetctl_control_status" and s.labels["status"] in ("fail", "warn", "error")):
                print("  ", s.name, s.labels, s.value)
PY
