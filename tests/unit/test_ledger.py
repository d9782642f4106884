"""The ledger (orchestrator/history/ledger.py): incidents per host derived from the history, built through fleetctl's
own write path at given times (the test clock, $FLEETCTL_TEST_CLOCK), and `fleetctl hosts` / `fleetctl hosts show`."""

from __future__ import annotations

import copy
import json

import pytest

from orchestrator.history import ledger as ledger_mod, timefmt
from orchestrator.campaign import steps
from orchestrator.exitcodes import Exit
from orchestrator.history.store import Store
from tests.helpers.campaign import Script, start
from tests.helpers.cli import fleetctl
from tests.helpers.ledger import XID_48, XID_79, at, host, record


@pytest.fixture
def home(tmp_path):
    return tmp_path


def test_the_test_clock_stamps_runs_and_chain_records_and_the_chain_holds(home, h100, catalog, monkeypatch):
    with Store(home / "history.sqlite3") as store:
        for day in range(0, 35, 7):  # five weeks of weekly audits
            record(store, monkeypatch, at(day), [host("gpu1", h100, catalog)])
        started = [r["started_at"] for r in store.runs()]
        chained = [r[0] for r in store.db.execute("SELECT at FROM chain ORDER BY seq")]
    assert started == chained == [at(d) for d in range(0, 35, 7)]
    monkeypatch.delenv(timefmt.TEST_CLOCK)
    proc = fleetctl("report", "verify", home=home)
    assert proc.returncode == Exit.OK and "history chain intact: 5 records" in proc.stdout


def test_a_bad_test_clock_is_one_line_and_exit_2(home):
    proc = fleetctl("hosts", home=home, env={timefmt.TEST_CLOCK: "last tuesday"})
    assert proc.returncode == Exit.USAGE
    assert proc.stderr.strip().splitlines() == [
        "fleetctl: error: FLEETCTL_TEST_CLOCK='last tuesday' is not an ISO 8601 time (2026-01-31T12:00:00Z)"]


def test_an_xid_line_seen_by_every_audit_until_the_reboot_is_one_incident(home, h100, catalog, monkeypatch):
    with Store(home / "history.sqlite3") as store:
        record(store, monkeypatch, at(0), [host("gpu1", h100, catalog), host("gpu2", h100, catalog)])
        first = record(store, monkeypatch, at(1), [host("gpu1", h100, catalog, kernel_log=[XID_79])])
        for day in (2, 3):  # the line stays in the kernel log: the same incident
            record(store, monkeypatch, at(day), [host("gpu1", h100, catalog, kernel_log=[XID_79])])
        # rebooted, it falls off the bus again: a second incident; and an ECC Xid with it
        again = record(store, monkeypatch, at(4), [host("gpu1", h100, catalog, boot="boot-2",
                                                        kernel_log=[XID_79, XID_48])])
        with ledger_mod.Ledger(store) as ledger:
            incidents = ledger.incidents(host="gpu1")
    uuid = h100["gpus"][0]["uuid"]
    assert [(i["at"], i["class"], i["gpu"], i["source"], i["driver"]) for i in incidents] == [
        (at(1), "xid_79", uuid, f"run:{first}", "580.159.04"),
        (at(4), "xid_79", uuid, f"run:{again}", "580.159.04"),
        (at(4), "xid", uuid, f"run:{again}", "580.159.04")]
    assert "Xid 48" in incidents[2]["detail"] and "double bit" in incidents[2]["detail"]


def test_a_control_failing_across_audits_is_one_incident_at_its_onset(home, h100, catalog, monkeypatch):
    with Store(home / "history.sqlite3") as store:
        record(store, monkeypatch, at(0), [host("gpu1", h100, catalog)])
        onset = record(store, monkeypatch, at(1), [host("gpu1", h100, catalog, lost=True)])
        record(store, monkeypatch, at(2), [host("gpu1", h100, catalog, lost=True)])  # still lost: the same one
        record(store, monkeypatch, at(3), [host("gpu1", h100, catalog)])  # back after a reseat
        again = record(store, monkeypatch, at(9), [host("gpu1", h100, catalog, lost=True)])
        with ledger_mod.Ledger(store) as ledger:
            lost = ledger.incidents(host="gpu1", classes=["gpu_lost"])
    assert [(i["at"], i["source"], i["gpu"]) for i in lost] == [
        (at(1), f"run:{onset}", h100["gpus"][0]["uuid"]), (at(9), f"run:{again}", h100["gpus"][0]["uuid"])]


def test_campaign_gates_and_rollbacks_are_incidents(home, h100, catalog, monkeypatch):
    with Store(home / "history.sqlite3") as store:
        record(store, monkeypatch, at(0), [host("a", h100, catalog), host("b", h100, catalog)])
        monkeypatch.setenv(timefmt.TEST_CLOCK, at(1))
        journal, cid, engine = start(store, Script({("a", "probe_after"): "fail"}), ["a"], ["b"])
        assert engine.run() == "rolled_back"
        with ledger_mod.Ledger(store) as ledger:
            incidents = ledger.incidents()
    assert [(i["host"], i["class"], i["at"]) for i in incidents] == [("a", "gate_failed", at(1)),
                                                                     ("a", "rollback", at(1))]
    assert incidents[0]["source"].startswith(f"campaign:{cid}:") and incidents[0]["driver"] == "580.159.04"


def test_the_ledger_catches_up_incrementally_and_rebuilds_for_another_history(home, h100, catalog, monkeypatch):
    with Store(home / "history.sqlite3") as store:
        record(store, monkeypatch, at(0), [host("gpu1", h100, catalog, kernel_log=[XID_79])])
        with ledger_mod.Ledger(store) as ledger:
            assert len(ledger.incidents()) == 1
        record(store, monkeypatch, at(1), [host("gpu2", h100, catalog, kernel_log=[XID_79])])
        with ledger_mod.Ledger(store, update=False) as ledger:
            assert ledger.update() == 1  # only the new record is read
            assert [i["host"] for i in ledger.incidents()] == ["gpu1", "gpu2"]
    (home / "history.sqlite3").unlink()  # another history under the same name: the ledger is rebuilt from it
    with Store(home / "history.sqlite3") as store:
        record(store, monkeypatch, at(2), [host("gpu3", h100, catalog, kernel_log=[XID_79])])
        with ledger_mod.Ledger(store) as ledger:
            assert [i["host"] for i in ledger.incidents()] == ["gpu3"]


@pytest.fixture
def fleet_history(home, h100, catalog, monkeypatch):
    """Three weeks: gpu1 falls off the bus three times (rebooted between), gpu2 once three weeks ago, gpu3 never."""
    with Store(home / "history.sqlite3") as store:
        for day in range(22):
            boot = f"boot-{day // 7}"
            logs = {"gpu1": [XID_79] if day in (8, 15, 19) else [], "gpu2": [XID_79] if day == 0 else []}
            record(store, monkeypatch, at(day), [
                host(n, h100, catalog, boot=f"{n}-{boot if n != 'gpu1' else day}", kernel_log=logs.get(n, []))
                for n in ("gpu1", "gpu2", "gpu3")])
    return home


def test_hosts_lists_the_hosts_with_incidents_in_the_window(fleet_history):
    env = {timefmt.TEST_CLOCK: at(21, 12)}
    proc = fleetctl("hosts", "--within", "14d", "--format", "json", home=fleet_history, env=env)
    assert proc.returncode == Exit.OK, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["within_s"] == 14 * 86400
    assert doc["hosts"] == [{"host": "gpu1", "count": 3, "classes": {"xid_79": 3}, "last": at(19),
                             "since_last_s": 2.5 * 86400, "mtbi_s": 5.5 * 86400}]
    wide = json.loads(fleetctl("hosts", "--within", "30d", "--format", "json", home=fleet_history, env=env).stdout)
    assert [h["host"] for h in wide["hosts"]] == ["gpu1", "gpu2"]
    table = fleetctl("hosts", home=fleet_history, env=env)
    assert table.returncode == Exit.OK
    line = next(line for line in table.stdout.splitlines() if "gpu1" in line)
    assert "xid_79 x3" in line and "2d12h" in line and "5d12h" in line


def test_hosts_show_gives_the_timeline(fleet_history):
    proc = fleetctl("hosts", "show", "gpu1", "--format", "json", home=fleet_history)
    assert proc.returncode == Exit.OK, proc.stderr
    doc = json.loads(proc.stdout)
    assert [(i["at"], i["class"]) for i in doc["incidents"]] == [(at(d), "xid_79") for d in (8, 15, 19)]
    table = fleetctl("hosts", "show", "gpu1", home=fleet_history)
    assert table.returncode == Exit.OK and table.stdout.count("xid_79") == 3
    assert fleetctl("hosts", "show", "gpu3", home=fleet_history).stdout.strip() == "gpu3: no incidents"


@pytest.mark.parametrize("args,message", [
    (("hosts", "show", "nosuch"), "fleetctl: error: host 'nosuch': the history holds no record of it (fleetctl hosts "
                                  "lists those with incidents)"),
    (("hosts", "--within", "-3d"), "'-3d' is not a duration"),
    (("hosts", "--within", "0"), "'0' is not above 0"),
])
def test_bad_input_is_one_line_and_exit_2(fleet_history, args, message):
    proc = fleetctl(*args, home=fleet_history)
    assert proc.returncode == Exit.USAGE
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3, proc.stderr  # click: usage + line
    assert proc.stdout == ""


def test_report_verify_passes_beside_the_ledger(fleet_history):
    assert fleetctl("hosts", home=fleet_history).returncode == Exit.OK
    assert (fleet_history / "history.sqlite3.ledger").exists()
    proc = fleetctl("report", "verify", home=fleet_history)
    assert proc.returncode == Exit.OK and "history chain intact: 22 records" in proc.stdout


def test_gpu_days_count_each_gap_up_to_its_limit_on_the_driver_seen_before_it(home, h100, catalog, monkeypatch):
    newer = copy.deepcopy(h100)
    newer["driver"]["module_version"] = "590.10.01"
    with Store(home / "history.sqlite3") as store:
        for day in (0, 1, 2):
            record(store, monkeypatch, at(day), [host("gpu1", h100, catalog)])
        record(store, monkeypatch, at(10), [host("gpu1", newer, catalog)])  # 8 days unseen: 2 of them counted
        record(store, monkeypatch, at(11), [host("gpu1", newer, catalog, lost=True)])
        record(store, monkeypatch, at(12), [host("gpu1", newer, catalog)])  # its one GPU lost for a day: none
        with ledger_mod.Ledger(store) as ledger:
            days = ledger.gpu_days()
            observed = ledger.observations(host="gpu1")
    assert days == [{"host": "gpu1", "driver": "580.159.04", "model": "NVIDIA H100 80GB HBM3", "gpu_days": 4.0},
                    {"host": "gpu1", "driver": "590.10.01", "model": "NVIDIA H100 80GB HBM3", "gpu_days": 1.0}]
    assert [(o["at"], o["gpus"]) for o in observed][-3:] == [(at(10), 1), (at(11), 0), (at(12), 1)]


class Unreachable(Script):
    """Every step ok, except HOST, unreachable at STEP as the runner reports it (steps.unreachable_or_failed)."""

    def __init__(self, host, step):
        super().__init__()
        self.host, self.step = host, step

    def __getitem__(self, step):
        run = super().__getitem__(step)

        def unreachable(ctx, hosts):
            out = run(ctx, hosts)
            if step == self.step and self.host in out:
                out[self.host] = steps.Outcome("fail", "unreachable: ssh: connect to host b port 22: No route to host",
                                               {}, None)
            return out
        return unreachable


def test_a_host_unreachable_at_a_campaign_step_is_an_incident(home, h100, catalog, monkeypatch):
    with Store(home / "history.sqlite3") as store:
        record(store, monkeypatch, at(0), [host("a", h100, catalog), host("b", h100, catalog)])
        monkeypatch.setenv(timefmt.TEST_CLOCK, at(2))
        journal, cid, engine = start(store, Unreachable("b", "verify"), ["a", "b"], fail_at=[1])
        engine.run()
        with ledger_mod.Ledger(store) as ledger:
            found = ledger.incidents(classes=["unreachable_at_step"])
    assert [(i["host"], i["at"], i["detail"]) for i in found] == [
        ("b", at(2), "verify: unreachable: ssh: connect to host b port 22: No route to host")]
