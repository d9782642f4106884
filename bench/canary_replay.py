#!/usr/bin/env python3
"""Replay the canary judgement (orchestrator/judge/canary/statistics.py) on synthetic series: false rollbacks and
detection.

Usage: .venv/bin/python bench/canary_replay.py [--iterations 400] [--quick] [--seed 0] [--jobs N] [--looks MIN]
                                              [--canaries 1,4,16] [--controls 4,16,64]

Every iteration draws, per host, one sample a minute of a level metric (tensor activity, 0.65) over a window
before the change (2 h, ending 1 h before the soak: the drain and the reboot) and over the soak (2 h):

  value = 0.65 x (1 + host offset) x (1 + shared(t)) x (1 + own(t)) x drift(t) x (1 - regression) + white noise
  host offset  N(0, 3%), fixed per host                 (same-SKU hosts differ)
  own(t)       AR(1), phi 0.8 a minute, sd 2%, per host (a job's phases)
  shared(t)    AR(1), phi 0.95, sd 2%, every host        (the job mix)
  drift(t)     with --drift rows: every host 8% slower from a time drawn in the soak's first 30 min to its end
  white        N(0, 1%), and 1% of the scrapes missing
  regression   0, 2%, 5% or 10%, the canary hosts only, over the soak only

and judges the same series three ways, with the same policy (higher is better, max_change 3%, alpha 0.01,
min_samples 10 blocks a side):

  calibrated   canary.judge_level, canary against control, each host against its own window before too (fleetctl)
  cohort       canary.judge_level without the window before: canary against control over the soak only
  self         the canary hosts' own window before against the soak, no control (what a before/after soak sees):
               the same blocks, rank test and Hodges-Lehmann shift, relative to the canary's median before

A regression of 0 that fails is a false rollback; of 2/5/10%, a fail is a detection (2% is under the 3% tolerated:
failing it is not wanted). With --looks MIN it is also judged every MIN minutes of the soak (from MIN on), and a
fail at any look counts, as the soak's checks would act on it. Exit 0 when fleetctl's way (calibrated) meets the
targets of issue 35 in every row (<= 1% false rollbacks, drift or not; >= 95% detection of a 5% regression with 4
canary hosts), 1 when one is missed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from orchestrator.judge.canary import statistics as canary  # noqa: E402

LEVEL, OFFSET_SD, OWN_PHI, OWN_SD, SHARED_PHI, SHARED_SD, WHITE_SD, MISSING = 0.65, 0.03, 0.8, 0.02, 0.95, 0.02, 0.01, 0.01
DRIFT, DRIFT_START_MAX_MIN = 0.08, 30
BEFORE_MIN, GAP_MIN, SOAK_MIN = 120, 60, 120
REGRESSIONS = (0.0, 0.02, 0.05, 0.10)
CANARIES, CONTROLS = (1, 4, 16), (4, 16, 64)
METHODS = ("calibrated", "cohort", "self")
MAX_CHANGE = 0.03
MAX_FALSE_ROLLBACK, MIN_DETECTION, TARGET_CANARIES = 0.01, 0.95, 4


def ar1(rng: np.random.Generator, rows: int, n: int, phi: float, sd: float) -> np.ndarray:
    """ROWS stationary AR(1) series of N steps with marginal standard deviation SD."""
    out = np.empty((rows, n))
    out[:, 0] = rng.normal(0, sd, rows)
    shocks = rng.normal(0, sd * np.sqrt(1 - phi ** 2), (rows, n))
    for t in range(1, n):
        out[:, t] = phi * out[:, t - 1] + shocks[:, t]
    return out


def draw(rng: np.random.Generator, hosts: int, drift: bool) -> tuple[np.ndarray, np.ndarray]:
    """(minutes, values hosts x minutes) with no regression, over the window before, the gap and the soak."""
    minutes = np.arange(-(BEFORE_MIN + GAP_MIN), SOAK_MIN)
    n = len(minutes)
    values = (LEVEL * (1 + rng.normal(0, OFFSET_SD, (hosts, 1))) * (1 + ar1(rng, 1, n, SHARED_PHI, SHARED_SD))
              * (1 + ar1(rng, hosts, n, OWN_PHI, OWN_SD)))
    if drift:
        start = rng.uniform(0, DRIFT_START_MAX_MIN)
        values *= 1 - DRIFT * np.clip((minutes - start) / 5, 0, 1)  # ramped in over 5 minutes
    values += LEVEL * rng.normal(0, WHITE_SD, values.shape)
    values[rng.random(values.shape) < MISSING] = np.nan
    return minutes, values


def series(minutes: np.ndarray, values: np.ndarray, names: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Rows -> host -> [(unix time, value)], as orchestrator/judge/promql.py's range() gives them (NaN: no sample)."""
    t = 1.7e9 + minutes * 60.0
    return {name: [(a, b) for a, b in zip(t.tolist(), row.tolist()) if b == b] for name, row in zip(names, values)}


def self_comparison(before: np.ndarray, after: np.ndarray) -> str:
    """The canary hosts' own window before against the soak, no control: verdict."""
    width = max(before.shape[1], after.shape[1])
    windows = np.full((len(before) + len(after), width), np.nan)  # each window a row: centred on its own mean
    windows[:len(before), :before.shape[1]], windows[len(before):, :after.shape[1]] = before, after
    block = canary.block_length(canary.lag1(windows))
    x, y = canary.block_means(after, block), canary.block_means(before, block)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if min(len(x), len(y)) < canary.MIN_SAMPLES:
        return "no_verdict"
    p, shift, _ = canary.shift_test(x, y, "higher")
    change = shift / np.nanmedian(before)
    return "fail" if p < canary.ALPHA and -change > MAX_CHANGE else "pass"


def judge(minutes: np.ndarray, values: np.ndarray, n_canary: int, ends: list[int],
          regressions: tuple[float, ...]) -> dict[float, list[dict[str, str]]]:
    """Per regression, the three verdicts at each look (the soak's first END minutes): the series that the
    regression leaves alone (the controls', the windows before) are made once."""
    names = [f"c{i}" for i in range(n_canary)] + [f"k{i}" for i in range(len(values) - n_canary)]
    before, soak = minutes < -GAP_MIN, minutes >= 0
    can_b = series(minutes[before], values[:n_canary, before], names[:n_canary])
    con_b = series(minutes[before], values[n_canary:, before], names[n_canary:])
    con_a = {end: series(minutes[soak][:end], values[n_canary:, soak][:, :end], names[n_canary:]) for end in ends}
    kw = {"name": "tensor_active", "good": "higher", "max_change": MAX_CHANGE}
    out: dict[float, list[dict[str, str]]] = {}
    for r in regressions:
        after = values[:n_canary, soak] * (1 - r)
        out[r] = []
        for end in ends:
            can_a = series(minutes[soak][:end], after[:, :end], names[:n_canary])
            out[r].append({
                "calibrated": canary.judge_level(can_a, con_a[end], canary_before=can_b, control_before=con_b,
                                                 **kw)["verdict"],
                "cohort": canary.judge_level(can_a, con_a[end], **kw)["verdict"],
                "self": self_comparison(values[:n_canary, before], after[:, :end])})
    return out


def row(args: tuple[int, int, bool, int, int | None, np.random.SeedSequence]) -> dict:
    """One (canaries, controls, drift) row: per method and regression, the share of iterations failed."""
    n_canary, n_control, drift, iterations, looks, seed = args
    rng = np.random.default_rng(seed)
    ends = list(range(looks, SOAK_MIN, looks)) + [SOAK_MIN] if looks else [SOAK_MIN]
    fails = {(m, r): 0 for m in METHODS for r in REGRESSIONS}
    undecided = {m: 0 for m in METHODS}
    for _ in range(iterations):
        minutes, values = draw(rng, n_canary + n_control, drift)
        for r, looks_made in judge(minutes, values, n_canary, ends, REGRESSIONS).items():
            for m in METHODS:
                fails[m, r] += any(look[m] == "fail" for look in looks_made)
                undecided[m] += r == 0.05 and looks_made[-1][m] == "no_verdict"
    return {"canaries": n_canary, "controls": n_control, "drift": drift,
            "rates": {k: v / iterations for k, v in fails.items()},
            "no_verdict": {m: v / iterations for m, v in undecided.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=400, help="draws per row (default 400)")
    ap.add_argument("--quick", action="store_true", help="CI-sized: 40 draws a row, the first two control sizes only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--looks", type=int, default=None, metavar="MIN",
                    help="also judge every MIN minutes of the soak; a fail at any look counts")
    ap.add_argument("--canaries", default=",".join(map(str, CANARIES)), help="canary cohort sizes (default 1,4,16)")
    ap.add_argument("--controls", default=",".join(map(str, CONTROLS)), help="control cohort sizes (default 4,16,64)")
    opts = ap.parse_args()
    iterations = 40 if opts.quick else opts.iterations
    controls = [int(k) for k in opts.controls.split(",")][:2 if opts.quick else None]
    cases = [(c, k, d) for d in (False, True) for c in map(int, opts.canaries.split(",")) for k in controls]
    seeds = np.random.SeedSequence(opts.seed).spawn(len(cases))
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=opts.jobs) as pool:
        rows = list(pool.map(row, [(*case, iterations, opts.looks, s) for case, s in zip(cases, seeds)]))
    elapsed = time.monotonic() - started

    table = Table(title=f"Canary judgement replay: {iterations} draws a row, seed {opts.seed}, soak {SOAK_MIN} min at "
                        f"1 sample/min, max_change {MAX_CHANGE:.0%}, alpha {canary.ALPHA:g}"
                        + (f", judged every {opts.looks} min" if opts.looks else ", judged at the end"))
    for col in ("canary", "control", "drift"):
        table.add_column(col, justify="right")
    for m in METHODS:
        for r in REGRESSIONS:
            table.add_column(f"{m}\n{'false rb' if r == 0 else f'{r:.0%} det'}", justify="right")
    table.add_column("no verdict\n5%, calib.", justify="right")
    missed = []
    for res in rows:
        table.add_row(str(res["canaries"]), str(res["controls"]), "8%" if res["drift"] else "-",
                      *[f"{res['rates'][m, r]:.1%}" for m in METHODS for r in REGRESSIONS],
                      f"{res['no_verdict']['calibrated']:.1%}")
        where = f"{res['canaries']} canary vs {res['controls']} control{', drift' if res['drift'] else ''}"
        if res["rates"]["calibrated", 0.0] > MAX_FALSE_ROLLBACK:
            missed.append(f"{where}: {res['rates']['calibrated', 0.0]:.1%} false rollbacks > {MAX_FALSE_ROLLBACK:.0%}")
        if res["canaries"] == TARGET_CANARIES and res["rates"]["calibrated", 0.05] < MIN_DETECTION:
            missed.append(f"{where}: {res['rates']['calibrated', 0.05]:.1%} of 5% regressions caught < {MIN_DETECTION:.0%}")
    console = Console(width=200)
    console.print(table)
    console.print(f"{len(rows)} rows in {elapsed:.0f} s on {opts.jobs} process(es)")
    for line in missed:
        console.print(f"target missed: {line}")
    if not missed:
        console.print(f"targets met (calibrated): <= {MAX_FALSE_ROLLBACK:.0%} false rollbacks in every row; "
                      f">= {MIN_DETECTION:.0%} of 5% regressions caught with {TARGET_CANARIES} canary hosts")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
