"""A history that cannot be written, or was left mid-run (issue 21; a damaged one: test_history_damage.py): one line
naming the file and the cause (exit 74, an operating error, never "internal error"); read-only commands read it
without changing a byte; runs a dead process left `running` are explained by `report verify` and closed as
interrupted."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator.history import chain
from orchestrator.history.store import Store
from tests.helpers.campaign import Script, start
from tests.helpers.cli import REPO, fleetctl


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A history with audit runs and a finished campaign, written by the real Store and engine."""
    home = tmp_path / "home"
    with Store(home / "history.sqlite3") as store:
        for _ in range(3):
            run_id, _ = store.begin_run("audit", [], "test", None, None)
            store.finish_run(run_id, 0, {"exit_code": 0}, [
                {"name": "gpu-a", "reachable": True, "groups": [], "facts": None,
                 "findings": [{"control": "driver.installed", "severity": "critical", "status": "pass",
                               "message": "m" * 2000, "evidence": {}, "remediation": None}]}])
        _, _, engine = start(store, Script(), ["gpu-a"], ["gpu-b"])
        assert engine.run() == "done"
    return home


def digest(home) -> str:
    return hashlib.sha256((home / "history.sqlite3").read_bytes()).hexdigest()


def test_read_only_commands_leave_the_history_as_it_is(home):
    before = digest(home)
    (home / "history.sqlite3").chmod(0o444)
    for args in (("report", "--format", "json"), ("report", "verify"), ("metrics",), ("campaign", "list"),
                 ("campaign", "show", "1", "--format", "json")):
        proc = fleetctl(*args, home=home)
        assert proc.returncode == 0, (args, proc.stderr)
        assert digest(home) == before, args
    assert "history chain intact" in fleetctl("report", "verify", home=home).stdout


def no_growth(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_is_one_line_naming_the_history_and_exit_74(home):
    """RLIMIT_FSIZE stands in for a full file system: no file of fleetctl's may grow."""
    path = home / "history.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 4
    env = dict(os.environ, FLEETCTL_HOME=str(home), FLEETCTL_CONFIG=os.devnull)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "audit"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120, preexec_fn=no_growth(1024))
    assert proc.returncode == 74, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"fleetctl: error: {path}: the history: ")
    assert "it cannot be written" in proc.stderr and "internal error" not in proc.stderr
    with sqlite3.connect(path) as db:  # nothing left half-written (the fixture's own campaign run aside)
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 4


def test_a_file_size_limit_is_named_and_never_taken_for_damage(home):
    """Issue 42: under a file-size limit (ulimit -f, SIGXFSZ ignored: a write past it fails with EFBIG) SQLite cannot
    make the -shm it reads the history through, and that was reported as a damaged history to restore from a
    backup. No connection is left open here: the command makes the -shm itself."""
    path = home / "history.sqlite3"
    before = digest(home)
    env = dict(os.environ, FLEETCTL_HOME=str(home), FLEETCTL_CONFIG=os.devnull)
    for args in (("audit",), ("plan", "--to", "580.65.06")):
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                              env=env, cwd=REPO, timeout=120, preexec_fn=no_growth(4096))
        assert proc.returncode == 74, (args, proc.stderr)
        assert proc.stderr == (f"fleetctl: error: {path}: the history: it cannot be written (disk I/O error): a "
                               "file-size limit (ulimit -f) lets this process write no file past 4096 bytes; raise "
                               "it, then run the command again\n"), args
        assert digest(home) == before, args


def test_a_home_whose_name_is_too_long_is_one_line_naming_the_variable(tmp_path):
    """Issue 42: a component of FLEETCTL_HOME over NAME_MAX (255 bytes) was an internal error (70) in the commands
    that only read the history."""
    home = tmp_path / ("h" * 300)
    for args in (("report",), ("metrics",), ("report", "verify"), ("campaign", "list"), ("audit",)):
        proc = fleetctl(*args, home=home)
        assert proc.returncode == 74, (args, proc.stderr)
        assert proc.stderr == (f"fleetctl: error: the history's path is longer than the file system allows (255 bytes "
                               f"a name, 4096 in all): FLEETCTL_HOME={str(home)[:100]}...; set FLEETCTL_HOME to a "
                               "shorter directory\n"), args
    assert not list(tmp_path.iterdir())  # nothing made


def test_a_run_a_dead_process_left_running_is_explained_then_closed_as_interrupted(home):
    path = home / "history.sqlite3"
    gone = json.dumps({"node": __import__("socket").getfqdn(), "pid": 2 ** 22 + 7, "start": "1"})
    with Store(path) as store:
        run_id, _ = store.begin_run("audit", [], "test", None, None)
        store.db.execute("UPDATE runs SET process=? WHERE id=?", (gone, run_id))
    verify = fleetctl("report", "verify", home=home)
    assert verify.returncode == 0, verify.stdout
    assert f"note: run {run_id} never finished: the process that ran them is gone" in verify.stdout
    with Store(path) as store:
        store.begin_run("audit", [], "test", None, None)  # the next recorded run closes it
        row = store.run(run_id)
        assert row["status"] == "interrupted" and "its process was gone" in json.loads(row["summary"])["error"]
        assert chain.verify(store.db).ok


def as_someone_else():
    """Run as an unprivileged user where the tests run as root (CI): a directory's mode binds them."""
    if os.getuid() == 0:
        os.setgid(65534)
        os.setuid(65534)


@pytest.mark.parametrize("made", ["file", "read-only"])
def test_a_home_that_cannot_hold_the_history_is_one_line_naming_the_variable_and_the_fix(made):
    """Issue 46: FLEETCTL_HOME a file gave `[Errno 20] Not a directory`; a read-only one did not say what to set."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # where another user may look
        home = Path(tmp) / "home"
        if made == "file":
            home.write_text("not a directory\n")
        else:
            home.mkdir(mode=0o555)
        env = dict(os.environ, FLEETCTL_HOME=str(home), FLEETCTL_CONFIG=os.devnull)
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "audit"], capture_output=True, text=True,
                              env=env, cwd=REPO, timeout=120, preexec_fn=as_someone_else)
        assert not (home / "history.sqlite3").exists()
    assert proc.returncode == 74 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"fleetctl: error: {home}/history.sqlite3: the history"), proc.stderr
    assert f"{home} (from $FLEETCTL_HOME)" in proc.stderr, proc.stderr
    fix = "set FLEETCTL_HOME to a " + ("directory fleetctl may write" if made == "file" else "writable directory")
    assert fix in proc.stderr, proc.stderr


def test_the_help_says_where_the_history_lives():
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "--help"], capture_output=True, text=True,
                          cwd=REPO, timeout=60, env=dict(os.environ, COLUMNS="200"))
    assert "The history (every audit, plan, campaign and report's record) lives in $FLEETCTL_HOME, else" in \
        " ".join(proc.stdout.split())
