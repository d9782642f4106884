"""What a campaign cost in capacity, read off its journal (the campaign_steps rows; no table of its own).

A host is one node. Each time a campaign takes a host out of service is a pass: forward (drain .. undrain, or the
release of a host that changed nothing) and rollback (rollback_drain .. rollback_undrain). A pass's time splits in
three:

- busy: drained while the host's own jobs still ran (drain finished .. the host found idle: wait_idle's `idle_at`,
  else its finish);
- idle: drained and idle, the waste (idle .. the install began; a host released without a change: .. it was back);
- change: install began .. back in service (undrain or release finished).

A pass not back yet counts up to now (a finished campaign: up to its end); a forward pass that never came back (a
failed install) ends where the host's rollback pass begins. Per wave and per campaign the sums are node-hours. The
capacity budget (--capacity-budget) counts what the fleet lost: idle and change (a drained host whose own jobs still
run loses nothing), and pacing() says why no further host may be drained now.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from ..history.timefmt import parse as parse_time, stamp
from .options import CampaignOptions
from .transitions import CAMPAIGN_TERMINAL, HostState as H

KINDS = ("busy", "idle", "change")  # a pass's three parts, in the order they come
COST = ("idle", "change")  # what the fleet loses, and the capacity budget counts
UNIT = "node-hours (a host is one node)"


@dataclass(frozen=True)
class Phases:
    """The steps that bound one kind of pass."""
    kind: str
    drain: str
    wait: str
    change: str
    back: tuple[str, ...]


PHASES = (Phases("forward", H.DRAIN, H.WAIT_IDLE, H.INSTALL, (H.UNDRAIN, H.RELEASE)),
          Phases("rollback", H.ROLLBACK_DRAIN, H.ROLLBACK_WAIT_IDLE, H.ROLLBACK_INSTALL, (H.ROLLBACK_UNDRAIN,)))


@dataclass(frozen=True)
class Pass:
    """One host out of service once: when it was drained, found idle, began its change, came back (None: not yet)
    and until when it is counted (back, or now)."""
    host: str
    wave: int
    kind: str
    drained_at: datetime
    idle_at: datetime | None
    change_at: datetime | None
    back_at: datetime | None
    end: datetime

    @property
    def under_way(self) -> bool:
        return self.back_at is None

    def seconds(self) -> dict[str, float]:
        """busy, idle and change, in seconds: together the time from the drain to the end."""
        idle = self.idle_at or self.change_at or self.end
        change = self.change_at or self.end
        return {"busy": (idle - self.drained_at).total_seconds(),
                "idle": (change - idle).total_seconds() if self.idle_at else 0.0,
                "change": (self.end - change).total_seconds() if self.change_at else 0.0}

    def cost_s(self) -> float:
        s = self.seconds()
        return sum(s[k] for k in COST)

    def as_dict(self) -> dict[str, Any]:
        when = {k: stamp(v) if v else None for k, v in (("drained_at", self.drained_at), ("idle_at", self.idle_at),
                                                         ("change_at", self.change_at), ("back_at", self.back_at))}
        return {"host": self.host, "wave": self.wave, "pass": self.kind, **when, "under_way": self.under_way,
                **{f"{k}_s": round(v, 3) for k, v in self.seconds().items()}}


def _at(row: Mapping[str, Any] | None, key: str) -> datetime | None:
    return parse_time(row[key]) if row is not None and row[key] else None


def _idle_at(row: Mapping[str, Any] | None) -> datetime | None:
    """When a finished, passed wait_idle found the host idle: its detail's idle_at, else (a campaign recorded before
    it) when the step finished."""
    if row is None or row["status"] != "ok" or not row["finished_at"]:
        return None
    detail = row["detail"]
    detail = json.loads(detail) if isinstance(detail, str) else detail or {}
    return parse_time(detail["idle_at"]) if detail.get("idle_at") else parse_time(row["finished_at"])


def passes(rows: Iterable[Mapping[str, Any]], waves: Mapping[str, int], now: datetime) -> list[Pass]:
    """Every pass in ROWS (campaign_steps rows: host, step, status, started_at, finished_at, detail), by host in
    WAVES' order (host -> its wave), forward first; a pass not back yet counted up to NOW."""
    by_host: dict[str, dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        by_host.setdefault(r["host"], {})[r["step"]] = r
    order = {h: i for i, h in enumerate(waves)}
    out = []
    for host in sorted(by_host, key=lambda h: (waves.get(h, 0), order.get(h, len(order)), h)):
        steps, found = by_host[host], []
        for p in PHASES:
            drain = steps.get(p.drain)
            if drain is None or drain["status"] != "ok" or not drain["finished_at"]:
                continue  # never taken out of service (a failed drain: released as it was)
            back = min((t for t in (_at(steps.get(b), "finished_at") for b in p.back) if t), default=None)
            found.append((_at(drain, "finished_at"), _idle_at(steps.get(p.wait)),
                          _at(steps.get(p.change), "started_at"), back, p.kind))
        for i, (drained, idle, change, back, kind) in enumerate(found):
            following = found[i + 1][0] if i + 1 < len(found) else None
            end = max(drained, back or following or now)  # a forward pass never back: until the rollback's drain
            idle = min(max(idle, drained), end) if idle else None  # within the pass, whatever the clocks said
            change = min(max(change, idle or drained), end) if change else None
            out.append(Pass(host, waves.get(host, 0), kind, drained, idle, change, back or following, end))
    return out


def node_hours(ps: Iterable[Pass]) -> dict[str, Any]:
    """The sums of PS, in node-hours (KINDS), and how many hosts they are."""
    ps = list(ps)
    sums = {k: 0.0 for k in KINDS}
    for p in ps:
        for k, v in p.seconds().items():
            sums[k] += v
    return {**{k: round(v / 3600, 4) for k, v in sums.items()}, "hosts": len({p.host for p in ps})}


def figures(rows: Iterable[Mapping[str, Any]], waves: Mapping[str, int], now: datetime,
            budget_node_hours: float | None = None) -> dict[str, Any]:
    """The capacity document (`campaign show --format json`'s `capacity`): the campaign's sums and each wave's in
    node-hours, every pass's figures in seconds, and the budget (None without one)."""
    ps = passes(rows, waves, now)
    total = node_hours(ps)
    spent = sum(p.cost_s() for p in ps) / 3600
    return {"unit": UNIT, "until": stamp(now), **total,
            "waves": [{"wave": w, **node_hours(p for p in ps if p.wave == w)} for w in sorted(set(waves.values()))],
            "passes": [p.as_dict() for p in ps],
            "budget": None if budget_node_hours is None else {
                "node_hours": budget_node_hours, "spent": round(spent, 4), "left": round(budget_node_hours - spent, 4),
                "counts": list(COST)}}


def text(sums: Mapping[str, Any], each: bool = False) -> str:
    """SUMS (a wave's or the campaign's) in words: 'busy 0.67, idle 0.02, change 0.23 node-hours (1 host)', then the
    budget where SUMS has one; EACH: say that a host is one node."""
    hosts = sums["hosts"]
    out = (", ".join(f"{k} {sums[k]:.2f}" for k in KINDS)
           + f" node-hours ({hosts} host{'s' if hosts != 1 else ''}{', a node each' if each else ''})")
    budget = sums.get("budget")
    return out + (f"; budget {budget['node_hours']:g}: {budget['spent']:.2f} spent" if budget else "")


def summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The capacity document DOC without each pass (the report's, the notification's)."""
    return {k: v for k, v in doc.items() if k != "passes"}


# ---- a campaign of the history ----------------------------------------------------------------------------------

def _read(journal: Any, cid: int, now: datetime | None) -> tuple[Any, list[Any], dict[str, int], datetime]:
    """Campaign CID's row, step rows, hosts' waves, and until when a pass under way counts (a finished campaign: its
    end; else NOW, default now)."""
    c = journal.campaign(cid)
    until = parse_time(c["updated_at"]) if c["state"] in CAMPAIGN_TERMINAL else now or datetime.now(timezone.utc)
    return c, journal.steps(cid), {r["host"]: r["wave"] for r in journal.hosts(cid)}, until


def of_campaign(journal: Any, cid: int, now: datetime | None = None) -> dict[str, Any]:
    """Campaign CID's capacity figures (figures()): passes under way counted up to NOW (default: now; a finished
    campaign's up to when it finished)."""
    c, rows, waves, until = _read(journal, cid, now)
    return figures(rows, waves, until, CampaignOptions.from_dict(json.loads(c["options"])).capacity_budget_node_hours)


def _spent(journal: Any, cid: int, now: datetime | None) -> tuple[float, list[Pass]]:
    """Node-hours campaign CID has cost the fleet (COST), and its passes."""
    _, rows, waves, until = _read(journal, cid, now)
    ps = passes(rows, waves, until)
    return sum(p.cost_s() for p in ps) / 3600, ps


def budget_left(journal: Any, cid: int, options: CampaignOptions, now: datetime | None = None) -> float | None:
    """Node-hours left of campaign CID's capacity budget (negative: overspent); None without a budget."""
    if options.capacity_budget_node_hours is None:
        return None
    return options.capacity_budget_node_hours - _spent(journal, cid, now)[0]


def pacing(journal: Any, cid: int, options: CampaignOptions, now: datetime | None = None,
           hosts: int = 1) -> str | None:
    """Why HOSTS more (an NVLink domain's) may not be drained now, in one line; None when the budget allows them
    (or there is none). Spent is what the passes cost so far; a host is expected to cost what the campaign's
    finished forward passes cost (their median; none finished yet: nothing), and each host out of service what it
    has still to cost of that. More hosts are drained only while spent and expected fit in the budget."""
    budget = options.capacity_budget_node_hours
    if budget is None:
        return None
    spent, ps = _spent(journal, cid, now)
    done = [p.cost_s() / 3600 for p in ps if p.kind == "forward" and not p.under_way]
    each = statistics.median(done) if done else 0.0
    out = [p for p in ps if p.under_way]
    coming = sum(max(0.0, each - p.cost_s() / 3600) for p in out)
    if spent + coming + hosts * each <= budget:
        return None
    line = f"capacity budget: {spent:.1f} of {budget:g} node-hours spent"
    if spent < budget:
        line += (f", {coming:.1f} more expected of the {len(out)} host{'s' if len(out) != 1 else ''} out of service"
                 if out else "") + f", {each:.1f} per host drained"
    return line
