"""Per-host pipelines (`--pace host`): within a wave, each host goes from wait_idle to undrain as soon as its own
jobs have ended, bounded by --max-in-flight; the scripted steps of helpers.campaign, with a wait_idle that
answers `wait` while a host's jobs still run."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from orchestrator.campaign import steps, transitions
from orchestrator.campaign.engine import Clock
from orchestrator.history.timefmt import parse as parse_time

from tests.helpers.campaign import UPGRADE, Script, start, states


class Jobs(Script):
    """Script, and each host's jobs run for LOOKS[host] looks of wait_idle (None: they never end); UNTIL[host]: the
    jobs also end once that host is done (a job that outlasts another host's whole change, on any machine's pace)."""

    until: dict[str, str] = {}

    def __init__(self, looks: dict[str, int | None], **kw):
        super().__init__(**kw)
        self.looks, self.seen = looks, {h: 0 for h in looks}

    def __getitem__(self, step):
        scripted = super().__getitem__(step)
        if step not in ("wait_idle", "rollback_wait_idle"):
            return scripted

        def run(ctx, hosts):
            out = scripted(ctx, hosts)
            done = {r["host"] for r in ctx.journal.hosts(ctx.campaign) if r["state"] == "done"}
            for h in hosts:
                self.seen[h] = self.seen.get(h, 0) + 1
                left = self.looks.get(h, 0)
                if self.until.get(h) in done:
                    continue
                if left is None or self.seen[h] <= left:
                    out[h] = steps.Outcome(transitions.WAIT, f"job {h}1 still runs", {})
            return out
        return run


def steps_of(journal, cid, host):
    return {r["step"]: r for r in journal.steps(cid, host)}


def at(row, key):
    return parse_time(row[key])


def out_of_service(journal, cid):
    """(drained at, back at) of every host, from the journal."""
    spans = {}
    for host in ("a", "b", "c", "d"):
        s = steps_of(journal, cid, host)
        if "drain" in s:
            spans[host] = (at(s["drain"], "finished_at"), at(s["undrain"], "finished_at"))
    return spans


def test_a_host_whose_job_ends_first_is_back_in_service_before_the_longest_job_ends(store):
    script = Jobs({"a": 0, "b": 4, "c": 400})
    script.until = {"c": "a"}  # c's job ends once a is back (else after 400 looks: a batch of the wave would be late)
    journal, cid, engine = start(store, script, ["a", "b", "c"], pace="host", idle={"timeout_s": 60, "poll_s": 0})
    assert engine.run() == "done"
    a, c = steps_of(journal, cid, "a"), steps_of(journal, cid, "c")
    assert at(a["undrain"], "finished_at") < at(c["wait_idle"], "finished_at")
    for host in "abc":
        s = journal.steps(cid, host)
        assert [r["step"] for r in s] == UPGRADE and {r["attempts"] for r in s} == {1}  # looked at, written once
    installs = [hosts for step, hosts in script.calls if step == "install"]
    assert installs[0] == ("a",) and ("c",) in installs


def test_pace_wave_installs_none_before_the_waves_longest_job_ends(store):
    script = Jobs({"a": 0, "b": 4, "c": 12})
    journal, cid, engine = start(store, script, ["a", "b", "c"], pace="wave", idle={"timeout_s": 60, "poll_s": 0})
    assert engine.run() == "done"
    a, c = steps_of(journal, cid, "a"), steps_of(journal, cid, "c")
    assert at(a["install"], "started_at") >= at(c["wait_idle"], "finished_at")
    assert [hosts for step, hosts in script.calls if step == "install"] == [("a", "b", "c")]


def test_max_in_flight_keeps_at_most_that_many_hosts_out_of_service(store):
    script = Jobs({"a": 2, "b": 2, "c": 0, "d": 1})
    journal, cid, engine = start(store, script, ["a", "b", "c", "d"], pace="host", max_in_flight=2,
                                 idle={"timeout_s": 60, "poll_s": 0})
    assert engine.run() == "done"
    spans = out_of_service(journal, cid)
    assert len(spans) == 4
    for host, (start_, _) in spans.items():  # at each drain, at most 2 hosts out of service (itself included)
        assert sum(s <= start_ < e for s, e in spans.values()) <= 2, (host, spans)
    paced = [e for e in journal.events(cid) if e["event"] == "paced"]
    assert paced and "--max-in-flight 2" in paced[0]["reason"]


def test_a_host_whose_jobs_outlast_the_idle_timeout_is_released_untouched(store):
    script = Jobs({"a": 0, "b": None})
    journal, cid, engine = start(store, script, ["a", "b"], pace="host", fail_at=[2],
                                 idle={"timeout_s": 1, "poll_s": 0})
    engine.run()
    assert states(journal, cid) == {"a": "done", "b": "failed"}
    b = steps_of(journal, cid, "b")
    assert b["wait_idle"]["status"] == "fail" and b["wait_idle"]["reason"].startswith("after 1s: job b1 still runs")
    assert "install" not in b and b["release"]["status"] == "ok"  # undrained, its driver untouched


def test_an_nvlink_domain_moves_when_the_last_of_its_hosts_is_idle(store):
    script = Jobs({"a": 0, "b": 5, "c": 0})
    journal, cid, engine = start(store, script, ["a", "b", "c"], pace="host", domains={"a": "rack1", "b": "rack1"},
                                 idle={"timeout_s": 60, "poll_s": 0})
    assert engine.run() == "done"
    a, b = steps_of(journal, cid, "a"), steps_of(journal, cid, "b")
    assert at(a["install"], "started_at") >= at(b["wait_idle"], "finished_at")
    assert ("a", "b") in [hosts for step, hosts in script.calls if step == "install"]
    assert ("c",) in [hosts for step, hosts in script.calls if step == "install"]  # c did not wait for the rack


def test_a_crash_with_hosts_at_different_steps_resumes_each_from_its_own_step(store):
    script = Jobs({"a": 0, "b": 30}, crash_at=("a", "activate"))
    journal, cid, engine = start(store, script, ["a", "b"], pace="host", idle={"timeout_s": 60, "poll_s": 0})
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    assert states(journal, cid) == {"a": "activate", "b": "wait_idle"}
    assert engine.run() == "done"
    a, b = steps_of(journal, cid, "a"), steps_of(journal, cid, "b")
    assert a["activate"]["attempts"] == 2 and a["install"]["attempts"] == 1
    assert b["wait_idle"]["attempts"] == 2 and [r["step"] for r in journal.steps(cid, "b")] == UPGRADE


class Slow(Jobs):
    """Jobs, and each install takes INSTALL_S seconds."""

    def __init__(self, looks, install_s: float, **kw):
        super().__init__(looks, **kw)
        self.install_s = install_s

    def __getitem__(self, step):
        scripted = super().__getitem__(step)
        if step != "install":
            return scripted

        def run(ctx, hosts):
            import time
            time.sleep(self.install_s)
            return scripted(ctx, hosts)
        return run


def test_a_spent_capacity_budget_halts_the_campaign_before_it_drains_another_host(store):
    script = Slow({"a": 0, "b": 0, "c": 0}, install_s=1.0)
    budget = 1.5 / 3600  # node-hours: one host's change (1 s and more) fits, a second one's would not
    journal, cid, engine = start(store, script, ["a", "b", "c"], pace="host", max_in_flight=1, fail_at=[3],
                                 capacity_budget_node_hours=budget, idle={"timeout_s": 60, "poll_s": 0})
    assert engine.run() == "halted"
    c = journal.campaign(cid)
    assert c["reason"].startswith("wave 1: capacity budget: 0.0 of") and "per host drained" in c["reason"]
    assert states(journal, cid) == {"a": "done", "b": "drain", "c": "drain"}  # nothing more taken out of service
    paced = [e["reason"] for e in journal.events(cid) if e["event"] == "paced"]
    assert any("--max-in-flight 1" in p for p in paced) and any("capacity budget" in p for p in paced)


def test_a_clock_that_knows_when_a_hosts_jobs_end_spares_the_looks_before_and_finds_it_at_the_same_poll(store):
    """engine.Clock.unchanged_until (a simulated clock's: bench/drain_policies.py): a host still busy is looked at
    again at the first idle poll after the time the clock gives, not at each poll before; it is found idle at the
    very poll it would have been found at."""
    class Ends(Script):
        end: float | None = None  # when the host's job ends (monotonic): 1.5 s after its first look

        def __getitem__(self, step):
            scripted = super().__getitem__(step)

            def run(ctx, hosts):
                self.end = self.end or time.monotonic() + 1.5
                out = scripted(ctx, hosts)
                return out if time.monotonic() >= self.end else {
                    h: steps.Outcome(transitions.WAIT, "job a1 still runs", {}) for h in hosts}
            return run if step == "wait_idle" else scripted

    class Knows(Clock):
        def unchanged_until(self, at):
            return script.end

    script = Ends()
    journal, cid, engine = start(store, script, ["a"], pace="host", idle={"timeout_s": 60, "poll_s": 1})
    engine.clock = Knows()
    assert engine.run() == "done"
    looks = [t for step, t in script.calls if step == "wait_idle"]
    assert len(looks) == 2  # the first look, and the poll after 1.5 s (not the one at 1 s)
    wait = steps_of(journal, cid, "a")["wait_idle"]
    assert timedelta(seconds=1.5) <= at(wait, "finished_at") - at(wait, "started_at") < timedelta(seconds=2.5)
