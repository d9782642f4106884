#!/usr/bin/env python3
"""How long sealing and verifying the history's hash chain take as the history grows.

    python bench/chain_verify.py [AUDITS] [HOSTS]

Writes AUDITS audit runs of HOSTS hosts (27 findings each, like a real audit) into a fresh history in a temporary
directory, through the same Store calls fleetctl uses, then times `chain.verify` over it. Prints the figures."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.history import chain  # noqa: E402
from orchestrator.history.store import Store  # noqa: E402


def main() -> None:
    audits = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    hosts = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    findings = [{"control": f"control.{i}", "severity": "high", "status": "pass" if i % 5 else "fail",
                 "message": "x" * 60, "evidence": {"value": i, "expected": [1, 2, 3]}, "remediation": None}
                for i in range(27)]
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "history.sqlite3") as store:
        started = time.perf_counter()
        for _ in range(audits):
            run_id, _ = store.begin_run("audit", [], "bench", None, None)
            store.finish_run(run_id, 0, {"hosts": hosts}, [
                {"name": f"gpu-{h:04d}", "groups": ["h100"], "reachable": True, "error": None,
                 "facts": {"driver": {"module_version": "570.86.15"}}, "findings": findings} for h in range(hosts)])
        write_s = time.perf_counter() - started
        size = (Path(tmp) / "history.sqlite3").stat().st_size
        started = time.perf_counter()
        verdict = chain.verify(store.db)
        verify_s = time.perf_counter() - started
    rows = audits * hosts * 27
    print(f"{audits} audits x {hosts} hosts ({rows} findings, {verdict.records} chain records, "
          f"{size / 2**20:.1f} MiB): write+seal {write_s:.2f}s ({1000 * write_s / audits:.1f} ms per audit), "
          f"verify {verify_s:.2f}s ({1e6 * verify_s / rows:.1f} us per finding), intact={verdict.ok}")


if __name__ == "__main__":
    main()
