"""Campaigns driven by the real engine and journal with scripted steps in place of playbook runs, and soak checks
scripted in place of soak.observe (the lab tests run the real steps)."""

from __future__ import annotations

from datetime import datetime, timedelta

from orchestrator import baseline as baseline_mod
from orchestrator.fleet import inventory
from orchestrator.campaign import soak, steps
from orchestrator.campaign.engine import Engine, Parts
from orchestrator.campaign.journal import Journal
from orchestrator.campaign.options import CampaignOptions
from orchestrator.history.timefmt import stamp

UPGRADE = ["precheck", "probe_before", "drain", "wait_idle", "install", "activate", "verify", "probe_after", "undrain"]


def plan_of(*waves: list[str], fail_at: list[int] | None = None, domains: dict[str, str] | None = None,
            gpus: dict[str, tuple[int, str]] | None = None) -> dict:
    """A recorded plan of WAVES; DOMAINS: host -> its NVLink domain (the budget then counts domains); GPUS: host ->
    (its GPU count, their model) as planning found them (default 2, unknown model)."""
    fail_at = fail_at or [1] + [2] * (len(waves) - 1)
    domains, gpus = domains or {}, gpus or {}
    return {"target": "570.86.15", "ramp": ["1", "100%"], "group_order": ["all"], "skipped": [], "excluded": [],
            "waves": [{"index": i, "size": len(w), "cumulative": 0,
                       "budget": {"canary": i == 1, "fail_at": fail_at[i - 1], "budget_hosts": None,
                                  "budget_percent": None, "unit": "domain" if domains else "host",
                                  "rule": f"fails at {fail_at[i - 1]}"},
                       "hosts": [{"name": h, "groups": [], "from_version": "550.163.01", "change": "upgrade",
                                  "domain": domains.get(h), "gpus": gpus.get(h, (2, None))[0],
                                  "gpu_model": gpus.get(h, (2, None))[1]} for h in w]}
                      for i, w in enumerate(waves, 1)]}


OPTIONS = {"forks": None, "soak_s": 0, "rollback_scope": "campaign", "window_end": None,
           "hooks": {"drain": None, "undrain": None, "timeout_s": 10}, "idle": {"timeout_s": 1, "poll_s": 1},
           "probe": {"samples": 10, "warmup_s": 0, "trial_s": 0.02}}


class Script:
    """Stands in for steps.STEPS: every step ok, except the outcomes given per (host, step); records calls."""

    def __init__(self, outcomes: dict[tuple[str, str], str] | None = None, crash_at: tuple[str, str] | None = None):
        self.outcomes = outcomes or {}
        self.crash_at = crash_at
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def __getitem__(self, step):
        def run(ctx, hosts):
            self.calls.append((step, tuple(hosts)))
            if self.crash_at and self.crash_at[1] == step and self.crash_at[0] in hosts:
                self.crash_at = None
                raise KeyboardInterrupt("crash")
            out = {}
            for h in hosts:
                outcome = self.outcomes.get((h, step), "ok")
                before = ({"version": "550.163.01", "packages": {}, "boot_id": "b", "gpus": 2}
                          if step == "precheck" else None)
                out[h] = steps.Outcome(outcome, None if outcome == "ok" else f"{step} {outcome}", {}, before)
            return out
        return run


def start(store, script, *waves, fail_at=None, observe=None, domains=None, gpus=None, **options):
    """A campaign over WAVES driven by an engine given SCRIPT as its steps (and OBSERVE as its soak checks)."""
    names = [h for w in waves for h in w]
    fleet = inventory.Fleet("test", tuple(inventory.Host(n, ("all",)) for n in names), frozenset({"all"}), {})
    journal = Journal(store)
    run_id, _ = store.begin_run("campaign", [], "test", None, None)
    cid, locked = journal.create(run_id, plan_of(*waves, fail_at=fail_at, domains=domains, gpus=gpus),
                                 options_of(**options))
    return journal, cid, Engine(journal, journal.handle(cid), fleet, baseline_mod.load(None), parts(script, observe))


def options_of(**options) -> CampaignOptions:
    return CampaignOptions.from_dict(dict(OPTIONS, **options))


def parts(script, observe=None) -> Parts:
    return Parts(steps=script, observe=observe) if observe else Parts(steps=script)


def states(journal, cid):
    return {r["host"]: r["state"] for r in journal.hosts(cid)}


class Watch:
    """Stands in for soak.observe: every watched host ok, except (host, gap, kind) -> reason; records calls."""

    def __init__(self, failures: dict[tuple[str, int, str], str] | None = None):
        self.failures = failures or {}
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def __call__(self, ctx, hosts, final):
        kind = "gate" if final else "check"
        gap = ctx.journal.campaign(ctx.campaign)["wave"] - 1
        self.calls.append((kind, tuple(hosts)))
        return {h: soak.Observation("fail", f"soak: {self.failures[(h, gap, kind)]}", {"seen": ["x"]})
                if (h, gap, kind) in self.failures
                else soak.Observation("ok", None, {"marker": {"seq": len(self.calls)}})
                for h in hosts}


SOAKING = {"soak_s": [0.4], "soak_interval_s": 0.1}


class Clock:
    """The journal's time (every record it stamps), moved by the scripted steps."""

    def __init__(self, start: datetime):
        self.t = start

    def __call__(self) -> str:
        return stamp(self.t)


# Minutes each step takes: a host drained, its job ending 40 minutes later, installed a minute after that, back 14
# minutes later
MINUTES = {"wait_idle": 41, "install": 5, "activate": 5, "verify": 2, "probe_after": 1, "undrain": 1}


class Clocked(Script):
    """Script's steps, each taking MINUTES[step] on CLOCK; wait_idle (and the rollback's) finds each host idle
    IDLE_AFTER minutes after it began (its last job's end), or as it ends.""" 

    def __init__(self, clock: Clock, outcomes=None, minutes=None, idle_after: float = 40, **kwargs):
        super().__init__(outcomes, **kwargs)
        self.clock, self.minutes, self.idle_after = clock, minutes or MINUTES, idle_after

    def __getitem__(self, step):
        run = super().__getitem__(step)

        def timed(ctx, hosts):
            began = self.clock.t
            out = run(ctx, hosts)
            self.clock.t += timedelta(minutes=self.minutes.get(step, 0))
            idle_at = min(began + timedelta(minutes=self.idle_after), self.clock.t)
            for o in out.values():
                if step.endswith("wait_idle") and o.outcome == "ok":
                    o.detail = {**(o.detail or {}), "idle_at": stamp(idle_at)}
            return out
        return timed


# A gate's reason as an earlier fleetctl recorded it: every series.
WALL = "gate fail: GPU health unchanged: no new faults; " + "; ".join(
    f"GPU {g} {m}: median 54.8 -> 50.1 GB/s (-8.5%), below the floor of 0.95x its own median before"
    for g in range(8) for m in ("h2d_gbs", "d2h_gbs", "bandwidth_gbs"))


class OldGate(Script):
    """Every step ok but probe_after, which fails with WALL."""

    def __getitem__(self, step):
        run = super().__getitem__(step)
        if step != "probe_after":
            return run
        return lambda ctx, hosts: {h: steps.Outcome("fail", WALL, {}) for h in run(ctx, hosts)}


TENSOR = {"name": "tensor_active", "kind": "level", "verdict": "fail", "canary": 0.431, "control": 0.453,
          "change": -0.086, "ci": [-0.095, -0.033], "p_value": 6.4e-05, "samples": {"canary": 12, "control": 36},
          "window": ["2026-03-01T10:00:00.000", "2026-03-01T12:00:00.000"], "control_hosts": ["b"],
          "reason": "tensor_active: canary 0.431 vs control 0.453 (-8.6%, 95% CI -9.5% .. -3.3%), p=6.4e-05: "
                    "past the 3% tolerated"}
XID = {"name": "xid", "verdict": "missing", "reason": "xid: no series for any control host"}


class Judged:
    """soak.observe as Watch (FAILURES: (host, gap, kind) -> reason), every observation
    judging the canary metrics as VERDICTS; HOLD: what the end-of-soak gate holds the campaign for."""

    def __init__(self, verdicts, failures=None, hold=None):
        self.watch, self.verdicts, self.hold = Watch(failures), verdicts, hold

    def __call__(self, ctx, hosts, final):
        out = self.watch(ctx, hosts, final)
        for o in out.values():
            o.detail["canary_metrics"] = self.verdicts
            if final and self.hold:
                o.detail["hold"] = self.hold
        return out
