#!/usr/bin/env python3
"""Odd inputs at scale (issue 42): an IMEX node list of thousands of entries, an inventory of 60,000 hosts.

Usage: .venv/bin/python bench/input_scale.py [--imex 1000,10000,95000] [--hosts 60000] [--memory-gib 4]
                                             [--skip imex|inventory]

imex: for each N, a node list of N IPv6 addresses and an `nvidia-imex-ctl -N -j` status of N members, this host's
entry connected to every one: the wall time of the host's readers (parse_nodes, parse_domain) and of the imex.domain
control on facts of N nodes (as an old or hostile collector could send them), with what each made of it. Past
MAX_NODES (1024) each says so in one line instead.

inventory: an inventory of HOSTS hosts in one line of JSON (what a generator writes), each at 127.0.x.y port 9 where
nothing listens (the pre-flight finds every one refused at once: what is measured is fleetctl's own work), then
`fleetctl audit -i INV --format json -o FILE` with the whole fleet and with `-l` one host, each in a fresh process
under an address-space limit of MEMORY_GIB (RLIMIT_AS) and a fresh history: wall time, peak RSS and exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "collections"))


def timed(function, *args):
    started = time.perf_counter()
    try:
        result = function(*args)
    except Exception as e:  # a reader's one-line refusal
        result = e
    return time.perf_counter() - started, result


def imex(n: int) -> None:
    from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_imex as readers
    from orchestrator.controls import imex as controls

    addresses = [f"fd00::{i:x}" for i in range(1, n + 1)]
    members = {str(i): {"status": "READY", "host": a.upper(), "hostName": f"tray-{i}", "version": "570.86.15"}
               for i, a in enumerate(addresses)}
    members["0"]["connections"] = {str(i): {"host": a, "status": "CONNECTED"} for i, a in enumerate(addresses)}
    ctl = json.dumps({"status": "UP", "nodes": members})
    nodes_s, (nodes, problems) = timed(readers.parse_nodes, "\n".join(addresses))
    domain_s, domain = timed(readers.parse_domain, ctl, [addresses[0]])
    facts = {"imex": {"nodes": addresses, "nodes_config_file": "/etc/nvidia-imex/nodes_config.cfg", "domain": {
        "status": "UP", "nodes": [{"address": a, "hostname": None, "status": "READY", "version": "570.86.15",
                                   "connection": "CONNECTED"} for a in addresses]}}}
    control_s, check = timed(controls.imex_domain, facts, {})
    said = problems[0] if problems else f"{len(nodes)} addresses"
    domain_said = str(domain) if isinstance(domain, Exception) else f"{len(domain[0]['nodes'])} members"
    print(f"imex {n:>7} entries: parse_nodes {nodes_s:7.3f} s ({said}); parse_domain {domain_s:7.3f} s "
          f"({domain_said}); imex.domain {control_s:7.3f} s ({check.status}: {check.message[:90]})", flush=True)


def inventory(hosts: int, path: Path) -> None:
    """HOSTS hosts at 127.0.x.y port 9, as one line of JSON."""
    entries = {f"gpu-{i:05d}": {"ansible_host": f"127.0.{i >> 8 & 255}.{i & 255}", "ansible_port": 9}
               for i in range(hosts)}
    path.write_text(json.dumps({"all": {"hosts": entries}}, separators=(",", ":")) + "\n")


def audit(inv: Path, memory: int, work: Path, *limit: str) -> dict[str, float | int]:
    """`fleetctl audit` of INV (LIMIT: -l HOST) in a fresh process under MEMORY bytes of address space."""
    home = Path(tempfile.mkdtemp(dir=work))
    env = dict(os.environ, FLEETCTL_HOME=str(home), FLEETCTL_CONFIG=os.devnull)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "audit", "-i", str(inv), *limit, "--format",
                             "json", "-o", str(home / "report.json")], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (memory, memory)))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    err = proc.stderr.read().strip().splitlines()
    return {"wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mib": usage.ru_maxrss // 1024, "exit": os.waitstatus_to_exitcode(status),
            "stderr": err[-1][:160] if err else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imex", default="1000,10000,95000")
    parser.add_argument("--hosts", type=int, default=60_000)
    parser.add_argument("--memory-gib", type=float, default=4)
    parser.add_argument("--skip", choices=("imex", "inventory"))
    args = parser.parse_args()
    if args.skip != "imex":
        for n in (int(x) for x in args.imex.split(",")):
            imex(n)
    if args.skip != "inventory":
        with tempfile.TemporaryDirectory(prefix="fleetctl-bench-") as work:
            inv = Path(work) / "fleet.yml"
            inventory(args.hosts, inv)
            print(f"inventory of {args.hosts} hosts: one line of {inv.stat().st_size / 2**20:.1f} MiB", flush=True)
            memory = int(args.memory_gib * 2**30)
            for label, limit in (("whole fleet", ()), ("-l gpu-00001", ("-l", "gpu-00001"))):
                print(f"fleetctl audit, {label}: {json.dumps(audit(inv, memory, Path(work), *limit))}", flush=True)


if __name__ == "__main__":
    main()
