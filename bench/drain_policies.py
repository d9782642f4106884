#!/usr/bin/env python3
"""The capacity a campaign costs a busy cluster, per drain policy: a discrete-event replay of a job trace.

Usage: .venv/bin/python bench/drain_policies.py [--nodes 64,1024,8192] [--policies wave,host,reservation]
           [--swf FILE [--cores-per-node 1]] [--seed 0] [--load 0.93] [--max-runtime 72h] [--warmup 72h]
           [--waves 1,10%,50%,100%] [--soak 2h,30m] [--soak-interval 1m] [--lead 30m] [--max-in-flight N|P%]
           [--idle-timeout D] [--precheck 1m] [--install 5m] [--activate 8m] [--verify 2m] [--probe 10m]
           [--profile FILE]

The campaign is fleetctl's own: the plan is plan.build's (N H100 hosts of a generated inventory, each audited from
the real H100 capture in tests/testdata, as tests/unit/test_plan.py builds them), and the campaign Engine drives it
over a Journal in a temporary history ($FLEETCTL_HOME under /dev/shm where there is one), with the options
`fleetctl upgrade --drain-preset slurm` gives it (upgrade.campaign_options). Simulated are the parts outside
fleetctl, given as engine.Parts:

  clock      simulated time: now, monotonic and sleep read and move it; a batch given to Clock.submit runs at once
             and is done after its step's duration (--precheck, --install, --activate, --verify; --probe for
             probe_before, probe_after and the rollback's; drain, wait_idle and undrain none); Clock.wait moves time
             to the first batch done. While time moves, the cluster runs its jobs. The history's timestamps
             (store.now) are the clock's, so the capacity read off the journal is in simulated time. No signal nor
             abort comes: the engine looks when something can have changed (engine.Clock.look_s, unchanged_until:
             a busy host is looked at again at the first idle poll after a job on a drained node ends), not every
             second; the journal records the same as if it looked every second.
  scheduler  the cluster as Slurm (scheduler.Scheduler): drain (no new job on the node, its jobs run on), busy (the
             node still runs a job), undrain (in service again, out of its wave's reservation), and a reservation
             per wave (no job that would still run at its start starts on its nodes; jobs running go on).
  steps      drain, undrain and wait_idle are fleetctl's own (steps.py, through ctx.scheduler: the cluster), but
             wait_idle's look at the GPUs (a playbook) finds a node's GPUs free once its jobs have ended; every other
             step succeeds; the soak's checks pass.

The cluster: N nodes, FIFO with EASY backfill, at every event. The first job of the queue starts as soon as enough
nodes are free (in service, not reserved before its end: lowest node numbers first); if it cannot, it holds the
earliest time enough nodes free up for it (by the running jobs' time limits), and a later job starts now if it fits
and either ends by then or leaves the first job enough nodes (at most 100 jobs looked at behind it, Slurm's
bf_max_job_test). Jobs plan with their time limit: the SWF's requested time; the generated trace's run time.

The trace (default generated, seeded): job lengths lognormal with median 2 h and p99 48 h (mu = ln 2h,
sigma = ln(48/2) / 2.326 = 1.366), cut at --max-runtime (a partition's MaxTime); nodes per job a power of two from
1 to 64, at most a quarter of the cluster, each equally likely (small jobs are the many, sizes cluster at powers of
two; mean 18.1 nodes); Poisson arrivals asking exactly --load of the cluster's node-hours. With --swf: the Standard
Workload Format of the Parallel Workloads Archive (18 fields a line, ';' starts a comment): submit time (field 2),
run time (4), allocated processors (5; else the requested, 8) / --cores-per-node rounded up to nodes (at most N),
requested time (9; at least the run time) as the limit; jobs that never ran (run time or processors not above 0)
are left out.

The campaign starts --warmup into the trace and moves every node from 550.163.01 to 570.86.15; no host gives up
waiting for its jobs (--idle-timeout: the trace's longest job and an hour). The policies:

  wave         --pace wave: a wave's hosts move step by step together: none is installed before the wave's longest
               job has ended (the batch, as before issue 43)
  host         --pace host: each host goes on from wait_idle as soon as its own jobs have ended
  reservation  --pace host --drain-mode reservation: a wave's nodes reserved from when its drain is due: the end
               of the soak before it plus the wave before's precheck and probe_before (the canary's from --lead
               after the campaign began, its checks run before)

Reported per policy and N (node-hours, a host is one node):
  idle      drained and idle, the waste: campaign/capacity.py's figures, read off the journal (busy: drained while
            its jobs ran; change: from the install until back in service)
  cluster   the cluster's own count of the waste: node-hours out of service (drained, or in a reservation begun)
            with no job, during the campaign, less the change: it sees what the journal cannot (a reserved node idle
            before its drain, a host idle until the look that finds it so)
  duration  the campaign's, in simulated hours
  delayed   jobs that started later than in the same trace replayed without a campaign (and their share of the jobs
            that started after the campaign began, there), and their summed delay
  wall      seconds the replay took (the engine, the journal and the cluster)
Targets (issue 43): at 1,024 nodes the per-host pipelines waste at most a fifth of the batch's idle node-hours, and
reservations less again. Exit 1 when a target at 1,024 nodes measured here is missed; 2 for bad input.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import heapq
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from orchestrator import audit, baseline as baseline_mod, plan, settings, upgrade
from orchestrator.fleet import inventory  # noqa: E402
from orchestrator.history import store as store_mod  # noqa: E402
from orchestrator.campaign import capacity, engine as engine_mod, soak, steps  # noqa: E402
from orchestrator.campaign.context import Outcome  # noqa: E402
from orchestrator.campaign.engine import Engine, Parts  # noqa: E402
from orchestrator.campaign.journal import Journal  # noqa: E402
from orchestrator.errors import InputError  # noqa: E402
from orchestrator.exitcodes import Exit  # noqa: E402
from orchestrator.fleet.runner import HostOutcome  # noqa: E402
from orchestrator.history.store import Store  # noqa: E402
from orchestrator.history.timefmt import stamp  # noqa: E402

HOUR = 3600.0
FROM, TARGET = "550.163.01", "570.86.15"
CAPTURE = REPO / "tests/testdata/h100-580.159.04-audit/audit-nvml.json"  # a real H100's facts (docs/benchmarks.md)
EPOCH = datetime(2025, 1, 6, tzinfo=timezone.utc)  # the trace's time 0, in simulated time
MEDIAN_S, P99_S, Z99 = 2 * HOUR, 48 * HOUR, 2.326  # the generated job lengths: lognormal, median 2 h, p99 48 h
SIZES = (1, 2, 4, 8, 16, 32, 64)  # nodes per generated job, each equally likely
BACKFILL_DEPTH = 100  # jobs looked at behind a blocked first job (Slurm's bf_max_job_test)
SWF_LINE_MAX = 4096  # characters: an SWF line is 18 numbers
POLICIES = {"wave": ("wave", "drain"), "host": ("host", "drain"), "reservation": ("host", "reservation")}


class BadInput(Exception):
    """A command-line value or trace the bench cannot use: one line, exit 2."""


def duration(text: str) -> float:
    """'5m', '2h', '90s', '0' -> seconds (fleetctl's own duration syntax: settings.py)."""
    return settings.LEAD.duration(text)


# ---- the trace -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trace:
    """Jobs in submit order: submit time and run time (s from the trace's start), nodes, time limit (s)."""
    submit: np.ndarray
    run: np.ndarray
    nodes: np.ndarray
    limit: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.submit)


def generated(n: int, horizon_s: float, load: float, max_runtime_s: float, seed: int) -> Trace:
    """Jobs submitted over HORIZON_S asking for exactly LOAD of N nodes' node-hours there (the module docstring says
    how they are drawn): Poisson arrivals, their rate set by the jobs drawn."""
    rng = np.random.default_rng(seed)
    sigma = math.log(P99_S / MEDIAN_S) / Z99
    sizes = [s for s in SIZES if s <= max(1, n // 4)]
    count = 1024
    while True:
        run = np.minimum(rng.lognormal(math.log(MEDIAN_S), sigma, count), max_runtime_s).round()
        nodes = rng.choice(sizes, count)
        asked = np.cumsum(run * nodes)
        if asked[-1] >= load * n * horizon_s:
            m = int(np.searchsorted(asked, load * n * horizon_s)) + 1
            arrivals = np.cumsum(rng.exponential(1.0, m + 1))
            submit = (arrivals[:m] * horizon_s / arrivals[m]).round()
            return Trace(submit, run[:m], nodes[:m], run[:m].copy(),
                         f"generated (seed {seed}): lognormal lengths median 2h p99 48h cut at "
                         f"{settings.duration_text(max_runtime_s)}, nodes 1-{max(sizes)} (powers of two), "
                         f"load {load:g}")
        count *= 2


def swf(path: str, n: int, cores_per_node: int) -> Trace:
    """A Standard Workload Format file (Parallel Workloads Archive) as a trace on N nodes; a line that is not SWF is
    BadInput naming it."""
    rows = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(iter(lambda: f.readline(SWF_LINE_MAX), ""), 1):
                if len(line) == SWF_LINE_MAX and not line.endswith("\n"):
                    raise BadInput(f"{path}:{number}: not a Standard Workload Format line: longer than "
                                   f"{SWF_LINE_MAX} characters")
                line = line.split(";", 1)[0].strip()
                if not line:
                    continue
                words = line.split()
                try:
                    if len(words) != 18:
                        raise ValueError(f"{len(words)} fields, SWF has 18")
                    submit, run, procs, asked, limit = (float(words[i]) for i in (1, 3, 4, 7, 8))
                    if not all(math.isfinite(v) for v in (submit, run, procs, asked, limit)):
                        raise ValueError("a field is not a finite number")
                except ValueError as e:
                    raise BadInput(f"{path}:{number}: not a Standard Workload Format line: {e}") from None
                procs = procs if procs > 0 else asked
                if run <= 0 or procs <= 0 or submit < 0:
                    continue  # never ran (cancelled in the queue), or no size known
                rows.append((submit, run, min(n, math.ceil(procs / cores_per_node)), max(limit, run)))
    except OSError as e:
        raise BadInput(f"--swf {path}: {e.strerror or e}") from None
    if not rows:
        raise BadInput(f"--swf {path}: no job that ran (with a run time and processors above 0)")
    a = np.array(sorted(rows))
    a[:, 0] -= a[0, 0]
    return Trace(a[:, 0], a[:, 1], a[:, 2].astype(np.int64), a[:, 3],
                 f"{Path(path).name}, {cores_per_node} processor{'s' if cores_per_node > 1 else ''} a node")


# ---- the cluster ---------------------------------------------------------------------------------------

class Cluster:
    """N nodes running TRACE, FIFO with EASY backfill (the module docstring), in simulated seconds (self.t). Its
    scheduler side (drain, busy, undrain, reserve, release) is what fleetctl's steps call: hosts are node names."""

    def __init__(self, trace: Trace, n: int, names: list[str]):
        self.trace, self.n, self.t = trace, n, 0.0
        self.index = {name: i for i, name in enumerate(names)}
        self.next = 0  # the next job of the trace to be submitted
        self.queue: list[int] = []
        self.ends: list[tuple[float, int]] = []  # heap of (end, job)
        self.job_on = np.full(n, -1, np.int64)  # the job on each node, -1: none
        self.planned_end = np.full(n, np.inf)  # each busy node's job's start + time limit: what backfill plans with
        self.ends_at = np.full(n, np.inf)  # each busy node's job's end (its start + run time)
        self.drained = np.zeros(n, bool)
        self.reserved_from = np.full(n, np.inf)  # the start of the reservation holding the node
        self.reservations: dict[str, tuple[float, np.ndarray]] = {}
        self.started = np.full(len(trace), np.nan)
        self.nodes_of: dict[int, np.ndarray] = {}
        self.busy_node_s = 0.0  # node-seconds running a job
        self.out_idle_node_s = 0.0  # node-seconds out of service (drained, or in a reservation begun) with no job

    # -- time
    def advance(self, until: float) -> None:
        """Run the cluster up to UNTIL: jobs end, jobs arrive, the scheduler starts what it can at each event."""
        submit = self.trace.submit
        while True:
            t = until
            if self.ends and self.ends[0][0] < t:
                t = self.ends[0][0]
            if self.next < len(submit) and submit[self.next] < t:
                t = float(submit[self.next])
            self._account(t)
            self.t = t
            changed = False
            while self.ends and self.ends[0][0] <= t:
                _, job = heapq.heappop(self.ends)
                nodes = self.nodes_of.pop(job)
                self.job_on[nodes], self.planned_end[nodes], self.ends_at[nodes] = -1, np.inf, np.inf
                changed = True
            while self.next < len(submit) and submit[self.next] <= t:
                self.queue.append(self.next)
                self.next += 1
                changed = True
            if changed:
                self.schedule()
            if t >= until:
                return

    def _account(self, t: float) -> None:
        dt = t - self.t
        if dt <= 0:
            return
        idle = self.job_on < 0
        self.busy_node_s += dt * (self.n - int(idle.sum()))
        if self.drained.any() or self.reservations:
            self.out_idle_node_s += dt * int((idle & (self.drained | (self.reserved_from <= self.t))).sum())

    def finish(self) -> None:
        """Run until every job of the trace has started and ended."""
        while self.next < len(self.trace) or self.queue or self.ends:
            later = [self.ends[0][0]] if self.ends else []
            if self.next < len(self.trace):
                later.append(float(self.trace.submit[self.next]))
            if not later:
                raise RuntimeError(f"{len(self.queue)} jobs can never start (nodes drained or reserved for good)")
            self.advance(min(later))

    # -- the scheduler
    def schedule(self) -> None:
        """FIFO, then EASY backfill behind the first job that cannot start."""
        if not self.queue:
            return
        now, tr = self.t, self.trace
        free = (self.job_on < 0) & ~self.drained
        if self.reservations:
            free &= self.reserved_from > now
        count = int(free.sum())
        shadow, extra, looked, keep = None, 0, 0, []
        for pos, job in enumerate(self.queue):
            if count == 0 or looked >= BACKFILL_DEPTH:
                keep += self.queue[pos:]
                break
            k, limit = int(tr.nodes[job]), float(tr.limit[job])
            nodes = None
            if k <= count:
                usable = free & (self.reserved_from >= now + limit) if self.reservations else free
                found = np.flatnonzero(usable)
                nodes = found[:k] if len(found) >= k else None
            if shadow is None:
                if nodes is not None:
                    self._start(job, nodes, free)
                    count -= k
                    continue
                shadow, extra = self._shadow(k, limit, free)
            else:
                looked += 1
                if nodes is not None and (now + limit <= shadow or k <= extra):
                    self._start(job, nodes, free)
                    count -= k
                    if now + limit > shadow:
                        extra -= k
                    continue
            keep.append(job)
        self.queue = keep

    def _shadow(self, k: int, limit: float, free: np.ndarray) -> tuple[float, int]:
        """When K nodes will be free for the first job (by the running jobs' limits) and how many more free then;
        (inf, 0) when drains or reservations keep it from ever starting as things stand."""
        usable = ~self.drained & (self.reserved_from >= self.t + limit) if self.reservations else ~self.drained
        now_free = int((free & usable).sum())
        ends = self.planned_end[usable & (self.job_on >= 0)]
        need = k - now_free
        if need > len(ends) or need <= 0:
            return math.inf, 0
        at = float(np.partition(ends, need - 1)[need - 1])
        return at, int((ends <= at).sum()) - need

    def _start(self, job: int, nodes: np.ndarray, free: np.ndarray) -> None:
        tr = self.trace
        self.job_on[nodes], self.planned_end[nodes] = job, self.t + float(tr.limit[job])
        self.ends_at[nodes] = self.t + float(tr.run[job])
        free[nodes] = False
        self.nodes_of[job] = nodes
        self.started[job] = self.t
        heapq.heappush(self.ends, (self.t + float(tr.run[job]), job))

    def _nodes(self, hosts: list[str]) -> np.ndarray:
        return np.array([self.index[h] for h in hosts], np.int64)

    # -- what fleetctl's steps call (the scheduler interface's Slurm side)
    def drain(self, hosts: list[str]) -> None:
        self.drained[self._nodes(hosts)] = True

    def undrain(self, hosts: list[str]) -> None:
        nodes = self._nodes(hosts)
        self.drained[nodes] = False
        for name, (start, held) in list(self.reservations.items()):  # back in service: out of the reservation
            rest = np.setdiff1d(held, nodes)
            self.reservations[name] = (start, rest)
            self.reserved_from[np.setdiff1d(held, rest)] = np.inf
        self.schedule()

    def busy(self, hosts: list[str]) -> dict[str, str]:
        """host -> why it is still busy: the job on its node."""
        return {h: f"job {self.job_on[self.index[h]]} runs on it" for h in hosts if self.job_on[self.index[h]] >= 0}

    def reserve(self, name: str, hosts: list[str], start: float) -> None:
        nodes = self._nodes(hosts)
        self.reservations[name] = (start, nodes)
        self.reserved_from[nodes] = np.minimum(self.reserved_from[nodes], start)

    def release(self, name: str) -> None:
        start, nodes = self.reservations.pop(name, (0.0, np.array([], np.int64)))
        self.reserved_from[nodes] = np.inf
        for other_start, other in self.reservations.values():
            self.reserved_from[other] = np.minimum(self.reserved_from[other], other_start)
        self.schedule()


# ---- the parts fleetctl's engine is given ----------------------------------------------------------------

class SimClock(engine_mod.Clock):
    """engine.Clock in simulated time (the module docstring): the cluster runs while time moves. No signal nor abort
    comes, so the engine need not look every second (look_s); and a drained node gets no new job, so a host still
    busy is not looked at again before a job on a drained node ends (unchanged_until): time jumps to the next event
    that can change what the engine sees."""
    look_s = HOUR

    def unchanged_until(self, at: float) -> float:
        running = self.cluster.ends_at[self.cluster.drained]
        return float(running.min()) if len(running) else math.inf

    def __init__(self, cluster: Cluster, durations: dict[str, float]):
        self.cluster, self.durations = cluster, durations
        self.pending: list[tuple[float, int, Future, Any, BaseException | None]] = []
        self.seq = 0

    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.cluster.t)

    def stamp(self) -> str:
        return stamp(self.now())

    def monotonic(self) -> float:
        return self.cluster.t

    def sleep(self, seconds: float) -> None:
        self.advance(self.cluster.t + max(0.0, seconds))

    def advance(self, until: float) -> None:
        """Move time to UNTIL, completing the batches due meanwhile in order."""
        while self.pending and self.pending[0][0] <= until:
            at, _, future, result, error = heapq.heappop(self.pending)
            self.cluster.advance(at)
            future.set_exception(error) if error is not None else future.set_result(result)
        self.cluster.advance(until)

    def submit(self, pool: Any, step: str, fn: Callable[..., Any], *args: Any) -> Future:
        """Run FN(*ARGS) now; its future is done after STEP's duration."""
        future: Future = Future()
        result, error = None, None
        try:
            result = fn(*args)
        except Exception as e:  # the future carries it, as a pool's would
            error = e
        self.seq += 1
        heapq.heappush(self.pending, (self.cluster.t + self.durations.get(step, 0.0), self.seq, future, result, error))
        return future

    def wait(self, futures: Any, timeout: float | None = None) -> set[Future]:
        """The futures of FUTURES done once time has moved to the first of them done, or by TIMEOUT."""
        futures = set(futures)
        done = {f for f in futures if f.done()}
        if done:
            return done
        due = [at for at, _, f, _, _ in self.pending if f in futures]
        until = min(due) if due else math.inf
        if timeout is not None:
            until = min(until, self.cluster.t + timeout)
        if until == math.inf:
            raise RuntimeError("waiting for batches that were never submitted")
        self.advance(until)
        return {f for f in futures if f.done()}


class SimScheduler:
    """scheduler.Scheduler on the simulated cluster (what ctx.scheduler is to the steps and the engine): drain,
    busy, undrain, and a reservation per wave (reserve again: exactly those hosts, its start kept; none: gone)."""
    name, reserves = "simulated", True

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def left_out(self, fleet: inventory.Fleet, hosts: list[str]) -> list[dict[str, Any]]:
        return []

    def drain(self, ctx: Any, hosts: list[str]) -> dict[str, Outcome]:
        self.cluster.drain(hosts)
        return {h: Outcome("ok", None, {"slurm": {"node": h}}) for h in hosts}

    def busy(self, ctx: Any, hosts: list[str]) -> dict[str, str]:
        return self.cluster.busy(hosts)

    def undrain(self, ctx: Any, hosts: list[str]) -> dict[str, Outcome]:
        self.cluster.undrain(hosts)
        return {h: Outcome("ok", None, {"slurm": {"node": h, "resumed": True}}) for h in hosts}

    def failed_jobs(self, ctx: Any, hosts: list[str]) -> tuple[dict[str, list[dict[str, Any]]], str | None]:
        return {}, None

    def reserve(self, ctx: Any, wave: int, hosts: list[str], start: datetime) -> None:
        name = f"wave {wave}"
        if name in self.cluster.reservations:
            start = EPOCH + timedelta(seconds=self.cluster.reservations[name][0])
            self.cluster.release(name)
        if hosts:
            self.cluster.reserve(name, hosts, (start - EPOCH).total_seconds())

    def release(self, journal: Any, campaign: int, keep: int | None = None) -> None:
        for name in [n for n in self.cluster.reservations if n != f"wave {keep}"]:
            self.cluster.release(name)


class SimSteps:
    """steps.STEPS for the simulation: drain, undrain and wait_idle are fleetctl's own (through ctx.scheduler: the
    cluster); every other step succeeds (its duration is the clock's)."""

    REAL = ("drain", "undrain", "wait_idle")

    def __getitem__(self, step: str) -> Callable[[Any, list[str]], dict[str, Outcome]]:
        runner = steps.STEPS[step]
        if runner.__name__ in self.REAL:
            return runner

        def run(ctx: Any, hosts: list[str]) -> dict[str, Outcome]:
            before = {"version": FROM, "packages": {"nvidia-driver-550-server-open": FROM}, "boot_id": "b",
                      "gpus": 8, "daemons": []} if step == "precheck" else None
            return {h: Outcome("ok", None, {}, before) for h in hosts}
        return run


def observe(ctx: Any, hosts: list[str], final: bool) -> dict[str, soak.Observation]:
    """The soak's checks and end gate: every host passes."""
    return {h: soak.Observation("ok") for h in hosts}


def gpus_in_use(ctx: Any, hosts: list[str]) -> dict[str, Outcome]:
    """wait_idle's look at the GPUs (a playbook): a simulated node's GPUs are free once its jobs have ended."""
    return {}


@contextmanager
def simulated(clock: SimClock) -> Iterator[None]:
    """fleetctl in simulated time: the history's timestamps (store.now, wherever it is imported) are the clock's,
    and wait_idle's GPU look is the simulated hosts'."""
    swapped = [(m, "now", m.now, clock.stamp) for m in list(sys.modules.values())
               if m is not None and m.__name__.startswith("orchestrator") and getattr(m, "now", None) is store_mod.now]
    swapped += [(steps, "_gpus_in_use", steps._gpus_in_use, gpus_in_use)]
    for module, name, _, value in swapped:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, was, _ in swapped:
            setattr(module, name, was)


# ---- the fleet, the plan and the campaign ---------------------------------------------------------------

def host_names(n: int) -> list[str]:
    return [f"gpu-{i:05d}" for i in range(1, n + 1)]


def fleet_and_plan(n: int, waves: str) -> tuple[inventory.Fleet, baseline_mod.Baseline, dict[str, Any]]:
    """N H100 hosts on FROM (the real capture, as tests/unit/test_plan.py makes them) and plan.build's plan."""
    base = baseline_mod.load(None)
    facts = copy.deepcopy(json.loads(CAPTURE.read_text())["hosts"][0]["facts"])
    facts["driver"].update(module_version=FROM, userspace_version=FROM, branch=FROM.split(".")[0])
    facts["nouveau"].update(blacklisted=True, blacklist_files=["/etc/modprobe.d/blacklist-nouveau.conf"])
    names = host_names(n)
    fleet = inventory.Fleet("bench", tuple(inventory.Host(h, ("all", "gpu")) for h in names),
                            frozenset({"all", "gpu"}), {})
    entry = audit.evaluate_host(fleet.hosts[0], HostOutcome(names[0], "ok", "", {"fleetctl.gpu.gpu_facts":
                                                                                   {"facts": facts}}), base)
    made = plan.build(TARGET, plan.parse_ramp(waves), [dict(entry, name=h) for h in names], base)
    if made["excluded"] or sum(w["size"] for w in made["waves"]) != n:
        raise SystemExit(f"the plan left hosts out: {made['excluded'][:1]}")
    return fleet, base, made


@dataclass
class Result:
    policy: str
    nodes: int
    state: str
    idle_node_h: float
    busy_node_h: float
    change_node_h: float
    out_idle_node_h: float
    duration_h: float
    delayed: int
    delay_h: float
    jobs: int  # that started after the campaign began, without it
    wall_s: float


def replay(trace: Trace, n: int, policy: str, args: argparse.Namespace, made: dict[str, Any],
           fleet: inventory.Fleet, base: baseline_mod.Baseline, reference: np.ndarray, home: Path) -> Result:
    """One campaign of POLICY over the cluster running TRACE, from args.warmup on; REFERENCE: each job's start
    without a campaign."""
    t0 = time.perf_counter()
    pace, drain_mode = POLICIES[policy]
    cluster = Cluster(trace, n, host_names(n))
    durations = {"precheck": args.precheck, "probe_before": args.probe, "probe_after": args.probe,
                 "probe_again": args.probe, "rollback_probe": args.probe, "install": args.install,
                 "rollback_install": args.install, "activate": args.activate, "rollback_activate": args.activate,
                 "verify": args.verify, "rollback_verify": args.verify}
    clock = SimClock(cluster, durations)
    options = upgrade.campaign_options({  # as `fleetctl upgrade` makes them, from its parameters
        "soak": args.soak, "soak_interval": args.soak_interval, "drain_preset": "slurm",
        "idle_timeout": args.idle_timeout, "pace": pace, "drain_mode": drain_mode, "lead": args.lead,
        "max_in_flight": args.max_in_flight})
    units = {h.get("domain") or h["name"] for w in made["waves"] for h in w["hosts"]}
    options = replace(options, max_in_flight=upgrade.in_flight_at_most(args.max_in_flight, len(units)))
    cluster.advance(args.warmup)
    parts = Parts(steps=SimSteps(), observe=observe, clock=clock, scheduler=SimScheduler(cluster))
    with simulated(clock), Store(home / f"history-{n}-{policy}.sqlite3") as store:
        journal = Journal(store)
        run_id, _ = store.begin_run("campaign", ["bench", policy], "bench", None, None)
        cid, _ = journal.create(run_id, made, options)
        state = Engine(journal, journal.handle(cid), fleet, base, parts).run()
        end = cluster.t
        spent = capacity.of_campaign(journal, cid, clock.now())
    out_idle_h = cluster.out_idle_node_s / HOUR
    cluster.finish()
    late = cluster.started - reference
    delayed = late > 1e-6
    return Result(policy, n, str(state), spent["idle"], spent["busy"], spent["change"], out_idle_h,
                  (end - args.warmup) / HOUR, int(delayed.sum()), float(late[delayed].sum()) / HOUR,
                  int((reference >= args.warmup).sum()), time.perf_counter() - t0)


# ---- the command -----------------------------------------------------------------------------------------

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="64,1024,8192", help="cluster sizes, comma-separated")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"of {', '.join(POLICIES)}")
    parser.add_argument("--swf", help="a Standard Workload Format trace instead of the generated one")
    parser.add_argument("--cores-per-node", type=int, default=1, help="--swf: processors per node")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", type=float, default=0.93, help="generated: node-hours asked / node-hours there")
    parser.add_argument("--max-runtime", type=duration, default=duration("72h"), help="generated: jobs cut at")
    parser.add_argument("--warmup", type=duration, default=duration("72h"), help="the campaign starts this far in")
    parser.add_argument("--waves", default=settings.WAVES.default)
    parser.add_argument("--soak", type=settings.SOAK.parse, default=settings.SOAK.parse(settings.SOAK.default))
    parser.add_argument("--soak-interval", type=settings.SOAK_INTERVAL.parse,
                        default=settings.SOAK_INTERVAL.parse(settings.SOAK_INTERVAL.default))
    parser.add_argument("--lead", type=duration, default=settings.LEAD.duration(settings.LEAD.default))
    parser.add_argument("--max-in-flight", default=None, metavar="N|P%")
    parser.add_argument("--idle-timeout", type=duration, default=None,
                        help="default: the longest job of the trace and an hour (no host gives up waiting)")
    for step, default in (("precheck", "1m"), ("install", "5m"), ("activate", "8m"), ("verify", "2m"),
                          ("probe", "10m")):
        parser.add_argument(f"--{step}", type=duration, default=duration(default), help="the step's duration")
    parser.add_argument("--profile", help="write a cProfile of the replays here (pstats)")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.nodes.split(",")]
    except ValueError:
        args.sizes = []
    if not args.sizes or any(s < 1 or s > 100_000 for s in args.sizes):
        raise BadInput(f"--nodes {args.nodes!r}: node counts from 1 to 100000, such as 64,1024")
    args.policies = args.policies.split(",")
    if any(p not in POLICIES for p in args.policies):
        raise BadInput(f"--policies {','.join(args.policies)!r}: choose from {', '.join(POLICIES)}")
    if args.cores_per_node < 1:
        raise BadInput(f"--cores-per-node {args.cores_per_node}: at least 1")
    if not 0 < args.load <= 2:
        raise BadInput(f"--load {args.load:g}: above 0, at most 2")
    plan.parse_ramp(args.waves)
    upgrade.in_flight_at_most(args.max_in_flight, 1)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return verdict(measure(parse(argv)))
    except (BadInput, InputError) as e:
        print(f"{Path(__file__).name}: {e}", file=sys.stderr)
        return Exit.USAGE


def measure(args: argparse.Namespace) -> list[Result]:
    """Every size and policy of ARGS, printed as it is measured, in a temporary history."""
    profile = cProfile.Profile() if args.profile else None
    rows = []
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-", dir=shm if shm.is_dir() else None) as tmp:
        home = os.environ.get("FLEETCTL_HOME")
        os.environ["FLEETCTL_HOME"] = tmp
        try:
            for n in args.sizes:
                rows += bench_size(n, args, Path(tmp), profile)
        finally:
            os.environ.pop("FLEETCTL_HOME") if home is None else os.environ.update(FLEETCTL_HOME=home)
    if profile:
        profile.dump_stats(args.profile)
    return rows


def bench_size(n: int, args: argparse.Namespace, home: Path, profile: cProfile.Profile | None) -> list[Result]:
    t0 = time.perf_counter()
    waves = plan.wave_sizes(plan.parse_ramp(args.waves), n)
    horizon = args.warmup + len(waves) * (args.max_runtime + HOUR + max(args.soak)) + 48 * HOUR
    trace = swf(args.swf, n, args.cores_per_node) if args.swf else generated(n, horizon, args.load,
                                                                             args.max_runtime, args.seed)
    if args.idle_timeout is None:
        args = argparse.Namespace(**{**vars(args), "idle_timeout": float(trace.run.max()) + HOUR})
    fleet, base, made = fleet_and_plan(n, args.waves)
    reference = Cluster(trace, n, host_names(n))
    reference.finish()
    last = float(trace.submit[-1])
    print(f"\n{n} nodes, waves {'+'.join(map(str, waves))}, soak {','.join(map(settings.duration_text, args.soak))}"
          f" (checks every {settings.duration_text(args.soak_interval)}), max in flight "
          f"{args.max_in_flight or 'a wave'}; {trace.source}; {len(trace)} jobs over {last / HOUR / 24:.1f} days, "
          f"utilisation without a campaign {busy_share(trace, reference.started, n, args.warmup, last):.1%} "
          f"after the first {settings.duration_text(args.warmup)} (set up in {time.perf_counter() - t0:.1f} s)",
          flush=True)
    print(f"{'policy':<12} {'idle node-h':>11} {'cluster':>9} {'busy':>7} {'change':>7} {'duration':>9} "
          f"{'delayed':>15} {'delay':>10} {'wall':>7}", flush=True)
    rows = []
    for policy in args.policies:
        if profile:
            profile.enable()
        r = replay(trace, n, policy, args, made, fleet, base, reference.started, home)
        if profile:
            profile.disable()
        print(f"{policy:<12} {r.idle_node_h:>11,.1f} {r.out_idle_node_h - r.change_node_h:>9,.1f} "
              f"{r.busy_node_h:>7,.0f} {r.change_node_h:>7,.0f} {r.duration_h:>8.1f}h "
              f"{r.delayed:>7} ({r.delayed / max(r.jobs, 1):>5.1%})"
              f" {r.delay_h:>9,.0f}h {r.wall_s:>6.1f}s" + ("" if r.state == "done" else f"  campaign {r.state}"),
              flush=True)
        rows.append(r)
    if rows:
        longest = max(r.duration_h for r in rows) * HOUR
        print(f"utilisation without a campaign over the campaigns' time: "
              f"{busy_share(trace, reference.started, n, args.warmup, args.warmup + longest):.1%}")
    return rows


def busy_share(trace: Trace, started: np.ndarray, n: int, since: float, until: float) -> float:
    """The share of N nodes' time from SINCE to UNTIL that jobs ran, given when each job STARTED."""
    end = started + trace.run
    return float((np.clip(np.minimum(end, until) - np.maximum(started, since), 0, None) * trace.nodes).sum()
                 / (n * max(until - since, 1e-9)))


def verdict(rows: list[Result]) -> int:
    """The targets at 1,024 nodes, where measured, on the journal's idle node-hours (and the cluster's count of idle
    out of service less the change beside them): exit 1 when one is missed."""
    at = {r.policy: r for r in rows if r.nodes == 1024}
    missed = []

    def said(r: Result) -> str:
        return f"{r.idle_node_h:,.1f} ({r.out_idle_node_h - r.change_node_h:,.1f} by the cluster's count)"
    if "wave" in at and "host" in at:
        met = at["wave"].idle_node_h >= 5 * at["host"].idle_node_h and at["wave"].idle_node_h > 0
        print(f"\n1,024 nodes: per-host pipelines {said(at['host'])} idle node-hours against the batch's "
              f"{said(at['wave'])} (target: at most a fifth){'' if met else ': MISSED'}")
        missed += [] if met else ["per-host pipelines"]
    if "host" in at and "reservation" in at:
        met = at["reservation"].idle_node_h < at["host"].idle_node_h
        print(f"1,024 nodes: reservations {said(at['reservation'])} against the per-host pipelines' "
              f"{said(at['host'])} (target: fewer){'' if met else ': MISSED'}")
        missed += [] if met else ["reservations"]
    return Exit.FINDINGS if missed else Exit.OK


if __name__ == "__main__":
    sys.exit(main())
