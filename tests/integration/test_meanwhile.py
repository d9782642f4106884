"""Runner.meanwhile: work a campaign would otherwise do between two playbooks (scipy's import) is done while the next
playbook runs, after ansible-runner's fork, once. A real ansible-playbook on this machine (ansible_connection=local),
whose host waits until the work has run: had the work waited for the playbook's end, the host would have waited its
minute and the test failed on the time."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

from orchestrator.fleet import inventory, runner


def fleet(tmp_path: Path) -> inventory.Fleet:
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\ni=0\nwhile [ ! -e "{tmp_path}/release" ] && [ $i -lt 600 ]; do sleep 0.1; '
                      f'i=$((i+1)); done\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    path = tmp_path / "hosts.ini"
    path.write_text(f"gpu-a ansible_connection=local ansible_python_interpreter={python}\n")
    return inventory.load(str(path))


def test_work_runs_once_while_the_playbook_runs(tmp_path):
    seen: list[list[str]] = []

    def work() -> None:
        seen.append([" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)])
        (tmp_path / "release").touch()

    def broken() -> None:
        raise ImportError("no scipy here")

    playbooks = runner.Runner()
    playbooks.meanwhile(broken)
    playbooks.meanwhile(work)
    started = time.monotonic()
    outcomes = playbooks.run_playbook("audit.yml", fleet(tmp_path), ["gpu-a"])
    assert time.monotonic() - started < 50, "the host waited for the work: it did not run during the playbook"
    assert len(seen) == 1 and any("ansible-playbook" in c for c in seen[0]), seen
    assert outcomes["gpu-a"].status == "ok" and outcomes["gpu-a"].results, outcomes["gpu-a"]

    playbooks.run_playbook("audit.yml", fleet(tmp_path), ["gpu-a"])
    assert len(seen) == 1  # once
