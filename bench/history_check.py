#!/usr/bin/env python3
"""What SQLite's check of the history costs every command that opens it, as the history grows.

    python bench/history_check.py [AUDITS] [HOSTS]

Fills a fresh history as bench/report_export.py does (AUDITS audits of HOSTS real H100 host entries), then times
`PRAGMA quick_check` and `PRAGMA integrity_check` (what each fleetctl process runs once before it reads or writes
the history; quick_check misses an index that no longer matches its table) with the file's pages cached and read
from disk (dropped from the page cache first), and `fleetctl metrics` and `fleetctl campaign list` as a whole.
Prints medians of 3."""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_export import fill, timed  # noqa: E402


def uncache(path: Path) -> None:
    """Drop PATH's pages from the page cache: the next read comes from disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def pragma(path: Path, name: str, cold: bool) -> float:
    runs = []
    for _ in range(3):
        if cold:
            uncache(path)
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        started = time.perf_counter()
        assert db.execute(f"PRAGMA {name}(1)").fetchone()[0] == "ok"
        runs.append(time.perf_counter() - started)
        db.close()
    return statistics.median(runs)


def main() -> None:
    audits = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    hosts = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        fill(home, audits, hosts)
        path = home / "history.sqlite3"
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        print(f"history: {audits} audits x {hosts} hosts x 27 findings, {path.stat().st_size / 2**20:.1f} MiB")
        for name in ("quick_check", "integrity_check"):
            print(f"PRAGMA {name:<16} cached {pragma(path, name, False):6.2f}s  from disk "
                  f"{pragma(path, name, True):6.2f}s")
        for args in (("metrics",), ("campaign", "list")):
            wall, _ = timed(home, *args)
            print(f"fleetctl {' '.join(args):<15} {wall:6.2f}s")


if __name__ == "__main__":
    main()
