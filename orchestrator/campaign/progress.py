"""What the operator sees while a campaign runs: a live table of waves and hosts on a terminal (the command line's
cli/campaign_view.py), one plain line per event otherwise (cron mail, CI logs), and always the JSONL event log
($FLEETCTL_HOME/campaigns/ID.jsonl).

The JSONL log is a copy of the history's event table: it is caught up from the history whenever it is opened, so
a crash between a commit and a write loses nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from ..errors import stdout_failed
from ..sanitize import clean_line
from ..history.store import home
from .transitions import Record

def log_path(cid: int) -> Path:
    return home() / "campaigns" / f"{cid}.jsonl"


class EventLog:
    """Appends events to the campaign's JSONL file, never twice, catching up from the history first."""

    def __init__(self, cid: int, history: list[dict[str, Any]]):
        self.path = log_path(cid)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.last = 0
        if self.path.exists():
            text = self.path.read_text()
            if text and not text.endswith("\n"):  # a line cut by a crash: dropped, written again below
                text = text[:text.rfind("\n") + 1]
                self.path.write_text(text)
            for line in text.splitlines():
                try:
                    self.last = max(self.last, json.loads(line)["seq"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a crash: the history has it, it is written again below
        for record in history:
            self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        if record["seq"] <= self.last:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
        self.last = record["seq"]


def describe(record: dict[str, Any]) -> str:
    e = record["event"]
    if e == Record.STEP_STARTED:
        return f"{record['step']} started" + (" (resumed after an interruption)" if record.get("resumed") else "")
    if e == Record.STEP_FINISHED:
        text = f"{record['step']} {record['outcome']} -> {record['state']}"
        return text + (f": {record['reason']}" if record.get("reason") else "")
    if e == Record.BATCH_FINISHED:
        return (f"{record['step']} of {len(record['batch'])} host{'s' if len(record['batch']) != 1 else ''} took "
                f"{record['batch_s']:.1f}s ({record['ansible_s']:.1f}s in ansible-playbook)")
    if e == Record.SOAK_CHECK:
        what = "end-of-soak gate" if record["kind"] == "gate" else "soak check"
        parts = [f"{len(record['ok'])} ok"] + [f"{h} unreachable" for h in record["unreachable"]]
        parts += [f"{h} FAILED: {reason}" for h, reason in record["failed"].items()]
        parts += [f"{h} saw: {'; '.join(seen)}" for h, seen in record.get("seen", {}).items()
                  if h not in record["failed"]]
        return f"{what} after wave {record['gap']}: " + "; ".join(parts)
    if e == Record.CAMPAIGN_STARTED:
        return f"campaign to {record['target']}: " + " | ".join(
            f"wave {i}: {', '.join(hosts)}" for i, hosts in enumerate(record["waves"], 1))
    text = e.replace("_", " ")
    if record.get("state"):
        text += f" -> {record['state']}"
    return text + (f": {record['reason']}" if record.get("reason") else "")


class PlainLines:
    def __init__(self, out: TextIO | None = None):
        self.out = out  # None: standard output as it is when an event comes

    def __call__(self, record: dict[str, Any]) -> None:
        who = f" {record['host']}" if record.get("host") else ""
        out = self.out or sys.stdout
        out.write(clean_line(f"{record['at']} campaign {record['campaign']}{who}: {describe(record)}") + "\n")
        out.flush()


class Display:
    """The display (a live view or plain lines) as the journal's listener sees it: standard output that cannot be
    written any more (a closed pipe, a full disk: errors.stdout_failed) stops the display, said once on stderr, and
    never the campaign: its hosts are mid-change, its events still go to the history, the JSONL log and the
    notifications. FAILED: what stopped it (the command's end says so: cli/campaign.py)."""

    def __init__(self, sink, cid: int):
        self.sink, self.cid = sink, cid
        self.failed: OSError | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        if self.failed is not None:
            return
        try:
            self.sink(record)
        except OSError as e:
            if not stdout_failed(e):
                raise
            self.failed = e
            sys.stderr.write(f"fleetctl: cannot write the standard output ({e.strerror}): campaign {self.cid} goes "
                             f"on, its events in {log_path(self.cid)}\n")


class Fanout:
    """The journal's listener: the JSONL log, then the display."""

    def __init__(self, *sinks):
        self.sinks = [s for s in sinks if s is not None]

    def __call__(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink(record)
