"""Repeat offenders (orchestrator/history/offenders.py): a host with `count` incidents of the baseline's classes within
its window is left out of the plan with its evidence, in no wave nor control cohort, and listed by
`fleetctl hosts --repeat-offenders`. Histories are built through fleetctl's own write path at given times (the test
clock), as in test_ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import baseline as baseline_mod, plan, schemas, settings
from orchestrator.history import offenders, timefmt
from orchestrator.exitcodes import Exit
from orchestrator.judge.canary import planning
from orchestrator.history.store import Store
from tests.helpers.cli import fleetctl
from tests.helpers.facts import entry, on
from tests.helpers.ledger import XID_79, at, host, record

THREE = "repeat offender: 3 incidents in 14 days: Xid 79 x3"
EMBEDDED = Path(offenders.__file__).parents[1] / "data" / "default-baseline.yml"


@pytest.fixture
def policed(tmp_path) -> Path:
    """The embedded baseline with the policy the docs show (its last group is `all`): 3 incidents within 14 days of
    the default classes. The embedded baseline itself sets none (a policy is the operator's choice)."""
    path = tmp_path / "policed.yml"
    path.write_text(EMBEDDED.read_text() + "    incidents:\n      repeat_offender: {count: 3, within: 14d}\n")
    return path


def history(store, monkeypatch, facts, catalog, offender="gpu1", twice="gpu2", clean=("gpu3", "gpu4")):
    """OFFENDER falls off the bus in three boots (each seen by two audits: one incident each), TWICE in two; the
    CLEAN hosts log nothing."""
    boots = {offender: (1, 5, 9), twice: (2, 6)}
    for day in range(0, 11):
        hosts = []
        for name in (offender, twice, *clean):
            fell = [d for d in boots.get(name, ()) if d <= day]
            boot = f"boot-{len(fell)}"
            log = [XID_79] if fell and day - fell[-1] <= 1 else []  # the line stays until the next reboot's audit
            hosts.append(host(name, facts, catalog, boot=boot, kernel_log=log))
        record(store, monkeypatch, at(day), hosts)


def test_a_host_with_xid_79_in_three_boots_is_left_out_of_the_plan_and_of_every_control_cohort(
        tmp_path, h100, catalog, monkeypatch, policed):
    base = baseline_mod.load(str(policed))
    with Store(tmp_path / "history.sqlite3") as store:
        history(store, monkeypatch, h100, catalog)
        monkeypatch.setenv(timefmt.TEST_CLOCK, at(10))
        names = ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"]
        left = offenders.left_out(store, [(n, ("all", "gpu", "h100")) for n in names], base)
    assert left == [{"name": "gpu1", "code": "repeat_offender", "reason": THREE}]
    facts = on(h100, "550.163.01")
    p = plan.build("570.86.15", plan.parse_ramp(settings.WAVES.default),
                   [entry(n, ["gpu", "h100"], facts) for n in names], base, left_out=left)
    assert p["excluded"] == [{"name": "gpu1", "groups": ["gpu", "h100"], "code": "repeat_offender",
                              "reason": THREE}]
    planned = [h["name"] for w in p["waves"] for h in w["hosts"]]
    assert sorted(planned) == ["gpu2", "gpu3", "gpu4", "gpu5"]  # two in the window: below the count, planned
    controls = [h for cohorts in planning.control_cohorts(p).values() for c in cohorts.values() for h in c]
    assert controls and "gpu1" not in controls


def test_fleetctl_plan_and_upgrade_leave_out_a_repeat_offender_named_with_its_evidence_until_it_ages_out(
        tmp_path, h100, catalog, monkeypatch, policed):
    with Store(tmp_path / "history.sqlite3") as store:
        history(store, monkeypatch, h100, catalog, offender="localhost")
    monkeypatch.delenv(timefmt.TEST_CLOCK)
    out = tmp_path / "plan.json"
    embedded = fleetctl("plan", "--to", "570.86.15", home=tmp_path, env={timefmt.TEST_CLOCK: at(10)})
    assert embedded.returncode == Exit.OK and "repeat" not in embedded.stdout, embedded.stdout  # no policy: planned
    proc = fleetctl("plan", "--to", "570.86.15", "-b", str(policed), "--format", "json", "-o", str(out),
                    home=tmp_path, env={timefmt.TEST_CLOCK: at(10)})
    assert proc.returncode == Exit.OK, proc.stderr
    report = json.loads(out.read_text())
    assert schemas.first_error("campaign-plan", report) is None
    assert report["excluded"] == [{"name": "localhost", "groups": ["ungrouped"], "code": "repeat_offender",
                                   "reason": THREE}]
    campaign = fleetctl("upgrade", "--to", "570.86.15", "-b", str(policed), "--dry-run", home=tmp_path,
                        env={timefmt.TEST_CLOCK: at(10)})
    assert campaign.returncode == Exit.FINDINGS, campaign.stderr  # as the run would end: its host left out
    assert f"not in the campaign: localhost: {THREE}" in campaign.stdout
    later = fleetctl("plan", "--to", "570.86.15", "-b", str(policed), home=tmp_path, env={timefmt.TEST_CLOCK: at(30)})
    assert later.returncode == Exit.OK, later.stderr
    assert "excluded (no_driver)" in later.stdout and "repeat" not in later.stdout  # 14 days on: judged as ever


def test_hosts_repeat_offenders_lists_them_with_their_evidence_by_the_baselines_policy(
        tmp_path, h100, catalog, monkeypatch, policed):
    with Store(tmp_path / "history.sqlite3") as store:
        history(store, monkeypatch, h100, catalog)
    clock = {timefmt.TEST_CLOCK: at(10)}
    none = fleetctl("hosts", "--repeat-offenders", home=tmp_path, env=clock)  # the embedded baseline sets none
    assert none.returncode == Exit.USAGE and none.stderr.count("\n") == 1 and "repeat_offender" in none.stderr, \
        none.stderr
    text = fleetctl("hosts", "--repeat-offenders", "-b", str(policed), home=tmp_path, env=clock)
    assert text.returncode == Exit.OK, text.stderr
    assert "gpu1" in text.stdout and "3 incidents in 14 days: Xid 79 x3" in text.stdout
    assert "gpu2" not in text.stdout and "gpu3" not in text.stdout
    strict = tmp_path / "strict.yml"
    strict.write_text("schema_version: 1\ngroups:\n  all:\n    incidents:\n      repeat_offender:\n"
                      "        count: 2\n        within: 8d\n        classes: [xid_79, gpu_lost]\n")
    proc = fleetctl("hosts", "--repeat-offenders", "-b", str(strict), "--format", "json", home=tmp_path, env=clock)
    assert proc.returncode == Exit.OK, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["policy"] == {"count": 2, "within_s": 8 * 86400, "classes": ["xid_79", "gpu_lost"]}
    assert [(h["host"], h["count"], h["classes"], h["evidence"]) for h in doc["hosts"]] == [
        ("gpu1", 2, {"xid_79": 2}, "2 incidents in 8 days: Xid 79 x2"),  # the one of day 1 is older than 8 days
        ("gpu2", 2, {"xid_79": 2}, "2 incidents in 8 days: Xid 79 x2")]
    assert [i["at"] for i in doc["hosts"][0]["incidents"]] == [at(5), at(9)]
    assert all(i["source"].startswith("run:") for i in doc["hosts"][0]["incidents"])


@pytest.mark.parametrize("policy,expected", [
    ("{count: 3, within: 14d, classes: [xid_79, xid_97]}",
     "$.groups.all.incidents.repeat_offender.classes[1]: 'xid_97' is not an incident class (xid_79, xid, "),
    ("{count: 3, within: -14d}", "$.groups.all.incidents.repeat_offender.within: '-14d' is not a duration"),
    ("{count: 3, within: 0d}", "$.groups.all.incidents.repeat_offender.within: '0d' is not above 0"),
    ("{count: 0, within: 14d}", "$.groups.all.incidents.repeat_offender.count: 0 is less than the minimum of 1"),
    ("{count: -2, within: 14d}", "$.groups.all.incidents.repeat_offender.count: -2 is less than the minimum of 1"),
])
@pytest.mark.parametrize("command", [["plan", "--to", "570.86.15"], ["hosts", "--repeat-offenders"]])
def test_a_bad_repeat_offender_policy_is_one_line_and_exit_2(tmp_path, policy, expected, command):
    bad = tmp_path / "bad.yml"
    bad.write_text(f"schema_version: 1\ngroups:\n  all:\n    incidents:\n      repeat_offender: {policy}\n")
    proc = fleetctl(*command, "-b", str(bad), home=tmp_path)
    assert proc.returncode == Exit.USAGE
    assert proc.stderr.startswith(f"fleetctl: error: {bad}: {expected}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""
