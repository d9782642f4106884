"""What the operator sees while a campaign runs: a live table of waves and hosts on a terminal (rich), one plain
line per event otherwise (cron mail, CI logs), and always the JSONL event log ($FLEETCTL_HOME/campaigns/ID.jsonl).

The JSONL log is a copy of the history's event table: it is caught up from the history whenever it is opened, so
a crash between a commit and a write loses nothing."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..render import safe
from ..sanitize import clean_line
from ..store import home

STATE_STYLE = {"done": "green", "skipped": "dim", "failed": "bold red", "held": "bold yellow",
               "rolled_back": "magenta", "rollback_failed": "bold red", "not_started": "dim"}


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
    if e == "step_started":
        return f"{record['step']} started" + (" (resumed after an interruption)" if record.get("resumed") else "")
    if e == "step_finished":
        text = f"{record['step']} {record['outcome']} -> {record['state']}"
        return text + (f": {record['reason']}" if record.get("reason") else "")
    if e == "batch_finished":
        return (f"{record['step']} of {len(record['batch'])} host{'s' if len(record['batch']) != 1 else ''} took "
                f"{record['batch_s']:.1f}s ({record['ansible_s']:.1f}s in ansible-playbook)")
    if e == "soak_check":
        what = "end-of-soak gate" if record["kind"] == "gate" else "soak check"
        parts = [f"{len(record['ok'])} ok"] + [f"{h} unreachable" for h in record["unreachable"]]
        parts += [f"{h} FAILED: {reason}" for h, reason in record["failed"].items()]
        parts += [f"{h} saw: {'; '.join(seen)}" for h, seen in record.get("seen", {}).items()
                  if h not in record["failed"]]
        return f"{what} after wave {record['gap']}: " + "; ".join(parts)
    if e == "campaign_started":
        return f"campaign to {record['target']}: " + " | ".join(
            f"wave {i}: {', '.join(hosts)}" for i, hosts in enumerate(record["waves"], 1))
    text = e.replace("_", " ")
    if record.get("state"):
        text += f" -> {record['state']}"
    return text + (f": {record['reason']}" if record.get("reason") else "")


class PlainLines:
    def __init__(self, out: TextIO = sys.stdout):
        self.out = out

    def __call__(self, record: dict[str, Any]) -> None:
        who = f" {record['host']}" if record.get("host") else ""
        self.out.write(clean_line(f"{record['at']} campaign {record['campaign']}{who}: {describe(record)}") + "\n")
        self.out.flush()


class LiveView:
    """Waves and hosts, redrawn on every event; the last events below."""

    def __init__(self, console: Console, hosts: list[dict[str, Any]], title: str):
        self.hosts = {h["host"]: dict(h) for h in hosts}
        self.title = title
        self.recent: list[str] = []
        self.soak_until: datetime | None = None
        self.last_check = "none yet"
        self.live = Live(console=console, refresh_per_second=4, transient=False, get_renderable=self.render)

    def soak_line(self) -> str | None:
        """While soaking: the time left, the last check and what it saw (redrawn every refresh)."""
        if self.soak_until is None:
            return None
        left = max(0.0, (self.soak_until - datetime.now(timezone.utc)).total_seconds())
        return f"soaking: {int(left // 3600)}h{int(left % 3600 // 60):02d}m{int(left % 60):02d}s left; " \
               f"last check {self.last_check}"

    def render(self) -> Table:
        caption = self.soak_line()
        t = Table(title=safe(self.title, "table.title"), title_justify="left", expand=False,
                  caption=safe(clean_line(caption), "table.caption") if caption else None, caption_justify="left")
        for col in ("Wave", "Host", "State", "Step", "Reason"):
            t.add_column(col, overflow="fold")
        for h in sorted(self.hosts.values(), key=lambda h: (h["wave"], h["position"])):
            style = STATE_STYLE.get(h["state"], "cyan")
            t.add_row(str(h["wave"]), safe(h["host"]), safe(h["state"], style), safe(h.get("step") or ""),
                      safe((h.get("reason") or "")[:120]))
        for line in self.recent[-5:]:
            t.add_row("", "", "", "", safe(clean_line(line), "dim"))
        return t

    def __call__(self, record: dict[str, Any]) -> None:
        host = self.hosts.get(record.get("host") or "")
        if host is not None:
            if record["event"] == "step_started":
                host["step"] = record["step"] + " ..."
            elif record["event"] == "step_finished":
                host.update(step=record["step"], state=record["state"], reason=record.get("reason"))
            elif record.get("state"):
                host["state"] = record["state"]
        for name, state in (record.get("hosts") or {}).items():
            if name in self.hosts:
                self.hosts[name]["state"] = state
        if record["event"] == "soak_check":
            self.last_check = f"{record['at'][11:19]}: {describe(record)}"[:200]
        elif record.get("state") and record.get("state_from") != record["state"]:
            until = record.get("soak_until")
            self.soak_until = datetime.fromisoformat(until.replace("Z", "+00:00")) \
                if record["state"] == "soaking" and until else None
        self.recent.append(f"{record['at'][11:19]} {record.get('host') or ''} {describe(record)}"[:150])
        self.live.refresh()

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.__exit__(*exc)


class Fanout:
    """The journal's listener: the JSONL log, then the display."""

    def __init__(self, *sinks):
        self.sinks = [s for s in sinks if s is not None]

    def __call__(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink(record)
