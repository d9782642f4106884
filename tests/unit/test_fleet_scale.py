"""A fleet of 60,000 hosts (issue 42): what fleetctl does per host after the inventory is read stays linear, in
memory and time. Before, every host's group peers were a tuple of its whole group (60,000 x 60,000 names: the audit
of a 60,000-host inventory ended in MemoryError, exit 70, at 3.5 GB), and `Fleet.only`, `Fleet.host` and the audit's
summary scanned the fleet once per host.

Run in a subprocess under an address-space limit, with a timeout that only stops a hang (no speed is asserted:
bench/input_scale.py measures it)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from tests.helpers.cli import REPO

MEMORY_LIMIT = 1024 ** 3
HOSTS = 60_000

SCRIPT = f"""
import json
from orchestrator import audit
from orchestrator.fleet.inventory import Fleet, Host

hosts = tuple(Host(f"gpu-{{i:05d}}", ("all", "gpu", "rack-a" if i % 2 else "rack-b"), {{"ansible_host": "10.0.0.1"}})
              for i in range({HOSTS}))
fleet = Fleet("big.yml", hosts, frozenset({{"all", "gpu", "rack-a", "rack-b"}}), "big.yml")
views = audit.peers(fleet, {{}})
names = [h.name for h in hosts]
entries = [audit.host_entry(h, None, [dict(status="fail", severity="high")], True, None) for h in hosts]
print(json.dumps({{
    "views": len(views),
    "peers": {{c: label for c, (label, answer) in views["gpu-00001"].items()}},
    "group": [len(members) for label, members in audit.peer_sets(fleet, {{}}, "group").values()][:2],
    "only": len(fleet.only(names[::2]).hosts),
    "found": sum(fleet.host(n).name == n for n in names),
    "summary": audit.summarize(entries, "high"),
}}))
"""


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def test_a_60000_host_fleet_is_judged_in_memory_linear_in_its_size():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO, timeout=120,
                          preexec_fn=limit_memory)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got["views"] == HOSTS and got["only"] == HOSTS // 2 and got["found"] == HOSTS
    # gpu-00001's group-comparing controls see its rack (30,000 hosts); its NVLink domain is itself
    assert set(got["peers"].values()) == {"rack-a", "gpu-00001"} and got["group"] == [HOSTS // 2] * 2
    assert got["summary"]["noncompliant"] == HOSTS and got["summary"]["compliant"] == 0
