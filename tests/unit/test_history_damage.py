"""A damaged history (issue 36): a real history with a few runs and a campaign, one 4 KiB page of it overwritten with
random bytes (the first page, one in the middle, the last). Every command that opens it says so in one line and
exits 74, none writes into it, and `report verify` reports SQLite's integrity check beside the chain."""

from __future__ import annotations

import hashlib
import os
import sqlite3

import pytest

from orchestrator.exitcodes import Exit
from orchestrator.history.store import Store
from tests.helpers.campaign import Script, start
from tests.helpers.cli import fleetctl

COMMANDS = [("audit",), ("plan", "--to", "580.65.06"), ("metrics",), ("report",), ("campaign", "list"),
            ("campaign", "show", "1")]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Audit runs (a few pages of findings each) and a finished campaign, written by the real Store and engine."""
    home = tmp_path_factory.mktemp("history")
    with Store(home / "history.sqlite3") as store:
        for _ in range(6):
            run_id, _ = store.begin_run("audit", [], "test", None, None)
            store.finish_run(run_id, 0, {"exit_code": 0}, [
                {"name": f"gpu-{h}", "reachable": True, "groups": [], "facts": {"driver": "x" * 3000},
                 "findings": [{"control": f"c.{i}", "severity": "critical", "status": "pass", "message": "m" * 200,
                               "evidence": {}, "remediation": None} for i in range(20)]} for h in range(4)])
        _, _, engine = start(store, Script(), ["gpu-a"], ["gpu-b"])
        assert engine.run() == "done"
    with sqlite3.connect(home / "history.sqlite3") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert db.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert db.execute("PRAGMA page_count").fetchone()[0] > 40
    return (home / "history.sqlite3").read_bytes()


def damage(home, pristine: bytes, where: str) -> str:
    """Overwrite one page of a copy of PRISTINE in HOME; the damaged file's digest."""
    pages = len(pristine) // 4096
    page = {"first": 0, "middle": pages // 2, "last": pages - 1}[where]
    data = bytearray(pristine)
    data[page * 4096:(page + 1) * 4096] = os.urandom(4096)
    (home / "history.sqlite3").write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def unchanged(home, before: str) -> bool:
    """The file's bytes as they were (digest BEFORE), and nothing waiting in its write-ahead log to go into it."""
    wal = home / "history.sqlite3-wal"
    return (hashlib.sha256((home / "history.sqlite3").read_bytes()).hexdigest() == before
            and (not wal.exists() or wal.stat().st_size == 0))


def refused_by_every_command(home, before: str) -> None:
    """Every command that opens the damaged history in HOME (digest BEFORE) says so in one line, exits 74, and
    leaves it as it is."""
    for args in COMMANDS:
        proc = fleetctl(*args, home=home)
        assert proc.returncode == Exit.HISTORY, (args, proc.returncode, proc.stdout[-300:], proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
            f"fleetctl: error: {home / 'history.sqlite3'}: the history: it is damaged ("), (args, proc.stderr)
        assert unchanged(home, before), args


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_damaged_history_is_one_line_exit_74_and_never_written(tmp_path, pristine, where):
    refused_by_every_command(tmp_path, damage(tmp_path, pristine, where))


def test_a_damaged_index_is_refused_by_every_command(tmp_path, pristine):
    """Issue 42: a leaf page of an index whose keys changed, its structure intact (every finding's status in it now
    reads "fail"). SQLite's quick_check walks every page but never matches an index to its table: the damage passed
    it, and audit and plan wrote into the file while report and metrics reported from it."""
    path = tmp_path / "history.sqlite3"
    path.write_bytes(pristine)
    with sqlite3.connect(path) as db:
        page = db.execute("SELECT pageno FROM dbstat WHERE name='findings_by_host' AND pagetype='leaf'"
                          " ORDER BY pageno LIMIT 1").fetchone()[0] - 1
    db.close()
    data = bytearray(pristine)
    data[page * 4096:(page + 1) * 4096] = data[page * 4096:(page + 1) * 4096].replace(b"pass", b"fail")
    assert data != pristine
    path.write_bytes(data)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:  # the damage is of the kind quick_check misses
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        assert "findings_by_host" in db.execute("PRAGMA integrity_check").fetchone()[0]
    db.close()
    refused_by_every_command(tmp_path, hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("where", ["middle", "last"])
def test_verify_reports_sqlites_integrity_check_and_the_chain(tmp_path, pristine, where):
    before = damage(tmp_path, pristine, where)
    proc = fleetctl("report", "verify", home=tmp_path)
    assert proc.returncode == Exit.HISTORY and proc.stdout.count("\n") == 1, proc.stdout + proc.stderr
    chain, sqlite = proc.stdout.strip().split("; SQLite integrity_check: ")
    assert chain.startswith("history chain "), chain
    assert sqlite != "ok" and "page" in sqlite.lower(), sqlite
    assert unchanged(tmp_path, before)


def test_verify_of_a_file_that_is_not_a_database_any_more(tmp_path, pristine):
    damage(tmp_path, pristine, "first")
    proc = fleetctl("report", "verify", home=tmp_path)
    assert proc.returncode == Exit.HISTORY and proc.stderr.count("\n") == 1 and "damaged" in proc.stderr, proc.stderr


def test_an_intact_history_verifies_by_both(tmp_path, pristine):
    (tmp_path / "history.sqlite3").write_bytes(pristine)
    proc = fleetctl("report", "verify", home=tmp_path)
    assert proc.returncode == Exit.OK and proc.stdout.startswith("history chain intact: ")
    assert proc.stdout.endswith("; SQLite integrity_check: ok\n"), proc.stdout


def test_a_history_found_whole_is_checked_again_only_once_its_files_change(tmp_path, pristine, monkeypatch):
    """integrity_check reads the whole file: a later process (WHOLE empty again) skips it while the history and its
    log are as they were when a check found them whole or a process that found them whole last wrote them, and checks
    again after any other write, or a copy put in place. A read-only open (report, metrics, hosts) keeps what it found
    too: the reads after such a write pay one check."""
    from orchestrator.history import store as store_mod
    path = tmp_path / "history.sqlite3"
    path.write_bytes(pristine)
    checks = []
    real = Store.damage
    monkeypatch.setattr(Store, "damage", lambda self: checks.append(1) or real(self))

    def opened(readonly=False) -> int:
        store_mod.WHOLE.clear()  # a new process
        before = len(checks)
        with Store(path, readonly=readonly):
            pass
        return len(checks) - before
    assert opened() == 1 and (tmp_path / "history.sqlite3.checked").exists()
    assert opened() == 0 and opened(readonly=True) == 0
    with Store(path) as store:  # fleetctl's own write, by a process that found it whole: kept as checked
        store.begin_run("audit", [], "test", None, None)
    assert opened(readonly=True) == 0 and opened() == 0
    db = sqlite3.connect(path)  # a write by anything else: the next process checks again
    with db:
        db.execute("UPDATE runs SET operator = 'someone'")
    db.close()
    assert opened(readonly=True) == 1 and opened(readonly=True) == 0 and opened() == 0
    path.write_bytes(pristine)  # another file in its place
    assert opened() == 1
