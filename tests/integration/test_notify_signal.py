"""A signal while a finished run's notification is delivered (issue 36): the results already made are kept, the run
recorded interrupted as the command ended (issue 42), and the notification as interrupted too. A real audit of this machine (ansible_connection=local: findings, no lab)
notifies a loopback webhook that holds the request open; SIGTERM then."""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import time

from tests.helpers.cli import interrupt, start
from tests.helpers.webhooks import Receiver


def test_sigterm_during_the_notification_keeps_the_findings(tmp_path):
    hook = Receiver(fallback="hang")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"here ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    proc = start(tmp_path, "audit", "-i", str(inventory), "--no-preflight", "--webhook", hook.url(),
                 "--notify-timeout", "30", "--format", "json")
    try:
        deadline = time.monotonic() + 90
        while not hook.requests:  # the audit is over, its `findings` event on its way
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        out, err, took = interrupt(proc, signal.SIGTERM, timeout=30)
    finally:
        hook.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and took < 5, (err, took)
    assert err.splitlines()[-1] == "fleetctl: interrupted (SIGTERM)"
    assert "notification failed: webhook http://127.0.0.1:" in err and "interrupted by SIGTERM" in err
    with sqlite3.connect(tmp_path / "home" / "history.sqlite3") as db:
        db.row_factory = sqlite3.Row
        (run,) = db.execute("SELECT * FROM runs").fetchall()
        findings = db.execute("SELECT COUNT(*) FROM findings").fetchone()[0]
    summary = json.loads(run["summary"])
    event = hook.requests[0].json()
    assert (run["kind"], run["status"], run["exit_code"]) == ("audit", "interrupted", 143)  # as the command ended
    assert findings == sum(summary["findings"].values()) > 0 and summary["exit_code"] == 1  # the audit's own verdict
    assert event["run"]["id"] == run["id"] and event["event"] == "findings"
    assert summary["notifications"] == {"event": "findings", "targets": 1, "failed": [
        {"target": f"webhook http://127.0.0.1:{hook.port}/…", "notification": "findings",
         "reason": "interrupted by SIGTERM"}]}
