"""The campaign's Slurm decisions (schedulers/slurm.py) on the real node states of tests/testdata/slurm:
which node a campaign leaves out, drains, waits for, reserves and resumes. Slurm's answers come from the captures;
what fleetctl asks of Slurm is recorded. The lab tests (tests/lab/test_lab_slurm.py) run the same against slurmctld
and slurmd."""

from __future__ import annotations

import dataclasses
import subprocess
from datetime import datetime, timedelta, timezone

import pytest

from orchestrator.schedulers import slurmctl as slurm
from orchestrator.campaign import hooks, steps
from orchestrator.schedulers import scheduler
from orchestrator.campaign.context import Context
from orchestrator.campaign.hooks import Hooks
from orchestrator.campaign.options import CampaignOptions, IdleOptions
from orchestrator.schedulers import slurm as slurm_side
from orchestrator.errors import InputError, SlurmError
from orchestrator.fleet.inventory import Fleet, Host
from tests.helpers.slurm import captured

SLURM = slurm_side.Slurm()


class Journal:
    """What the Slurm side reads of the journal: host states, and the events it notes (and reads back)."""

    def __init__(self, states: dict[str, str]):
        self.states, self.notes = states, []

    def hosts(self, cid):
        return [{"host": h, "state": s} for h, s in self.states.items()]

    def note(self, cid, event, **data):
        self.notes.append((event, data))

    def events(self, cid):
        return [{"event": event, **data} for event, data in self.notes]


def context(states: dict[str, str], node_names: dict[str, str] | None = None, idle_s: int = 1,
            drain_mode: str = "drain") -> Context:
    hosts = tuple(Host(h, ("all",), {"fleetctl_node_name": (node_names or {}).get(h, h)}) for h in states)
    options = CampaignOptions(hooks=Hooks(slurm=True), idle=IdleOptions(timeout_s=idle_s, poll_s=1),
                              drain_mode=drain_mode)
    ctx = Context(Journal(states), 7, "570.86.15", Fleet("inv", hosts, frozenset({"all"}), {}), None, options,
                  scheduler=scheduler.of(options))
    ctx.befores = {h: {"version": "550.163.01"} for h in states}
    return ctx


def test_the_plan_leaves_out_every_node_someone_took_out_of_service_with_its_state_and_reason(fake):
    fake(n1="idle", n2="drained-admin", n3="down-admin", n4="maint", n5="allocated", n6="draining")
    fleet = context({h: "precheck" for h in ("n1", "n2", "n3", "n4", "n5", "n6", "n7")}).fleet
    out = {e["name"]: e for e in SLURM.left_out(fleet, [h.name for h in fleet.hosts])}
    assert sorted(out) == ["n2", "n3", "n4", "n6", "n7"]  # n1 idle and n5 running jobs: in the campaign
    assert out["n2"]["code"] == "drained_elsewhere"
    assert out["n2"]["reason"] == "out of service in Slurm, left as it is: IDLE+DRAIN (RMA: GPU 3 ECC (ticket 4411))"
    assert "DOWN (IB cable flapping)" in out["n3"]["reason"] and "MAINTENANCE" in out["n4"]["reason"]
    assert out["n7"]["code"] == "not_in_slurm"  # a host Slurm does not know is never guessed at


def test_drain_writes_the_campaigns_reason_and_a_rollback_says_so(fake):
    f = fake(n1="allocated", n2="idle")
    ctx = context({"n1": "drain", "n2": "rollback_drain"}, node_names={"n1": "n1", "n2": "n2"})
    out = ctx.scheduler.drain(ctx, ["n1", "n2"])
    assert f.asked == [("drain", "n1", "fleetctl campaign 7: 550.163.01 -> 570.86.15"),
                       ("drain", "n2", "fleetctl campaign 7: 570.86.15 -> 550.163.01 (rollback)")]
    assert out["n1"].outcome == "ok" and out["n1"].detail["slurm"]["before"] == {"state": "ALLOCATED", "reason": None}
    # a resumed run finds its own drain: nothing asked twice
    assert ctx.scheduler.drain(ctx, ["n1"])["n1"].outcome == "ok" and len(f.asked) == 2


def test_a_node_an_admin_drained_since_the_plan_is_never_drained_by_the_change_and_the_rollback_goes_on(fake):
    f = fake(n1="drained-admin", n2="drained-admin")
    out = SLURM.drain(context({"n1": "drain", "n2": "rollback_drain"}), ["n1", "n2"])
    assert out["n1"].outcome == "fail" and "RMA: GPU 3 ECC" in out["n1"].reason
    assert out["n2"].outcome == "ok" and out["n2"].detail["slurm"]["left"]
    assert f.asked == []


def test_undrain_resumes_only_this_campaigns_own_drain_and_says_when_it_leaves_one(fake):
    f = fake(n1="idle", n2="idle", n3="idle")
    ctx = context({"n1": "undrain", "n2": "undrain", "n3": "release"})
    ctx.scheduler.drain(ctx, ["n1", "n2"])
    f.state["n2"] = dataclasses.replace(f.state["n2"], reason="IB cable flapping")  # an admin took it over
    out = ctx.scheduler.undrain(ctx, ["n1", "n2", "n3"])
    assert f.asked[-1] == ("resume", "n1") and ("resume", "n2") not in f.asked
    assert out["n2"].detail["slurm"] == {"node": "n2", "resumed": False, "state": "IDLE+DRAIN",
                                         "reason": "IB cable flapping"}
    assert ctx.journal.notes == [("slurm_node_left", {"host": "n2", "node": "n2", "state": "IDLE+DRAIN",
                                                      "node_reason": "IB cable flapping"})]
    assert out["n3"].outcome == "ok" and not out["n3"].detail["slurm"]["resumed"]  # never drained: nothing to do
    assert f.state["n3"].state == "IDLE"


def test_busy_names_each_node_slurm_still_runs_jobs_on_until_it_reports_drained(fake):
    f = fake(n1="draining", n2="drained-after-job")
    ctx = context({"n1": "wait_idle", "n2": "wait_idle", "n3": "wait_idle"})
    busy = ctx.scheduler.busy(ctx, ["n1", "n2", "n3"])
    assert sorted(busy) == ["n1", "n3"] and busy["n3"] == "Slurm has no node n3"
    assert busy["n1"].startswith("Slurm still has jobs on n1: ALLOCATED+DRAIN")
    f.state["n1"] = captured(f.testdata, "drained-after-job", "n1")
    assert ctx.scheduler.busy(ctx, ["n1", "n2"]) == {}


def test_slurm_unreachable_is_one_line_for_the_step(monkeypatch):
    def refuse(*a, **k):
        raise SlurmError("sinfo --json did not answer within 15s (is slurmctld up?)")
    monkeypatch.setattr(slurm, "_run", refuse)
    with pytest.raises(SlurmError, match="is slurmctld up"):
        SLURM.drain(context({"n1": "drain"}), ["n1"])


JOBCOMP = (
    "JobId=41 UserId=root(0) GroupId=root(0) Name=train step 1 JobState=COMPLETED Partition=gpu TimeLimit=UNLIMITED "
    "StartTime=2026-11-24T10:00:00 EndTime=2026-11-24T10:05:00 NodeList=h100-01 NodeCnt=1 ProcCnt=1 WorkDir=/ "
    "ReservationName= Tres=cpu=1,node=1 Account= QOS= WcKey= Cluster=lab0 SubmitTime=2026-11-24T10:00:00 "
    "EligibleTime=2026-11-24T10:00:00 DerivedExitCode=0:0 ExitCode=0:0\n"
    "JobId=42 UserId=root(0) GroupId=root(0) Name=wrap JobState=FAILED Partition=gpu TimeLimit=UNLIMITED "
    "StartTime=2026-11-24T10:06:00 EndTime=2026-11-24T10:06:01 NodeList=h100-[01-02] NodeCnt=2 ProcCnt=2 WorkDir=/ "
    "ReservationName= Tres=cpu=2,node=2 Account= QOS= WcKey= Cluster=lab0 SubmitTime=2026-11-24T10:06:00 "
    "EligibleTime=2026-11-24T10:06:00 DerivedExitCode=0:0 ExitCode=3:0\n"
    "JobId=43 UserId=root(0) GroupId=root(0) Name=cut\n")


def test_the_job_completion_log_gives_each_jobs_end_state_nodes_and_time(monkeypatch, tmp_path):
    jobs = slurm.parse_jobcomp(JOBCOMP)
    assert [(j["id"], j["name"], j["state"], j["exit_code"], j["nodelist"]) for j in jobs] == [
        ("41", "train step 1", "COMPLETED", "0:0", "h100-01"), ("42", "wrap", "FAILED", "3:0", "h100-[01-02]")]
    assert jobs[1]["end"] == datetime(2026, 11, 24, 10, 6, 1).astimezone(timezone.utc)  # the controller's local time
    log = tmp_path / "jobcomp.log"
    log.write_text(JOBCOMP)
    monkeypatch.setattr(slurm, "jobcomp_path", lambda: log)
    monkeypatch.setattr(slurm, "hostnames", lambda nodelist: {"h100-[01-02]": ["h100-01", "h100-02"]}[nodelist])
    since = datetime(2026, 11, 24, 10, 1).astimezone(timezone.utc)
    failed = slurm_side.failed_jobs(["h100-02", "h100-03"], since)
    assert [j["id"] for j in failed["h100-02"]] == ["42"] and failed["h100-03"] == []


def test_a_node_whose_slurmd_never_answers_after_the_change_stays_drained_and_fails_its_host(fake, monkeypatch):
    f = fake(n1="idle", n2="idle")
    ctx = context({"n1": "undrain", "n2": "undrain"})
    ctx.scheduler.drain(ctx, ["n1", "n2"])
    lost = f.state["n2"]
    f.state["n2"] = dataclasses.replace(lost, state=lost.state + "+NOT_RESPONDING", flags=lost.flags | {"NOT_RESPONDING"})
    monkeypatch.setattr(slurm_side, "SLURMD_WAIT_S", 0.0)
    out = ctx.scheduler.undrain(ctx, ["n1", "n2"])
    assert out["n1"].outcome == "ok" and out["n2"].outcome == "fail"
    assert "slurmd on n2 has not answered slurmctld" in out["n2"].reason and "stays drained" in out["n2"].reason
    assert ("resume", "n2") not in f.asked and f.state["n2"].drained_or_draining


def ran(command: str, tmp_path) -> list[list[str]]:
    """The argv of each scontrol COMMAND runs, as a shell on the node runs it (a recording scontrol on PATH)."""
    log = tmp_path / "argv"
    (tmp_path / "scontrol").write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" >> {log}; printf "\\n" >> {log}\n')
    (tmp_path / "scontrol").chmod(0o755)
    subprocess.run(["/bin/sh", "-c", command], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True, timeout=10)
    return [line.rstrip("\0").split("\0") for line in log.read_text().splitlines()]


def test_the_activation_reboots_the_campaigns_own_nodes_through_slurm_and_leaves_anyone_elses_alone(fake, tmp_path):
    f = fake(n1="drained-after-job", n2="drained-admin", n3="rebooted-down")
    ctx = context({"a1": "activate", "a2": "activate", "a3": "rollback_activate"},
                  node_names={"a1": "n1", "a2": "n2", "a3": "n3"})
    change = ctx.scheduler.reboot_commands(ctx, ["a1", "a2"], rollback=False)
    assert sorted(change) == ["a1"]  # an admin's drain: the host reboots by itself, the node's state is theirs
    reason = "reason=fleetctl campaign 7: 550.163.01 -> 570.86.15"
    # FAIL, not DRAIN: Slurm clears DRAIN when the reboot completes, and with ReturnToService=2 the node would be
    # back in service at its next ping, before the verify
    assert ran(change["a1"], tmp_path) == [["update", "nodename=n1", "state=fail", reason],
                                           ["reboot", "nextstate=DOWN", reason, "n1"]]
    back = ctx.scheduler.reboot_commands(ctx, ["a3"], rollback=True)
    assert ran(back["a3"], tmp_path)[-1] == [
        "reboot", "nextstate=DOWN", "reason=fleetctl campaign 7: 570.86.15 -> 550.163.01 (rollback)", "n3"]
    assert f.asked == []  # asked by the node itself, as the activation reboots it
    kubernetes = scheduler.of(CampaignOptions(hooks=hooks.resolve("kubernetes", None, None)))
    assert kubernetes.reboot_commands(ctx, ["a1"], rollback=False) == {}  # its own `shutdown -r`


def test_undrain_resumes_a_node_its_reboot_left_down_or_failed_and_withdraws_a_reboot_not_done(fake):
    f = fake(n1="rebooted-down", n2="rebooted-rts2", n3="reboot-requested", n4="drained-admin")
    ctx = context({h: "undrain" for h in ("n1", "n2", "n3", "n4")})
    out = ctx.scheduler.undrain(ctx, ["n1", "n2", "n3", "n4"])
    assert all(out[n].outcome == "ok" and out[n].detail["slurm"]["resumed"] for n in ("n1", "n2", "n3")), out
    assert f.asked == [("resume", "n1"), ("resume", "n2"), ("cancel_reboot", "n3"), ("resume", "n3")]
    assert not out["n4"].detail["slurm"]["resumed"]  # an admin's: left


# ---- one interface: which scheduler a campaign drains through --------------------------------------------------

def test_each_drain_preset_is_a_scheduler_of_its_own_and_only_slurm_reserves(tmp_path):
    ctx = context({"good": "drain", "bad": "drain"})
    assert isinstance(ctx.scheduler, slurm_side.Slurm) and ctx.scheduler.reserves
    kubernetes = scheduler.of(CampaignOptions(hooks=hooks.resolve("kubernetes", None, None)))
    assert (kubernetes.name, kubernetes.reserves, kubernetes.busy(ctx, ["good"])) == ("kubernetes", False, {})
    # an operator's templates: the drain step runs them, host by host; nothing is left out, nothing known busy
    templates = CampaignOptions(hooks=hooks.resolve(None, "sh -c 'test {host} = good'", None))
    mine = dataclasses.replace(ctx, options=templates, scheduler=scheduler.of(templates))
    assert mine.scheduler.name == "templates" and mine.scheduler.left_out(mine.fleet, ["good"]) == []
    out = steps.drain(mine, ["good", "bad"])
    assert out["good"].outcome == "ok" and out["bad"].outcome == "fail" and "exited 1" in out["bad"].reason
    assert steps.undrain(mine, ["bad"])["bad"].outcome == "ok"  # no --undrain: nothing to run
    with pytest.raises(InputError, match="only fleetctl's own Slurm drains reserve nodes"):
        mine.scheduler.reserve(mine, 1, ["good"], datetime.now(timezone.utc))


# ---- maintenance reservations (--drain-mode reservation) -----------------------------------------------------

def test_scontrols_reservations_are_read_as_slurm_prints_them(testdata):
    held = slurm.parse_reservations((testdata / "slurm" / "reservations.scontrol.txt").read_text())
    assert held["fleetctl-c7-w2"] == slurm.Reservation("fleetctl-c7-w2", "INACTIVE", "2026-11-28T23:01:15",
                                                       "h100-[02-03]", frozenset({"MAINT", "IGNORE_JOBS",
                                                                                  "SPEC_NODES"}))
    assert held["rma-ticket-4411"].active and held["rma-ticket-4411"].nodelist == "h100-01"
    assert slurm.parse_reservations("No reservations in the system\n") == {}


LATER = datetime.now(timezone.utc) + timedelta(hours=1)


def test_a_waves_reservation_is_made_once_holds_the_hosts_not_back_and_only_the_campaigns_own_go(fake):
    f = fake(n1="idle", n2="allocated", n3="maint")
    f.hold("rma-ticket-4411", datetime.now(timezone.utc), ["n3"])  # an operator's
    ctx = context({"n1": "precheck", "n2": "precheck"}, node_names={"n1": "n1", "n2": "n2"},
                  drain_mode="reservation")
    ctx.scheduler.reserve(ctx, 2, ["n1", "n2"], LATER)
    assert f.asked == [("create", "fleetctl-c7-w2", LATER, ["n1", "n2"])]
    assert ctx.journal.notes[0][0] == "slurm_reservation"  # written before Slurm was asked: the campaign's own
    ctx.scheduler.reserve(ctx, 2, ["n1", "n2"], LATER)  # asked again (a resume): nothing new
    ctx.scheduler.reserve(ctx, 2, ["n2"], LATER)  # n1 back in service meanwhile
    assert f.asked[1:] == [("update", "fleetctl-c7-w2", ["n2"])]
    ctx.scheduler.release(ctx.journal, 7, keep=2)
    assert len(f.asked) == 2
    ctx.scheduler.release(ctx.journal, 7)
    assert f.asked[-1] == ("delete", "fleetctl-c7-w2") and list(f.held) == ["rma-ticket-4411"]


def test_a_reservation_named_as_the_campaigns_that_it_did_not_make_is_refused_and_never_touched(fake):
    f = fake(n1="idle")
    f.hold("fleetctl-c7-w2", LATER, ["n1"])  # another fleetctl history's campaign 7, say
    ctx = context({"n1": "precheck"}, drain_mode="reservation")
    with pytest.raises(InputError, match="Slurm already holds a reservation named fleetctl-c7-w2, which campaign 7 "
                                         "did not make"):
        ctx.scheduler.reserve(ctx, 1, ["n1"], LATER)
    ctx.scheduler.release(ctx.journal, 7)
    assert f.asked == [] and "fleetctl-c7-w2" in f.held


def test_in_its_own_reservation_a_node_is_drained_and_leaves_it_when_resumed_an_operators_is_left_out(fake):
    f = fake(n1="idle", n2="idle", n3="maint")
    f.hold("rma-ticket-4411", datetime.now(timezone.utc), ["n3"])
    ctx = context({"n1": "drain", "n2": "drain", "n3": "drain"}, drain_mode="reservation")
    ctx.scheduler.reserve(ctx, 1, ["n1", "n2"], datetime.now(timezone.utc))  # started: the nodes show reserved
    assert f.state["n1"].maintenance and f.state["n1"].taken_out
    out = ctx.scheduler.drain(ctx, ["n1", "n2", "n3"])
    assert (out["n1"].outcome, out["n2"].outcome) == ("ok", "ok") and f.state["n1"].drained_or_draining
    assert out["n3"].outcome == "fail" and "MAINTENANCE" in out["n3"].reason  # the operator's: left as it is
    ctx.journal.states.update(n1="undrain", n2="undrain")
    ctx.scheduler.undrain(ctx, ["n1"])
    assert f.asked[-2:] == [("resume", "n1"), ("update", "fleetctl-c7-w1", ["n2"])]
    ctx.scheduler.undrain(ctx, ["n2"])
    assert f.asked[-1] == ("delete", "fleetctl-c7-w1") and list(f.held) == ["rma-ticket-4411"]
