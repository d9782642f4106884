"""A soak on a real H100 probe result (tests/testdata/probe): the scripted steps recording it, a campaign soaking after
its canary, the soak's playbook run answered, the canary metrics from a Prometheus stand-in."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.fleet import runner
from orchestrator.campaign import cohort, soak
from orchestrator.history.timefmt import parse, stamp
from tests.helpers.campaign import Script, start

REAL = json.loads((Path(__file__).parents[1] / "testdata/probe/h100-580.159.04-trial1.0-warmup20-n10.json").read_text())
FACTS = json.loads((Path(__file__).parents[1] / "testdata/h100-580.159.04-audit/audit-nvml.json").read_text()
                   )["hosts"][0]["facts"]  # the same H100's audit facts


class WithProbes(Script):
    """Every step ok; the probes' details carry the real probe result (as the real steps record it)."""

    def __getitem__(self, step):
        run = super().__getitem__(step)

        def with_probe(ctx, hosts):
            out = run(ctx, hosts)
            if step in ("probe_before", "probe_after"):
                for o in out.values():
                    o.detail = {"probe": REAL}
            return out
        return with_probe


def soaking_after(store, later: list[str], gpus=None):
    """A campaign soaking after its canary 'a' (wave 2: LATER), stopped before its first check; its context."""
    def stop(ctx, hosts, final):
        raise KeyboardInterrupt("stop")
    journal, cid, engine = start(store, WithProbes(), ["a"], later, soak_s=[3600], soak_interval_s=60,
                                 soak_grace_s=300, canary=None, canary_max_failures=0, observe=stop, gpus=gpus)
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    assert journal.campaign(cid)["state"] == "soaking" and soak.watched(journal, cid) == ["a"]
    ctx = engine.ctx
    ctx.befores = {r["host"]: json.loads(r["before"]) for r in journal.hosts(cid) if r["before"]}
    ctx.befores["a"]["gpus"] = REAL["health"]["gpu_count"]  # the precheck of the captured H100
    return ctx


def answer(monkeypatch, result=None, reachable=True, error=None, facts=None):
    """The soak's playbook run for the next observation: RESULT as the probe's (or nothing: unreachable / an error)
    and FACTS as the audit's (default: the real H100's); records the markers and the probe options."""
    seen = {}

    def run_on_fleet(playbooks, name, fleet, extravars, forks=None, check_ssh=True):
        assert name == "soak.yml"
        seen.update(markers=extravars["fleetctl_kmsg_markers"], opts=extravars)
        if result is None:
            return {h.name: runner.HostOutcome(h.name, "ok" if reachable else "unreachable", error or "")
                    for h in fleet.hosts}
        return {h.name: runner.HostOutcome(h.name, "ok", "", {
            "fleetctl.gpu.gpu_probe": {"probe": result},
            "fleetctl.gpu.gpu_facts": {"facts_json": json.dumps(facts or FACTS)}}) for h in fleet.hosts}
    monkeypatch.setattr(runner.Runner, "run_on_fleet", run_on_fleet)
    return seen


def observe(ctx, monkeypatch, result=None, final=False, **kw):
    answer(monkeypatch, result, **kw)
    out = soak.observe(ctx, ["a"], final)
    ctx.journal.record_soak(ctx.campaign, 1, "gate" if final else "check", out)
    return out["a"]


TENSOR = 'avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"{hosts}"})'


def with_metrics(ctx, tmp_path, prometheus, *metrics):
    from orchestrator import baseline
    path = tmp_path / "canary.yml"
    path.write_text("schema_version: 1\nname: t\ngroups:\n  all:\n    canary:\n      min_samples: 4\n"
                    "      metrics:\n" + "".join(f"        - {m}\n" for m in metrics))
    ctx.base = baseline.load(str(path))
    ctx.prometheus = prometheus
    for step in ("drain", "undrain"):  # the canary came back 20 minutes ago: a window of samples since
        for key in ("started_at", "finished_at"):
            [(was,)] = ctx.journal.db.execute(f"SELECT {key} FROM campaign_steps WHERE campaign_id=? AND host='a' "
                                              "AND step=?", (ctx.campaign, step))
            ctx.journal.db.execute(f"UPDATE campaign_steps SET {key}=? WHERE campaign_id=? AND host='a' AND step=?",
                                   (stamp(parse(was) - timedelta(minutes=20)), ctx.campaign, step))
    prometheus.back = cohort.step_time(ctx, "a", "undrain", "finished_at")
    return ctx


def tensor(ctx, tmp_path, prometheus):
    return with_metrics(ctx, tmp_path, prometheus, f"{{name: tensor_active, query: '{TENSOR}', host_label: Hostname, "
                                                    "good: higher, max_change: 3%}")


def slower(factor):
    result = copy.deepcopy(REAL)
    for s in result["throughput"]["samples"]:
        s["value"] *= factor
    return result


class Prometheus:
    """What a Prometheus answers the soak's range queries: every host's tensor activity (0.45, its own offset, 1%
    noise) x DURING while the window asked starts after the canary came back (x 1 before), x CANARY on 'a'; or,
    for the Xid query, a counter rising by XIDS[host] over the window. Records the queries."""

    def __init__(self, during=1.0, canary=1.0, xids=None):
        self.during, self.canary, self.xids, self.queries = during, canary, xids or {}, []

    def range(self, query, start, end, step, host_label="Hostname"):
        import random
        self.queries.append((query, start, end))
        rng, now = random.Random(len(self.queries)), start >= self.back
        times = [start + k * step for k in range(int((end - start) / step) + 1)]
        out = {}
        for i, host in enumerate("abcd"):
            if host not in query:
                continue
            if "XID" in query:
                out[host] = [(t, self.xids.get(host, 0) * k / (len(times) - 1)) for k, t in enumerate(times)]
            else:
                level = 0.45 * (1 + 0.01 * i) * (self.during * (self.canary if host == "a" else 1) if now else 1)
                out[host] = [(t, level * (1 + 0.01 * rng.gauss(0, 1))) for t in times]
        return out
