"""Each host's record: the incidents the history holds (an Xid, uncorrectable ECC, a GPU lost, a failed gate, a
rollback ...), one row each with its time, host, driver version, GPU and the record it came from, and each host's
observations (when it was seen, on which driver, with how many GPUs) for rates per GPU-day.

The ledger is an index, not a record: a SQLite file beside the history (HISTORY.ledger), derived from the
history's chained records only and never chained itself, so `report verify` neither reads nor depends on it. It is
caught up incrementally at each use: the chain is the history's log, and the ledger keeps the sequence number and
digest of the last record it read (its high-water mark); only the records after it are read. A history that no
longer holds that record with that digest (restored from a backup, another file) makes the ledger rebuild itself.

Dedupe (docs/hosts.md): an Xid line stays in the kernel log until the host reboots, and every audit until then
sees it again: it is one incident, keyed by host, boot id, the line's sequence number and its text. A control that
keeps failing audit after audit (and a probe that keeps failing) is one incident at its onset; it is a new one
only after a run in which it passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable

from . import timefmt
from ..campaign.transitions import HostState, Record


@dataclass(frozen=True)
class IncidentClass:
    name: str
    what: str  # in words
    reads: str  # the history's records it is derived from


CLASSES = {c.name: c for c in (
    IncidentClass("xid_79", "Xid 79: a GPU fell off the bus", "host_results facts xid.events (code 79)"),
    IncidentClass("xid", "an Xid other than 79 (its code and catalog class in the detail)",
                  "host_results facts xid.events"),
    IncidentClass("ecc_uncorrectable", "uncorrectable ECC errors since the last reset", "findings gpu.ecc_errors fail"),
    IncidentClass("row_remap", "a row remap pending or failed", "findings gpu.remapped_rows fail"),
    IncidentClass("gpu_lost", "fewer GPUs answer than expected, or one is lost", "findings gpu.count fail"),
    IncidentClass("nvlink_down", "NVLink links down or failing", "findings gpu.nvlink fail"),
    IncidentClass("probe_below_floor", "a probe below the baseline's floors", "probe_results health fail"),
    IncidentClass("gate_failed", "a campaign's health gate failed (probe before/after a change, a soak check)",
                  "campaign events step_finished (probe steps, fail), soak_check_failed"),
    IncidentClass("rollback", "a campaign rolled the host back", "campaign events: host state rolled_back"),
    IncidentClass(HostState.ROLLBACK_FAILED.value, "a rollback failed: the host needs a person",
                  "campaign events: host state rollback_failed"),
    IncidentClass("unreachable_at_step", "unreachable at a campaign step", "campaign events step_finished "
                                                                           "(fail, unreachable)"),
)}
# A failing control -> its class: one incident at the onset of each spell of failing audits.
FINDING_CLASSES = {"gpu.ecc_errors": "ecc_uncorrectable", "gpu.remapped_rows": "row_remap", "gpu.count": "gpu_lost",
                   "gpu.nvlink": "nvlink_down"}
GATE_STEPS = (HostState.PROBE_BEFORE, HostState.PROBE_AFTER, HostState.PROBE_AGAIN, HostState.ROLLBACK_PROBE)
# A host's end state in a campaign -> its class (a failed rollback's class is named after the state)
HOST_STATES = {HostState.ROLLED_BACK: "rollback", HostState.ROLLBACK_FAILED: HostState.ROLLBACK_FAILED.value}
MAX_GAP_S = 2 * 86400  # a host unseen longer than this between two observations: the rest of the gap is not counted

SCHEMA = """
CREATE TABLE IF NOT EXISTS mark (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL,              -- the last chain record read
    digest TEXT NOT NULL               -- its digest: another history (or a restored one) is read again
);
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY,
    at TEXT NOT NULL,
    host TEXT NOT NULL,
    class TEXT NOT NULL,
    code INTEGER,                      -- an Xid's code
    driver TEXT,                       -- the driver version the host ran (its last audit's)
    gpu TEXT,                          -- UUIDs where known, else index or PCI bus id (comma list); NULL: the host
    detail TEXT NOT NULL,              -- one line: what was seen
    source TEXT NOT NULL,              -- run:ID or campaign:ID:SEQ (the event), the chained record
    key TEXT NOT NULL,                 -- dedupe (module docstring)
    UNIQUE (host, class, key)
);
CREATE INDEX IF NOT EXISTS incidents_by_host ON incidents (host, at);
CREATE INDEX IF NOT EXISTS incidents_by_class ON incidents (class, at);
CREATE INDEX IF NOT EXISTS incidents_by_time ON incidents (at);
CREATE TABLE IF NOT EXISTS observations (
    host TEXT NOT NULL,
    at TEXT NOT NULL,
    driver TEXT,
    gpus INTEGER NOT NULL,             -- GPUs that answered
    model TEXT,                        -- the first GPU's name that answered
    boot_id TEXT,
    source TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS observations_by_host ON observations (host, at);
CREATE TABLE IF NOT EXISTS failing (   -- (host, control) failing at its last observation: onset dedupe
    host TEXT NOT NULL,
    what TEXT NOT NULL,
    PRIMARY KEY (host, what)
);
CREATE TABLE IF NOT EXISTS drivers (host TEXT PRIMARY KEY, driver TEXT);
CREATE TABLE IF NOT EXISTS gpus (      -- each host's GPUs as last seen whole: a lost GPU is named by its UUID
    host TEXT NOT NULL,
    idx INTEGER NOT NULL,
    uuid TEXT,
    pci TEXT,
    PRIMARY KEY (host, idx)
);
"""
# Only what the ledger reads of a host's facts, extracted by SQLite (no JSON document parsed in Python).
FACTS = ("SELECT h.host, json_extract(h.facts, '$.host.boot_id'),"
         " json_extract(h.facts, '$.driver.module_version'), json_extract(h.facts, '$.xid.events'),"
         " (SELECT json_group_array(json_array(json_extract(g.value, '$.index'), json_extract(g.value, '$.uuid'),"
         "  json_extract(g.value, '$.pci_bus_id'), json_extract(g.value, '$.name'), json_extract(g.value, '$.lost')))"
         "  FROM json_each(h.facts, '$.gpus') g)"
         " FROM host_results h WHERE h.run_id=? AND h.facts IS NOT NULL")


def ledger_path(history: Path) -> Path:
    return Path(f"{history}.ledger")


def connect(history: Path) -> sqlite3.Connection:
    """The ledger beside HISTORY (0600, as the history), or one in memory where that directory cannot be written."""
    path, db = ledger_path(history), None
    try:
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        db = sqlite3.connect(path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(SCHEMA)
        db.execute("BEGIN IMMEDIATE")  # it can be written (a read-only file, or one damaged: rebuilt in memory)
        db.execute("ROLLBACK")
    except (OSError, sqlite3.Error):
        if db is not None:
            db.close()
        db = sqlite3.connect(":memory:", isolation_level=None)
        db.executescript(SCHEMA)
    return db


def _indexes(evidence: dict[str, Any]) -> list[int]:
    """The GPUs a finding's evidence names by index (lost, failure, pending, a per-GPU mapping)."""
    named: set[int] = set()
    for key in ("lost", "failure", "pending", "uncorrected_volatile", "gpus"):
        value = evidence.get(key)
        if isinstance(value, dict):
            value = list(value)
        for v in value if isinstance(value, list) else ():
            with contextlib.suppress(TypeError, ValueError):
                named.add(int(v))
    return sorted(named)


class Ledger:
    """The ledger of one history (a Store), caught up at construction (update())."""

    def __init__(self, store: Any, update: bool = True):
        self.store = store
        self.db = connect(store.path)
        if update:
            self.update()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- catching up ----------------------------------------------------------------------------------
    def update(self) -> int:
        """Read the chain records after the mark (all of them again where the mark is not this history's);
        returns how many were read. One transaction of the ledger: a crash leaves it at its last mark."""
        hist = self.store.db
        with self.db, self.store.snapshot():
            self.db.execute("BEGIN IMMEDIATE")  # another fleetctl catching up meanwhile: read its mark after it
            mark = self.db.execute("SELECT seq, digest FROM mark").fetchone()
            if mark and (hist.execute("SELECT digest FROM chain WHERE seq=?", (mark[0],)).fetchone()
                         or [None])[0] != mark[1]:
                mark = None
            if mark is None:
                for table in ("mark", "incidents", "observations", "failing", "drivers", "gpus"):
                    self.db.execute(f"DELETE FROM {table}")
            records = hist.execute("SELECT seq, kind, ref, at, digest FROM chain WHERE seq > ? ORDER BY seq",
                                   (mark[0] if mark else 0,)).fetchall()
            for seq, kind, ref, at, digest in records:
                if kind == "run":
                    self._run(int(ref))
                else:
                    self._event(ref)
            if records:
                self.db.execute("INSERT OR REPLACE INTO mark (id, seq, digest) VALUES (1, ?, ?)",
                                (records[-1][0], records[-1][4]))
        return len(records)

    def _add(self, at: str, host: str, cls: str, gpu: str | None, detail: str, source: str, key: str,
             driver: str | None = None, code: int | None = None) -> None:
        if driver is None:
            row = self.db.execute("SELECT driver FROM drivers WHERE host=?", (host,)).fetchone()
            driver = row[0] if row else None
        self.db.execute("INSERT OR IGNORE INTO incidents (at, host, class, code, driver, gpu, detail, source, key)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (at, host, cls, code, driver, gpu, detail, source, key))

    def _label(self, host: str, index: int | None = None, pci: str | None = None) -> str | None:
        """A GPU of HOST by its UUID where the ledger has seen it (by INDEX or PCI bus id), else as given."""
        row = self.db.execute("SELECT uuid FROM gpus WHERE host=? AND (idx=? OR pci=?) AND uuid IS NOT NULL",
                              (host, index, (pci or "").lower() or None)).fetchone()
        return row[0] if row else f"GPU {index}" if index is not None else pci

    def _model(self, host: str, live: list[list[Any]]) -> str | None:
        """The model of HOST's GPUs: the first that answered, else (none did) the one seen last."""
        model = next((g[3] for g in live if g[3]), None)
        if model is None:
            row = self.db.execute("SELECT model FROM observations WHERE host=? AND model IS NOT NULL"
                                  " ORDER BY rowid DESC LIMIT 1", (host,)).fetchone()
            model = row[0] if row else None
        return model

    def _onset(self, host: str, what: str, failing: bool) -> bool:
        """Whether WHAT starts failing on HOST now (it did not at its last observation)."""
        if not failing:
            self.db.execute("DELETE FROM failing WHERE host=? AND what=?", (host, what))
            return False
        return self.db.execute("INSERT OR IGNORE INTO failing (host, what) VALUES (?, ?)", (host, what)).rowcount == 1

    def _run(self, run_id: int) -> None:
        hist = self.store.db
        run = hist.execute("SELECT started_at, status FROM runs WHERE id=?", (run_id,)).fetchone()
        if run is None or run[1] != "done":
            return
        at, source = run[0], f"run:{run_id}"
        for host, boot_id, driver, events, gpus in hist.execute(FACTS, (run_id,)):
            gpus = json.loads(gpus or "[]")
            if driver:
                self.db.execute("INSERT OR REPLACE INTO drivers (host, driver) VALUES (?, ?)", (host, driver))
            live = [g for g in gpus if not g[4]]
            self.db.executemany("INSERT OR REPLACE INTO gpus (host, idx, uuid, pci) VALUES (?, ?, ?, ?)",
                                [(host, g[0], g[1], (g[2] or "").lower()) for g in live if g[1]])
            self.db.execute("INSERT INTO observations (host, at, driver, gpus, model, boot_id, source)"
                            " VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (host, at, driver, len(live), self._model(host, live), boot_id, source))
            for e in json.loads(events or "[]"):
                cls = "xid_79" if e.get("code") == 79 else "xid"
                detail = f"Xid {e.get('code')} ({e.get('class') or 'unknown'}, {e.get('severity')}): " \
                         f"{(e.get('raw') or '')[:200]}"
                self._add(at, host, cls, self._label(host, pci=e.get("pci_bus_id")), detail, source,
                          f"{boot_id}|{e.get('seq')}|{e.get('raw')}", driver, e.get("code"))
        for host, control, status, message, evidence in hist.execute(
                "SELECT host, control, status, message, evidence FROM findings WHERE run_id=? AND control IN"
                f" ({','.join('?' * len(FINDING_CLASSES))})", (run_id, *FINDING_CLASSES)):
            if self._onset(host, control, status == "fail"):
                gpu = ",".join(map(str, (self._label(host, i) for i in _indexes(json.loads(evidence))))) or None
                self._add(at, host, FINDING_CLASSES[control], gpu,
                          f"{control}: {message}"[:300], source, f"{control}@{run_id}")
        for host, health, reasons in hist.execute(
                "SELECT host, health, reasons FROM probe_results WHERE run_id=?", (run_id,)):
            if self._onset(host, "probe", health == "fail"):
                why = "; ".join(map(str, json.loads(reasons or "[]")))
                self._add(at, host, "probe_below_floor", None, f"probe: {why}"[:300], source, f"probe@{run_id}")

    def _event(self, ref: str) -> None:
        cid, seq = (int(x) for x in ref.split(":"))
        row = self.store.db.execute("SELECT at, event, host, data FROM campaign_events WHERE campaign_id=? AND seq=?",
                                    (cid, seq)).fetchone()
        if row is None or not row[2]:
            return
        at, event, host, data = row[0], row[1], row[2], json.loads(row[3])
        source = f"campaign:{cid}:{seq}"
        reason = str(data.get("reason") or "")
        if event == Record.STEP_FINISHED and data.get("outcome") == "fail":
            if reason.startswith("unreachable"):
                self._add(at, host, "unreachable_at_step", None, f"{data.get('step')}: {reason}"[:300], source, ref)
            elif data.get("step") in GATE_STEPS:
                self._add(at, host, "gate_failed", None, f"{data.get('step')}: {reason}"[:300], source, ref)
        elif event == Record.SOAK_CHECK_FAILED:
            self._add(at, host, "gate_failed", None, f"soak {data.get('kind')}: {reason}"[:300], source, ref)
        if data.get("state") in HOST_STATES:
            self._add(at, host, HOST_STATES[data["state"]], None, f"campaign {cid}: {reason or data['state']}"[:300],
                      source, f"campaign:{cid}:{data['state']}")

    # ---- what it answers (fleetctl hosts; the repeat-offender policy, the breaker, report drivers) ---------
    def incidents(self, host: str | None = None, since: str | None = None, until: str | None = None,
                  classes: Iterable[str] | None = None, driver: str | None = None,
                  gpu: str | None = None) -> list[dict[str, Any]]:
        """Incidents, oldest first, of HOST, CLASSES, DRIVER and GPU where given, at SINCE or later and before
        UNTIL."""
        where, args = ["1=1"], []
        for column, value in (("host", host), ("driver", driver), ("gpu", gpu)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since:
            where.append("at >= ?")
            args.append(since)
        if until:
            where.append("at < ?")
            args.append(until)
        if classes is not None:
            where.append("class IN (SELECT value FROM json_each(?))")
            args.append(json.dumps(list(classes)))
        cur = self.db.execute("SELECT at, host, class, code, driver, gpu, detail, source FROM incidents WHERE "
                              + " AND ".join(where) + " ORDER BY at, id", args)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur]

    def counts(self, since: str | None = None, until: str | None = None) -> dict[str, dict[str, Any]]:
        """host -> {classes: {class: n}, count, first, last} of the incidents in [SINCE, UNTIL)."""
        out: dict[str, dict[str, Any]] = {}
        for host, cls, n, first, last in self.db.execute(
                "SELECT host, class, COUNT(*), MIN(at), MAX(at) FROM incidents WHERE at >= ? AND at < ?"
                " GROUP BY host, class ORDER BY host", (since or "", until or "9999")):
            h = out.setdefault(host, {"classes": {}, "count": 0, "first": first, "last": last})
            h["classes"][cls] = n
            h["count"] += n
            h["first"], h["last"] = min(h["first"], first), max(h["last"], last)
        return out

    def observations(self, host: str | None = None, since: str | None = None,
                     until: str | None = None) -> list[dict[str, Any]]:
        """Each observation of a host (a run that recorded its facts), oldest first: at, host, driver, gpus, model,
        boot_id, source. GPU-days per host and driver follow from consecutive ones (docs/hosts.md)."""
        cur = self.db.execute(
            "SELECT host, at, driver, gpus, model, boot_id, source FROM observations WHERE (? IS NULL OR host = ?)"
            " AND at >= ? AND at < ? ORDER BY host, at", (host, host, since or "", until or "9999"))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur]

    def gpu_days(self, since: str | None = None, until: str | None = None,
                 max_gap_s: float = MAX_GAP_S) -> list[dict[str, Any]]:
        """GPU-days observed per host, driver and GPU model in [SINCE, UNTIL): between two consecutive observations
        of a host, the time between them (at most MAX_GAP_S: a longer gap counts only that much, the rest unseen)
        times the GPUs that answered at the first, credited to the first's driver. [{host, driver, model,
        gpu_days}]"""
        cur = self.db.execute(
            "SELECT host, driver, model, SUM(MIN(julianday(next) - julianday(at), ?) * gpus) FROM"
            " (SELECT host, at, driver, gpus, model, LEAD(at) OVER (PARTITION BY host ORDER BY at) AS next"
            "  FROM observations WHERE at >= ? AND at < ?)"
            " WHERE next IS NOT NULL GROUP BY host, driver, model ORDER BY host, driver",
            (max_gap_s / 86400, since or "", until or "9999"))
        return [{"host": h, "driver": d, "model": m, "gpu_days": round(g, 6)} for h, d, m, g in cur]

    def incident_counts(self, since: str | None = None, until: str | None = None) -> list[dict[str, Any]]:
        """Incidents per driver, GPU model and class in [SINCE, UNTIL), those with a driver: the model is the host's
        at its latest observation up to the incident. [{driver, model, class, count}]"""
        cur = self.db.execute(
            "SELECT driver, (SELECT o.model FROM observations o WHERE o.host = i.host AND o.at <= i.at"
            " ORDER BY o.at DESC LIMIT 1) AS model, class, COUNT(*) FROM incidents i"
            " WHERE at >= ? AND at < ? AND driver IS NOT NULL GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            (since or "", until or "9999"))
        return [{"driver": d, "model": m, "class": c, "count": n} for d, m, c, n in cur]

    def moves(self, since: str | None = None, until: str | None = None) -> list[dict[str, Any]]:
        """Hosts seen on one driver, then on another at their next observation, in [SINCE, UNTIL): per GPU model
        (at the second), from and to, how many hosts. [{model, from, to, hosts}]"""
        cur = self.db.execute(
            "SELECT model, prev, driver, COUNT(DISTINCT host) FROM"
            " (SELECT host, driver, model, LAG(driver) OVER (PARTITION BY host ORDER BY at) AS prev"
            "  FROM observations WHERE at >= ? AND at < ?)"
            " WHERE prev IS NOT NULL AND driver IS NOT NULL AND prev != driver GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            (since or "", until or "9999"))
        return [{"model": m, "from": a, "to": b, "hosts": n} for m, a, b, n in cur]

    def known(self, host: str) -> bool:
        """Whether the history observed HOST at all (an incident or an observation)."""
        return bool(self.db.execute("SELECT 1 FROM observations WHERE host=? UNION ALL SELECT 1 FROM incidents"
                                    " WHERE host=? LIMIT 1", (host, host)).fetchone())


def hosts_summary(ledger: Ledger, within_s: float, now: str | None = None) -> list[dict[str, Any]]:
    """Each host with incidents in the last WITHIN_S seconds before NOW (default: the clock's now), most incidents
    first: host, count, classes, last, since_last_s, mtbi_s (mean time between its incidents in the window; None
    with fewer than two)."""
    end = timefmt.parse(now or timefmt.now())
    start = timefmt.stamp(end - timedelta(seconds=within_s))
    out = []
    for host, h in ledger.counts(start, timefmt.stamp(end + timedelta(milliseconds=1))).items():
        first, last = timefmt.parse(h["first"]), timefmt.parse(h["last"])
        out.append({"host": host, "count": h["count"], "classes": dict(sorted(h["classes"].items())),
                    "last": h["last"], "since_last_s": round((end - last).total_seconds(), 3),
                    "mtbi_s": round((last - first).total_seconds() / (h["count"] - 1), 3) if h["count"] > 1 else None})
    return sorted(out, key=lambda h: (-h["count"], h["host"]))


def age(seconds: float | None) -> str:
    """SECONDS in words for a table: 3d4h, 5h12m, 40m, 12s; '-' for None."""
    if seconds is None:
        return "-"
    s = int(seconds)
    d, h, m = s // 86400, s % 86400 // 3600, s % 3600 // 60
    return f"{d}d{h}h" if d else f"{h}h{m}m" if h else f"{m}m" if m else f"{s}s"
