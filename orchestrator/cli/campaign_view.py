"""A campaign on the screen: the live table of waves and hosts while it runs on a terminal (the journal's listener
next to the JSONL log: campaign/progress.py), `campaign list` and `campaign show`."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..history import timefmt
from ..campaign import readmodel
from ..campaign import capacity
from ..campaign.progress import describe
from ..campaign.soak import GATE_VERDICTS
from ..campaign.transitions import CampaignState, HostState, Record
from ..judge.gate import median_text, metric_figures, series_label
from ..sanitize import clean_line, one_line
from ..history.store import Store
from .render import STATUS_STYLE, safe

H = HostState  # a campaign done or rolled back looks as a host does
STATE_STYLE = {H.DONE: "green", H.SKIPPED: "dim", H.FAILED: "bold red", H.HELD: "bold yellow",
               H.ROLLED_BACK: "magenta", H.ROLLBACK_FAILED: "bold red", H.NOT_STARTED: "dim"}
# Characters of a campaign's reason in `campaign list`, on one line: a reason recorded by an earlier fleetctl may
# name every series of a gate (`campaign show` has it whole).
LISTED_REASON = 200


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
                      safe(one_line(h.get("reason") or "", LISTED_REASON)))
        for line in self.recent[-5:]:
            t.add_row("", "", "", "", safe(clean_line(line), "dim"))
        return t

    def __call__(self, record: dict[str, Any]) -> None:
        host = self.hosts.get(record.get("host") or "")
        if host is not None:
            if record["event"] == Record.STEP_STARTED:
                host["step"] = record["step"] + " ..."
            elif record["event"] == Record.STEP_FINISHED:
                host.update(step=record["step"], state=record["state"], reason=record.get("reason"))
            elif record.get("state"):
                host["state"] = record["state"]
        for name, state in (record.get("hosts") or {}).items():
            if name in self.hosts:
                self.hosts[name]["state"] = state
        if record["event"] == Record.SOAK_CHECK:
            self.last_check = f"{record['at'][11:19]}: {describe(record)}"[:200]
        elif record.get("state") and record.get("state_from") != record["state"]:
            until = record.get("soak_until")
            self.soak_until = timefmt.parse(until) if record["state"] == CampaignState.SOAKING and until else None
        self.recent.append(f"{record['at'][11:19]} {record.get('host') or ''} {describe(record)}"[:150])
        self.live.refresh()

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.__exit__(*exc)


def list_table(store: Store, console: Console) -> None:
    t = Table(title="fleetctl campaigns", title_justify="left")
    for col in ("ID", "Target", "State", "Wave", "Hosts", "Started", "Operator", "Reason"):
        t.add_column(col, overflow="fold")
    for c in readmodel.listing(store):
        style = STATE_STYLE.get(c["state"], "cyan")
        t.add_row(str(c["id"]), safe(c["target"]), safe(c["state"], style), f"{c['wave']}/{c['waves']}",
                  safe(", ".join(f"{n} {s}" for s, n in sorted(c["hosts"].items()))), safe(c["created_at"][:19]),
                  safe(c["operator"]), safe(one_line(c["reason"] or "", LISTED_REASON)))
    console.print(t)


def show_table(doc: dict[str, Any], console: Console, verbose: bool = False) -> None:
    """The hosts and their one-line reasons; VERBOSE: every gate's reasons in full and its series, one row each."""
    c = doc["campaign"]
    t = Table(title=safe(f"campaign {c['id']} to {c['target']}: {c['state']}", "table.title"), title_justify="left")
    domains = any(h.get("domain") for h in doc["hosts"])  # an NVLink domain's hosts move as one: say which
    for col in ("Wave", *(("Domain",) if domains else ()), "Host", "From", "State", "Steps", "Reason"):
        t.add_column(col, overflow="fold")
    for h in doc["hosts"]:
        steps = " ".join(f"{s['step']}:{s['status']}" + (f"x{s['attempts']}" if s["attempts"] > 1 else "")
                         for s in h["steps"])
        t.add_row(str(h["wave"]), *((safe(h.get("domain") or "-"),) if domains else ()), safe(h["name"]),
                  safe(h["from_version"] or ""),
                  safe(h["state"], STATE_STYLE.get(h["state"], "cyan")), safe(steps), safe(h["reason"] or ""))
    console.print(t)
    s = doc["soak"]
    if s["soaking"]:
        console.print(Text(clean_line(f"soaking after wave {s['after_wave']}: {s['remaining_s']:.0f}s left; last "
                                      f"check {(s['last_check_at'] or 'none yet')[:19]}")))
    for name, h in s["hosts"].items():
        if h["last"]:
            seen = "; ".join(h["last"]["seen"]) or "nothing wrong"
            console.print(Text(clean_line(f"soak {name}: {h['checks']} checks, {h['failed_canary_runs']} failed canary "
                                          f"runs; last {h['last']['kind']} {h['last']['status']} at "
                                          f"{h['last']['at'][11:19]}: {seen}"[:300])))
    if s.get("canary_metrics"):
        metrics_table(s["canary_metrics"], console)
    capacity_lines(doc["capacity"], console)
    if c["reason"]:
        console.print(Text(clean_line(f"reason: {c['reason']}")))
    if verbose:
        gates_table(doc, console)
    console.print(Text(clean_line(f"exit {c['exit_code']}; event log: {doc['event_log']}")))


def capacity_lines(figures: dict[str, Any], console: Console) -> None:
    """What the campaign cost in capacity (campaign/capacity.py): a line per wave, one for the campaign."""
    for w in figures["waves"]:
        console.print(Text(f"capacity wave {w['wave']}: {capacity.text(w)}"))
    console.print(Text(f"capacity in all: {capacity.text(figures, each=True)}"))


VERDICT_STYLE = {"pass": "green", "fail": "bold red", "no_verdict": "yellow", "missing": "magenta"}


def metrics_table(judged: dict[str, Any], console: Console) -> None:
    """The canary metrics' latest verdicts (the soak's, docs/canary.md): canary against control, one row a metric."""
    t = Table(title=safe(f"canary metrics, {judged['kind']} after wave {judged['gap']} at {judged['at'][11:19]}",
                         "table.title"), title_justify="left")
    for col in ("Metric", "Canary", "Control", "Change", "95% CI", "p", "Verdict"):
        t.add_column(col, overflow="fold")
    for m in judged["metrics"]:
        t.add_row(safe(m["name"]), *metric_figures(m), safe(m["verdict"], VERDICT_STYLE.get(m["verdict"], "cyan")))
    console.print(t)


def gates(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(host, which gate, its verdict) for every gate a host did not pass: the gate steps' and the soak's."""
    out = []
    for h in doc["hosts"]:
        out += [(h["name"], s["step"], s["detail"]["figures"]) for s in h["steps"]
                if s["status"] in ("fail", "inconclusive") and (s["detail"] or {}).get("figures")]
    for name, h in doc["soak"]["hosts"].items():
        out += [(name, f"{what} after wave {g['gap']}", g[key]) for g in h.get("gate_verdicts", [])
                for key, what in GATE_VERDICTS.items()
                if (g.get(key) or {}).get("status", "pass") != "pass"]
    return out


def gates_table(doc: dict[str, Any], console: Console) -> None:
    """campaign show --verbose: each failed gate's reasons in full, then its series (GPU, metric) one row each."""
    t = Table(title="gate series", title_justify="left")
    for col in ("Host", "Gate", "Series", "Before", "After", "Change", "p", "n", "Status"):
        t.add_column(col, overflow="fold", justify="left" if col in ("Host", "Gate", "Series", "Status") else "right")
    for host, which, verdict in gates(doc):
        for reason in verdict["reasons"]:
            console.print(Text(clean_line(f"{host} {which}: {reason}")))
        for f in verdict["figures"]:
            t.add_row(safe(host), safe(which), safe(series_label(f["gpu"], f["metric"])),
                      _num(f.get("median_before"), median_text), _num(f.get("median_after"), median_text),
                      _num(f.get("change"), "{:+.1%}".format), _num(f.get("p_value"), "{:.2g}".format),
                      f"{f.get('n_before', '')}/{f.get('n_after', '')}",
                      safe(" ".join(str(f[k]) for k in ("status", "rule") if f.get(k)),
                           STATUS_STYLE.get(f.get("status"), "")))
    if t.row_count:
        console.print(t)


def _num(value: float | None, text: Callable[[float], str]) -> str:
    return "" if value is None else text(value)


def live(console: Console) -> Callable[[list[dict[str, Any]], str], LiveView] | None:
    """What upgrade.drive is given to show a campaign: a live view on a terminal, None otherwise (plain lines)."""
    if not console.is_terminal:
        return None
    return lambda hosts, title: LiveView(console, hosts, title)
