"""Notifications (issue 15): commands and webhooks against REAL local HTTP and HTTPS servers, and campaigns driven
by the real engine with scripted steps (tests/helpers/campaign.py) that notify: the payloads are
schema-valid, Slack and Teams bodies have their shape, retries back off, a hanging server times out, TLS is
verified, and a failing notification changes nothing in a campaign but is recorded."""

from __future__ import annotations

import base64
import json
import os
import shlex
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.notify import send as notify, events as notify_events, webhook as webhook_mod
from orchestrator import redact, schemas
from orchestrator.campaign import readmodel
from orchestrator.campaign import engine as engine_mod, progress
from orchestrator.errors import InputError
from orchestrator.history.store import Store
from tests.helpers.campaign import Clocked, Script, start, states
from tests.helpers.cli import REPO
from tests.helpers.notify import drive, valid
from tests.helpers.webhooks import Proxy, closed_port, private_ca, recorded, recorder, self_signed

TOKEN = "Bearer s3cr3t-t0ken-value"


@pytest.fixture
def store(quick_webhooks, store):
    """The store, its notifications quick (conftest.py's quick_webhooks)."""
    return store


def event_names(journal, cid) -> list[tuple]:
    """The campaign's history without the notification records: what the engine did."""
    return [(e["event"], e["host"], e.get("step"), e.get("outcome"), e.get("state"))
            for e in journal.events(cid) if e["event"] != "notification_failed"]


# ---- campaigns -------------------------------------------------------------------------------------------

CAMPAIGNS = {  # name: (script outcomes, waves, fail_at, expected state, expected notifications)
    "passes": ({}, (["a"], ["b", "c"]), None, "done", ["started", "wave_passed", "done"]),
    "rolls_back": ({("b", "verify"): "fail"}, (["a"], ["b"]), [1, 1], "rolled_back",
                   ["started", "wave_passed", "host_failed", "wave_failed", "rolled_back"]),
    "halts": ({("a", "probe_after"): "inconclusive", ("a", "probe_again"): "inconclusive"}, (["a"], ["b"]), None,
              "halted", ["started", "halted"]),
}


@pytest.mark.parametrize("name", CAMPAIGNS)
def test_a_campaign_notifies_a_webhook_and_a_command_with_schema_valid_events(store, monkeypatch, tmp_path,
                                                                             receivers, name):
    outcomes, waves, fail_at, final, expected = CAMPAIGNS[name]
    hook = receivers()
    script, out = recorder(tmp_path / "cmd")
    notifier = notify.build([f"{shlex.quote(sys.executable)} {script} {out} {{event}} {{campaign}} {{host}} "
                             f"{{severity}}"], [hook.url()], "json", None, None, 5)
    journal, cid, engine = start(store, Script(outcomes), *waves, fail_at=fail_at)
    assert drive(journal, cid, engine, notifier) == final
    received = [valid(b) for b in hook.bodies()]
    assert [b["event"] for b in received] == expected
    commands = recorded(out)
    assert [c["stdin"] for c in commands] == received  # the same JSON on stdin, in the same order
    for c in commands:  # placeholders filled per word
        p = c["stdin"]
        assert c["argv"] == [p["event"], str(cid), p["host"] or "", p["severity"]]
    for b in received:
        assert b["source"] == "campaign" and b["campaign"]["id"] == cid and b["campaign"]["target"] == "570.86.15"
        assert b["tool"]["name"] == "fleetctl" and b["control_node"]
    by_event = {b["event"]: b for b in received}
    assert by_event["started"]["severity"] == "info" and by_event["started"]["campaign"]["wave"] == 1
    if name == "passes":
        assert by_event["wave_passed"]["campaign"]["wave"] == 1 and by_event["done"]["counts"] == {"done": 3}
        assert by_event["done"]["severity"] == "info"
    if name == "rolls_back":
        failed = by_event["host_failed"]
        assert (failed["host"], failed["reason"], failed["severity"]) == ("b", "verify fail", "warning")
        assert failed["campaign"]["wave"] == 2
        assert "rolling back 2 hosts: a, b" in by_event["wave_failed"]["summary"]
        assert by_event["rolled_back"]["campaign"]["state"] == "rolled_back"
        assert f"fleetctl campaign show {cid}" in by_event["rolled_back"]["action"]
    if name == "halts":
        halted = by_event["halted"]
        assert halted["severity"] == "critical" and halted["campaign"]["state"] == "halted"
        assert f"fleetctl campaign resume {cid}" in halted["action"] and f"fleetctl rollback {cid}" in halted["action"]
        assert "a" in halted["action"]
        # resumed (the held host accepted): notifications go on from there, nothing is sent twice
        engine_mod.accept_held(journal, cid)
        assert drive(journal, cid, engine, notifier) == "done"
        assert [b["event"] for b in hook.bodies()] == expected + ["wave_passed", "done"]
    assert not [e for e in journal.events(cid) if e["event"] == "notification_failed"]


def test_window_closed_aborted_and_a_failed_rollback(store, monkeypatch, receivers):
    hook = receivers()
    notifier = notify.build([], [hook.url()], "json", None, None, 5)
    journal, cid, engine = start(store, Script(), ["a"], ["b"], window_end="2000-01-01T00:00:00Z")
    assert drive(journal, cid, engine, notifier) == "halted"
    closed = valid(hook.bodies()[-1])
    assert closed["event"] == "window_closed" and f"fleetctl campaign resume {cid} --window" in closed["action"]
    # a host failing its rollback: critical, once for the host, and the campaign's rolled_back is critical too
    # (hosts c, d: the halted campaign keeps a and b locked)
    script = Script({("c", "verify"): "fail", ("c", "rollback_install"): "fail"})
    journal, cid, engine = start(store, script, ["c"], ["d"])
    assert drive(journal, cid, engine, notifier) == "rolled_back"
    tail = [valid(b) for b in hook.bodies()][-4:]
    assert [(b["event"], b["severity"], b["host"]) for b in tail] == [
        ("host_failed", "warning", "c"), ("wave_failed", "warning", None), ("host_failed", "critical", "c"),
        ("rolled_back", "critical", None)]
    assert "needs a person" in tail[2]["action"] and "FAILED on c" in tail[3]["summary"]
    # abort between waves (requested by another fleetctl): aborted
    journal, cid, engine = start(store, Script(), ["e"], ["f"], soak_s=30)
    monkeypatch.setattr(engine_mod.Engine, "soak", lambda self, c: self.journal.transition(
        self.cid, "abort_requested", reason="aborted by the operator"))
    assert drive(journal, cid, engine, notifier) == "aborted"
    aborted = valid(hook.bodies()[-1])
    assert aborted["event"] == "aborted" and f"fleetctl rollback {cid}" in aborted["action"]


def test_a_campaigns_end_says_what_it_cost_in_capacity(store, receivers, clock):
    """done and rolled_back carry the campaign's node-hours (per wave and in all) and say them in their summary:
    each host drained, its job ending 40 minutes later, installed a minute after that and back 14 minutes later
    (tests/helpers/campaign.py); a host failing its verify is out of service until its rollback."""
    from orchestrator.campaign import capacity
    hook = receivers()
    notifier = notify.build([], [hook.url()], "json", None, None, 5)
    journal, cid, engine = start(store, Clocked(clock), ["a"], ["b"], capacity_budget_node_hours=2)
    assert drive(journal, cid, engine, notifier) == "done"
    done = valid(hook.bodies()[-1])
    assert done["event"] == "done" and done["capacity"] == capacity.summary(capacity.of_campaign(journal, cid))
    assert [done["capacity"][k] for k in ("busy", "idle", "change", "hosts")] == [1.3333, 0.0333, 0.4667, 2]
    assert done["summary"] == (f"campaign {cid} to 570.86.15 done: 2 hosts on the new driver; capacity: busy 1.33, "
                               f"idle 0.03, change 0.47 node-hours (2 hosts); budget 2: 0.50 spent")
    journal, cid, engine = start(store, Clocked(clock, {("d", "verify"): "fail"}), ["c"], ["d"], fail_at=[1, 1])
    assert drive(journal, cid, engine, notifier) == "rolled_back"
    back = valid(hook.bodies()[-1])
    assert back["event"] == "rolled_back" and back["capacity"]["budget"] is None
    assert [(w["wave"], w["busy"], w["idle"], w["change"]) for w in back["capacity"]["waves"]] == [
        (1, 0.6667, 0.0167, 0.2333), (2, 0.6667, 0.0167, 0.2)]  # d: install to its rollback's drain, 12 minutes
    assert back["summary"].endswith("; capacity: busy 1.33, idle 0.03, change 0.43 node-hours (2 hosts)")


def test_failing_notifications_change_nothing_in_a_campaign_and_are_recorded(store, monkeypatch, tmp_path, receivers,
                                                                            capfd):
    """The same three campaigns with notifications that all fail (a command exiting 3, one that hangs, a webhook
    answering 500, one refusing the connection, a TLS one whose certificate is not trusted): the same steps, the
    same states and the same events as without any; every failure one line on stderr and one journal event."""
    monkeypatch.setattr(notify, "TRIES", 2)
    headers = tmp_path / "headers"
    headers.write_text(f"Authorization: {TOKEN}\n")
    headers.chmod(0o600)  # a headers file others can read is refused
    broken = receivers(fallback=500)
    tls = receivers(tls=self_signed(tmp_path / "pki").server_context())
    urls = [broken.url("/services/T0/B0/SECRETPATH"), f"http://127.0.0.1:{closed_port()}/x", tls.url()]
    timings = []
    for name, (outcomes, waves, fail_at, final, expected) in CAMPAIGNS.items():
        runs = {}
        failing = notify.build([f"{sys.executable} -c 'import sys; sys.exit(3)'",
                                f"{sys.executable} -c 'import time; time.sleep(30)'"],
                               urls, "slack", str(headers), None, 0.5)
        for notifier in (None, failing):  # each in a history of its own (a halted campaign keeps its hosts)
            home = tmp_path / f"{name}-{notifier is None}"
            monkeypatch.setenv("FLEETCTL_HOME", str(home))
            script = Script(dict(outcomes))
            journal, cid, engine = start(Store(home / "history.sqlite3"), script, *waves, fail_at=fail_at)
            capfd.readouterr()
            started = time.monotonic()
            assert drive(journal, cid, engine, notifier) == final
            took = time.monotonic() - started
            runs[notifier is None] = (script.calls, states(journal, cid), event_names(journal, cid),
                                      journal.campaign(cid)["reason"], readmodel.exit_code(journal, cid), cid)
            err = capfd.readouterr().err
        # nothing waited for the hanging command (0.5 s per event, one after the other) but the end of the drive,
        # and the campaign's measured span leaves the failures recorded after it out
        span = readmodel.time_split(journal.events(cid))["span_s"]
        assert took >= 0.5 * len(expected) and span < 0.5 * len(expected), (took, span)
        timings.append(f"{name}: drive {took:.2f}s with failing notifications, campaign span {span:.2f}s")
        (calls0, states0, events0, reason0, code0, _), (calls1, states1, events1, reason1, code1, cid) = \
            runs[True], runs[False]
        assert (calls1, states1, reason1, code1) == (calls0, states0, reason0, code0), name
        assert [e[:4] for e in events1] == [e[:4] for e in events0], name
        failures = [e for e in journal.events(cid) if e["event"] == "notification_failed"]
        assert len(failures) == len(expected) * 5, (name, failures)
        assert {f["target"] for f in failures} == {
            f"command {sys.executable}", f"webhook http://127.0.0.1:{broken.port}/…",
            f"webhook http://127.0.0.1:{urls[1].split(':')[2].split('/')[0]}/…",
            f"webhook https://127.0.0.1:{tls.port}/…"}
        reasons = {f["reason"] for f in failures}
        assert {"exited 3", "no exit in 0.5s (killed)", "HTTP 500 Internal Server Error (2 tries)",
                "connection refused (2 tries)"} <= reasons, reasons
        assert any(r.startswith("TLS: certificate not trusted (self") for r in reasons), reasons
        assert [f["notification"] for f in failures[::5]] == expected or \
            sorted(f["notification"] for f in failures) == sorted(expected * 5)
        lines = err.splitlines()
        assert len(lines) == len(failures) and all(line.startswith("fleetctl: warning: notification failed: ")
                                                    for line in lines), err
        assert "Traceback" not in err
        for text in (err, json.dumps(journal.events(cid)), progress.log_path(cid).read_text()):
            assert "s3cr3t" not in text and "SECRETPATH" not in text
        # the JSONL log holds every event of the history, in order, the notification failures included
        log = [json.loads(line)["seq"] for line in progress.log_path(cid).read_text().splitlines()]
        assert log == [e["seq"] for e in journal.events(cid)]
    # per campaign: 2 tries for its first notification, then one each while the target keeps failing
    assert len(broken.requests) == sum(len(c[4]) + 1 for c in CAMPAIGNS.values())
    assert broken.requests[0].headers["Authorization"] == TOKEN
    with capfd.disabled():
        print("\n" + "\n".join(timings))
    for history in tmp_path.glob("*/history.sqlite3"):
        assert b"s3cr3t" not in history.read_bytes() and b"SECRETPATH" not in history.read_bytes()


def test_a_bug_while_building_an_event_never_stops_the_campaign(store, monkeypatch, receivers, capfd):
    hook = receivers()
    notifier = notify.build([], [hook.url()], "json", None, None, 5)
    journal, cid, engine = start(store, Script(), ["a"], ["b"])
    monkeypatch.setattr(notify_events.CampaignNotes, "wave_passed", lambda self, r: 1 / 0)
    assert drive(journal, cid, engine, notifier) == "done"
    assert [b["event"] for b in hook.bodies()] == ["started", "done"]
    (failed,) = [e for e in journal.events(cid) if e["event"] == "notification_failed"]
    assert failed["reason"] == "internal error building the event: ZeroDivisionError"
    assert "Traceback" not in capfd.readouterr().err


# ---- webhooks --------------------------------------------------------------------------------------------

def payload(**over) -> dict:
    base = notify_events.envelope("halted", "critical", "campaign", "campaign 7 to 570.86.15 halted for a person: "
                                  "inconclusive gate <!channel> & co", "fleetctl campaign resume 7",
                                  campaign={"id": 7, "target": "570.86.15", "state": "halted", "wave": 2, "waves": 3,
                                            "event_seq": 40}, host=None, reason="inconclusive gate",
                                  counts={"held": 1, "done": 2})
    return valid({**base, **over})


def webhook(url, fmt="json", headers=None, ca=None, timeout=5.0) -> notify.Notifier:
    return notify.build([], [url], fmt, headers, ca, timeout)


def test_slack_and_teams_bodies(receivers):
    hook = receivers()
    for fmt in ("slack", "teams", "json"):
        assert webhook(hook.url(), fmt).send_now(payload()) == []
    slack, teams, plain = hook.bodies()
    assert plain == payload() | {"at": plain["at"]}
    assert slack["text"].startswith("fleetctl campaign 7 to 570.86.15: halted: ")
    assert [b["type"] for b in slack["blocks"]] == ["header", "section", "section", "section", "context"]
    header, summary, fields, action, context = slack["blocks"]
    assert header["text"]["type"] == "plain_text" and len(header["text"]["text"]) <= 150
    assert summary["text"]["type"] == "mrkdwn" and "&lt;!channel&gt; &amp; co" in summary["text"]["text"]
    assert "<!channel>" not in json.dumps(slack["blocks"])  # escaped: no @channel ping from an event's text
    assert len(fields["fields"]) <= 10 and {"type": "mrkdwn", "text": "*Campaign*\n7"} in fields["fields"]
    assert action["text"]["text"] == "*What to do:* fleetctl campaign resume 7"
    assert context["elements"][0]["type"] == "mrkdwn"
    assert teams["type"] == "message" and len(teams["attachments"]) == 1
    attachment = teams["attachments"][0]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert (card["type"], card["version"], card["$schema"]) == ("AdaptiveCard", "1.4",
                                                                "http://adaptivecards.io/schemas/adaptive-card.json")
    assert [b["type"] for b in card["body"]] == ["TextBlock", "TextBlock", "FactSet", "TextBlock"]
    assert card["body"][0]["color"] == "Attention" and card["body"][3]["text"].endswith("campaign resume 7")
    assert {"title": "Wave", "value": "2 of 3"} in card["body"][2]["facts"]
    assert {r.headers["Content-Type"] for r in hook.requests} == {"application/json; charset=utf-8"}


def test_retries_back_off_on_500_then_succeed(receivers, monkeypatch):
    monkeypatch.setattr(webhook_mod, "BACKOFF_S", 0.2)
    monkeypatch.setattr(webhook_mod, "MAX_RETRY_AFTER_S", 1)
    hook = receivers(500, 503, 200)
    started = time.monotonic()
    assert webhook(hook.url()).send_now(payload()) == []
    took = time.monotonic() - started
    assert len(hook.requests) == 3
    gaps = [b.at - a.at for a, b in zip(hook.requests, hook.requests[1:])]
    assert gaps[0] < 0.2 and 0.4 <= gaps[1] < 0.4 + 0.5, gaps  # at once, then 2 x 0.2 s (urllib3's backoff)
    print(f"\nretries: gaps {gaps[0]:.3f}s {gaps[1]:.3f}s, delivered after {took:.3f}s")
    # the server's Retry-After is waited for, an hour no longer than MAX_RETRY_AFTER_S, a malformed one not at all
    for retry_after, wait in (("1", (1, 1.5)), ("3600", (1, 1.5)), ("soon", (0, 0.2))):
        hook = receivers((429, {"Retry-After": retry_after}), 200)
        assert webhook(hook.url()).send_now(payload()) == []
        gap = hook.requests[1].at - hook.requests[0].at
        assert wait[0] <= gap < wait[1], (retry_after, gap)
    # a 4xx is not retried; a redirect is not followed (it would carry the headers elsewhere)
    for status, reason in ((404, "HTTP 404 Not Found"), (302, "HTTP 302 Found: redirects are not followed")):
        hook = receivers(fallback=status)
        (failure,) = webhook(hook.url()).send_now(payload())
        assert failure.reason == reason and len(hook.requests) == 1 and hook.requests[0].path == "/hook"


def test_a_hanging_server_times_out_and_a_dead_target_then_gets_one_try(receivers, monkeypatch):
    monkeypatch.setattr(webhook_mod, "BACKOFF_S", 0.05)
    hook = receivers(fallback="hang")
    target = webhook(hook.url(), timeout=0.5)
    d = target.dispatch()
    started = time.monotonic()
    d.submit(payload())
    d.submit(payload(event="window_closed", severity="warning"))
    d.close(wait=True)
    took = time.monotonic() - started
    first, second = d.take_failures()
    assert first.reason == "no answer in 0.5s (3 tries)" and second.reason == "no answer in 0.5s"
    assert len(hook.requests) == 4 and 2.0 <= took < 4.0, took  # 3 x 0.5 + 0.05 + 0.1, then 1 x 0.5
    print(f"\nhanging server: 2 events failed in {took:.2f}s (3 tries, then 1)")


@pytest.mark.parametrize("answer, reason", [("stall", "no answer in 0.5s (3 tries)"),
                                            ("cut", "the answer was cut short (3 tries)")])
def test_an_answer_that_stalls_or_is_cut_mid_body_is_retried_then_one_line(receivers, monkeypatch, capfd, answer,
                                                                          reason):
    monkeypatch.setattr(webhook_mod, "BACKOFF_S", 0.05)
    hook = receivers(fallback=answer)
    started = time.monotonic()
    (failure,) = webhook(hook.url(), timeout=0.5).send_now(payload())
    took = time.monotonic() - started
    assert failure.reason == reason and len(hook.requests) == 3
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "Exception in thread" not in err, err
    assert took < 2.5, took  # each try ends at its read timeout (0.5 s), not at the watchdog's 1 s


def test_webhooks_go_through_the_environments_proxy_unless_no_proxy_lists_the_host(receivers, tmp_path, monkeypatch):
    monkeypatch.setattr(webhook_mod, "BACKOFF_S", 0.05)
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    proxy = Proxy()
    try:
        pki = private_ca(tmp_path / "ca")
        plain, tls = receivers(), receivers(tls=pki.server_context())
        monkeypatch.setenv("http_proxy", proxy.url)
        monkeypatch.setenv("https_proxy", proxy.url.replace("http://", "http://fleet:pa%3Ass@"))
        assert webhook(plain.url()).send_now(payload()) == []  # sent on by the proxy
        assert webhook(tls.url(), ca=str(pki.ca)).send_now(payload()) == []  # through its tunnel, TLS to the target
        (failure,) = webhook(tls.url()).send_now(payload())  # the target's certificate is verified, as without one
        assert failure.reason.startswith("TLS: certificate not trusted (")
        tunnel = f"CONNECT 127.0.0.1:{tls.port}"
        assert [line.rsplit(" ", 1)[0] for line in proxy.lines] == [f"POST {plain.url()}", tunnel, tunnel]
        assert proxy.auth == [None] + 2 * ["Basic " + base64.b64encode(b"fleet:pa:ss").decode()]
        assert (len(plain.requests), len(tls.requests)) == (1, 1)
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{closed_port()}")
        (failure,) = webhook(plain.url()).send_now(payload())
        assert failure.reason == "proxy: connection refused (3 tries)"
        monkeypatch.setenv("no_proxy", "example.com,127.0.0.1")
        assert webhook(plain.url()).send_now(payload()) == []
        assert webhook(tls.url(), ca=str(pki.ca)).send_now(payload()) == []
        assert len(proxy.lines) == 3 and (len(plain.requests), len(tls.requests)) == (2, 2)  # straight to them
    finally:
        proxy.close()


def test_tls_is_verified_and_a_private_ca_can_be_trusted(receivers, tmp_path):
    for pki in (self_signed(tmp_path / "self"), private_ca(tmp_path / "ca")):
        hook = receivers(tls=pki.server_context())
        (failure,) = webhook(hook.url()).send_now(payload())
        assert failure.reason.startswith("TLS: certificate not trusted (") and "(3 tries)" not in failure.reason
        assert hook.requests == []  # nothing was sent to a server it could not verify
        assert webhook(hook.url(), ca=str(pki.ca)).send_now(payload()) == []
        assert [b["event"] for b in hook.bodies()] == ["halted"]


def test_a_tls_handshake_cut_short_is_tried_again(monkeypatch):
    monkeypatch.setattr(webhook_mod, "BACKOFF_S", 0.05)
    hellos = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        def serve():  # reads the client's hello, then closes the connection: a server restarting, a balancer
            while len(hellos) < 3:
                conn, _ = server.accept()
                with conn:
                    hellos.append(conn.recv(1 << 16))

        threading.Thread(target=serve, daemon=True).start()
        (failure,) = webhook(f"https://127.0.0.1:{server.getsockname()[1]}/hook").send_now(payload())
    assert failure.reason == "TLS: the server closed the connection (3 tries)"
    assert len(hellos) == 3 and all(h.startswith(b"\x16\x03") for h in hellos)  # TLS handshake records


def test_headers_arrive_and_are_never_shown(receivers, tmp_path, monkeypatch, capfd):
    headers = tmp_path / "headers"
    headers.write_text(f"# tokens\nAuthorization: {TOKEN}\nX-Team: gpu\n\n")
    headers.chmod(0o600)
    monkeypatch.setenv(notify.HEADERS_ENV, "X-Team: infra\nX-Extra: e1")
    hook = receivers(500, fallback=401)
    failures = webhook(hook.url("/services/SECRETPATH"), headers=str(headers)).send_now(payload())
    got = hook.requests[0].headers
    assert (got["Authorization"], got["X-Team"], got["X-Extra"]) == (TOKEN, "infra", "e1")  # the environment wins
    assert got["User-Agent"].startswith("fleetctl/")
    assert [f.reason for f in failures] == ["HTTP 401 Unauthorized (2 tries)"]
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "s3cr3t" not in err and "SECRETPATH" not in err and "e1" not in err


def test_a_notify_command_gets_the_json_on_stdin_and_is_killed_on_timeout(tmp_path):
    script, out = recorder(tmp_path)
    assert notify.build([f"{sys.executable} {script} {out} --event={{event}} {{kind}} x{{campaign}}x"], [], "json",
                        None, None, 5).send_now(payload()) == []
    (got,) = recorded(out)
    assert got["stdin"] == payload() | {"at": got["stdin"]["at"]}
    assert got["argv"] == ["--event=halted", "campaign", "x7x"]
    pidfile = tmp_path / "pid"
    slow = notify.build([f"/bin/sh -c 'sleep 30 & echo $! > {pidfile}; wait'"], [], "json", None, None, 0.5)
    started = time.monotonic()
    (failure,) = slow.send_now(payload())
    assert failure.reason == "no exit in 0.5s (killed)" and time.monotonic() - started < 3
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{pidfile.read_text().strip()}") or \
        open(f"/proc/{pidfile.read_text().strip()}/stat").read().split()[2] == "Z"  # its child went with it
    missing = notify.build(["/nonexistent/notifier"], [], "json", None, None, 1).send_now(payload())
    assert [f.reason for f in missing] == ["cannot run it: No such file or directory"]


@pytest.mark.parametrize("commands, webhooks, headers, expected", [
    (["page {nobody}"], [], None, "unknown placeholder 'nobody'"),
    (["page 'unclosed"], [], None, "No closing quotation"),
    ([], ["ftp://example.com/x"], None, "--webhook ftp://example.com/…: not an http:// or https:// URL"),
    ([], ["https://user:pw@example.com/x"], None, "credentials in the URL"),
    ([], ["http://10.1.2.3/hook"], "Authorization: Bearer x", "plain http would send the webhook headers"),
    ([], ["https://example.com/x"], "Authorization Bearer s3cr3t", "line 1: not a 'Name: value' header"),
    ([], ["https://example.com/x"], "Content-Type: text/plain", "header Content-Type is fleetctl's to set"),
])
def test_bad_notification_settings_are_input_errors(tmp_path, commands, webhooks, headers, expected):
    path = None
    if headers:
        path = tmp_path / "h"
        path.write_text(headers + "\n")
        path.chmod(0o600)
    with pytest.raises(InputError, match=None) as e:
        notify.build(commands, webhooks, "json", str(path) if path else None, None, 5)
    assert expected in str(e.value) and "s3cr3t" not in str(e.value)


def test_history_keeps_no_notify_arguments_nor_webhook_paths():
    argv = ["upgrade", "--notify", "pager --token abc", "--webhook", "https://hooks.slack.com/services/T/B/XYZ",
            "--webhook=https://h.example:8443/x?k=1", "--notify=notify-send", "--yes"]
    assert redact.argv(argv) == ["upgrade", "--notify", "pager [arguments not recorded]", "--webhook",
                                        "https://hooks.slack.com/…", "--webhook=https://h.example:8443/…",
                                        "--notify=notify-send", "--yes"]


# ---- audit and probe through the command line -----------------------------------------------------------

def run_cli(*args, home, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO,
                          env={**os.environ, "FLEETCTL_HOME": str(home), "FLEETCTL_CONFIG": os.devnull, **(env or {})})


def test_audit_findings_notify_and_a_failure_is_in_the_runs_summary_not_its_exit_code(tmp_path, receivers):
    """localhost has no NVIDIA driver: the audit exits 1 with findings, with or without notifications."""
    home = tmp_path / "home"
    script, out = recorder(tmp_path / "cmd")
    headers = tmp_path / "headers"
    headers.write_text(f"Authorization: {TOKEN}\n")
    headers.chmod(0o600)
    good, bad = receivers(), receivers(fallback=500)
    report = tmp_path / "audit.json"
    proc = run_cli("audit", "--format", "json", "-o", str(report),
                   "--notify", f"{sys.executable} {script} {out} {{run}}", "--notify", "false",
                   "--webhook", good.url("/services/SECRETPATH"), "--webhook", bad.url(),
                   "--webhook-format", "teams", "--webhook-headers", str(headers), "--notify-timeout", "2", home=home)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("fleetctl: warning: notification failed: ") for line in lines)
    assert "command false (audit run 1 findings): exited 1" in lines[0] + lines[1]
    assert f"webhook http://127.0.0.1:{bad.port}/… (audit run 1 findings): HTTP 500 Internal Server Error (3 tries)" \
        in lines[0] + lines[1]
    doc = json.loads(report.read_text())
    assert schemas.first_error("audit-report", doc) is None
    sent = doc["summary"]["notifications"]
    assert sent["targets"] == 4 and sorted(f["target"] for f in sent["failed"]) == [
        "command false", f"webhook http://127.0.0.1:{bad.port}/…"]
    (event,) = [valid(c["stdin"]) for c in recorded(out)]
    assert event["event"] == "findings" and event["severity"] == "critical" and event["run"]["kind"] == "audit"
    assert event["hosts"][0]["name"] == "localhost"
    assert "driver.installed critical fail" in event["hosts"][0]["problems"][0]
    assert event["counts"] == {"hosts": 1, "reachable": 1, "unreachable": 0, "compliant": 0, "noncompliant": 1}
    card = good.requests[0].json()["attachments"][0]["content"]
    assert card["type"] == "AdaptiveCard" and good.requests[0].headers["Authorization"] == TOKEN
    with sqlite3.connect(home / "history.sqlite3") as c:
        summary, argv = c.execute("SELECT summary, argv FROM runs").fetchone()
    assert json.loads(summary)["notifications"] == sent  # recorded with the run
    assert "SECRETPATH" not in argv and "[arguments not recorded]" in argv
    assert b"s3cr3t" not in (home / "history.sqlite3").read_bytes() and "s3cr3t" not in proc.stderr
    # compliant (--fail-on never): nothing to notify
    quiet = run_cli("audit", "--fail-on", "never", "--format", "json", "--notify", "false", home=home)
    assert quiet.returncode == 0 and quiet.stderr == "" and "notifications" not in json.loads(quiet.stdout)["summary"]


def test_probe_findings_notify(tmp_path, receivers):
    home = tmp_path / "home"
    hook = receivers()
    proc = run_cli("probe", "--format", "json", "--webhook", hook.url(), home=home)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["notifications"] == {"event": "findings", "targets": 1, "failed": []}
    (event,) = [valid(b) for b in hook.bodies()]
    assert (event["source"], event["run"]["kind"], event["counts"]["unhealthy"]) == ("probe", "probe", 1)
    assert event["hosts"][0]["name"] == "localhost" and event["hosts"][0]["problems"][0].startswith(("fail", "error"))


@pytest.mark.parametrize("command, args, expected", [
    (["audit"], ["--notify", "x {bogus}"], "unknown placeholder 'bogus'"),
    (["probe"], ["--webhook", "ftp://x/y"], "not an http:// or https:// URL"),
    (["upgrade", "--to", "570.86.15", "--yes"], ["--webhook", "https://x/y", "--webhook-ca", "/nonexistent/ca.pem"],
     "cannot read the webhook CA"),
    (["campaign", "resume", "1"], ["--webhook", "https://x/y", "--webhook-ca", "README.md"],
     "not a PEM CA certificate"),
    (["rollback", "1"], ["--webhook", "https://x/y", "--webhook-format", "xml"], "'xml' is not one of"),
])
def test_bad_notification_flags_exit_2_before_anything_runs(tmp_path, command, args, expected):
    home = tmp_path / "home"
    proc = run_cli(*command, *args, home=home)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and expected in proc.stderr, (command, proc.stderr)
    assert not (home / "history.sqlite3").exists()


def test_a_large_audits_findings_event_stays_bounded_and_valid():
    from types import SimpleNamespace

    hosts = [{"name": f"gpu-{i:03}", "reachable": i >= 3, "error": "unreachable: timed out" if i < 3 else None,
              "findings": [{"control": f"c{j}", "severity": "high", "status": "fail", "message": "m"}
                           for j in range(12)]} for i in range(60)]
    summary = {"hosts": 60, "reachable": 57, "unreachable": 3, "compliant": 0, "noncompliant": 57, "fail_on": "high",
               "exit_code": 3}
    run = SimpleNamespace(id=4, uuid="6f1c1c2e-8a51-4df0-9a57-3f1f0c7f6b1e", kind="audit", limit="gpu-*",
                          fleet=SimpleNamespace(source="/etc/fleetctl/hosts.ini"))
    event = valid(notify_events.run_payload(run, summary, hosts))
    assert len(event["hosts"]) == 50 and all(len(h["problems"]) <= 10 for h in event["hosts"])
    assert event["severity"] == "warning" and event["hosts"][0]["problems"] == ["unreachable: unreachable: timed out"]
    assert event["summary"].endswith("; and 55 more hosts")
    assert event["action"].endswith("fleetctl audit -i /etc/fleetctl/hosts.ini -l 'gpu-*'")
    summary.update(exit_code=0, noncompliant=0)
    assert notify_events.run_payload(run, summary, hosts) is None


def test_a_soak_failure_is_a_critical_soak_failed_naming_the_host_and_what_was_seen(store, monkeypatch, receivers):
    from orchestrator.campaign import soak
    from tests.helpers.campaign import Watch

    hook = receivers()
    notifier = notify.build([], [hook.url()], "json", None, None, 5)
    watch = Watch({("a", 1, "check"): "new Xid 119 (GSP RPC timeout) on GPU 0"})
    journal, cid, engine = start(store, Script(), ["a"], ["b"], soak_s=[0.3], soak_interval_s=0.1, observe=watch)
    assert drive(journal, cid, engine, notifier) == "rolled_back"
    received = [valid(b) for b in hook.bodies()]
    assert [b["event"] for b in received] == ["started", "wave_passed", "soak_failed", "wave_failed", "rolled_back"]
    failed = received[2]
    assert (failed["severity"], failed["host"], failed["campaign"]["state"]) == ("critical", "a", "soaking")
    assert "new Xid 119" in failed["summary"] and "new Xid 119" in failed["reason"]
    assert "no later wave starts" in failed["action"] and f"fleetctl campaign show {cid}" in failed["action"]
    assert "the soak after wave 1 failed" in received[3]["summary"]
    assert "canary_metrics" not in failed  # no canary metric in the baseline


def test_a_soak_failed_or_held_on_canary_metrics_carries_each_metrics_verdict(store, receivers):
    """soak_failed (a metric failed) and halted (one could not be judged at the end of the soak, canary.on_missing:
    hold) carry the observation's verdicts with their figures; the summary stays one line."""
    from tests.helpers.campaign import Judged, TENSOR, XID

    hook = receivers()
    notifier = notify.build([], [hook.url()], "json", None, None, 5)
    watch = Judged([TENSOR, XID], {("a", 1, "check"): TENSOR["reason"]})
    journal, cid, engine = start(store, Script(), ["a"], ["b"], soak_s=[0.3], soak_interval_s=0.1, observe=watch)
    assert drive(journal, cid, engine, notifier) == "rolled_back"
    failed = next(valid(b) for b in hook.bodies() if b["event"] == "soak_failed")
    tensor, xid = failed["canary_metrics"]
    assert tensor == {k: TENSOR[k] for k in ("name", "verdict", "canary", "control", "change", "ci", "p_value",
                                             "reason")}  # not the control hosts nor the window: campaign show has them
    assert xid == {"name": "xid", "verdict": "missing", "canary": None, "control": None, "change": None, "ci": None,
                   "p_value": None, "reason": XID["reason"]}
    assert "\n" not in failed["summary"] and TENSOR["reason"] in failed["summary"]

    hook = receivers()
    notifier = notify.build([], [hook.url()], "json", None, None, 5)
    watch = Judged([dict(TENSOR, verdict="no_verdict")], hold="canary metric not judged at the end of the soak")
    journal, cid, engine = start(store, Script(), ["c"], ["d"], soak_s=[0.3], soak_interval_s=0.1, observe=watch)
    assert drive(journal, cid, engine, notifier) == "halted"
    halted = next(valid(b) for b in hook.bodies() if b["event"] == "halted")
    assert [(m["name"], m["verdict"], m["change"]) for m in halted["canary_metrics"]] == [
        ("tensor_active", "no_verdict", -0.086)]


def test_the_events_are_declared_once_and_the_schema_and_the_listener_agree():
    """notify_events.NOTES is the one list of events: the schema's enum names the same ones, every campaign event
    has the method that words it, and an event sent at a severity NOTES does not declare is a bug, not a message."""
    events = [n.event for n in notify_events.NOTES]
    enum = schemas.validator("notification").schema["properties"]["event"]["enum"]
    assert sorted(events) == sorted(enum) and len(set(events)) == len(events)
    for note in notify_events.NOTES:
        assert not note.records or callable(getattr(notify_events.CampaignNotes, note.event)), note.event
        assert [level for level, _ in note.severities] == sorted(
            (level for level, _ in note.severities), key=["info", "warning", "critical"].index), note.event
    with pytest.raises(ValueError, match="notification started: severity critical is not declared"):
        notify_events.envelope("started", "critical", "campaign", "x", None)
