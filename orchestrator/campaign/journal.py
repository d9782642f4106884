"""The campaign's write-ahead record, in the history's SQLite file.

Every transition is committed before it is acted on: a step is written `started` (and the host marked changed,
for a step that changes packages) before its playbook runs; its outcome and the host's next state are written
in one transaction after. A crash in between leaves the host in the state that names the unfinished step, so a
resume runs it again on the same history row (attempts + 1): steps are idempotent on the host (exact package
state, reboot keyed on the boot id), and no finished step is ever run again (one row per host and step).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import OperationError
from ..history import chain
from ..history.store import Store, now, operator, process_alive, process_identity
from . import transitions
from .transitions import HostState, Record
from .options import Campaign, CampaignOptions

SCHEMA = """
CREATE TABLE IF NOT EXISTS campaigns (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    target TEXT NOT NULL,
    state TEXT NOT NULL,               -- transitions.CAMPAIGN_TABLE states
    wave INTEGER NOT NULL,             -- the wave being worked on (1-based)
    options TEXT NOT NULL,             -- JSON: probe protocol, hooks, soak, window, rollback scope, forks
    plan TEXT NOT NULL,                -- JSON: campaign-plan.schema.json
    reason TEXT,                       -- why it halted, rolled back or was aborted
    abort_requested INTEGER NOT NULL DEFAULT 0,
    soak_until TEXT,
    driver TEXT,                       -- JSON {node, pid, start}: the process driving it now
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS campaign_hosts (
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    host TEXT NOT NULL,
    wave INTEGER NOT NULL,
    position INTEGER NOT NULL,
    state TEXT NOT NULL,
    changed INTEGER NOT NULL DEFAULT 0, -- a package-changing step began: a rollback concerns this host
    reason TEXT,
    before TEXT,                       -- JSON: what precheck recorded (packages, boot id, GPUs, version)
    updated_at TEXT NOT NULL,
    PRIMARY KEY (campaign_id, host)
);
CREATE TABLE IF NOT EXISTS campaign_steps (
    id INTEGER PRIMARY KEY,
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    host TEXT NOT NULL,
    step TEXT NOT NULL,
    status TEXT NOT NULL,              -- started | ok | fail | inconclusive | skip
    attempts INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    reason TEXT,
    detail TEXT,
    UNIQUE (campaign_id, host, step)
);
CREATE TABLE IF NOT EXISTS campaign_events (
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    seq INTEGER NOT NULL,
    at TEXT NOT NULL,
    event TEXT NOT NULL,
    host TEXT,
    data TEXT NOT NULL,
    PRIMARY KEY (campaign_id, seq)
);
CREATE TABLE IF NOT EXISTS campaign_soak (
    id INTEGER PRIMARY KEY,
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    gap INTEGER NOT NULL,              -- the soak after wave GAP
    host TEXT NOT NULL,
    kind TEXT NOT NULL,                -- check (every --soak-interval) | gate (at the end of the soak)
    at TEXT NOT NULL,
    status TEXT NOT NULL,              -- ok | fail | unreachable
    reason TEXT,
    detail TEXT NOT NULL               -- JSON: kernel-log marker, boot id, what was seen, the canary run
);
CREATE INDEX IF NOT EXISTS campaign_soak_host ON campaign_soak (campaign_id, host, id);
CREATE TABLE IF NOT EXISTS host_locks (
    host TEXT PRIMARY KEY,
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    since TEXT NOT NULL
);
"""


def driven_elsewhere(driver: str | None) -> bool:
    """Whether the process recorded as driving a campaign (process_identity) is another process of this machine,
    alive or not known to be gone (its pid is there and psutil is denied it): a campaign is never driven twice.
    Another machine's driver is not this machine's to judge: its campaign can be resumed here."""
    if not driver:
        return False
    d = json.loads(driver)
    if d.get("node") != socket.getfqdn() or d["pid"] == os.getpid():
        return False
    return process_alive(d) is not False


class Journal:
    def __init__(self, store: Store, listener=None, create: bool = True):
        """CREATE: the campaign tables, where the history may be written and lacks them (a report: no)."""
        self.store = store
        self.db = store.db
        if create and not getattr(store, "readonly", False):
            self.db.executescript(SCHEMA)
        self.empty = not self.db.execute("SELECT 1 FROM sqlite_master WHERE name='campaigns'").fetchone()
        self.listener = listener  # called with every event (progress display, JSONL log)
        self._pending: list[dict[str, Any]] = []

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            yield self.db

    # ---- events ---------------------------------------------------------------------------------------
    def _event(self, db: sqlite3.Connection, campaign_id: int, event: str, host: str | None = None,
               **data: Any) -> dict[str, Any]:
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM campaign_events WHERE campaign_id=?",
                         (campaign_id,)).fetchone()[0]
        record = {"campaign": campaign_id, "seq": seq, "at": now(), "event": event, "host": host, **data}
        db.execute("INSERT INTO campaign_events (campaign_id, seq, at, event, host, data) VALUES (?, ?, ?, ?, ?, ?)",
                   (campaign_id, seq, record["at"], event, host, json.dumps(data, sort_keys=True)))
        chain.append(db, "event", f"{campaign_id}:{seq}", record["at"], operator())
        self._pending.append(record)
        return record

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for record in pending:
            if self.listener:
                self.listener(record)

    # ---- campaigns -------------------------------------------------------------------------------------
    def create(self, run_id: int, plan: dict[str, Any], options: CampaignOptions) -> tuple[int, list[str]]:
        """A new campaign with every planned host pending, and the host locks; hosts locked by another
        campaign are left out of it (returned)."""
        self._pending = []
        with self.tx() as db:
            stamp = now()
            cur = db.execute(
                "INSERT INTO campaigns (run_id, target, state, wave, options, plan, driver, created_at, updated_at)"
                " VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)",
                (run_id, plan["target"], transitions.CAMPAIGN_START, json.dumps(options.as_dict(), sort_keys=True),
                 json.dumps(plan, sort_keys=True), json.dumps(process_identity()), stamp, stamp))
            cid = cur.lastrowid
            locked = []
            position = 0
            for wave in plan["waves"]:
                for h in wave["hosts"]:
                    owner = db.execute("SELECT campaign_id FROM host_locks WHERE host=?", (h["name"],)).fetchone()
                    if owner is not None:
                        locked.append(f"{h['name']} (campaign {owner[0]})")
                        continue
                    db.execute("INSERT INTO host_locks (host, campaign_id, since) VALUES (?, ?, ?)",
                               (h["name"], cid, stamp))
                    position += 1
                    db.execute("INSERT INTO campaign_hosts (campaign_id, host, wave, position, state, updated_at)"
                               " VALUES (?, ?, ?, ?, ?, ?)",
                               (cid, h["name"], wave["index"], position, transitions.HOST_START, stamp))
            self._event(db, cid, Record.CAMPAIGN_STARTED, target=plan["target"],
                        waves=[[h["name"] for h in w["hosts"]] for w in plan["waves"]], locked_elsewhere=locked)
        self._flush()
        return cid, locked

    def campaign(self, cid: int) -> sqlite3.Row:
        if self.empty:  # a read-only history that never ran a campaign
            raise LookupError(cid)
        row = self.db.execute("SELECT * FROM campaigns WHERE id=?", (cid,)).fetchone()
        if row is None:
            raise LookupError(cid)
        return row

    def handle(self, cid: int) -> Campaign:
        """Campaign CID, typed: its target, options and plan."""
        return Campaign.of(self.campaign(cid))

    def campaigns(self) -> list[sqlite3.Row]:
        return [] if self.empty else self.db.execute("SELECT * FROM campaigns ORDER BY id").fetchall()

    def claim(self, cid: int) -> None:
        """Become the process driving campaign CID; refused while another live process does."""
        with self.tx() as db:
            row = db.execute("SELECT driver FROM campaigns WHERE id=?", (cid,)).fetchone()
            if row and driven_elsewhere(row[0]):
                d = json.loads(row[0])
                where = "this machine" if d.get("node") == socket.getfqdn() else d.get("node") or "another machine"
                raise OperationError(f"campaign {cid} is being driven by pid {d['pid']} on {where}"
                                     + ("" if process_alive(d) else " (or was: fleetctl cannot tell whether it runs)"))
            db.execute("UPDATE campaigns SET driver=? WHERE id=?", (json.dumps(process_identity()), cid))

    def transition(self, cid: int, event: str, reason: str | None = None, wave: int | None = None,
                   soak_until: str | None = None, moves: dict[str, list[str]] | None = None,
                   lock: bool = False, host_reasons: dict[str, str] | None = None, **data: Any) -> str:
        """Campaign-level transition per transitions.CAMPAIGN_TABLE, committed with its event, the next wave or
        soak deadline and the host moves the event makes (MOVES: a transitions.MOVES name -> the hosts named, of
        which the move's row picks those it concerns; HOST_REASONS: why), all in one transaction. LOCK: the moved
        hosts' locks are taken again first (a manual rollback)."""
        with self.tx() as db:
            state = db.execute("SELECT state FROM campaigns WHERE id=?", (cid,)).fetchone()[0]
            new = transitions.campaign_next(state, event)
            hosts = self._moved(db, cid, event, moves or {})
            self._lock(db, cid, sorted(hosts) if lock else [])
            db.execute("UPDATE campaigns SET state=?, reason=COALESCE(?, reason), wave=COALESCE(?, wave),"
                       " soak_until=?, updated_at=? WHERE id=?", (new, reason, wave, soak_until, now(), cid))
            for host, host_state in hosts.items():
                db.execute("UPDATE campaign_hosts SET state=?, reason=COALESCE(?, reason), updated_at=?"
                           " WHERE campaign_id=? AND host=?",
                           (host_state, (host_reasons or {}).get(host), now(), cid, host))
            if new in transitions.CAMPAIGN_TERMINAL:
                db.execute("DELETE FROM host_locks WHERE campaign_id=?", (cid,))
            if soak_until and new == transitions.CampaignState.SOAKING:
                data["soak_until"] = soak_until
            self._event(db, cid, event, state_from=state, state=new, reason=reason, wave=wave,
                        hosts=hosts or None, **data)
        self._flush()
        return new

    @staticmethod
    def _moved(db: sqlite3.Connection, cid: int, event: str, moves: dict[str, list[str]]) -> dict[str, str]:
        """Host name -> new state for the moves EVENT makes (transitions.EVENT_MOVES), read off transitions.MOVES
        against the hosts' rows now."""
        out: dict[str, str] = {}
        for _, move, named in transitions.moves_for(event, moves):
            for host in named:
                row = db.execute("SELECT state, changed FROM campaign_hosts WHERE campaign_id=? AND host=?",
                                 (cid, host)).fetchone()
                if row is not None and move.concerns(row[0], bool(row[1])):
                    out[host] = move.to
        return out

    @staticmethod
    def _lock(db: sqlite3.Connection, cid: int, hosts: list[str]) -> None:
        """Take HOSTS' locks for campaign CID again (a manual rollback); refused if another campaign holds one."""
        for host in hosts:
            owner = db.execute("SELECT campaign_id FROM host_locks WHERE host=?", (host,)).fetchone()
            if owner is not None and owner[0] != cid:
                raise OperationError(f"{host} is locked by campaign {owner[0]}")
            db.execute("INSERT OR IGNORE INTO host_locks (host, campaign_id, since) VALUES (?, ?, ?)",
                       (host, cid, now()))

    def update_options(self, cid: int, **changes: Any) -> None:
        with self.tx() as db:
            options = json.loads(db.execute("SELECT options FROM campaigns WHERE id=?", (cid,)).fetchone()[0])
            options.update(changes)
            db.execute("UPDATE campaigns SET options=? WHERE id=?", (json.dumps(options, sort_keys=True), cid))

    def request_abort(self, cid: int) -> None:
        with self.tx() as db:
            db.execute("UPDATE campaigns SET abort_requested=1 WHERE id=?", (cid,))
            self._event(db, cid, Record.ABORT_REQUESTED_BY_OPERATOR)
        self._flush()

    # ---- hosts and steps -------------------------------------------------------------------------------
    def tally(self, cid: int) -> dict[str, int]:
        """Host count per state."""
        return {state: n for state, n in self.db.execute(
            "SELECT state, COUNT(*) FROM campaign_hosts WHERE campaign_id=? GROUP BY state ORDER BY state", (cid,))}

    def hosts(self, cid: int) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM campaign_hosts WHERE campaign_id=? ORDER BY position", (cid,)).fetchall()

    def befores(self, cid: int) -> list[tuple[str, str]]:
        """(host, what its precheck recorded, as JSON text) of each host that has a record."""
        return self.db.execute("SELECT host, before FROM campaign_hosts WHERE campaign_id=? AND before IS NOT NULL"
                               " AND before != '' ORDER BY position", (cid,)).fetchall()

    def steps(self, cid: int, host: str | None = None) -> list[sqlite3.Row]:
        if host is None:
            return self.db.execute("SELECT * FROM campaign_steps WHERE campaign_id=? ORDER BY id", (cid,)).fetchall()
        return self.db.execute("SELECT * FROM campaign_steps WHERE campaign_id=? AND host=? ORDER BY id",
                               (cid, host)).fetchall()

    def step_detail(self, cid: int, host: str, step: HostState) -> dict[str, Any] | None:
        row = self.db.execute("SELECT detail FROM campaign_steps WHERE campaign_id=? AND host=? AND step=?",
                              (cid, host, step)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def step_started(self, cid: int, host: str, step: HostState) -> str | None:
        """When HOST's STEP was first written ahead (a resumed step keeps it), or None."""
        row = self.db.execute("SELECT started_at FROM campaign_steps WHERE campaign_id=? AND host=? AND step=?",
                              (cid, host, step)).fetchone()
        return row[0] if row else None

    def begin_step(self, cid: int, hosts: list[str], step: HostState) -> None:
        """Write ahead: STEP is about to run on HOSTS."""
        with self.tx() as db:
            stamp = now()
            for host in hosts:
                state = db.execute("SELECT state FROM campaign_hosts WHERE campaign_id=? AND host=?",
                                   (cid, host)).fetchone()[0]
                if state not in transitions.HOST_ROWS or transitions.HOST_ROWS[state].step != step:
                    raise RuntimeError(f"{host}: state {state} does not run {step}")
                row = db.execute("SELECT status, attempts FROM campaign_steps WHERE campaign_id=? AND host=? AND step=?",
                                 (cid, host, step)).fetchone()
                if row is None:
                    db.execute("INSERT INTO campaign_steps (campaign_id, host, step, status, attempts, started_at)"
                               " VALUES (?, ?, ?, 'started', 1, ?)", (cid, host, step, stamp))
                elif row[0] == "started":  # interrupted by a crash: the same step, resumed
                    db.execute("UPDATE campaign_steps SET attempts=attempts+1 WHERE campaign_id=? AND host=? AND step=?",
                               (cid, host, step))
                else:
                    raise RuntimeError(f"{host}: step {step} already finished ({row[0]}); it is never run twice")
                if transitions.HOST_ROWS[state].changes_host:
                    db.execute("UPDATE campaign_hosts SET changed=1 WHERE campaign_id=? AND host=?", (cid, host))
                self._event(db, cid, Record.STEP_STARTED, host, step=step, resumed=row is not None)
        self._flush()

    def finish_step(self, cid: int, host: str, step: HostState, outcome: str, reason: str | None,
                    detail: dict[str, Any] | None, before: dict[str, Any] | None = None) -> str:
        """The step's outcome and the host's next state, in one transaction. Returns the next state."""
        with self.tx() as db:
            state = db.execute("SELECT state FROM campaign_hosts WHERE campaign_id=? AND host=?",
                               (cid, host)).fetchone()[0]
            new = transitions.HOST_ROWS[state].next(outcome)
            db.execute("UPDATE campaign_steps SET status=?, finished_at=?, reason=?, detail=?"
                       " WHERE campaign_id=? AND host=? AND step=?",
                       (outcome, now(), reason, json.dumps(detail, sort_keys=True) if detail is not None else None,
                        cid, host, step))
            db.execute("UPDATE campaign_hosts SET state=?, reason=CASE WHEN ? IN ('ok', 'skip') THEN reason ELSE ? END,"
                       " before=COALESCE(?, before), updated_at=? WHERE campaign_id=? AND host=?",
                       (new, outcome, reason, json.dumps(before, sort_keys=True) if before else None, now(), cid, host))
            self._event(db, cid, Record.STEP_FINISHED, host, step=step, outcome=outcome, reason=reason, state=new)
        self._flush()
        return new

    def note(self, cid: int, event: str, **data: Any) -> None:
        """An event that changes no state (e.g. a batch's timing)."""
        with self.tx() as db:
            self._event(db, cid, event, **data)
        self._flush()

    def note_later(self, cid: int, event: str, **data: Any) -> None:
        """note() from inside a listener: committed now, handed to the listener with the next flush (flushing here
        would hand it to the JSONL log before the records of the flush still under way)."""
        with self.tx() as db:
            self._event(db, cid, event, **data)

    def flush(self) -> None:
        """Hand the listener what note_later() left."""
        self._flush()

    def move(self, cid: int, event: str, moves: dict[str, list[str]], reason: str | None = None,
             host_reason: bool = False) -> None:
        """A host event that moves hosts outside the host table (MOVES: a transitions.MOVES name -> the hosts named,
        as transitions.EVENT_MOVES allows EVENT: a host's own rollback within its wave's budget, the hosts of an
        NVLink domain stopped when one of them failed) and leaves the campaign's state as it is, all in one
        transaction: one event per host moved. HOST_REASON: REASON becomes each moved host's reason too."""
        if not any(moves.values()):
            return
        with self.tx() as db:
            for host, state in self._moved(db, cid, event, moves).items():
                db.execute("UPDATE campaign_hosts SET state=?, reason=COALESCE(?, reason), updated_at=?"
                           " WHERE campaign_id=? AND host=?", (state, reason if host_reason else None, now(), cid, host))
                self._event(db, cid, event, host, state=state, reason=reason)
        self._flush()

    # ---- the watched soak ------------------------------------------------------------------------------
    def record_soak(self, cid: int, gap: int, kind: str, observations: dict[str, Any]) -> None:
        """One soak check or end-of-soak gate of several hosts (OBSERVATIONS: host -> soak.Observation), with a
        `soak_check` event and a `soak_check_failed` event per failing host, in one transaction: what was seen
        (and the kernel-log marker it was read up to) is in the history before anything acts on it."""
        if not observations:
            return
        with self.tx() as db:
            stamp = now()
            for host, o in observations.items():
                db.execute("INSERT INTO campaign_soak (campaign_id, gap, host, kind, at, status, reason, detail)"
                           " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           (cid, gap, host, kind, stamp, o.status, o.reason, json.dumps(o.detail, sort_keys=True)))
            self._event(db, cid, Record.SOAK_CHECK, kind=kind, gap=gap,
                        ok=sorted(h for h, o in observations.items() if o.status == "ok"),
                        unreachable=sorted(h for h, o in observations.items() if o.status == "unreachable"),
                        failed={h: o.reason for h, o in sorted(observations.items()) if o.status == "fail"},
                        seen={h: o.detail.get("seen", []) for h, o in sorted(observations.items())
                              if o.detail.get("seen")})
            for host, o in sorted(observations.items()):
                if o.status == "fail":
                    self._event(db, cid, Record.SOAK_CHECK_FAILED, host, kind=kind, gap=gap, reason=o.reason)
        self._flush()

    def soak_records(self, cid: int, host: str | None = None, gap: int | None = None,
                     kind: str | None = None) -> list[dict[str, Any]]:
        """Soak observations, oldest first, each with its detail decoded."""
        return self._soak(cid, host, gap, kind, " ORDER BY id")

    def latest_soak(self, cid: int, host: str | None = None, gap: int | None = None, kind: str | None = None,
                    judged: bool = False) -> dict[str, Any] | None:
        """The latest soak observation (of HOST, after wave GAP, of KIND where given; JUDGED: of those that judged
        the canary metrics), its detail decoded, or None."""
        found = self._soak(cid, host, gap, kind, (" AND json_extract(detail, '$.canary_metrics') IS NOT NULL"
                                                  if judged else "") + " ORDER BY id DESC LIMIT 1")
        return found[0] if found else None

    def canary_metrics(self, cid: int, gap: int | None = None, kind: str | None = None) -> dict[str, Any] | None:
        """The latest judgement of the canary metrics (docs/canary.md) in campaign CID's soak (after wave GAP, of
        KIND where given): {at, gap, kind, metrics: the verdicts as the soak recorded them}, or None."""
        judged = self.latest_soak(cid, gap=gap, kind=kind, judged=True)
        return {"at": judged["at"], "gap": judged["gap"], "kind": judged["kind"],
                "metrics": judged["detail"]["canary_metrics"]} if judged else None

    def latest_soak_status(self, cid: int) -> dict[str, tuple[str, str | None]]:
        """Host -> (status, reason) of its latest soak observation, for every host observed: one query."""
        try:
            rows = self.db.execute("SELECT s.host, s.status, s.reason FROM campaign_soak s JOIN (SELECT MAX(id) AS id"
                                   " FROM campaign_soak WHERE campaign_id=? GROUP BY host) m ON s.id = m.id",
                                   (cid,)).fetchall()
        except sqlite3.OperationalError:  # a read-only history from before the watched soak
            return {}
        return {r[0]: (r[1], r[2]) for r in rows}

    def _soak(self, cid: int, host: str | None, gap: int | None, kind: str | None, tail: str) -> list[dict[str, Any]]:
        query, args = "SELECT * FROM campaign_soak WHERE campaign_id=?", [cid]
        for column, value in (("host", host), ("gap", gap), ("kind", kind)):
            if value is not None:
                query += f" AND {column}=?"
                args.append(value)
        try:
            rows = self.db.execute(query + tail, args).fetchall()
        except sqlite3.OperationalError:  # a read-only history from before the watched soak
            return []
        return [dict(r, detail=json.loads(r["detail"])) for r in rows]

    def events(self, cid: int) -> list[dict[str, Any]]:
        return [{"campaign": cid, "seq": r["seq"], "at": r["at"], "event": r["event"], "host": r["host"],
                 **json.loads(r["data"])}
                for r in self.db.execute("SELECT * FROM campaign_events WHERE campaign_id=? ORDER BY seq", (cid,))]

    # ---- what the reports read (report.py, prometheus.py): [] from a history without the tables -------------
    def latest_host_states(self) -> list[sqlite3.Row]:
        """Each host's state in its latest campaign, with that campaign's id, target and state."""
        try:
            return self.db.execute(
                "WITH latest AS (SELECT host, MAX(campaign_id) AS campaign_id FROM campaign_hosts GROUP BY host)"
                " SELECT h.host, h.state, c.id, c.target, c.state AS campaign_state FROM latest l"
                " JOIN campaign_hosts h ON h.campaign_id = l.campaign_id AND h.host = l.host"
                " JOIN campaigns c ON c.id = l.campaign_id ORDER BY c.id, h.host").fetchall()
        except sqlite3.OperationalError:  # a history that never ran a campaign has no campaign tables
            return []

    def soak_states(self, ids: list[int]) -> list[sqlite3.Row]:
        """(id, state, soak_until) of campaigns IDS."""
        return [self.db.execute("SELECT id, state, soak_until FROM campaigns WHERE id=?", (cid,)).fetchone()
                for cid in ids]

    def latest_soak_hosts(self) -> list[sqlite3.Row]:
        """Per campaign and host: the latest soak observation and the failed canary runs."""
        try:
            return self.db.execute(
                "SELECT s.campaign_id, s.host, s.kind, s.status, (SELECT SUM(json_extract(detail, '$.canary.ok') = 0)"
                " FROM campaign_soak c WHERE c.campaign_id = s.campaign_id AND c.host = s.host) AS canary_failed"
                " FROM campaign_soak s WHERE s.id = (SELECT MAX(id) FROM campaign_soak m"
                " WHERE m.campaign_id = s.campaign_id AND m.host = s.host) ORDER BY s.campaign_id, s.host").fetchall()
        except sqlite3.OperationalError:  # a history from before the watched soak, or without campaigns
            return []

    def campaigns_between(self, since: str | None, until: str | None) -> list[sqlite3.Row]:
        """Campaigns created between SINCE and UNTIL (either may be None), with their run's operator and control
        node; raises on a history without campaign tables."""
        return self.db.execute("SELECT c.*, r.operator, r.control_node FROM campaigns c JOIN runs r ON r.id = c.run_id"
                               " WHERE (? IS NULL OR c.created_at >= ?) AND (? IS NULL OR c.created_at <= ?)"
                               " ORDER BY c.id", (since, since, until, until)).fetchall()

    def locks(self) -> dict[str, int]:
        return {r["host"]: r["campaign_id"] for r in self.db.execute("SELECT * FROM host_locks")}
