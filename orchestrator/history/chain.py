"""The tamper-evident history: every finished run (audit, probe, plan, campaign start) and every campaign event is
a record in one hash chain. A record's digest covers the previous record's digest and the record's content, and
the content is rebuilt from the history's own tables when the chain is verified: editing a finding, deleting an
event or reordering records breaks the chain at that record.

    digest(n) = sha256( digest(n-1) | seq | kind | ref | at | operator | control_node | tool_version
                        | canonical JSON of the record's rows )

Canonical JSON: keys sorted, no spaces, UTF-8. The first record's previous digest is GENESIS.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from .. import __version__
from ..campaign.transitions import Record

GENESIS = "sha256:" + "0" * 64
SCHEMA = """
CREATE TABLE IF NOT EXISTS chain (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,                -- run | event
    ref TEXT NOT NULL,                 -- run id, or campaign:seq
    at TEXT NOT NULL,
    operator TEXT NOT NULL,
    control_node TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    prev TEXT NOT NULL,
    digest TEXT NOT NULL,
    UNIQUE (kind, ref)
);
"""


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _rows(db: sqlite3.Connection, query: str, args: tuple) -> list[dict[str, Any]]:
    cur = db.execute(query, args)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def content(db: sqlite3.Connection, kind: str, ref: str) -> dict[str, Any] | None:
    """The rows a record stands for, read from the history now (None when its main row is gone)."""
    if kind == "run":
        run = _rows(db, "SELECT * FROM runs WHERE id=?", (int(ref),))
        if not run:
            return None
        rid = int(ref)
        return {"run": run[0],
                "host_results": _rows(db, "SELECT * FROM host_results WHERE run_id=? ORDER BY host", (rid,)),
                "findings": _rows(db, "SELECT * FROM findings WHERE run_id=? ORDER BY host, control", (rid,)),
                "probe_results": _rows(db, "SELECT * FROM probe_results WHERE run_id=? ORDER BY host", (rid,))}
    cid, seq = (int(x) for x in ref.split(":"))
    event = _rows(db, "SELECT * FROM campaign_events WHERE campaign_id=? AND seq=?", (cid, seq))
    if not event:
        return None
    out: dict[str, Any] = {"event": event[0]}
    data = json.loads(event[0]["data"])
    if event[0]["event"] == Record.STEP_FINISHED:  # the step's outcome and evidence are final once it finished
        out["step"] = _rows(db, "SELECT campaign_id, host, step, status, started_at, finished_at, reason, detail"
                                " FROM campaign_steps WHERE campaign_id=? AND host=? AND step=?",
                            (cid, event[0]["host"], data["step"]))
    if event[0]["event"] == Record.CAMPAIGN_STARTED:
        out["campaign"] = _rows(db, "SELECT id, run_id, target, plan, created_at FROM campaigns WHERE id=?", (cid,))
    return out


def digest_of(prev: str, seq: int, kind: str, ref: str, at: str, operator: str, node: str, version: str,
              body: dict[str, Any] | None) -> str:
    h = hashlib.sha256()
    for part in (prev, str(seq), kind, ref, at, operator, node, version):
        h.update(part.encode() + b"\n")
    h.update(canonical(body))
    return "sha256:" + h.hexdigest()


def append(db: sqlite3.Connection, kind: str, ref: str, at: str, operator: str) -> str:
    """Seal one record (call inside the transaction that wrote its rows). Returns its digest."""
    last = db.execute("SELECT seq, digest FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
    node = socket.getfqdn()
    digest = digest_of(prev, seq, kind, ref, at, operator, node, __version__, content(db, kind, ref))
    db.execute("INSERT INTO chain (seq, kind, ref, at, operator, control_node, tool_version, prev, digest)"
               " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (seq, kind, ref, at, operator, node, __version__, prev, digest))
    return digest


def head(db: sqlite3.Connection) -> dict[str, Any]:
    row = db.execute("SELECT seq, digest FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    return {"records": row[0] if row else 0, "digest": row[1] if row else GENESIS}


@dataclass
class Verdict:
    ok: bool
    records: int
    head: str
    broken: dict[str, Any] | None = None  # the first broken record: seq, kind, ref, why

    def line(self) -> str:
        if self.ok:
            return f"history chain intact: {self.records} records, head {self.head}"
        b = self.broken
        what = f"record {b['seq']} ({b['kind']} {b['ref']})" if b.get("seq") is not None else f"{b['kind']} {b['ref']}"
        return f"history chain broken at {what}: {b['why']}"


@contextmanager
def snapshot(db: sqlite3.Connection) -> Iterator[None]:
    """One read transaction for the block (or the caller's, if one is open): in WAL mode every statement in it sees
    the history as it was at its first read, whatever other processes commit meanwhile, so a run sealed meanwhile
    is seen whole (its row and its record) or not at all."""
    if db.in_transaction:
        yield
        return
    db.execute("BEGIN")
    try:
        yield
    finally:
        if db.in_transaction:  # SQLite may have ended it on an error
            db.execute("ROLLBACK")


def verify(db: sqlite3.Connection, expected_head: str | None = None) -> Verdict:
    """Walk the chain from the start, rebuilding every record from the tables; the first mismatch is named.
    Rows that should have been sealed but are not in the chain (a deleted record) are named too. All of it is read
    in one snapshot: runs that other processes seal meanwhile are never taken for records missing from the chain.
    SQLite's own check of the file is the Store's (Store.damage)."""
    with snapshot(db):
        return _verify(db, expected_head)


def _verify(db: sqlite3.Connection, expected_head: str | None) -> Verdict:
    prev, count = GENESIS, 0
    rows = db.execute("SELECT * FROM chain ORDER BY seq").fetchall()
    for n, r in enumerate(rows, 1):
        seq, kind, ref = r[0], r[1], r[2]
        where = {"seq": seq, "kind": kind, "ref": ref}
        if seq != n:
            return Verdict(False, count, prev, dict(where, why=f"sequence jumps from {n - 1} to {seq}: a record was "
                                                                f"deleted"))
        if r[7] != prev:
            return Verdict(False, count, prev, dict(where, why="it does not follow the record before it "
                                                               "(records deleted or reordered)"))
        body = content(db, kind, ref)
        if body is None:
            return Verdict(False, count, prev, dict(where, why="its rows are gone from the history"))
        if digest_of(prev, seq, kind, ref, r[3], r[4], r[5], r[6], body) != r[8]:
            return Verdict(False, count, prev, dict(where, why="its content changed since it was recorded"))
        prev, count = r[8], count + 1
    sealed = {(r[1], r[2]) for r in rows}
    for (rid,) in db.execute("SELECT id FROM runs WHERE status != 'running' ORDER BY id"):
        if ("run", str(rid)) not in sealed:
            return Verdict(False, count, prev, {"seq": None, "kind": "run", "ref": str(rid),
                                                "why": "a finished run that is not in the chain (its record was "
                                                       "deleted, or the run was added behind fleetctl's back)"})
    try:
        events = db.execute("SELECT campaign_id, seq FROM campaign_events ORDER BY campaign_id, seq").fetchall()
    except sqlite3.OperationalError:
        events = []
    for cid, seq in events:
        if ("event", f"{cid}:{seq}") not in sealed:
            return Verdict(False, count, prev, {"seq": None, "kind": "event", "ref": f"{cid}:{seq}",
                                                "why": "a campaign event that is not in the chain"})
    if expected_head and expected_head != prev:
        return Verdict(False, count, prev, {"seq": None, "kind": "head", "ref": expected_head,
                                            "why": f"the chain ends at {prev}, not at the head given "
                                                   "(records after it were removed, or it is another history)"})
    return Verdict(True, count, prev)
