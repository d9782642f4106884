#!/usr/bin/env python3
"""Wall time and CPU of `fleetctl audit` on localhost (the embedded default), over N runs.

Usage: .venv/bin/python bench/audit_localhost.py [N]
Prints median/min/max wall seconds, CPU seconds of the whole process tree (fleetctl, ansible-playbook and, on
localhost, the module itself), and the module's own collection time as the host reported it.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    walls, cpus, collects = [], [], []
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, FLEETCTL_HOME=home)
        for _ in range(n):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "audit", "--format", "json"],
                                  capture_output=True, text=True, env=env)
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
            report = json.loads(proc.stdout)
            collects.append(report["hosts"][0]["facts"]["collect_seconds"])
    print(f"fleetctl audit, localhost, {n} runs (exit {proc.returncode})")
    for name, xs in (("wall s", walls), ("cpu s (process tree)", cpus), ("module collect s", collects)):
        print(f"  {name:22s} median {statistics.median(xs):6.3f}  min {min(xs):6.3f}  max {max(xs):6.3f}")


if __name__ == "__main__":
    main()
