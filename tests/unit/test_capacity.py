"""What a campaign costs in capacity (campaign/capacity.py): each host's time out of service split into busy (its own
jobs still ran), idle (the waste) and change, from step rows built by hand, then from real campaigns driven by the
real engine and journal with scripted steps on a clock the test moves (tests/helpers/campaign.py), as
`campaign show` prints them; and the capacity budget's line."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from orchestrator import upgrade
from orchestrator.campaign import capacity
from orchestrator.campaign.engine import Engine, Parts, accept_held
from orchestrator.campaign.options import CampaignOptions
from orchestrator.history.timefmt import stamp
from tests.helpers.campaign import Clocked, start
from tests.helpers.cli import fleetctl

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=timezone.utc)


def at(minutes: float) -> str:
    return stamp(T0 + timedelta(minutes=minutes))


def row(host, step, status, started, finished=None, detail=None) -> dict:
    """A campaign_steps row as the journal writes it (times in minutes after T0)."""
    return {"host": host, "step": step, "status": status, "started_at": at(started),
            "finished_at": None if finished is None else at(finished),
            "detail": None if detail is None else json.dumps(detail)}


def upgraded(host, drained, idle, change, back, rest="ok") -> list[dict]:
    return [row(host, "drain", "ok", drained - 0.1, drained),
            row(host, "wait_idle", "ok", drained, idle + 0.5, {"users": [], "idle_at": at(idle)}),
            row(host, "install", "ok", change, change + 5), row(host, "undrain", rest, back - 0.1, back)]


def test_a_hosts_time_out_of_service_splits_into_busy_idle_and_change():
    rows = [
        # drained at t0, its job ends at +40 min, installed at +41, undrained at +55
        *upgraded("a", 0, 40, 41, 55),
        # its install fails at +50: it stays out of service until its rollback drains it again at +60 (a pass of
        # its own: idle at once, the old driver back at +80)
        row("b", "drain", "ok", 0, 0), row("b", "wait_idle", "ok", 0, 10, {"idle_at": at(10)}),
        row("b", "install", "fail", 30, 50),
        row("b", "rollback_drain", "ok", 59, 60), row("b", "rollback_wait_idle", "ok", 60, 61),  # before idle_at
        row("b", "rollback_install", "ok", 62, 70), row("b", "rollback_undrain", "ok", 79, 80),
        # its jobs outlast --idle-timeout: released at +300, never idle
        row("c", "drain", "ok", 0, 0), row("c", "wait_idle", "fail", 0, 299.5), row("c", "release", "ok", 299.5, 300),
        # idle at +5, released at +7 when a host of its NVLink domain failed: nothing changed
        row("d", "drain", "ok", 0, 0), row("d", "wait_idle", "ok", 0, 5, {"idle_at": at(5)}),
        row("d", "release", "ok", 6, 7),
        # a failed drain takes nothing out of service
        row("g", "drain", "fail", 0, 1), row("g", "release", "ok", 1, 2),
    ]
    waves = {"a": 1, "b": 2, "c": 2, "d": 2, "g": 2}
    doc = capacity.figures(rows, waves, T0 + timedelta(hours=10))
    seconds = {(p["host"], p["pass"]): (p["busy_s"], p["idle_s"], p["change_s"]) for p in doc["passes"]}
    assert seconds == {("a", "forward"): (40 * 60, 60, 14 * 60),
                       ("b", "forward"): (10 * 60, 20 * 60, 30 * 60), ("b", "rollback"): (60, 60, 18 * 60),
                       ("c", "forward"): (300 * 60, 0, 0), ("d", "forward"): (5 * 60, 2 * 60, 0)}
    assert not any(p["under_way"] for p in doc["passes"])
    assert doc["waves"] == [{"wave": 1, "busy": 0.6667, "idle": 0.0167, "change": 0.2333, "hosts": 1},
                            {"wave": 2, "busy": 5.2667, "idle": 0.3833, "change": 0.8, "hosts": 3}]
    assert (doc["busy"], doc["idle"], doc["change"], doc["hosts"]) == (5.9333, 0.4, 1.0333, 4)
    assert doc["unit"] == "node-hours (a host is one node)" and doc["budget"] is None
    assert capacity.text(doc) == "busy 5.93, idle 0.40, change 1.03 node-hours (4 hosts)"


def test_a_pass_under_way_counts_up_to_now():
    rows = [row("e", "drain", "ok", 0, 0), row("e", "wait_idle", "started", 0),  # its jobs still run
            row("f", "drain", "ok", 0, 0), row("f", "wait_idle", "ok", 0, 10, {"idle_at": at(10)}),
            row("f", "install", "started", 12)]  # a crash mid-install: written ahead, not finished
    doc = capacity.figures(rows, {"e": 1, "f": 1}, T0 + timedelta(minutes=30), budget_node_hours=2)
    assert [(p["host"], p["busy_s"], p["idle_s"], p["change_s"], p["under_way"], p["back_at"])
            for p in doc["passes"]] == [("e", 1800, 0, 0, True, None), ("f", 600, 120, 1080, True, None)]
    assert doc["until"] == at(30)
    assert doc["budget"] == {"node_hours": 2, "spent": 0.3333, "left": 1.6667, "counts": ["idle", "change"]}


# ---- real campaigns on a clock the test moves ------------------------------------------------------------------


def test_campaign_show_says_what_each_wave_and_the_campaign_cost(store, clock, tmp_path):  # noqa: F811
    journal, cid, engine = start(store, Clocked(clock), ["a"], ["b", "c"], capacity_budget_node_hours=12)
    assert engine.run() == "done"
    shown = fleetctl("campaign", "show", str(cid), home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = [line.strip() for line in shown.stdout.splitlines() if line.startswith("capacity")]
    assert lines == ["capacity wave 1: busy 0.67, idle 0.02, change 0.23 node-hours (1 host)",
                     "capacity wave 2: busy 1.33, idle 0.03, change 0.47 node-hours (2 hosts)",
                     "capacity in all: busy 2.00, idle 0.05, change 0.70 node-hours (3 hosts, a node each); "
                     "budget 12: 0.75 spent"]
    doc = json.loads(fleetctl("campaign", "show", str(cid), "--format", "json", home=tmp_path).stdout)["capacity"]
    assert doc == capacity.of_campaign(journal, cid)
    a = doc["passes"][0]
    assert (a["host"], a["pass"], a["busy_s"], a["idle_s"], a["change_s"], a["under_way"]) == \
        ("a", "forward", 2400, 60, 840, False)
    assert a["idle_at"] == stamp(datetime.fromisoformat(a["drained_at"].replace("Z", "+00:00"))
                                 + timedelta(minutes=40))
    assert doc["budget"] == {"node_hours": 12, "spent": 0.75, "left": 11.25, "counts": ["idle", "change"]}


def test_the_capacity_budget_says_why_no_further_host_is_drained(store, clock):  # noqa: F811
    """A host costs 11.8 node-hours (an hour idle, 10.8 in change). A second host's install under way counts up to
    now: past a budget of 12. Under a budget of 20, no further host is drained while the one out of service is
    expected to cost as much as the first; under 40, one more is, two are not."""
    slow = Clocked(clock, minutes={"wait_idle": 60, "install": 648}, idle_after=0, crash_at=("b", "install"))
    journal, cid, engine = start(store, slow, ["a"], ["b"])
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    later = clock.t + timedelta(minutes=30)  # b idle an hour, then 30 minutes into its install
    budget = CampaignOptions(capacity_budget_node_hours=12)
    assert capacity.pacing(journal, cid, CampaignOptions(), later) is None  # no budget
    assert capacity.budget_left(journal, cid, CampaignOptions(), later) is None
    assert capacity.budget_left(journal, cid, budget, later) == pytest.approx(12 - 11.8 - 1.5)
    assert capacity.pacing(journal, cid, budget, later) == "capacity budget: 13.3 of 12 node-hours spent"
    now = clock.t  # b idle an hour, its install just begun: 12.8 spent, b expected to cost 10.8 more
    assert capacity.pacing(journal, cid, CampaignOptions(capacity_budget_node_hours=20), now) == (
        "capacity budget: 12.8 of 20 node-hours spent, 10.8 more expected of the 1 host out of service, 11.8 per "
        "host drained")
    assert capacity.pacing(journal, cid, CampaignOptions(capacity_budget_node_hours=40), now) is None
    assert capacity.pacing(journal, cid, CampaignOptions(capacity_budget_node_hours=40), now, hosts=2) is not None


@pytest.mark.parametrize("value, why", [("0", "not in the range 0<x<=10000000"), ("-1", "not in the range"),
                                        ("1e9", "not in the range"), ("12h", "not a valid float"),
                                        ("nan", "node-hours above 0, at most 10000000")])
def test_a_bad_capacity_budget_is_one_line_and_exit_2(tmp_path, value, why):
    proc = fleetctl("upgrade", "--to", "570.86.15", "--capacity-budget", value, "--dry-run", home=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--capacity-budget" in proc.stderr and why in proc.stderr, proc.stderr


def test_a_campaign_halted_on_its_budget_goes_on_when_resumed_with_a_larger_one(store, clock):  # noqa: F811
    """Each host costs 0.25 node-hours (a minute idle, 14 in change): a budget of 0.3 takes one, then the campaign
    halts with nothing out of service. `campaign resume --capacity-budget 1` (upgrade.new_budget, then the
    resume's acceptance of a halt) records the change and the campaign finishes under it."""
    script = Clocked(clock)
    journal, cid, engine = start(store, script, ["a", "b"], pace="host", max_in_flight=1,
                                 capacity_budget_node_hours=0.3)
    assert engine.run() == "halted"
    assert journal.campaign(cid)["reason"].startswith("wave 1: capacity budget: 0.2")
    assert [r["state"] for r in journal.hosts(cid)] == ["done", "drain"]
    upgrade.new_budget(journal, cid, 1.0)
    accept_held(journal, cid)
    resumed = Engine(journal, journal.handle(cid), engine.ctx.fleet, engine.ctx.base, Parts(steps=script))
    assert resumed.run() == "done"
    assert [(e["node_hours"], e["was"]) for e in journal.events(cid) if e["event"] == "capacity_budget_changed"] \
        == [(1.0, 0.3)]
    assert capacity.of_campaign(journal, cid)["budget"]["node_hours"] == 1.0


def test_a_budget_for_every_interrupted_campaign_at_once_is_one_line_and_exit_2(tmp_path):
    proc = fleetctl("campaign", "resume", "--interrupted", "--capacity-budget", "5", home=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--capacity-budget" in proc.stderr and "CAMPAIGN_ID" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, why", [
    (["1"], "give --promote or --rollback"),
    (["1", "--promote", "--reason", "x" * 501], "--reason"),
    (["1", "--promote"], "no campaign 1 in the history"),
])
def test_campaign_judge_takes_a_decision_on_a_campaign_in_the_history(tmp_path, args, why):
    proc = fleetctl("campaign", "judge", *args, home=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and why in proc.stderr, proc.stderr


def test_campaign_judge_refuses_a_campaign_not_halted_for_a_person(store, clock):  # noqa: F811 (the fixture)
    """Only a halted campaign waits for a person's judgement; one that finished is refused in one line, unchanged."""
    journal, cid, engine = start(store, Clocked(clock), ["a"], pace="host")
    assert engine.run() == "done"
    proc = fleetctl("campaign", "judge", str(cid), "--rollback", home=store.path.parent)
    assert proc.returncode == 2 and proc.stderr == (f"fleetctl: error: campaign {cid} is done: only a campaign halted "
                                                    f"for a person is judged (fleetctl campaign show {cid})\n")
    assert journal.campaign(cid)["state"] == "done"
