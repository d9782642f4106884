"""--drain-mode reservation in the engine: which wave's nodes the campaign holds when (the scheduler interface's
reserve and release, as the engine calls them), the canary wave waiting for its reservation, a refusal before any
host is touched, and the reservations let go of however the campaign stops. The steps are scripted
(tests/helpers/campaign.py); Slurm's side is tests/helpers/slurm.py's, and the real one the
lab's (tests/lab/test_lab_slurm.py)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from orchestrator import baseline as baseline_mod, upgrade
from orchestrator.fleet import inventory
from orchestrator.campaign import soak
from orchestrator.campaign.engine import Engine, Parts
from orchestrator.campaign.hooks import Hooks
from orchestrator.campaign.journal import Journal
from orchestrator.schedulers.templates import Templates
from orchestrator.errors import InputError
from orchestrator.history.store import Store
from orchestrator.history.timefmt import parse
from tests.helpers.campaign import Script, options_of, plan_of

RESERVED = {"drain_mode": "reservation", "hooks": {"slurm": True}}


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "history.sqlite3") as s:
        yield s


class Holds(Templates):
    """A scheduler recording what the engine holds and lets go of, as (what, wave, hosts, start)."""

    def __init__(self):
        super().__init__(Hooks())
        self.calls: list[tuple] = []

    def reserve(self, ctx, wave, hosts, start):
        self.calls.append(("reserve", wave, tuple(hosts), start))

    def release(self, journal, campaign, keep=None):
        self.calls.append(("release", keep))


def campaign(store, script, *waves, scheduler=None, **options):
    fleet = inventory.Fleet("test", tuple(inventory.Host(n, ("all",)) for w in waves for n in w), frozenset({"all"}),
                            {})
    journal = Journal(store)
    run_id, _ = store.begin_run("campaign", [], "test", None, None)
    cid, _ = journal.create(run_id, plan_of(*waves), options_of(**{**RESERVED, **options}))
    engine = Engine(journal, journal.handle(cid), fleet, baseline_mod.load(None),
                    Parts(steps=script, scheduler=scheduler, observe=lambda ctx, hosts, final: {
                        h: soak.Observation("ok") for h in hosts}))
    return journal, cid, engine


def test_each_wave_is_held_from_its_start_the_canary_waits_for_its_own_and_all_go_at_the_end(store):
    holds, script = Holds(), Script()
    journal, cid, engine = campaign(store, script, ["a"], ["b", "c"], scheduler=holds, lead_s=0.6, soak_s=[0.3])
    assert engine.run() == "done"
    created = parse(journal.campaign(cid)["created_at"])
    soak_until = next(e["soak_until"] for e in journal.events(cid) if e["event"] == "wave_passed")
    checks = sum((parse(s["finished_at"]) - parse(s["started_at"]) for s in journal.steps(cid, "a")[:2]), timedelta())
    assert holds.calls == [("release", 1), ("reserve", 1, ("a",), created + timedelta(seconds=0.6)),
                           ("release", 2), ("reserve", 2, ("b", "c"), parse(soak_until) + checks),  # wave 1 soaks
                           ("release", 2), ("reserve", 2, ("b", "c"), holds.calls[5][3]),  # wave 2 under way
                           ("release", None)]
    drain = journal.steps(cid, "a")[2]
    assert drain["step"] == "drain" and parse(drain["started_at"]) >= created + timedelta(seconds=0.6)  # with its hold


@pytest.mark.parametrize("held, refusal, said", [
    ("fleetctl-c1-w2", None, "Slurm already holds a reservation named fleetctl-c1-w2, which campaign 1 did not make"),
    (None, "scontrol create reservation exited 1: scontrol: error: Error parsing flags maint,ignore_jobs.  No "
           "reservation created.", "Error parsing flags maint,ignore_jobs")])
def test_a_reservation_refused_at_the_start_stops_the_campaign_before_any_host_is_touched(store, fake, held, refusal,
                                                                                          said):
    f = fake(n1="idle", n2="idle")
    if held:
        f.hold(held, parse("2030-01-01T00:00:00Z"), ["n2"])
    f.refuse = refusal
    script = Script()
    journal, cid, engine = campaign(store, script, ["n1"], ["n2"], lead_s=0)
    with pytest.raises(InputError, match="^--drain-mode reservation: ") as e:
        engine.run()
    assert said in str(e.value) and "\n" not in str(e.value)
    assert script.calls == [] and f.asked == []  # no step ran: no node drained, nothing reserved or deleted
    c = journal.campaign(cid)
    assert c["state"] == "aborted" and c["reason"] == str(e.value)
    assert list(f.held) == ([held] if held else [])


def test_a_campaign_aborted_while_nobody_drives_it_lets_go_of_its_reservations(store, fake):
    f = fake(n1="idle", n2="idle")
    f.hold("rma-ticket-4411", parse("2030-01-01T00:00:00Z"), ["n2"])
    journal, cid, engine = campaign(store, Script(), ["n1"], ["n2"], lead_s=3600)
    engine.hold_nodes(journal.campaign(cid))  # then a kill -9: the canary's reservation is left behind
    assert list(f.held) == ["rma-ticket-4411", "fleetctl-c1-w1"]
    assert upgrade.abort(store, cid) == f"campaign {cid}: aborted\n"
    assert list(f.held) == ["rma-ticket-4411"] and f.asked[-1] == ("delete", "fleetctl-c1-w1")


class Slow(Script):
    """Every step ok; probe_before takes 0.3 s."""

    def __getitem__(self, step):
        run = super().__getitem__(step)

        def slow(ctx, hosts):
            time.sleep(0.3)
            return run(ctx, hosts)
        return slow if step == "probe_before" else run


def test_a_reservation_starts_when_its_waves_drain_is_due_not_when_its_checks_begin(store):
    holds = Holds()
    journal, cid, engine = campaign(store, Slow(), ["a"], ["b", "c"], scheduler=holds, lead_s=0.6, soak_s=[0.3])
    assert engine.run() == "done"
    created = parse(journal.campaign(cid)["created_at"])
    steps = {s["step"]: s for s in journal.steps(cid, "a")}
    # the canary's checks ran while its lead ran out; its drain came with its reservation
    assert parse(steps["precheck"]["started_at"]) < created + timedelta(seconds=0.6)
    assert parse(steps["drain"]["started_at"]) >= created + timedelta(seconds=0.6)
    # wave 2 is held from the soak's end plus what the canary's checks before its drain took (0.3 s and more)
    soak_until = parse(next(e["soak_until"] for e in journal.events(cid) if e["event"] == "wave_passed"))
    checks = sum((parse(steps[s]["finished_at"]) - parse(steps[s]["started_at"]) for s in ("precheck", "probe_before")),
                 timedelta())
    start = next(c[3] for c in holds.calls if c[:2] == ("reserve", 2))  # made while wave 1 soaks
    assert checks >= timedelta(seconds=0.3) and start == soak_until + checks
    drained = min(parse(journal.steps(cid, h)[2]["started_at"]) for h in ("b", "c"))
    assert drained >= start - timedelta(milliseconds=50)  # its nodes are held from about when they are drained
