"""The history: one SQLite file under $FLEETCTL_HOME (default: $XDG_STATE_HOME/fleetctl).

A run is written when it starts and completed when it ends, each in its own transaction, so a crash or a bad
input later never loses what was already recorded.
"""

from __future__ import annotations

import errno
import contextlib
import functools
import json
import os
import pwd
import resource
import socket
import sqlite3
import stat
import threading
import urllib.parse
import uuid
from collections import Counter
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from .. import __version__
from . import chain, timefmt
from ..errors import OperationError
from ..exitcodes import Exit
from ..sanitize import one_line


class HistoryError(OperationError):
    """The history cannot be read or written (read-only, full, damaged, busy): an operating error, not a bug."""

    exit_code = Exit.HISTORY


def history_error(path: Path, e: BaseException) -> HistoryError:
    """One line naming the history file and the cause."""
    text = str(e)
    low = text.lower()
    variable, directory = home_from()
    if getattr(e, "errno", None) == errno.ENAMETOOLONG:
        return HistoryError(f"the history's path is longer than the file system allows (255 bytes a name, 4096 in "
                            f"all): {variable}={one_line(directory, 100)}; set {variable} to a shorter directory")
    where = f"{one_line(str(directory), 100)} (from ${variable})" if path.parent == directory else None
    if getattr(e, "errno", None) == errno.ENOTDIR:
        return HistoryError(f"{path}: the history's directory {where or path.parent} is not a directory" + (
            "; set FLEETCTL_HOME to a directory fleetctl may write" if where else ""))
    if "readonly" in low or "read-only" in low or isinstance(e, PermissionError):
        why = "it is read-only here (file, directory or file system); fleetctl report, metrics and campaign show " \
              "read it as it is" + (f"; to keep one elsewhere, set FLEETCTL_HOME to a writable directory (now "
                                    f"{where})" if where else "")
    elif "full" in low or "i/o" in low or "too large" in low:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]  # a write past it fails (EFBIG) as on a full disk
        why = f"it cannot be written ({text}): " + (
            "free space on its file system, then run the command again" if limit == resource.RLIM_INFINITY else
            f"a file-size limit (ulimit -f) lets this process write no file past {limit} bytes; raise it, then run "
            "the command again")
    elif "malformed" in low or "not a database" in low or "corrupt" in low:
        return damaged(path, text)
    elif "locked" in low or "busy" in low:
        why = "another fleetctl holds it for longer than 30 s"
    else:
        why = text
    return HistoryError(f"{path}: the history: {why}")


def damaged(path: Path, problem: str) -> HistoryError:
    """The history is damaged: SQLite says so (PROBLEM)."""
    return HistoryError(f"{path}: the history: it is damaged ({problem}): `fleetctl report verify` says how; "
                        "restore it from a backup")


def process_start(pid: int) -> float | None:
    """When process PID started, in seconds since boot: a pid and its start name one process. psutil's creation time
    less the boot time, both from the same reading of the boot time (a clock step moves the boot time and, from
    psutil 7.1, the creation time with it; read again when it moved in between), so that the answer never changes
    while the process lives. None: no such process; psutil.AccessDenied where it may not be told."""
    import psutil  # here: `fleetctl check` reads the history and never imports psutil

    try:
        for _ in range(3):
            boot = psutil.boot_time()
            started = psutil.Process(pid).create_time()
            if psutil.boot_time() == boot:
                break
        return round(started - boot, 2)
    except psutil.NoSuchProcess:
        return None


def process_identity() -> dict[str, Any]:
    """This process as the history names it (runs.process, campaigns.driver)."""
    return {"node": socket.getfqdn(), "pid": os.getpid(), "start": process_start(os.getpid())}


def process_alive(identity: dict[str, Any]) -> bool | None:
    """Whether the process IDENTITY (process_identity) names is alive; None where it is another machine's or psutil
    is denied it: not ours to judge. Its pid with a start within a second of the recorded one is the same process
    (a pid is not reused that soon; the second spares a live process any rounding). An older fleetctl wrote "start"
    as /proc/PID/stat's field 22 (clock ticks since boot, a string): the same reading, in other units."""
    if identity.get("node") != socket.getfqdn():
        return None
    import psutil

    start = identity.get("start")
    if isinstance(start, str):
        start = int(start) / os.sysconf("SC_CLK_TCK")
    try:
        started = process_start(identity["pid"])
    except psutil.AccessDenied:
        return None
    return started is not None and (start is None or abs(started - start) <= 1)


def process_gone(identity: str | None) -> bool:
    """Whether the process recorded as IDENTITY (JSON) is gone from this machine (a run it left `running` was
    interrupted: a crash, kill -9, a history that could not be written at its end)."""
    return bool(identity) and process_alive(json.loads(identity)) is False


SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,                -- audit | probe | campaign ...
    started_at TEXT NOT NULL,
    finished_at TEXT,
    status TEXT NOT NULL,              -- running | done | failed | interrupted
    exit_code INTEGER,
    operator TEXT NOT NULL,
    control_node TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    argv TEXT NOT NULL,
    inventory TEXT,
    host_limit TEXT,
    baseline_name TEXT,
    baseline_path TEXT,
    baseline_digest TEXT,
    summary TEXT
);
CREATE TABLE IF NOT EXISTS host_results (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    host TEXT NOT NULL,
    reachable INTEGER NOT NULL,
    error TEXT,
    facts TEXT,
    groups TEXT,                       -- JSON list: the host's inventory groups at the time
    PRIMARY KEY (run_id, host)
);
CREATE TABLE IF NOT EXISTS findings (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    host TEXT NOT NULL,
    control TEXT NOT NULL,
    severity TEXT NOT NULL,
    status TEXT NOT NULL,
    message TEXT NOT NULL,
    evidence TEXT NOT NULL,
    remediation TEXT,
    PRIMARY KEY (run_id, host, control)
);
CREATE INDEX IF NOT EXISTS findings_by_control ON findings (control, status);
CREATE INDEX IF NOT EXISTS findings_by_host ON findings (host, control, status, run_id);
CREATE TABLE IF NOT EXISTS probe_results (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    host TEXT NOT NULL,
    reachable INTEGER NOT NULL,
    error TEXT,
    result TEXT,                       -- probe-result.schema.json
    health TEXT NOT NULL,              -- pass | fail | inconclusive | error
    reasons TEXT NOT NULL,
    PRIMARY KEY (run_id, host)
);
"""
SCHEMA_VERSION = 1


def home_from() -> tuple[str, Path]:
    """The variable the history's directory comes from, and the directory: $FLEETCTL_HOME, else
    $XDG_STATE_HOME/fleetctl, else $HOME/.local/state/fleetctl."""
    if os.environ.get("FLEETCTL_HOME"):
        return "FLEETCTL_HOME", Path(os.environ["FLEETCTL_HOME"])
    if os.environ.get("XDG_STATE_HOME"):
        return "XDG_STATE_HOME", Path(os.environ["XDG_STATE_HOME"]) / "fleetctl"
    return "HOME", Path(os.path.expanduser("~/.local/state")) / "fleetctl"


def home() -> Path:
    return home_from()[1]


def files(history: Path) -> tuple[Path, Path, Path]:
    """The history and the -wal and -shm files SQLite keeps beside it."""
    return history, Path(f"{history}-wal"), Path(f"{history}-shm")


NOT_REGULAR = {"d": "a directory", "p": "a FIFO", "s": "a socket", "c": "a character device", "b": "a block device"}


def regular(history: Path) -> None:
    """The history and its -wal and -shm, where they exist, are regular files: never a link that SQLite would
    write through and fleetctl chmod through, nor a FIFO or a device. HistoryError naming what the path is."""
    for path in files(history):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            what = f"a symbolic link to {os.readlink(path)}"
        elif not stat.S_ISREG(st.st_mode):
            what = NOT_REGULAR.get(stat.filemode(st.st_mode)[0], "not a regular file")
        else:
            continue
        raise HistoryError(f"{path} is {what}; fleetctl keeps its history in a regular file")


# The histories (st_dev, st_ino) this process holds SQLite connections to, and how many. Closing any descriptor of a
# file drops every POSIX lock the process holds on it, its connections' too (SQLite's "How To Corrupt", 2.2): a
# reader in another process then takes itself for the last one and deletes the write-ahead log under them. So
# fleetctl opens the history's files itself (private) only while this process has no connection to them.
CONNECTED: Counter[tuple[int, int]] = Counter()
CONNECTING = threading.Lock()  # held from private() until the connection made after it is counted, and at a close


def identity(history: Path) -> tuple[int, int]:
    st = os.stat(history)
    return st.st_dev, st.st_ino


def private(history: Path) -> None:
    """The history and its directory are the operator's (its argv, hosts, findings): a directory fleetctl creates
    for it is 0700 (its parents as mkdir -p makes them; an existing one is left as it is: it may be shared on
    purpose), a history it creates is 0600 before SQLite opens it (the -wal and -shm files take its mode), and an
    existing history (or -wal, -shm) of this user's loses the bits that let other users read it (its group's are
    left: a history shared with a group on purpose) when this process has no connection to it (CONNECTED). Each is
    changed through a descriptor opened without following a link: a link put there after `regular` looked is never
    followed."""
    history.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.close(os.open(history, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        return
    except FileExistsError:
        pass
    if CONNECTED[identity(history)]:  # its mode was set before the first of them
        return
    for path in files(history):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        except FileNotFoundError:
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o007:
                os.fchmod(fd, st.st_mode & 0o7770)
        finally:
            os.close(fd)


def now() -> str:
    return timefmt.now()


LOGINUID = Path("/proc/self/loginuid")  # the audit login uid: who logged in, kept across su and sudo
LOGINUID_UNSET = 2 ** 32 - 1  # a process no login started (a system service, a container)
CLAIMS = ("SUDO_USER", "LOGNAME", "USER")  # what the environment says about who ran it: anyone may set them


@functools.lru_cache(maxsize=None)
def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def operator() -> str:
    """Who ran it, as the kernel holds it: the real user, and the login uid where it is set and another user's
    (`root (login uid 1000 alice)`: alice, through sudo or su). What the environment claims (CLAIMS) and neither
    name already says is kept as a claim, shown as one: `root (login uid 1000 alice; claims SUDO_USER=mallory)`."""
    uid = os.getuid()
    user, notes = user_name(uid) or f"uid {uid}", []
    try:
        login = int(LOGINUID.read_text())
    except (OSError, ValueError):
        login = LOGINUID_UNSET
    named = {user}
    if login not in (LOGINUID_UNSET, uid):
        name = user_name(login)
        named.add(name)
        notes.append(f"login uid {login} {name}" if name else f"login uid {login}")
    claims = [f"{var}={value[:64] if value[:64].isprintable() else ascii(value[:64])}"
              for var in CLAIMS if (value := os.environ.get(var)) and value not in named]
    if claims:
        notes.append("claims " + ", ".join(claims))
    return f"{user} ({'; '.join(notes)})" if notes else user


# Each host's latest finished run that audited it (audit, plan, a campaign's planning audit): `latest (host, run_id)`.
LATEST_AUDITED = ("WITH latest AS (SELECT h.host, MAX(h.run_id) AS run_id FROM host_results h"
                  " JOIN runs r ON r.id = h.run_id WHERE r.status = 'done' GROUP BY h.host)")

def signature(history: Path) -> list[list[int] | None]:
    """The history's and its write-ahead log's inode, size and modification time (an empty log counts as none): any
    write changes it."""
    out = []
    for path in files(history)[:2]:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            out.append(None)
            continue
        out.append([st.st_ino, st.st_size, st.st_mtime_ns] if st.st_size else None)
    return out


def checked_as(history: Path) -> Any:
    """The signature the history had when integrity_check last found it whole (HISTORY.checked), or None."""
    try:
        return json.loads(Path(f"{history}.checked").read_text())
    except (OSError, ValueError):
        return None


WHOLE: set[tuple[str, int]] = set()  # the histories (path, inode) integrity_check found whole in this process


class Store:
    def __init__(self, path: Path | None = None, readonly: bool = False, check: bool = True):
        """READONLY (report, metrics, campaign show): an existing history is opened read-only and its bytes are
        left as they are; it works on a read-only file or file system. CHECK: a history SQLite finds damaged
        (`damage`) is a HistoryError before anything reads or writes it (`report verify` looks for itself)."""
        self.path = path or home() / "history.sqlite3"
        self.counted: tuple[int, int] | None = None  # this connection's entry in CONNECTED, until it is closed
        try:
            self.readonly = readonly and self.path.exists()
            regular(self.path)
        except OSError as e:
            raise history_error(self.path, e) from None
        try:
            with CONNECTING:
                if self.readonly:
                    self.db = self._open_readonly()
                else:
                    private(self.path)  # $FLEETCTL_HOME 0700 and the history 0600 when fleetctl creates them
                    self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
                self._count()
        except (OSError, sqlite3.Error) as e:
            raise history_error(self.path, e) from None
        self.db.row_factory = sqlite3.Row
        self._check(check)
        if self.readonly:
            return
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute("PRAGMA foreign_keys=ON")
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise HistoryError(f"{self.path} was written by a newer fleetctl (history schema {version})")
            self.db.executescript(SCHEMA + chain.SCHEMA)
            for table, column in (("host_results", "groups"), ("runs", "process")):
                if column not in {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")  # histories from before it
            if version != SCHEMA_VERSION:  # written once: a history opened as it is stays as it was (checked_as)
                self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as e:
            self.close()
            raise history_error(self.path, e) from None

    def _count(self) -> None:
        """Count the connection just opened in CONNECTED (with CONNECTING held); closed at once if it cannot be."""
        try:
            self.counted = identity(self.path)
        except OSError:
            self.db.close()
            raise
        CONNECTED[self.counted] += 1

    def _open_readonly(self) -> sqlite3.Connection:
        uri = "file:" + urllib.parse.quote(str(self.path.resolve()))
        last: BaseException | None = None
        for mode in ("?mode=ro", "?mode=ro&immutable=1"):  # immutable: no -shm can be made beside it
            try:
                db = sqlite3.connect(uri + mode, uri=True, timeout=30, isolation_level=None)
                db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
                return db
            except sqlite3.Error as e:
                last = e
        raise history_error(self.path, last) from None

    def damage(self) -> str | None:
        """SQLite's own check of the whole file, integrity_check: its first problem (one line), or None. It reads every
        page and matches every index to its table (quick_check does not: an index whose keys changed passes it); its
        cost: docs/hardening.md."""
        try:
            found = self.db.execute("PRAGMA integrity_check(1)").fetchone()[0]
        except sqlite3.DatabaseError as e:  # a page SQLite cannot even walk: the error is the answer
            if e.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
                raise  # not the file's fault: an I/O error (a full disk, a file-size limit), a lock
            found = str(e)
        return None if found == "ok" else " ".join(found.removeprefix("*** in database main ***").split())[:300]

    def _check(self, check: bool) -> None:
        """Once a process for each history file (a campaign opens it at every step), and not again while its files
        are as they were when a check found it whole (checked_as: a cron's reads between two audits cost no check):
        HistoryError if damaged."""
        if not check or (key := (str(self.path), os.stat(self.path).st_ino)) in WHOLE:
            return
        seen = signature(self.path)
        if seen == checked_as(self.path):
            WHOLE.add(key)
            return
        try:
            problem = self.damage()
        except sqlite3.Error as e:
            self.close()
            raise history_error(self.path, e) from None
        if problem:
            self.close()
            raise damaged(self.path, problem)
        WHOLE.add(key)
        # Kept by a read-only open too (beside the history: its bytes stay as they are), so the reads after a write
        # by something else pay one check between them, not one each.
        self._keep_checked(seen)

    def _keep_checked(self, seen: Any) -> None:
        with contextlib.suppress(OSError):  # a saving only: where it cannot be kept (read-only), checks go on
            fd = os.open(f"{self.path}.checked", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with open(fd, "w") as fh:  # torn by a crash, it is no JSON: checked_as says None, a check runs
                fh.write(json.dumps(seen))

    def snapshot(self) -> AbstractContextManager[None]:
        """The history as of one moment for the block (chain.snapshot)."""
        return chain.snapshot(self.db)

    def close(self) -> None:
        """Close the connection, then let private() open the history's files again once no other is open."""
        self.db.close()
        with CONNECTING:
            if self.counted is not None:
                CONNECTED[self.counted] -= 1
                if not CONNECTED[self.counted]:
                    del CONNECTED[self.counted]
                    self._whole_after_writes()
                self.counted = None

    def _whole_after_writes(self) -> None:
        """The last of this process's connections to a history it found whole has closed: what it wrote went through
        SQLite's transactions, so the files as they are now are kept as checked (a cron's audit of a 2 GiB history
        leaves no integrity check of 45 s to the `fleetctl hosts` after it). A write by anything else still changes
        the files' signature, and the next open checks."""
        if self.readonly or not os.path.exists(self.path):
            return
        if (str(self.path), os.stat(self.path).st_ino) not in WHOLE:
            return
        if checked_as(self.path) != (now := signature(self.path)):
            self._keep_checked(now)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: Any, e: BaseException | None, tb: Any) -> None:
        self.close()
        if isinstance(e, sqlite3.Error):  # read-only, full, damaged or busy: one line naming the file
            raise history_error(self.path, e) from None

    def begin_run(self, kind: str, argv: list[str], inventory: str, limit: str | None,
                  baseline: Any | None) -> tuple[int, str]:
        for stale in self.interrupted_runs():  # closed now, so no run lingers as `running` for ever
            self.fail_run(stale["id"], "interrupted: its process was gone when a later run began (a crash, kill -9, "
                                       "or a history that could not be written)", None, status="interrupted")
        run_uuid = str(uuid.uuid4())
        cur = self.db.execute(
            "INSERT INTO runs (uuid, kind, started_at, status, operator, control_node, tool_version, argv,"
            " inventory, host_limit, baseline_name, baseline_path, baseline_digest, process)"
            " VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_uuid, kind, now(), operator(), socket.getfqdn(), __version__, json.dumps(argv), inventory, limit,
             getattr(baseline, "name", None), str(getattr(baseline, "path", "")) or None,
             getattr(baseline, "digest", None), json.dumps(process_identity())))
        return cur.lastrowid, run_uuid

    def finish_run(self, run_id: int, exit_code: int, summary: dict[str, Any],
                   hosts: list[dict[str, Any]], at: str | None = None, status: str = "done") -> None:
        """Every host's facts and findings, and the run's end (AT, default now; STATUS `failed` or `interrupted` when
        its report could not be delivered: runs.close), in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            self._insert_hosts(run_id, hosts)
            self.seal_run(run_id, exit_code, summary, status, at)

    def close_run(self, run_id: int, exit_code: int, summary: dict[str, Any]) -> None:
        """The end of a run that records no hosts of its own (a campaign's: its hosts are in the journal)."""
        with self.db:
            self.db.execute("BEGIN")
            self.seal_run(run_id, exit_code, summary, "done")

    def _insert_hosts(self, run_id: int, hosts: list[dict[str, Any]]) -> None:
        for h in hosts:
            self.db.execute("INSERT INTO host_results (run_id, host, reachable, error, groups, facts)"
                            " VALUES (?, ?, ?, ?, ?, ?)",
                            (run_id, h["name"], int(h["reachable"]), h.get("error"), json.dumps(h.get("groups", [])),
                             json.dumps(h["facts"], sort_keys=True) if h.get("facts") is not None else None))
            self.db.executemany(
                "INSERT INTO findings (run_id, host, control, severity, status, message, evidence, remediation)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, h["name"], f["control"], f["severity"], f["status"], f["message"],
                  json.dumps(f["evidence"], sort_keys=True), f["remediation"]) for f in h["findings"]])

    def seal_run(self, run_id: int, exit_code: int | None, summary: dict[str, Any], status: str,
                 at: str | None = None) -> None:
        """Close the run (finished AT, default now) and add it to the hash chain (inside the caller's
        transaction)."""
        stamp = at or now()
        self.db.execute("UPDATE runs SET finished_at=?, status=?, exit_code=?, summary=? WHERE id=?",
                        (stamp, status, exit_code, json.dumps(summary, sort_keys=True), run_id))
        chain.append(self.db, "run", str(run_id), stamp, operator())

    def finish_probe(self, run_id: int, exit_code: int, summary: dict[str, Any], hosts: list[dict[str, Any]],
                     at: str | None = None, status: str = "done") -> None:
        """Every host's probe result and health verdict, and the run's end (AT, default now; STATUS as
        finish_run's), in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT INTO probe_results (run_id, host, reachable, error, result, health, reasons)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(run_id, h["name"], int(h["reachable"]), h["error"],
                  json.dumps(h["probe"], sort_keys=True) if h["probe"] is not None else None,
                  h["health"]["status"], json.dumps(h["health"]["reasons"])) for h in hosts])
            self.seal_run(run_id, exit_code, summary, status, at)

    def last_probe(self, host: str) -> dict[str, Any] | None:
        """HOST's most recent recorded probe result, whatever its verdict (the kernel-log marker), or None."""
        row = self.db.execute(
            "SELECT p.result FROM probe_results p JOIN runs r ON r.id = p.run_id"
            " WHERE p.host=? AND p.result IS NOT NULL AND r.status='done' ORDER BY p.run_id DESC LIMIT 1",
            (host,)).fetchone()
        return json.loads(row[0]) if row else None

    def last_healthy_throughput(self, host: str, engine: str, trial_s: float) -> dict[str, Any] | None:
        """HOST's most recent throughput samples from a probe that passed, taken the same way (engine, trial)."""
        for (result,) in self.db.execute(
                "SELECT p.result FROM probe_results p JOIN runs r ON r.id = p.run_id WHERE p.host=?"
                " AND p.result IS NOT NULL AND p.health='pass' AND r.status='done' ORDER BY p.run_id DESC", (host,)):
            tp = json.loads(result).get("throughput") or {}
            if tp.get("samples") and tp.get("engine") == engine and tp.get("trial_s") == trial_s:
                return tp
        return None

    def passing_facts(self, hosts: list[str], controls: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
        """{host: {control: facts}}: each host's facts at its latest recorded audit (audit or plan run) in which
        the control passed, for every host and control at once (one query, whatever the fleet's size)."""
        if not hosts or not controls:
            return {}
        rows = self.db.execute(
            "WITH latest AS (SELECT f.host, f.control, MAX(f.run_id) AS run_id FROM findings f"
            " JOIN runs r ON r.id = f.run_id"
            " WHERE f.host IN (SELECT value FROM json_each(?)) AND f.control IN (SELECT value FROM json_each(?))"
            " AND f.status = 'pass' AND r.status = 'done' GROUP BY f.host, f.control)"
            " SELECT l.host, l.control, l.run_id, h.facts FROM latest l"
            " JOIN host_results h ON h.run_id = l.run_id AND h.host = l.host WHERE h.facts IS NOT NULL",
            (json.dumps(sorted(set(hosts))), json.dumps(sorted(set(controls))))).fetchall()
        parsed: dict[tuple[int, str], dict[str, Any]] = {}  # one parse per stored document, shared by its controls
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for host, control, run_id, facts in rows:
            if (run_id, host) not in parsed:
                parsed[(run_id, host)] = json.loads(facts)
            out.setdefault(host, {})[control] = parsed[(run_id, host)]
        return out

    def probe_results(self, run_id: int) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM probe_results WHERE run_id=? ORDER BY host", (run_id,)).fetchall()

    def fail_run(self, run_id: int, message: str, exit_code: int | None, status: str = "failed") -> None:
        """Close a run that did not finish: failed (an error) or interrupted (a signal), never with findings."""
        with self.db:
            self.db.execute("BEGIN")
            self.seal_run(run_id, exit_code, {"error": message}, status)

    def interrupted_runs(self) -> list[sqlite3.Row]:
        """Runs left `running` by a process of this machine that is gone: interrupted, never finished."""
        try:
            rows = self.db.execute("SELECT * FROM runs WHERE status='running' ORDER BY id").fetchall()
        except sqlite3.OperationalError:
            return []
        return [r for r in rows if "process" in r.keys() and process_gone(r["process"])]

    def run(self, run_id: int) -> sqlite3.Row | None:
        return self.db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()

    def runs(self, kind: str | None = None) -> list[sqlite3.Row]:
        query = "SELECT * FROM runs" + (" WHERE kind=?" if kind else "") + " ORDER BY id"
        return self.db.execute(query, (kind,) if kind else ()).fetchall()

    def findings(self, run_id: int) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM findings WHERE run_id=? ORDER BY host, rowid", (run_id,)).fetchall()

    def host_results(self, run_id: int) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM host_results WHERE run_id=? ORDER BY host", (run_id,)).fetchall()

    # ---- what the reports read (report.py, prometheus.py) ---------------------------------------------------
    def audits_between(self, since: str | None, until: str | None) -> list[sqlite3.Row]:
        """Finished audit runs started between SINCE and UNTIL (either may be None), oldest first."""
        return self.db.execute("SELECT * FROM runs WHERE kind='audit' AND status='done' AND (? IS NULL OR started_at >= ?)"
                               " AND (? IS NULL OR started_at <= ?) ORDER BY id", (since, since, until, until)).fetchall()

    def run_hosts(self, run_id: int) -> list[sqlite3.Row]:
        """A run's host results in the order they were written."""
        return self.db.execute("SELECT * FROM host_results WHERE run_id=?", (run_id,)).fetchall()

    def host_findings(self, run_id: int, host: str) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM findings WHERE run_id=? AND host=? ORDER BY rowid", (run_id, host)).fetchall()

    def latest_audits(self) -> list[sqlite3.Row]:
        """Each host's row of its latest finished run that audited it (audit, plan, a campaign's planning audit)."""
        return self.db.execute(
            LATEST_AUDITED + " SELECT h.host, h.run_id, h.reachable, h.facts, h.groups, r.started_at FROM latest l"
            " JOIN host_results h ON h.run_id = l.run_id AND h.host = l.host JOIN runs r ON r.id = l.run_id"
            " ORDER BY h.host").fetchall()

    def latest_findings(self) -> dict[str, list[dict[str, Any]]]:
        """Each host's findings of its latest finished run that audited it: host -> [{host, control, severity,
        status}]."""
        out: dict[str, list[dict[str, Any]]] = {}
        for f in self.db.execute(
                LATEST_AUDITED + " SELECT f.host, f.control, f.severity, f.status FROM latest l"
                " JOIN findings f ON f.run_id = l.run_id AND f.host = l.host ORDER BY f.host, f.rowid"):
            out.setdefault(f["host"], []).append(dict(f))
        return out

    def latest_probes(self) -> list[sqlite3.Row]:
        """Each host's result of its latest finished probe run."""
        return self.db.execute(
            "WITH latest AS (SELECT p.host, MAX(p.run_id) AS run_id FROM probe_results p JOIN runs r ON r.id = p.run_id"
            " WHERE r.status = 'done' GROUP BY p.host)"
            " SELECT p.host, p.result, p.health, r.started_at FROM latest l"
            " JOIN probe_results p ON p.run_id = l.run_id AND p.host = l.host JOIN runs r ON r.id = l.run_id"
            " ORDER BY p.host").fetchall()

    def chain_last(self) -> sqlite3.Row | None:
        """The tamper-evident chain's newest record (seq, at), or None."""
        return self.db.execute("SELECT seq, at FROM chain ORDER BY seq DESC LIMIT 1").fetchone()

