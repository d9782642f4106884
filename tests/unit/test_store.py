"""The history's own file and who is recorded as running a command (issue 36): a history that is a link, a FIFO or
a device is refused in one line and nothing is changed through it; the operator is the identity the kernel holds
(the real uid, the audit login uid), and what the environment says is kept as a claim."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess

import pytest

from orchestrator.history import chain, store
from orchestrator.exitcodes import Exit
from orchestrator.history.store import HistoryError, Store, files
from tests.helpers.cli import fleetctl

ME = pwd.getpwuid(os.getuid()).pw_name
OTHER = next(p for p in pwd.getpwall() if p.pw_uid != os.getuid())  # a user this test does not run as
NAMELESS = next(uid for uid in range(4_000_000, 4_000_100) if uid not in {p.pw_uid for p in pwd.getpwall()})


@pytest.fixture
def login(tmp_path, monkeypatch):
    """Set this process's audit login uid (a file standing in for /proc/self/loginuid) and its environment's
    claims: login(uid, SUDO_USER=..., ...)."""
    path = tmp_path / "loginuid"
    monkeypatch.setattr(store, "LOGINUID", path)

    def set_(uid: int | None, **claims: str) -> None:
        if uid is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(str(uid))
        for var in store.CLAIMS:
            monkeypatch.delenv(var, raising=False)
        for var, value in claims.items():
            monkeypatch.setenv(var, value)
    return set_


@pytest.mark.parametrize("uid, claims, recorded", [
    (store.LOGINUID_UNSET, {"SUDO_USER": "mallory"}, f"{ME} (claims SUDO_USER=mallory)"),
    (store.LOGINUID_UNSET, {"LOGNAME": "eve", "USER": "eve"}, f"{ME} (claims LOGNAME=eve, USER=eve)"),
    (None, {"USER": ME, "LOGNAME": ME}, ME),  # no /proc/self/loginuid (a kernel without audit)
    (os.getuid(), {"USER": ME}, ME),
    # sudo from another login: what SUDO_USER says agrees with the kernel, and is not repeated
    (OTHER.pw_uid, {"SUDO_USER": OTHER.pw_name, "USER": ME}, f"{ME} (login uid {OTHER.pw_uid} {OTHER.pw_name})"),
    (OTHER.pw_uid, {"SUDO_USER": "mallory"},
     f"{ME} (login uid {OTHER.pw_uid} {OTHER.pw_name}; claims SUDO_USER=mallory)"),
    (NAMELESS, {}, f"{ME} (login uid {NAMELESS})"),
    (store.LOGINUID_UNSET, {"SUDO_USER": "eve\x1b[2J\u202e"}, f"{ME} (claims SUDO_USER='eve\\x1b[2J\\u202e')"),
])
def test_the_operator_is_who_the_kernel_says_and_the_environment_a_claim(login, uid, claims, recorded):
    login(uid, **claims)
    assert store.operator() == recorded


def test_the_recorded_operator_is_sealed_in_the_chain_as_recorded(login, tmp_path):
    login(store.LOGINUID_UNSET, SUDO_USER="mallory", LOGNAME="eve", USER="eve")
    with Store(tmp_path / "history.sqlite3") as s:
        run_id, _ = s.begin_run("audit", [], "test", None, None)
        s.finish_run(run_id, 0, {}, [])
        sealed = s.db.execute("SELECT operator FROM chain WHERE kind='run' AND ref=?", (str(run_id),)).fetchone()[0]
        assert s.run(run_id)["operator"] == sealed == f"{ME} (claims SUDO_USER=mallory, LOGNAME=eve, USER=eve)"
        assert chain.verify(s.db).ok


@pytest.fixture
def target(tmp_path):
    """A file someone else's history might be linked to (a copy of /etc/passwd's kind of file), 0644."""
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:root:/root:/bin/bash\n")
    path.chmod(0o644)
    return path


@pytest.mark.parametrize("linked", ["history.sqlite3", "history.sqlite3-wal", "history.sqlite3-shm"])
def test_a_history_that_is_a_link_is_refused_and_nothing_changes_through_it(tmp_path, target, linked):
    home = tmp_path / "home"
    home.mkdir()
    if linked != "history.sqlite3":
        Store(home / "history.sqlite3").close()
    (home / linked).symlink_to(target)
    for args in (("audit",), ("metrics",), ("report", "verify")):
        proc = fleetctl(*args, home=home)
        assert proc.returncode == Exit.HISTORY and proc.stderr == (
            f"fleetctl: error: {home / linked} is a symbolic link to {target}; fleetctl keeps its history in a "
            "regular file\n"), (args, proc.stderr)
        assert stat.S_IMODE(target.stat().st_mode) == 0o644 and target.read_text().startswith("root:x:0:0:"), args


def test_a_history_that_is_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "history.sqlite3")
    for readonly in (False, True):
        with pytest.raises(HistoryError, match="history.sqlite3 is a FIFO; fleetctl keeps its history in a regular"):
            Store(tmp_path / "history.sqlite3", readonly=readonly)


def test_an_existing_history_of_this_users_still_loses_the_bits_for_others(tmp_path):
    path = tmp_path / "history.sqlite3"
    Store(path).close()
    path.chmod(0o644)
    Store(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def rows_seen_by_another_process(path) -> int:
    """What the sqlite3 command-line tool, a process of its own that comes and goes, counts in table t."""
    return int(subprocess.run(["sqlite3", str(path), "SELECT COUNT(*) FROM t"], capture_output=True, text=True,
                              check=True, timeout=30).stdout)


def test_a_store_made_beside_an_open_one_leaves_its_locks_and_no_row_is_lost(tmp_path):
    """Issue 42: every Store once opened and closed the history's files itself (to set their mode), and closing any
    descriptor of a file drops every POSIX lock this process's connections hold on it. A reader in another process,
    finding no lock, took itself for the last connection and deleted the write-ahead log under the open one: 50 of
    51 rows lost, silently."""
    path = tmp_path / "history.sqlite3"
    held = Store(path)  # upgrade's Store for its campaign, held while each step's audit makes its own
    held.db.execute("CREATE TABLE t (x)")
    held.db.execute("INSERT INTO t VALUES (0)")
    Store(path).close()
    assert rows_seen_by_another_process(path) == 1
    for i in range(50):
        held.db.execute("INSERT INTO t VALUES (?)", (i,))
    assert all(f.exists() for f in files(path))
    assert rows_seen_by_another_process(path) == 51
    held.close()
    assert rows_seen_by_another_process(path) == 51
