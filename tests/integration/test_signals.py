"""Ctrl-C and SIGTERM during a real ansible-playbook (issue 21): a host on a loopback listener that accepts TCP and
never says a word, so the playbook hangs in SSH; and a webhook that answers a byte every half second. Each interrupt is one
line, exit 130 / 143, the run recorded `interrupted` (no findings), in seconds."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator import interrupts
from tests.helpers.cli import interrupt, start, tag, tagged

LISTEN_S = 120


@pytest.fixture
def drip_server():
    """An HTTP server that answers a byte at once and then one every half second, forever (each read is well within
    any per-read timeout, even on a loaded machine)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def serve(conn):
        try:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10000:
                conn.sendall(bytes([byte]))
                if stop.wait(0.5):
                    break
        except OSError:
            pass
        finally:
            conn.close()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    stop.set()
    server.close()


def history(tmp_path: Path) -> list[sqlite3.Row]:
    with sqlite3.connect(tmp_path / "home" / "history.sqlite3") as db:
        db.row_factory = sqlite3.Row
        runs = db.execute("SELECT * FROM runs ORDER BY id").fetchall()
        findings = db.execute("SELECT COUNT(*) FROM findings").fetchone()[0]
        return runs, findings


def descendants(pid: int) -> list[str]:
    """Command lines of every process below PID (ansible-runner starts ansible-playbook in a session of its own)."""
    parent, args = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                args[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier}
        found += [args[p] for p in frontier]
    return found


def playbook_running(pid: int) -> bool:
    return any("ansible-playbook" in a for a in descendants(pid))


def wait_until_playbook_runs(proc: subprocess.Popen, within: float = 60) -> None:
    """Until ansible-playbook runs below PROC (the audit is inside the playbook)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if playbook_running(proc.pid):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("ansible-playbook never started")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_during_the_playbook_is_one_line_and_an_interrupted_run(tmp_path, silent_listener, sig, code):
    inventory = tmp_path / "inv.ini"
    inventory.write_text(f"hung ansible_host=127.0.0.1 ansible_port={silent_listener} ansible_user=nobody\n")
    proc = start(tmp_path, "audit", "-i", str(inventory), "--no-preflight", "--format", "json")
    try:
        wait_until_playbook_runs(proc)
        time.sleep(1)
        out, err, took = interrupt(proc, sig, timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, err
    assert err == f"fleetctl: interrupted ({signal.Signals(sig).name})\n" and out == ""
    assert took < 30, took  # ansible-runner stopped ansible-playbook: not the 15 s SSH timeout and a record
    runs, findings = history(tmp_path)
    assert [(r["kind"], r["status"], r["exit_code"]) for r in runs] == [("audit", "interrupted", code)]
    assert findings == 0  # never findings, never "the host returned facts fleetctl cannot trust"
    assert tagged(tag(tmp_path)) == []  # nothing left behind: not ansible-playbook, its workers, nor their ssh


def test_sigterm_while_a_webhook_drips_its_answer_ends_the_command_at_once(tmp_path, drip_server):
    """An audit of an unreachable host (a closed port: exit 3, a `findings` notification) to a webhook that answers
    a byte every half second: SIGTERM during the delivery ends it (ansible-runner's handlers are not left behind)."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    inventory = tmp_path / "inv.ini"
    inventory.write_text(f"gone ansible_host=127.0.0.1 ansible_port={port} ansible_user=nobody\n")
    proc = start(tmp_path, "audit", "-i", str(inventory), "--no-preflight", "--webhook", drip_server,
                 "--notify-timeout", "5")
    try:
        wait_until_playbook_runs(proc)
        while playbook_running(proc.pid):
            time.sleep(0.2)  # the playbook is over: the delivery is under way
        time.sleep(2)
        out, err, took = interrupt(proc, signal.SIGTERM, timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert err.splitlines()[-1] == "fleetctl: interrupted (SIGTERM)" and took < 5, (err, took)


def test_a_webhook_that_drips_its_answer_is_cut_at_its_total_time(tmp_path, drip_server):
    """Each delivery try is bounded as a whole (twice --notify-timeout), not per socket read."""
    from orchestrator.notify import send as notify, events as notify_events

    hook = notify.build([], [drip_server], "json", None, None, 1.0)
    started = time.monotonic()
    failures = hook.send_now(notify_events.envelope("findings", "warning", "audit", "x", None, run={"id": 1}))
    took = time.monotonic() - started
    assert [f.reason for f in failures] == ["no complete answer in 2s (3 tries)"], failures
    assert took < 3 * 2 + 3 + 3, took  # three tries of 2 s and the back-off between them


def test_a_second_signal_during_a_deferred_block_is_raised_at_once():
    interrupts.install()
    try:
        with pytest.raises(interrupts.Interrupted) as second:
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                assert interrupts.requested()  # the first: noted, ansible-runner stops its playbook
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
                raise AssertionError("the second signal was ignored")
        assert second.value.name == "SIGTERM"
        assert not interrupts.requested()
        with pytest.raises(interrupts.Interrupted) as first:
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)
        assert (first.value.name, first.value.exit_code) == ("SIGTERM", 143)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
