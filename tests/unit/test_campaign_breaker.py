"""The campaign's circuit breaker (baseline campaign.breaker, issue 44): failures across waves, each wave within its
own budget, halt the campaign once they reach the breaker's limit within its window. Driven by the real engine with
scripted steps (tests/helpers/campaign.py), the journal's times set by the test clock."""

from __future__ import annotations

import os

import pytest

from orchestrator import baseline as baseline_mod, plan
from orchestrator.fleet import inventory
from orchestrator.notify import send as notify
from orchestrator.history import timefmt
from orchestrator.campaign import engine as engine_mod, soak, transitions
from orchestrator.campaign.engine import Engine
from orchestrator.campaign.journal import Journal
from orchestrator.errors import InputError
from orchestrator.exitcodes import Exit
from tests.helpers.campaign import Script, options_of, parts, plan_of
from tests.helpers.facts import entry, on
from tests.helpers.notify import drive, valid

T0 = "2026-03-02T10:00:00Z"


@pytest.fixture
def store(quick_webhooks, store):
    """The store, its notifications quick (conftest.py's quick_webhooks)."""
    return store


class Timed(Script):
    """A Script whose precheck of a host named in AT sets the journal's clock (FLEETCTL_TEST_CLOCK) first: the wave
    that host is in runs at that time."""

    def __init__(self, outcomes, at: dict[str, str] | None = None):
        super().__init__(outcomes)
        self.at = at or {}

    def __getitem__(self, step):
        run = super().__getitem__(step)

        def timed(ctx, hosts):
            for h in hosts:
                if step == "precheck" and h in self.at:
                    os.environ[timefmt.TEST_CLOCK] = self.at[h]
            return run(ctx, hosts)
        return timed


def wave(name: str, size: int = 10) -> list[str]:
    return [f"{name}{i}" for i in range(size)]


def begin(store, script, *waves, breaker=None, **options):
    """As helpers.campaign.start, with the plan's breaker as plan.breaker reads it off a baseline policy."""
    names = [h for w in waves for h in w]
    fleet = inventory.Fleet("test", tuple(inventory.Host(n, ("all",)) for n in names), frozenset({"all"}), {})
    journal = Journal(store)
    run_id, _ = store.begin_run("campaign", [], "test", None, None)
    made = plan_of(*waves)
    made["breaker"] = plan.breaker([{"campaign": {"breaker": breaker}}] if breaker else [{}])
    cid, _ = journal.create(run_id, made, options_of(**options))
    return journal, cid, Engine(journal, journal.handle(cid), fleet, baseline_mod.load(None), parts(script))


BREAKER = {"failures": 2, "percent": 5, "within": "1h"}


def test_failures_across_two_waves_each_within_its_budget_halt_the_campaign(store, monkeypatch):
    monkeypatch.setenv(timefmt.TEST_CLOCK, T0)
    script = Timed({("a3", "verify"): "fail", ("b5", "install"): "fail"}, at={"b0": "2026-03-02T10:40:00Z"})
    journal, cid, engine = begin(store, script, ["c"], wave("a"), wave("b"), wave("d"), breaker=BREAKER)
    state = engine.run()
    assert state == "halted" and transitions.CAMPAIGN_EXIT[state] == Exit.HALTED
    c = journal.campaign(cid)
    assert "\n" not in c["reason"] and c["reason"] == (
        "the circuit breaker tripped: 2 hosts failed within 1h (halts at >= max(2 hosts, 5% of 21 hosts changed "
        "within 1h) = 2): a3 (verify: verify fail), b5 (install: install fail)")
    tripped = [e for e in journal.events(cid) if e["event"] == "breaker_tripped"]
    assert len(tripped) == 1 and tripped[0]["failures"] == {"a3": "verify", "b5": "install"}
    rows = {r["host"]: r["state"] for r in journal.hosts(cid)}
    assert rows["a3"] == rows["b5"] == "rolled_back"  # each within its wave's budget: rolled back alone
    assert {rows[h] for h in wave("d")} == {"precheck"}  # no host of the next wave was touched


def test_the_same_failures_spread_beyond_the_window_do_not_halt(store, monkeypatch):
    monkeypatch.setenv(timefmt.TEST_CLOCK, T0)
    script = Timed({("a3", "verify"): "fail", ("b5", "install"): "fail"}, at={"b0": "2026-03-02T11:30:00Z"})
    journal, cid, engine = begin(store, script, ["c"], wave("a"), wave("b"), wave("d"), breaker=BREAKER)
    assert engine.run() == "done"
    assert not [e for e in journal.events(cid) if e["event"] == "breaker_tripped"]


def test_the_percent_of_hosts_changed_within_the_window_raises_the_limit(store, monkeypatch):
    monkeypatch.setenv(timefmt.TEST_CLOCK, T0)
    script = Timed({("a3", "verify"): "fail", ("b5", "install"): "fail"})
    journal, cid, engine = begin(store, script, ["c"], wave("a"), wave("b"),
                                 breaker={"failures": 2, "percent": 10, "within": "1h"})
    assert engine.run() == "done"  # 21 hosts changed within the hour: 10% of them is 3


def test_no_breaker_by_default(store, monkeypatch):
    monkeypatch.setenv(timefmt.TEST_CLOCK, T0)
    script = Timed({("a3", "verify"): "fail", ("b5", "install"): "fail"})
    journal, cid, engine = begin(store, script, ["c"], wave("a"), wave("b"))
    assert journal.handle(cid).plan["breaker"] is None
    assert engine.run() == "done"


def test_resume_counts_only_failures_after_the_trip(store, monkeypatch):
    monkeypatch.setenv(timefmt.TEST_CLOCK, T0)
    script = Timed({("a3", "verify"): "fail", ("b5", "install"): "fail", ("d1", "verify"): "fail",
                    ("e2", "verify"): "fail"})
    journal, cid, engine = begin(store, script, ["c"], wave("a"), wave("b"), wave("d"), wave("e"), wave("f"),
                                 breaker={"failures": 2, "within": "1h"})
    assert engine.run() == "halted"
    engine_mod.accept_held(journal, cid)
    # the two failures it tripped on count no more: d1 alone does not trip it, d1 and e2 do
    assert engine.run() == "halted"
    tripped = [e for e in journal.events(cid) if e["event"] == "breaker_tripped"]
    assert [t["failures"] for t in tripped] == [{"a3": "verify", "b5": "install"}, {"d1": "verify", "e2": "verify"}]
    assert {r["state"] for r in journal.hosts(cid) if r["wave"] == 6} == {"precheck"}


def test_a_soak_failure_counts(store, monkeypatch):
    monkeypatch.setenv(timefmt.TEST_CLOCK, T0)

    def observe(ctx, hosts, gate):
        return {h: soak.Observation("fail" if h == "a7" and gate else "ok", "Xid 79" if h == "a7" and gate else None,
                                    {}) for h in hosts}
    script = Timed({("a3", "verify"): "fail"})
    names = ["c"] + wave("a") + wave("b")
    fleet = inventory.Fleet("test", tuple(inventory.Host(n, ("all",)) for n in names), frozenset({"all"}), {})
    journal = Journal(store)
    run_id, _ = store.begin_run("campaign", [], "test", None, None)
    made = plan_of(["c"], wave("a"), wave("b"), fail_at=[1, 3, 3])
    made["breaker"] = plan.breaker([{"campaign": {"breaker": BREAKER}}])
    cid, _ = journal.create(run_id, made, options_of(soak_s=0.01, soak_interval_s=60))
    engine = Engine(journal, journal.handle(cid), fleet, baseline_mod.load(None), parts(script, observe))
    assert engine.run() == "halted"
    assert journal.campaign(cid)["reason"].endswith("a3 (verify: verify fail), a7 (soak: Xid 79)")


def test_the_breaker_is_notified(store, monkeypatch, receivers):  # noqa: F811 (the fixtures)
    monkeypatch.setenv(timefmt.TEST_CLOCK, T0)
    hook = receivers()
    notifier = notify.build([], [hook.url()], "json", None, None, 5)
    script = Timed({("a3", "verify"): "fail", ("b5", "install"): "fail"})
    journal, cid, engine = begin(store, script, ["c"], wave("a"), wave("b"), wave("d"), breaker=BREAKER)
    assert drive(journal, cid, engine, notifier) == "halted"
    note = valid(hook.bodies()[-1])
    assert note["event"] == "halted" and note["severity"] == "critical"
    assert "circuit breaker tripped" in note["summary"] and "a3 (verify" in note["summary"]
    assert f"fleetctl campaign resume {cid}" in note["action"] and f"fleetctl rollback {cid}" in note["action"]


def test_plan_takes_the_strictest_breaker_of_its_hosts_policies():
    assert plan.breaker([{}, {"campaign": {"budget_hosts": 3}}]) is None
    b = plan.breaker([{"campaign": {"breaker": {"failures": 3, "within": "2h"}}},
                      {"campaign": {"breaker": {"failures": 2, "percent": 5, "within": "30m"}}}])
    assert (b["failures"], b["percent"], b["within_s"]) == (2, 5, 1800)


@pytest.mark.parametrize("breaker, error", [
    ("{failures: 0, within: 1h}", r"\$\.groups\.all\.campaign\.breaker\.failures: 0 is less than the minimum of 1"),
    ("{failures: 2, within: -1h}", r"\$\.groups\.all\.campaign\.breaker\.within: '-1h' does not match"),
    ("{failures: 2, within: 0h}", r"\$\.groups\.all\.campaign\.breaker\.within: '0h' does not match"),
    ("{failures: 2, percent: 0, within: 1h}", r"\$\.groups\.all\.campaign\.breaker\.percent: 0 is less than or "),
])
def test_a_bad_breaker_is_one_line(tmp_path, breaker, error):
    path = tmp_path / "b.yml"
    path.write_text(f"schema_version: 1\ngroups:\n  all:\n    campaign: {{breaker: {breaker}}}\n")
    with pytest.raises(InputError, match=error) as e:
        baseline_mod.load(path)
    assert "\n" not in str(e.value) and e.value.exit_code == Exit.USAGE == 2


def test_the_plan_records_the_breaker_of_its_hosts_groups(device_facts, tmp_path):  # noqa: F811 (the fixture)
    path = tmp_path / "matrix.yml"
    path.write_text("schema_version: 1\ngroups:\n  all:\n    driver: {branches: ['550', '570']}\n"
                    "    campaign: {breaker: {failures: 3, percent: 5, within: 2h}}\n"
                    "  h100:\n    campaign: {breaker: {failures: 2, within: 1h}}\n")
    base = baseline_mod.load(path)
    facts = on(device_facts, "550.163.01")
    entries = [entry("h100-1", ["gpu", "h100"], facts, base), entry("l40s-1", ["gpu", "l40s"], facts, base)]
    # h100 inherits the percent of all (deep merge, as every baseline key); the strictest of the two groups wins
    assert plan.build("570.86.15", plan.parse_ramp("100%"), entries, base)["breaker"] == {
        "failures": 2, "percent": 5, "within_s": 3600, "within": "1h"}
    assert plan.build("570.86.15", plan.parse_ramp("100%"), entries[1:], base)["breaker"] == {
        "failures": 3, "percent": 5, "within_s": 7200, "within": "2h"}


def test_a_dry_run_or_plan_shows_the_breaker(device_facts, tmp_path):  # noqa: F811 (the fixture)
    from rich.console import Console

    from orchestrator.cli import render
    path = tmp_path / "matrix.yml"
    path.write_text("schema_version: 1\ngroups:\n  all:\n    driver: {branches: ['550', '570']}\n"
                    "    campaign: {breaker: {failures: 2, percent: 5, within: 1h}}\n")
    base = baseline_mod.load(path)
    entries = [entry("h100-1", ["gpu", "h100"], on(device_facts, "550.163.01"), base)]
    console = Console(record=True, width=200)
    report = plan.build("570.86.15", plan.parse_ramp("100%"), entries, base)
    report["summary"] = {"hosts": 1, "eligible": 1, "waves": 1, "skipped": 0, "excluded": 0, "unreachable": 0,
                         "exit_code": 0, "duration_s": 1.0}
    report["run"] = {"id": 1, "baseline": {"name": "matrix"}}
    render.print_plan(report, console)
    assert ("circuit breaker: the campaign halts (exit 5) once max(2 failed hosts, 5% of the hosts changed within "
            "it) failed within 1h, across waves") in console.export_text()
