"""`report verify` beside 20 processes recording audits at once (issue 36): it reads the chain and the runs as of
one moment, so a run sealed while it reads is never taken for one missing from the chain. Never a false "broken"."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

import orchestrator
from orchestrator.cli.report import report_verify
from orchestrator.history.store import Store

WRITERS, AUDITS = 20, 5  # processes, and the audits each records
DEADLINE_S = 60
# One writer: AUDITS audits of 8 hosts, 27 findings each, recorded through the Store calls `fleetctl audit` makes.
WRITER = """
import sys
from pathlib import Path
from orchestrator.history.store import Store
findings = [{"control": f"control.{i}", "severity": "high", "status": "pass" if i % 5 else "fail", "message": "m",
             "evidence": {"value": i}, "remediation": None} for i in range(27)]
hosts = [{"name": f"gpu-{h}", "groups": ["h100"], "reachable": True, "facts": {"driver": {"module_version": "1"}},
          "findings": findings} for h in range(8)]
with Store(Path(sys.argv[1])) as store:
    for _ in range(int(sys.argv[2])):
        run_id, _ = store.begin_run("audit", ["fleetctl", "audit"], "test", None, None)
        store.finish_run(run_id, 1, {"hosts": len(hosts)}, hosts)
"""


def test_verify_beside_20_writers_is_never_falsely_broken(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETCTL_HOME", str(tmp_path))
    history = tmp_path / "history.sqlite3"
    Store(history).close()
    code = Path(orchestrator.__file__).parents[1]  # the writers record with the fleetctl under test
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(history), str(AUDITS)], cwd=code,
                                stderr=subprocess.PIPE, text=True) for _ in range(WRITERS)]
    verdicts, deadline = [], time.monotonic() + DEADLINE_S
    try:
        while any(w.poll() is None for w in writers) and time.monotonic() < deadline:
            result = CliRunner().invoke(report_verify, [])  # the command itself, without a process's start-up
            verdicts.append((result.exit_code, result.output.strip()))
    finally:
        for w in writers:
            w.kill()
    errors = [w.communicate()[1] for w in writers]
    assert all(w.returncode == 0 for w in writers), errors
    assert len(verdicts) >= 10, f"only {len(verdicts)} verifies ran beside the writers"
    assert [v for v in verdicts if v[0] != 0] == []
    final = CliRunner().invoke(report_verify, [])
    assert final.exit_code == 0 and f"intact: {WRITERS * AUDITS} records" in final.output, final.output
