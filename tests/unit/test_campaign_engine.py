"""The campaign engine without hosts: the transition tables, the write-ahead journal and the wave decisions,
driven with scripted step outcomes in place of playbook runs (the lab tests run the real steps)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from orchestrator import baseline as baseline_mod
from orchestrator.fleet import inventory, runner
from orchestrator.campaign import engine as engine_mod, readmodel, transitions
from orchestrator.campaign.engine import Engine
from orchestrator.campaign.journal import Journal
from orchestrator.errors import OperationError
from orchestrator.exitcodes import Exit
from orchestrator.fleet.execution_nodes import RunnerConfig
from orchestrator.history.store import process_alive, process_gone, process_identity, process_start
from tests.helpers.campaign import SOAKING, UPGRADE, Script, Watch, options_of, parts, plan_of, start, states

ROLLBACK = ["rollback_drain", "rollback_wait_idle", "rollback_install", "rollback_activate", "rollback_verify",
            "rollback_probe", "rollback_undrain"]


# ---- the tables ----------------------------------------------------------------------------------------

def walk(state: str, outcome_for) -> list[str]:
    path = []
    while not transitions.is_terminal(state):
        row = transitions.HOST_ROWS[state]
        path.append(row.step)
        state = row.next(outcome_for(row.step))
    return path + [state]


def test_the_happy_path_and_the_rollback_path_read_off_the_table():
    assert walk("precheck", lambda s: "ok") == UPGRADE + ["done"]
    assert walk(transitions.ROLLBACK_START, lambda s: "ok") == ROLLBACK + ["rolled_back"]


def test_every_transition_lands_on_a_known_state_and_every_state_can_be_reached():
    known = set(transitions.HOST_ROWS) | set(transitions.TERMINAL)
    reached = {"precheck", transitions.ROLLBACK_START}
    for row in transitions.HOST_TABLE:
        for target in (row.ok, row.fail, row.inconclusive, row.skip):
            assert target is None or target in known, (row, target)
            if target:
                reached.add(target)
    assert set(transitions.HOST_ROWS) <= reached
    assert len({r.step for r in transitions.HOST_TABLE}) == len(transitions.HOST_TABLE)  # one row per step


def test_inconclusive_twice_holds_the_host_and_a_drain_failure_releases_it():
    assert walk("precheck", lambda s: "inconclusive" if s.startswith("probe_a") else "ok")[-1] == "held"
    assert walk("precheck", lambda s: "fail" if s == "wait_idle" else "ok")[-2:] == ["release", "failed"]


def test_the_moves_between_the_tables_are_read_off_the_host_table():
    """A domain peer's failure, an abort, a held host accepted, a rollback: which hosts each move concerns follows
    from the host table, so a step added to the upgrade moves with its neighbours without anyone editing MOVES."""
    H, rows, moves = transitions.HostState, transitions.HOST_ROWS, transitions.MOVES
    assert moves["abandon"].only == transitions.READ_ONLY_STATES
    assert moves["stop"].only == transitions.BEFORE_DRAIN + (H.DRAIN,)  # nothing done to the host yet
    assert moves["release"].to == rows[H.WAIT_IDLE].fail and moves["release"].only == (H.WAIT_IDLE, H.INSTALL)
    assert moves["fail"].only == (H.INSTALL, H.ACTIVATE, H.VERIFY, H.PROBE_AFTER, H.PROBE_AGAIN, H.UNDRAIN)
    assert moves["accept"].to == rows[H.PROBE_AGAIN].ok and moves["roll_back"].to == transitions.ROLLBACK_START
    assert moves["roll_back"].never == (H.ROLLED_BACK, H.ROLLBACK_FAILED)
    table = list(transitions.HOST_TABLE)
    at = table.index(rows[H.INSTALL])
    table[at:at + 1] = [replace(rows[H.INSTALL], ok="firmware"),
                        transitions.Row("firmware", H.ACTIVATE, H.FAILED, runner="install", changes_host=True)]
    grown = transitions.moves_of(tuple(table))
    assert grown["fail"].only == (H.INSTALL, "firmware", H.ACTIVATE, H.VERIFY, H.PROBE_AFTER, H.PROBE_AGAIN,
                                  H.UNDRAIN)
    assert {k: m for k, m in grown.items() if k != "fail"} == {k: m for k, m in moves.items() if k != "fail"}


def test_campaign_table_and_exit_codes():
    assert transitions.campaign_next("running", "wave_failed") == "rolling_back"
    assert transitions.campaign_next("rolling_back", "rollback_finished") == "rolled_back"
    with pytest.raises(ValueError):
        transitions.campaign_next("done", "wave_passed")
    assert transitions.CAMPAIGN_EXIT == {"done": 0, "rolled_back": 4, "halted": 5, "aborted": 5}


# ---- the journal and the engine with scripted steps -------------------------------------------------------

def test_waves_in_order_batched_per_step(store):
    script = Script()
    journal, cid, engine = start(store, script, ["a"], ["b", "c"])
    assert engine.run() == "done"
    assert script.calls[:len(UPGRADE)] == [(s, ("a",)) for s in UPGRADE]
    assert script.calls[len(UPGRADE):] == [(s, ("b", "c")) for s in UPGRADE]
    assert set(states(journal, cid).values()) == {"done"}
    assert journal.locks() == {}  # released at the end


def test_a_failed_canary_rolls_back_only_changed_hosts_and_cancels_the_rest(store):
    script = Script({("a", "probe_after"): "fail"})
    journal, cid, engine = start(store, script, ["a"], ["b"])
    assert engine.run() == "rolled_back"
    assert states(journal, cid) == {"a": "rolled_back", "b": "not_started"}
    assert [c for c in script.calls if c[1] == ("b",)] == []
    assert "wave 1 failed" in journal.campaign(cid)["reason"]


def test_failures_below_the_budget_roll_back_that_host_only(store):
    script = Script({("c", "verify"): "fail"})
    journal, cid, engine = start(store, script, ["a"], ["b", "c", "d"], fail_at=[1, 2])
    assert engine.run() == "done"
    assert states(journal, cid) == {"a": "done", "b": "done", "c": "rolled_back", "d": "done"}
    assert engine_mod.transitions.CAMPAIGN_EXIT["done"] == 0


def test_failures_at_the_budget_fail_the_wave_and_roll_back_the_campaign(store):
    script = Script({("c", "verify"): "fail", ("d", "install"): "fail"})
    journal, cid, engine = start(store, script, ["a"], ["b", "c", "d"], ["e"], fail_at=[1, 2, 2])
    assert engine.run() == "rolled_back"
    assert states(journal, cid) == {"a": "rolled_back", "b": "rolled_back", "c": "rolled_back", "d": "rolled_back",
                                    "e": "not_started"}


def test_wave_scope_rolls_back_the_failed_wave_only(store):
    script = Script({("b", "probe_after"): "fail"})
    journal, cid, engine = start(store, script, ["a"], ["b"], fail_at=[1, 1], rollback_scope="wave")
    assert engine.run() == "rolled_back"
    assert states(journal, cid) == {"a": "done", "b": "rolled_back"}


def test_a_host_failing_before_the_driver_is_touched_is_not_rolled_back(store):
    script = Script({("a", "wait_idle"): "fail"})
    journal, cid, engine = start(store, script, ["a"], ["b"])
    assert engine.run() == "rolled_back"
    assert states(journal, cid) == {"a": "failed", "b": "not_started"}
    assert ("release", ("a",)) in script.calls and not any(s == "install" for s, _ in script.calls)


def test_inconclusive_twice_halts_for_a_person_and_resume_accepts(store):
    script = Script({("a", "probe_after"): "inconclusive", ("a", "probe_again"): "inconclusive"})
    journal, cid, engine = start(store, script, ["a"], ["b"])
    assert engine.run() == "halted"
    assert states(journal, cid) == {"a": "held", "b": "precheck"}
    assert journal.locks() == {"a": cid, "b": cid}  # a halted campaign keeps its hosts
    engine_mod.accept_held(journal, cid)
    assert engine.run() == "done"
    assert states(journal, cid) == {"a": "done", "b": "done"}


def test_each_run_that_drives_a_campaign_is_closed_with_its_outcome(store, monkeypatch):
    """One truth in the history: `upgrade`'s run ends when the campaign stops (halted: 5), and the resume that
    finishes it has a run of its own that says so; a plain query of the runs agrees with `campaign show`."""
    from orchestrator.history import chain
    from orchestrator import runs, upgrade

    held = Script({("a", "probe_after"): "inconclusive", ("a", "probe_again"): "inconclusive"})
    journal, cid, _ = start(store, held, ["a"], ["b"])
    fleet = inventory.Fleet("test", (inventory.Host("a", ("all",)), inventory.Host("b", ("all",))),
                            frozenset({"all"}), {})
    script = held
    monkeypatch.setattr(upgrade, "drive", lambda journal, cid, fleet, base, *a: Engine(
        journal, journal.handle(cid), fleet, base, parts(script)).run())
    monkeypatch.setattr(upgrade, "load_for", lambda *a: (fleet, baseline_mod.load(None)))
    first = journal.campaign(cid)["run_id"]
    assert store.run(first)["status"] == "running"  # planned and started: not finished
    code, _ = upgrade.driven(store, journal, runs.Run(first, "", "campaign", fleet, None, None), cid, fleet,
                             baseline_mod.load(None), None, None, {"hosts": 2}, playbooks=runner.Runner())
    assert code == 5 and journal.campaign(cid)["state"] == "halted"
    script = Script()
    code, text = upgrade.resume(store, cid, None, None, None, None, argv=["campaign", "resume", str(cid)],
                                runner_config=RunnerConfig())
    assert code == 0 and f"campaign {cid} to 570.86.15: done" in text
    rows = store.db.execute("SELECT status, exit_code, summary, argv FROM runs WHERE kind='campaign' ORDER BY id")
    assert [(r["status"], r["exit_code"], json.loads(r["summary"])["state"], json.loads(r["argv"])) for r in rows] \
        == [("done", 5, "halted", []), ("done", 0, "done", ["campaign", "resume", str(cid)])]
    assert readmodel.document(store, cid)["campaign"]["exit_code"] == 0
    latest = store.db.execute(  # the query docs/reports.md gives
        "SELECT exit_code, json_extract(summary, '$.state') FROM runs WHERE kind = 'campaign'"
        " AND json_extract(summary, '$.campaign') = ? ORDER BY id DESC LIMIT 1", (cid,)).fetchone()
    assert tuple(latest) == (0, "done")
    assert chain.verify(store.db).ok


def test_a_campaign_that_rolls_back_closes_its_run_with_exit_4(store, monkeypatch):
    from orchestrator import runs, upgrade

    journal, cid, engine = start(store, Script({("a", "probe_after"): "fail"}), ["a"], ["b"])
    monkeypatch.setattr(upgrade, "drive", lambda *a: engine.run())
    run_id = journal.campaign(cid)["run_id"]
    code, _ = upgrade.driven(store, journal, runs.Run(run_id, "", "campaign", None, None, None), cid, None, None,
                             None, None, {"hosts": 2}, playbooks=runner.Runner())
    row = store.run(run_id)
    assert (code, row["status"], row["exit_code"], json.loads(row["summary"])["state"]) == (4, "done", 4, "rolled_back")


def test_a_closed_window_halts_before_the_next_wave(store):
    journal, cid, engine = start(store, Script(), ["a"], ["b"], window_end="2000-01-01T00:00:00Z")
    assert engine.run() == "halted"
    assert "window" in journal.campaign(cid)["reason"]
    assert states(journal, cid) == {"a": "precheck", "b": "precheck"}


def test_a_crash_mid_step_resumes_that_step_on_the_same_row(store):
    script = Script(crash_at=("a", "activate"))
    journal, cid, engine = start(store, script, ["a"])
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    assert states(journal, cid) == {"a": "activate"}
    assert journal.steps(cid, "a")[-1]["status"] == "started"
    assert journal.hosts(cid)[0]["changed"] == 1  # written before the install ran
    assert engine.run() == "done"
    rows = journal.steps(cid, "a")
    assert [r["step"] for r in rows] == UPGRADE
    assert {r["step"]: r["attempts"] for r in rows}["activate"] == 2
    assert [c for c in script.calls if c[0] == "install"] == [("install", ("a",))]  # never done twice
    resumed = [e for e in journal.events(cid) if e["event"] == "step_started" and e["resumed"]]
    assert [(e["host"], e["step"]) for e in resumed] == [("a", "activate")]


def test_a_finished_step_is_never_begun_again(store):
    journal, cid, engine = start(store, Script(), ["a"])
    engine.run()
    with pytest.raises(RuntimeError):
        journal.begin_step(cid, ["a"], "precheck")


def test_host_locks_keep_a_host_in_one_campaign(store):
    journal, first, _ = start(store, Script(), ["a", "b"])
    run_id, _ = store.begin_run("campaign", [], "test", None, None)
    second, locked = journal.create(run_id, plan_of(["b", "c"]), options_of())
    assert locked == [f"b (campaign {first})"]
    assert [r["host"] for r in journal.hosts(second)] == ["c"]


def test_a_campaign_driven_by_a_live_process_is_not_driven_twice(store):
    journal, cid, engine = start(store, Script(), ["a"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        driver = dict(process_identity(), pid=other.pid, start=process_start(other.pid))
        store.db.execute("UPDATE campaigns SET driver=? WHERE id=?", (json.dumps(driver), cid))
        with pytest.raises(OperationError, match="being driven by pid"):
            engine.run()
    finally:
        other.kill()
        other.wait()
    assert engine.run() == "done"  # its driver died: anyone may resume it


def test_a_pid_names_its_process_with_its_start_and_a_driver_that_cannot_be_judged_keeps_its_campaign(store,
                                                                                                        monkeypatch):
    """A live process with its recorded identity is alive, the same pid with another start is gone; a driver of this
    machine that psutil is denied keeps its campaign (never driven twice, nor interrupted); another machine's is not
    this one's to judge: a run it left is not taken for gone, and its campaign may be resumed here, as ever."""
    from orchestrator import upgrade
    from orchestrator.campaign.journal import driven_elsewhere

    journal, cid, engine = start(store, Script(), ["a"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        driver = dict(process_identity(), pid=other.pid, start=process_start(other.pid))
        assert process_alive(driver) is True
        assert process_alive(dict(driver, start=driver["start"] - 5)) is False  # a reused pid
        elsewhere = dict(driver, node="control-2.example")
        assert process_alive(elsewhere) is None and not process_gone(json.dumps(elsewhere))
        assert not driven_elsewhere(json.dumps(elsewhere))

        def denied(self):
            raise psutil.AccessDenied(self.pid)

        store.db.execute("UPDATE campaigns SET driver=? WHERE id=?", (json.dumps(driver), cid))
        with monkeypatch.context() as m:
            m.setattr(psutil.Process, "create_time", denied)
            assert process_alive(driver) is None and not process_gone(json.dumps(driver))
            assert upgrade.interrupted(journal) == []
            with pytest.raises(OperationError, match=re.escape(
                    f"campaign {cid} is being driven by pid {other.pid} on this machine (or was: fleetctl cannot tell")):
                engine.run()
    finally:
        other.kill()
        other.wait()
    assert engine.run() == "done"  # its driver (on this machine) is gone: anyone may resume it


def test_progress_live_view_plain_lines_and_jsonl_log(store, monkeypatch, tmp_path):
    import io

    from rich.console import Console

    from orchestrator.campaign import progress
    from orchestrator.cli import campaign_view

    monkeypatch.setenv("FLEETCTL_HOME", str(tmp_path))
    journal, cid, engine = start(store, Script({("b", "verify"): "fail"}), ["a"], ["b"],
                                 fail_at=[1, 1])
    screen, lines = io.StringIO(), io.StringIO()
    view = campaign_view.LiveView(Console(file=screen, force_terminal=True, width=200),
                                  [dict(r) for r in journal.hosts(cid)], "campaign")
    log = progress.EventLog(cid, journal.events(cid))
    journal.listener = progress.Fanout(log.write, view, progress.PlainLines(lines))
    with view:
        assert engine.run() == "rolled_back"
    assert screen.getvalue().count("┏") >= 1  # drawn on the terminal
    final = io.StringIO()
    Console(file=final, width=200).print(view.render())
    assert {h["host"]: h["state"] for h in view.hosts.values()} == {"a": "rolled_back", "b": "rolled_back"}
    assert "rollback_undrain" in final.getvalue() and "rolled_back" in final.getvalue()
    text = lines.getvalue().splitlines()
    assert f"campaign {cid} b: verify fail -> failed: verify fail" in " ".join(text)
    assert text[-1].endswith("rollback finished -> rolled_back")
    records = [json.loads(line) for line in progress.log_path(cid).read_text().splitlines()]
    assert [r["seq"] for r in records] == [e["seq"] for e in journal.events(cid)]
    # a crash between a commit and the log write: the log catches up when the campaign is opened again
    progress.log_path(cid).write_text("\n".join(json.dumps(r) for r in records[:5]) + "\n{\"seq\": 6, trunc")
    progress.EventLog(cid, journal.events(cid))
    again = progress.log_path(cid).read_text().splitlines()
    assert [json.loads(line)["seq"] for line in again] == [e["seq"] for e in journal.events(cid)]


def test_abort_list_and_show(store):
    import io

    from rich.console import Console

    from orchestrator import upgrade as upgrade_mod
    from orchestrator.cli import campaign_view
    from orchestrator.errors import InputError

    script = Script({("a", "probe_after"): "inconclusive", ("a", "probe_again"): "inconclusive"},
                    crash_at=("b", "install"))
    journal, cid, engine = start(store, script, ["a", "b"])
    with pytest.raises(KeyboardInterrupt):
        engine.run()  # b crashed mid-install: hosts mid-way
    store.db.execute("UPDATE campaigns SET driver=NULL WHERE id=?", (cid,))  # and its process is gone
    with pytest.raises(InputError, match=r"mid-way: a \(install\), b \(install\)"):
        upgrade_mod.abort(store, cid)
    assert engine.run() == "halted"  # resumed: b done, a held for a person
    assert "aborted" in upgrade_mod.abort(store, cid)
    assert journal.campaign(cid)["state"] == "aborted" and journal.locks() == {}
    with pytest.raises(InputError, match="already aborted"):
        upgrade_mod.abort(store, cid)
    out = io.StringIO()
    campaign_view.list_table(store, Console(file=out, width=200))
    assert "aborted" in out.getvalue() and "1 done, 1 held" in out.getvalue()
    doc = readmodel.document(store, cid)
    assert doc["campaign"]["exit_code"] == 5 and doc["time"]["steps"]["install"]["batches"] == 1
    assert [s["attempts"] for s in next(h for h in doc["hosts"] if h["name"] == "b")["steps"]
            if s["step"] == "install"] == [2]


def test_a_wave_interrupted_before_any_drain_still_halts_at_a_closed_window(store):
    journal, cid, engine = start(store, Script(crash_at=("b", "probe_before")), ["a"], ["b"])
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    journal.update_options(cid, window_end="2000-01-01T00:00:00Z")
    engine = Engine(journal, journal.handle(cid), engine.ctx.fleet, engine.ctx.base, engine.parts)
    assert engine.run() == "halted"
    assert states(journal, cid) == {"a": "done", "b": "probe_before"}  # nothing of b was changed


def test_interrupted_campaigns_are_those_at_work_whose_process_is_gone(store):
    from orchestrator import upgrade
    crashed_journal, crashed, engine = start(store, Script(crash_at=("a", "install")), ["a"])
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    _, halted, held_engine = start(store, Script({("b", "probe_after"): "inconclusive",
                                                                ("b", "probe_again"): "inconclusive"}), ["b"])
    assert held_engine.run() == "halted"
    _, finished, done_engine = start(store, Script(), ["c"])
    assert done_engine.run() == "done"
    journal = Journal(store)
    assert upgrade.interrupted(journal) == [crashed]  # the halted one waits for a person, the done one is done
    events = len(journal.events(finished))
    # a resume after a kill that came too late
    code, text = upgrade.resume(store, finished, None, None, None, None, argv=[], runner_config=RunnerConfig())
    assert code == 0 and text.startswith(f"campaign {finished} is done: nothing to resume\n")
    assert "exit 0" in text and len(journal.events(finished)) == events and "c" not in journal.locks()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:  # another fleetctl resumed it already: it is not interrupted, and a second resume refuses, changing nothing
        driver = dict(process_identity(), pid=other.pid, start=process_start(other.pid))
        store.db.execute("UPDATE campaigns SET driver=? WHERE id=?", (json.dumps(driver), crashed))
        events = len(journal.events(crashed))
        assert upgrade.interrupted(journal) == []
        with pytest.raises(OperationError, match=f"campaign {crashed} is being driven by pid {other.pid}"):
            upgrade.resume(store, crashed, None, None, None, None, argv=[], runner_config=RunnerConfig())
        assert len(journal.events(crashed)) == events
        ticks = Path(f"/proc/{other.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]  # as an older fleetctl wrote it
        reused = str(int(ticks) - 5 * os.sysconf("SC_CLK_TCK"))  # the same pid, a process started 5 s earlier
        for old, interrupted in ((ticks, []), (reused, [crashed])):
            store.db.execute("UPDATE campaigns SET driver=? WHERE id=?", (json.dumps(dict(driver, start=old)), crashed))
            assert upgrade.interrupted(journal) == interrupted
        store.db.execute("UPDATE campaigns SET driver=? WHERE id=?", (json.dumps(driver), crashed))
    finally:
        other.kill()
        other.wait()
    assert upgrade.interrupted(journal) == [crashed]


# ---- the watched soak (issue 20) -----------------------------------------------------------------------------

from orchestrator import settings, upgrade as upgrade_mod  # noqa: E402
from orchestrator.campaign import soak  # noqa: E402


def test_soak_transitions_are_in_the_campaign_table():
    assert transitions.campaign_next("soaking", "soak_failed") == "rolling_back"
    assert transitions.campaign_next("soaking", "soak_host_failed") == "soaking"
    with pytest.raises(ValueError):
        transitions.campaign_next("running", "soak_failed")


def test_soak_lengths_one_per_gap_the_last_repeated():
    assert settings.SOAK.parse("2h,30m,10m") == (7200.0, 1800.0, 600.0)
    assert settings.SOAK.parse("300") == (300.0,) and settings.SOAK.parse("0") == (0.0,)
    options = {"soak_s": [7200.0, 1800.0]}
    assert [soak.length(options, gap) for gap in (1, 2, 3, 7)] == [7200.0, 1800.0, 1800.0, 1800.0]
    assert soak.length({"soak_s": 300}, 4) == 300.0  # a campaign recorded before per-gap lengths
    assert settings.SOAK.value == (7200.0, 1800.0)
    assert upgrade_mod.UpgradeOptions(target="570.86.15").campaign.soak_s == [7200.0, 1800.0]  # as the history has it
    for bad in ("2h,,30m", "", "2h,x", "-5", "2h,400d", "2h,9000h"):
        with pytest.raises(ValueError, match="is not a duration|is longer than a year"):
            settings.SOAK.parse(bad)


def test_a_soak_check_watches_every_changed_host_then_gates_them_at_its_end(store):
    watch = Watch()
    journal, cid, engine = start(store, Script(), ["a"], ["b", "c"], ["d"], observe=watch, **SOAKING)
    assert engine.run() == "done"
    kinds = [k for k, _ in watch.calls]
    assert kinds.count("gate") == 2 and kinds.count("check") >= 4  # 0.4 s soaks checked every 0.1 s
    gap2 = [hosts for k, hosts in watch.calls if k == "gate"][1]
    assert gap2 == ("a", "b", "c")  # every host changed so far, not only the last wave
    assert all(r["status"] == "ok" for r in journal.soak_records(cid))
    assert readmodel.exit_code(journal, cid) == 0


def test_a_canary_failing_its_soak_rolls_the_campaign_back_before_the_next_wave(store):
    script = Script()
    journal, cid, engine = start(store, script, ["a"], ["b"], observe=Watch({("a", 1, "check"): "new Xid 119"}),
                                 **SOAKING)
    assert engine.run() == "rolled_back"
    assert states(journal, cid) == {"a": "rolled_back", "b": "not_started"}
    assert [c for c in script.calls if c[1] == ("b",)] == []
    assert "the soak after wave 1 failed" in journal.campaign(cid)["reason"]
    assert [r["reason"] for r in journal.hosts(cid)][0] == "soak: new Xid 119"
    assert [e["event"] for e in journal.events(cid)].count("soak_check_failed") == 1
    assert readmodel.exit_code(journal, cid) == 4


def test_a_later_host_failing_its_soak_within_the_budget_rolls_back_alone(store):
    watch = Watch({("c", 2, "gate"): "throughput at the end of the soak"})
    script = Script()
    journal, cid, engine = start(store, script, ["a"], ["b", "c", "d"], ["e"], fail_at=[1, 2, 2], observe=watch,
                                 **SOAKING)
    assert engine.run() == "done"
    assert states(journal, cid) == {"a": "done", "b": "done", "c": "rolled_back", "d": "done", "e": "done"}
    assert ("rollback_drain", ("c",)) in script.calls
    # the rollback came before wave 3 started
    assert script.calls.index(("rollback_undrain", ("c",))) < script.calls.index(("precheck", ("e",)))
    assert readmodel.exit_code(journal, cid) == 1


def test_soak_failures_over_a_later_waves_budget_roll_the_campaign_back(store):
    watch = Watch({("b", 2, "check"): "GPU lost", ("c", 2, "check"): "GPU lost"})
    journal, cid, engine = start(store, Script(), ["a"], ["b", "c", "d"], ["e"], fail_at=[1, 2, 2], observe=watch,
                                 **SOAKING)
    assert engine.run() == "rolled_back"
    assert states(journal, cid) == {"a": "rolled_back", "b": "rolled_back", "c": "rolled_back", "d": "rolled_back",
                                    "e": "not_started"}
    assert "wave 2 (2 of 3 hosts" in journal.campaign(cid)["reason"]


def test_a_recorded_soak_failure_is_acted_on_after_a_crash(store, monkeypatch):
    """A crash between writing the observation and acting on it: the resume reads it back, it does not look again
    (the next check would start past the Xid's kernel-log marker)."""
    watch = Watch({("a", 1, "check"): "new Xid 79"})
    journal, cid, engine = start(store, Script(), ["a"], ["b"], observe=watch, **SOAKING)

    def crash(self, failures):
        raise KeyboardInterrupt("crash")
    monkeypatch.setattr(Engine, "soak_failed", crash)
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    assert journal.campaign(cid)["state"] == "soaking"
    monkeypatch.undo()
    calls = len(watch.calls)
    fleet = inventory.Fleet("test", (inventory.Host("a", ("all",)), inventory.Host("b", ("all",))),
                            frozenset({"all"}), {})
    assert Engine(journal, journal.handle(cid), fleet, baseline_mod.load(None), parts(Script(), watch)).run() \
        == "rolled_back"
    assert len(watch.calls) == calls


def test_no_soak_watches_nothing(store):
    watch = Watch()
    journal, cid, engine = start(store, Script(), ["a"], ["b"], observe=watch, soak_s=[0])
    assert engine.run() == "done" and watch.calls == []


def test_exit_codes_a_failed_rollback_needs_a_person_and_hosts_left_out_are_not_success(store):
    script = Script({("b", "verify"): "fail", ("b", "rollback_verify"): "fail"})
    journal, cid, engine = start(store, script, ["a"], ["b", "c", "d"], fail_at=[1, 3])
    assert engine.run() == "done"
    assert states(journal, cid)["b"] == "rollback_failed"
    assert readmodel.exit_code(journal, cid) == Exit.NEEDS_PERSON == 6
    assert "NEEDS A PERSON: the rollback failed on b" in readmodel.summary_text(journal, cid)
    # a clean campaign whose plan left a host out (unhealthy, unreachable): done, exit 1, the reason said
    plan = dict(plan_of(["x"]), excluded=[{"name": "y", "groups": [], "code": "unhealthy", "reason": "GPU lost"}])
    run_id, _ = store.begin_run("campaign", [], "test", None, None)
    cid2, _ = journal.create(run_id, plan, options_of())
    fleet = inventory.Fleet("test", (inventory.Host("x", ("all",)),), frozenset({"all"}), {})
    assert Engine(journal, journal.handle(cid2), fleet, baseline_mod.load(None), parts(Script())).run() == "done"
    assert readmodel.exit_code(journal, cid2) == 1
    assert "left out at plan, not on the target: y: GPU lost" in readmodel.summary_text(journal, cid2)


def test_the_live_view_shows_the_soaks_time_left_and_its_last_check(store):
    import io

    from rich.console import Console

    from orchestrator.campaign import progress
    from orchestrator.cli import campaign_view

    screens = []

    class Snapshot(Watch):
        def __call__(self, ctx, hosts, final):
            out = super().__call__(ctx, hosts, final)
            screen = io.StringIO()
            Console(file=screen, width=200).print(view.render())
            screens.append(screen.getvalue())
            return out

    snapshot = Snapshot({("b", 2, "check"): "canary run failed"})
    journal, cid, engine = start(store, Script(), ["a"], ["b"], ["c"], fail_at=[1, 2, 2], observe=snapshot,
                                 soak_s=[0.5], soak_interval_s=0.2)
    view = campaign_view.LiveView(Console(file=io.StringIO(), force_terminal=True, width=200),
                                  [dict(r) for r in journal.hosts(cid)], "campaign")
    lines = io.StringIO()
    journal.listener = progress.Fanout(view, progress.PlainLines(lines))
    with view:
        assert engine.run() == "done"
    assert re.search(r"soaking: 0h00m0\ds left; last check none yet", screens[0]), screens[0]
    assert re.search(r"soaking: 0h00m0\ds left; last check \d\d:\d\d:\d\d: soak check after wave 1: 1 ok", screens[1])
    assert "soak check after wave 2: 1 ok; b FAILED: soak: canary run failed" in lines.getvalue()
    assert "soaking" not in str(view.render().caption or "")  # gone once the campaign ran on


# ---- NVLink domains: the domain, not the host, is the unit of change ----------------------------------------

RACKS = {"a1": "rack-a", "a2": "rack-a", "a3": "rack-a", "b1": "rack-b", "b2": "rack-b", "b3": "rack-b"}


def test_a_tray_failing_after_its_reboot_rolls_its_whole_domain_back_and_the_other_is_never_touched(store):
    script = Script({("a2", "verify"): "fail"})
    journal, cid, engine = start(store, script, ["a1", "a2", "a3"], ["b1", "b2", "b3"], fail_at=[1, 1],
                                 domains=RACKS)
    assert engine.run() == "rolled_back"
    got = states(journal, cid)
    assert [got[h] for h in ("a1", "a2", "a3")] == ["rolled_back"] * 3
    assert [got[h] for h in ("b1", "b2", "b3")] == ["not_started"] * 3
    # the trays that verified went no further than their failed peer: no probe, no undrain on the new driver
    assert ("probe_after", ("a1", "a3")) not in script.calls
    assert ("rollback_install", ("a1", "a2", "a3")) in script.calls  # the domain goes back together
    c = journal.campaign(cid)
    assert c["reason"].startswith("wave 1 failed (1 of 1 domains, ") and "a2: verify fail" in c["reason"]
    reasons = {r["host"]: r["reason"] for r in journal.hosts(cid)}
    assert reasons["a1"].startswith("NVLink domain rack-a: a2 failed (verify fail)")


def test_a_domain_failing_within_the_budget_goes_back_whole_and_the_campaign_goes_on(store):
    script = Script({("a1", "undrain"): "fail"})  # a1's peers are done by then: they go back with it
    domains = dict(RACKS, c1="rack-c")
    journal, cid, engine = start(store, script, ["c1"], ["a1", "a2", "b1", "b2"], fail_at=[1, 2], domains=domains)
    assert engine.run() == "done"
    got = states(journal, cid)
    assert (got["a1"], got["a2"]) == ("rolled_back", "rolled_back")
    assert (got["b1"], got["b2"], got["c1"]) == ("done", "done", "done")


def test_a_drain_failing_on_one_tray_releases_the_domains_drained_trays_and_changes_nothing(store):
    script = Script({("a1", "wait_idle"): "fail"})
    journal, cid, engine = start(store, script, ["a1", "a2", "a3"], fail_at=[1], domains=RACKS)
    assert engine.run() == "rolled_back"
    assert set(states(journal, cid).values()) == {"failed"}  # nothing changed: nothing to roll back
    assert ("release", ("a1", "a2", "a3")) in script.calls
    assert not any(step == "install" for step, _ in script.calls)


def test_the_soak_watches_a_domain_as_one_a_tray_failing_it_takes_its_domain_back_within_the_budget(store):
    watch = Watch({("b2", 2, "check"): "new Xid 79"})
    script = Script()
    domains = dict(RACKS, c1="rack-c", d1="rack-d")
    journal, cid, engine = start(store, script, ["c1"], ["b1", "b2", "b3", "d1"], ["a1", "a2"], fail_at=[1, 2, 2],
                                 observe=watch, domains=domains, **SOAKING)
    assert engine.run() == "done"
    got = states(journal, cid)
    assert [got[h] for h in ("b1", "b2", "b3")] == ["rolled_back"] * 3 and got["d1"] == "done"
    assert ("rollback_drain", ("b1", "b2", "b3")) in script.calls
    reasons = {r["host"]: r["reason"] for r in journal.hosts(cid)}
    assert reasons["b1"] == "NVLink domain rack-b: b2 failed (soak: new Xid 79): the domain moves as one", reasons


def test_a_failed_loop_task_says_which_item_failed_and_why():
    """A unit the activation must start again (nvidia-imex.service on a tray whose IMEX will not come up) fails a
    loop task: the step's reason names the item and its error, not Ansible's "One or more items failed"."""
    from orchestrator.fleet.runner import _message
    res = {"msg": "One or more items failed", "results": [
        {"item": "nvidia-persistenced.service", "changed": False},
        {"item": "nvidia-imex.service", "failed": True, "msg": "Unable to start service nvidia-imex.service"}]}
    assert _message(res) == "nvidia-imex.service: Unable to start service nvidia-imex.service"
    assert _message({"msg": "boom"}) == "boom"


def test_canary_metrics_not_judged_at_the_end_of_a_soak_hold_the_campaign_and_a_resume_goes_on(store):
    """canary.on_missing: hold (soak.canary_metrics puts it in the gate's detail): halted for a person, the record
    says why; `campaign resume` accepts it and the next wave runs."""
    class Unjudged(Watch):
        def __call__(self, ctx, hosts, final):
            out = super().__call__(ctx, hosts, final)
            if final:
                for o in out.values():
                    o.detail["hold"] = "canary metric not judged at the end of the soak: tensor_active: Prometheus " \
                                       "http://p:9090: connection refused (canary.on_missing: hold)"
            return out
    journal, cid, engine = start(store, Script(), ["a"], ["b"], observe=Unjudged(), **SOAKING)
    assert engine.run() == "halted"
    c = journal.campaign(cid)
    assert c["reason"].startswith("the soak after wave 1 is held: a: canary metric not judged") and \
        "connection refused" in c["reason"]
    assert states(journal, cid) == {"a": "done", "b": "precheck"}
    engine_mod.accept_held(journal, cid)
    assert engine.run() == "done"
    assert states(journal, cid) == {"a": "done", "b": "done"}


def test_a_counters_increase_counts_across_a_reset():
    from orchestrator.judge.canary.kinds import increase
    assert increase([(0, 3.0), (60, 5.0), (120, 1.0), (180, 2.0)]) == 4.0  # 3->5 (+2), a reboot: 0->1 (+1), 1->2 (+1)
    assert increase([(0, 7.0)]) == 0.0 and increase([]) == 0.0
