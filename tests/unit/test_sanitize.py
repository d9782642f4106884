"""Issue 36, item 8: text from hosts and files shows every character a terminal, a spreadsheet or a browser could
act on or hide (a right-to-left override, a zero-width space, BEL, BS, CR...) as its escape, the same in every
output format: the terminal's table and lines, CSV, HTML, Slack and Teams notifications. JSON keeps the data."""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from orchestrator.notify import send as notify, events as notify_events
from orchestrator import report
from orchestrator.cli import render
from orchestrator.sanitize import clean, clean_line, one_line, visible
from orchestrator.history.store import Store

# What the terminal table let through before (U+200B, U+061C, U+FEFF, U+2028), what it stripped, and more.
HIDDEN = {"\u202e": "\\u202e", "\u2066": "\\u2066", "\u200b": "\\u200b", "\u200d": "\\u200d", "\u061c": "\\u061c",
          "\ufeff": "\\ufeff", "\u2028": "\\u2028", "\u2029": "\\u2029", "\x07": "\\x07", "\x08": "\\x08",
          "\r": "\\r", "\x1b": "\\x1b", "\x9b": "\\x9b", "\x00": "\\x00", "\xa0": "\\xa0", "\U000e0041": "\\U000e0041"}


def test_the_rule():
    for ch, shown in HIDDEN.items():
        assert visible(f"gpu{ch}01") == f"gpu{shown}01" == clean(f"gpu{ch}01") == clean_line(f"gpu{ch}01")
    assert visible("gpü-01 [/red] \\u202e") == "gpü-01 [/red] \\u202e"  # printable text stays as it is
    assert clean("a\nb\tc") == "a\nb\tc" and clean_line("a\nb\tc") == "a\\nb\\tc"
    assert visible("\x1b]0;pwned\x07") == "\\x1b]0;pwned\\x07"  # an escape sequence is seen, not acted on
    assert one_line("said:\n  gpu\u202e01\r\n\x07") == "said: gpu\\u202e01 \\x07"  # white space squeezed


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A history whose one audited host, its groups and its finding each hold every HIDDEN character; the report
    in each format."""
    home = tmp_path_factory.mktemp("home")
    text = "".join(HIDDEN)
    base = SimpleNamespace(name=f"base{text}", path="/x.yml", digest="sha256:" + "0" * 64)
    with Store(home / "history.sqlite3") as store:
        run_id, _ = store.begin_run("audit", ["audit"], "hosts.yml", None, base)
        store.finish_run(run_id, 1, {}, [{
            "name": f"gpu{text}01", "reachable": True, "groups": [f"rack{text}", "all"],
            "facts": {"driver": {"module_version": f"570{text}"}},
            "findings": [{"control": "driver.installed", "severity": "high", "status": "fail",
                          "message": f"bad{text}news", "evidence": {"seen": text}, "remediation": None}]}])
        doc = report.build(store)
    return doc


def escaped(out: str, *shows: str) -> None:
    """OUT has no HIDDEN character, and the host, the message and what else SHOWS names with all of them escaped."""
    assert not set(HIDDEN) & set(out), sorted(set(HIDDEN) & set(out))
    shown = "".join(HIDDEN.values())
    for value in (f"gpu{shown}01", f"bad{shown}news", *(f"{s}{shown}" for s in shows)):
        assert value in out, value


def test_csv(exports):
    out = report.to_csv(exports)
    escaped(out, "rack")
    rows = list(csv.DictReader(io.StringIO(out[:out.rindex("# chain head")], newline="")))
    assert len(rows) == 1 and len(out.splitlines()) == 3  # a CR or a line separator starts no row of its own


def test_html(exports):
    out = report.to_html(exports)
    escaped(out, "base", "570")  # the baseline's name, a chart's label (the driver versions)


def test_terminal_table(exports):
    host = exports["hosts"][0]
    audit = {"run": {"id": 1, "baseline": {"name": host["audit"]["baseline"]["name"]}},
             "hosts": [{"name": host["name"], "groups": host["groups"], "findings": host["findings"]}],
             "summary": {"hosts": 1, "compliant": 0, "noncompliant": 1, "unreachable": 0, "exit_code": 1,
                         "findings": {"fail": 1, "error": 0, "warn": 0}, "fail_on": "high", "duration_s": 1.0}}
    buf = io.StringIO()
    render.print_audit(audit, Console(file=buf, width=400, force_terminal=False), True)
    escaped(buf.getvalue().replace("\n", ""), "rack", "base")  # rich folds the long cells: the escapes read across its lines


def strings(doc) -> list[str]:
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in strings(v)]
    return [doc] if isinstance(doc, str) else []


@pytest.mark.parametrize("fmt", ["slack", "teams"])
def test_notifications(exports, fmt):
    host = exports["hosts"][0]
    event = notify_events.envelope("findings", "warning", "audit",
                                   f"{host['name']}: {host['findings'][0]['message']}", None,
                                   run={"kind": "audit", "id": 1, "inventory": f"rack{''.join(HIDDEN)}"},
                                   host=host["name"])
    escaped(" ".join(strings(notify.shape(event, fmt))), "rack")
    assert notify.shape(event, "json") == event  # the event itself: JSON keeps the data


def test_json_keeps_the_data(exports):
    assert exports["hosts"][0]["name"] == "gpu" + "".join(HIDDEN) + "01"
