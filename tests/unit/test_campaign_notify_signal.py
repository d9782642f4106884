"""A signal while a campaign that has stopped waits for its last notifications (issue 36): the campaign keeps its
outcome and its run is closed with it; only the notification is recorded as interrupted. The real engine with
scripted steps (tests/helpers/campaign.py) and a real loopback webhook that holds the last event open."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from orchestrator import interrupts, runs, upgrade
from orchestrator.notify import send as notify
from tests.helpers.campaign import Script, start


@pytest.fixture
def store(quick_webhooks, store):
    """The store, its notifications quick (conftest.py's quick_webhooks)."""
    return store


def test_sigterm_during_a_finished_campaigns_last_notification_keeps_its_outcome(store, receivers, monkeypatch):
    hook = receivers(200, 200, "hang")  # started, wave_passed; `done` held open
    notifier = notify.build([], [hook.url()], "json", None, None, 30)
    journal, cid, engine = start(store, Script(), ["a"], ["b"])
    real_drive = upgrade.drive  # the scripted steps instead of ansible's, all else as `fleetctl upgrade` drives it
    monkeypatch.setattr(upgrade, "drive", lambda *args: real_drive(*args[:6], engine.parts))
    run_ = runs.Run(journal.campaign(cid)["run_id"], "", "campaign", engine.ctx.fleet, engine.ctx.base, None)

    def terminate_once_done_is_sent():
        deadline = time.monotonic() + 30
        while len(hook.requests) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    interrupts.install()
    try:
        threading.Thread(target=terminate_once_done_is_sent, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(interrupts.Interrupted) as stopped:
            upgrade.driven(store, journal, run_, cid, engine.ctx.fleet, engine.ctx.base, None, notifier, {},
                           playbooks=engine.parts.playbooks)
        took = time.monotonic() - started
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert stopped.value.exit_code == 143 and took < 10, took
    assert [b["event"] for b in hook.bodies()] == ["started", "wave_passed", "done"]
    assert journal.campaign(cid)["state"] == "done"
    events = journal.events(cid)
    assert "interrupted" not in [e["event"] for e in events]  # nothing to resume: `campaign show` says done
    assert [(e["notification"], e["reason"]) for e in events if e["event"] == "notification_failed"] == [
        ("done", "interrupted by SIGTERM")]
    run = store.run(run_.id)
    assert (run["status"], run["exit_code"]) == ("done", 143)  # the code fleetctl exits with
    summary = json.loads(run["summary"])
    assert (summary["campaign"], summary["state"], summary["exit_code"]) == (cid, "done", 0)
