#!/usr/bin/env python3
"""Replay the throughput gate on REAL samples: how often does it roll back a healthy host, and catch a regression?

Usage: .venv/bin/python bench/gate_replay.py [PROBE_RESULT.json ...] [--samples 10] [--trials 2000] [--seed 0]
Without paths it reads tests/testdata/probe/*.json (probe results captured on real GPUs, *-series.json: repeated
interconnect runs of one host, and *-probe-series.json, below: each run read as a probe result of its own) and
tests/testdata/*-health/bench.json (below), and exits 2 when there are none. Inputs:

  probe result          schemas/probe-result.schema.json (fleetctl probe --format json's hosts[].probe, or the module's)
  *-series.json         scripts/device-nvlink-capture.py: {"allreduce"|"p2p": [{"repeat": k, "samples": [...]}]}
  *-probe-series.json   scripts/device-probe-series.py, K builtin probes back to back on one host:
                          {"format": "fleetctl-probe-series/1", "device": "torch 2.x on NVIDIA H100 ...",
                           "trial_s": 0.5, "warmup_s": 10, "metrics": {NAME: {"unit", "higher_is_better"}},
                           "probes": [{"probe": k, "samples": [{"gpu": 0, "metric": NAME, "value": v}, ...]}, ...],
                           "alone":  [{"probe": k, "samples": [...]}]}   (optional: copies of each GPU alone)
                        every probe is a run of its own; "alone" runs are reference series, not gated
  bench.json            scripts/device-health-capture.py (tests/testdata/h100-580.159.04-health): pinned 1 GiB
                        copies, 15 samples, all GPUs at once (h2d_gbs, d2h_gbs: gated) and each GPU alone from cold
                        (reference), and 300 GEMM iteration times, from which gemm_p99_ms samples are drawn: each the
                        p99 of 300 iterations resampled from the real ones (one run's spread, not run-to-run: the
                        probe-series capture gives that)

Series of a metric the gate does not gate (orchestrator/judge/gate.py METRICS, e.g. gemm_p99_ms) and reference series
are replayed and listed, but left out of the targets below: their rows say what gating them would do.
For every (file, GPU, metric) series it draws, with replacement, two sides of --samples values:
  no regression   both sides from the real series                    -> false-rollback rate (fail)
  3% / 5% drop    the 'after' side worse by 3% / 5% (x0.97 / x0.95;  -> detection rate (fail)
                  x1.03 / x1.05 for a lower-is-better metric)
and judges them with orchestrator.judge.gate.judge_series under the default policy. It also judges every pair of real
runs with the same device, engine and trial length against each other as they are (no change between them: a fail
there is a false rollback that resampling one run cannot show, e.g. thermal or power-cap drift). Exit 0 when the targets are met
(<= 1% false rollbacks, >= 95% detection of a 5% drop), 1 when one is missed.

Note: resampling a short real series with replacement makes ties that independent measurements would not have;
the gate's p-value is exact with ties, so they cost power, not false rollbacks. A 5% drop sits exactly on the
default floor (0.95): the floor is strict, so those trials fall to the test, or to the floor when resampling
pushes the after median lower.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from orchestrator.judge import gate
from orchestrator import schemas

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "collections"))  # the probe's own percentile, from the collection's module_utils
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_throughput import P99, percentile  # noqa: E402
DEFAULT_GLOB = "tests/testdata/probe/*.json"
HEALTH_GLOB = "tests/testdata/*-health/bench.json"
P99_DRAWS = 10  # gemm_p99_ms samples drawn from a bench.json's GEMM iteration times
CASES = (("no regression", 0.0), ("3% drop", 0.03), ("5% drop", 0.05))
MAX_FALSE_ROLLBACK, MIN_DETECTION = 0.01, 0.95


def fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(2)


INTERCONNECT = {"allreduce": "allreduce_busbw_gbs", "p2p": "p2p_gbs"}


def series_runs(name: str, doc: dict) -> dict[str, dict]:
    """A *-series.json of scripts/device-nvlink-capture.py: every repeated run -> a probe result's throughput."""
    runs = {}
    for family, metric in INTERCONNECT.items():
        for run in doc.get(family, []):
            runs[f"{name}#{family}{run['repeat']}"] = {"throughput": {
                "engine": "builtin", "trial_s": 0.5, "device": f"{doc['gpus']} GPUs, torch {doc['torch']}, NCCL {doc['nccl']}",
                "metrics": {metric: {"unit": "GB/s", "higher_is_better": True}},
                "samples": [{"gpu": s["gpu"], "metric": metric, "value": s["value"]} for s in run["samples"]]}}
    return runs


def probe_series_runs(name: str, doc: dict) -> dict[str, dict]:
    """A *-probe-series.json of scripts/device-probe-series.py: every probe (and every 'alone' run) -> a throughput."""
    runs = {}
    for family, device in (("probes", doc["device"]), ("alone", f"{doc['device']}, each GPU alone")):
        for run in doc.get(family, []):
            runs[f"{name}#{family}{run['probe']}"] = {"reference": family == "alone", "throughput": {
                "engine": "builtin", "trial_s": doc["trial_s"], "device": device, "metrics": doc["metrics"],
                "samples": run["samples"]}}
    return runs


def health_bench_runs(name: str, doc: dict, rng: np.random.Generator) -> dict[str, dict]:
    """A bench.json of scripts/device-health-capture.py -> the copies at once (gated), alone (reference) and
    gemm_p99_ms samples drawn from the GEMM iteration times."""
    gbs = {"unit": "GB/s", "higher_is_better": True}
    runs = {}
    for family, run, device in (("copy_all_at_once", "at-once", "all GPUs at once, warm"),
                                ("copy_alone", "alone", "each GPU alone, cold")):
        samples = [{"gpu": int(g), "metric": f"{side}_gbs", "value": v} for g, sides in doc[family].items()
                   for side in ("h2d", "d2h") for v in sides[side]["samples_gbps"]]
        runs[f"{name}#{run}"] = {"reference": run == "alone", "throughput": {
            "engine": "builtin", "trial_s": 0.0, "device": f"torch {doc['torch']}, pinned 1 GiB copies, {device}",
            "metrics": {"h2d_gbs": gbs, "d2h_gbs": gbs}, "samples": samples}}
    samples = [{"gpu": int(g), "metric": "gemm_p99_ms",
                "value": float(percentile(rng.choice(np.array(gemm["ms"]), len(gemm["ms"])).tolist(), P99))}
               for g, gemm in doc["gemm"].items() for _ in range(P99_DRAWS)]
    runs[f"{name}#gemm"] = {"throughput": {
        "engine": "builtin", "trial_s": 0.0, "device": f"torch {doc['torch']}, bf16 GEMM, p99 of 300 iterations resampled",
        "metrics": {"gemm_p99_ms": {"unit": "ms", "higher_is_better": False}}, "samples": samples}}
    return runs


def load_docs(paths: list[Path], rng: np.random.Generator) -> dict[str, dict]:
    docs = {}
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            fail(f"{path}: cannot read a probe result: {e}")
        try:
            if doc.get("format") == "fleetctl-probe-series/1":
                docs.update(probe_series_runs(path.name, doc))
                continue
            if "copy_all_at_once" in doc:
                docs.update(health_bench_runs(f"{path.parent.name}/{path.name}", doc, rng))
                continue
        except (KeyError, TypeError, ValueError) as e:
            fail(f"{path}: not a probe series or bench capture: {type(e).__name__}: {e}")
        if path.name.endswith("-series.json"):
            docs.update(series_runs(path.name, doc))
            continue
        error = schemas.first_error("probe-result", doc)
        if error is not None:
            fail(f"{path}: {schemas.json_path(error)}: {error.message}")
        if doc["throughput"]:
            docs[path.name] = doc
    return docs


def load_series(docs: dict[str, dict]) -> list[dict]:
    """Every (file, GPU, metric) series with at least 2 real values."""
    out = []
    for name, doc in docs.items():
        tp = doc["throughput"]
        values = defaultdict(list)
        for s in tp["samples"]:
            if s["value"] is not None and math.isfinite(s["value"]):
                values[(s["gpu"], s["metric"])].append(float(s["value"]))
        for (gpu, metric), xs in sorted(values.items(), key=lambda kv: (kv[0][1], kv[0][0] if kv[0][0] is not None else -1)):
            if len(xs) >= 2:
                spec = tp["metrics"].get(metric, {"unit": "", "higher_is_better": True})
                out.append({"file": name, "gpu": gpu, "metric": metric, "values": np.array(xs),
                            "unit": spec["unit"], "higher_is_better": spec["higher_is_better"],
                            "device": tp.get("device") or "?",
                            "counted": gate.DEFAULTS.gated(metric) and not doc.get("reference")})
    return out


def replay(series: dict, drop: float, n: int, trials: int, rng: np.random.Generator) -> dict[str, int]:
    scale = (1 - drop) if series["higher_is_better"] else (1 + drop)
    counts = {"pass": 0, "fail": 0, "inconclusive": 0}
    label = f"GPU {series['gpu']} {series['metric']}"
    for _ in range(trials):
        before = rng.choice(series["values"], n).tolist()
        after = (rng.choice(series["values"], n) * scale).tolist()
        status, _, _ = gate.judge_series(label, series["metric"], before, after, series["higher_is_better"],
                                         series["unit"], gate.DEFAULTS)
        counts[status] += 1
    return counts


def real_pairs(docs: dict[str, dict], console: Console) -> None:
    """Every ordered pair of real runs with the same device, engine and trial length, judged as they are:
    independent runs of an unchanged host, so every 'fail' here is a false rollback between real runs."""
    table = Table(title="Real runs judged against each other (same device, engine, trial_s; no change between them)")
    for col in ("before", "after", "status", "largest drop"):
        table.add_column(col)
    common = os.path.commonprefix(list(docs)) if len(docs) > 1 else ""
    common = common[:common.rfind("-") + 1]
    groups: dict[str, dict[str, Any]] = {}  # the runs of one series file: summed up, not listed pair by pair
    for (na, a), (nb, b) in itertools.permutations(docs.items(), 2):
        ta, tb = a["throughput"], b["throughput"]
        if (ta["device"], ta["engine"], ta["trial_s"], set(ta["metrics"])) != \
                (tb["device"], tb["engine"], tb["trial_s"], set(tb["metrics"])):
            continue
        v = gate.judge_throughput(ta, tb, gate.DEFAULTS)
        drop, metric = max((f.get("drop") or 0.0, m) for (_, m), f in v.figures.items())
        if "#" in na and na.split("#")[0] == nb.split("#")[0]:
            g = groups.setdefault(f"{na.split('#')[0]} {metric}", {"pairs": 0, "statuses": defaultdict(int), "drop": 0.0})
            g["pairs"] += 1
            g["statuses"][v.status] += 1
            g["drop"] = max(g["drop"], drop)
            continue
        table.add_row(na[len(common):], nb[len(common):], v.status, f"{max(drop, 0.0):.1%} {metric}")
    for name, g in groups.items():
        table.add_row(f"{name}: every run", f"every other run ({g['pairs']} pairs)",
                      ", ".join(f"{k} {n}" for k, n in sorted(g["statuses"].items())), f"{g['drop']:.1%}")
    if table.row_count:
        console.print(table)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path, help=f"probe results (default: {DEFAULT_GLOB})")
    ap.add_argument("--samples", type=int, default=10, help="samples per side (default 10)")
    ap.add_argument("--trials", type=int, default=2000, help="trials per case and series (default 2000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    paths = args.paths or sorted(REPO.glob(DEFAULT_GLOB)) + sorted(REPO.glob(HEALTH_GLOB))
    if not paths:  # exit 2, like a usage error
        print(f"no probe results in {REPO / DEFAULT_GLOB}: capture some on a GPU host, or pass paths", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    docs = load_docs(paths, rng)
    series = load_series(docs)
    if not series:
        print(f"no throughput series with 2 or more values in {', '.join(map(str, paths))}", file=sys.stderr)
        return 2

    console = Console(width=max(Console().width, 110))
    for name in dict.fromkeys(x["file"] for x in series):
        console.print(f"{name}: {next(x['device'] for x in series if x['file'] == name)}")
    inputs = Table(title="Real series")
    for col in ("file", "GPU", "metric", "n", "median", "CV", "in targets"):
        inputs.add_column(col, justify="right" if col in ("n", "median", "CV") else "left")
    for x in series:
        v = x["values"]
        inputs.add_row(x["file"], "host" if x["gpu"] is None else str(x["gpu"]), x["metric"], str(len(v)),
                       f"{np.median(v):.1f} {x['unit']}" if np.median(v) >= 10 else f"{np.median(v):.3g} {x['unit']}", f"{np.std(v, ddof=1) / np.mean(v):.2%}",
                       "yes" if x["counted"] else "no (not gated)" if not gate.DEFAULTS.gated(x["metric"]) else "no (reference)")
    console.print(inputs)

    totals: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: {"pass": 0, "fail": 0, "inconclusive": 0})
    worst_fail: dict[str, float] = defaultdict(float)
    worst_detect: dict[str, float] = defaultdict(lambda: 1.0)
    for name, drop in CASES:
        for s in series:
            counts = replay(s, drop, args.samples, args.trials, rng)
            key = s["metric"] if s["counted"] else f"{s['metric']} ({'not gated' if not gate.DEFAULTS.gated(s['metric']) else 'reference'})"
            for k, c in counts.items():
                totals[(name, key)][k] += c
                if s["counted"]:
                    totals[(name, "all")][k] += c
            if s["counted"]:
                worst_fail[name] = max(worst_fail[name], counts["fail"] / args.trials)
                worst_detect[name] = min(worst_detect[name], counts["fail"] / args.trials)

    table = Table(title=f"Gate replay: {args.samples} samples a side, {args.trials} trials per series and case, seed {args.seed}")
    for col in ("case", "metric", "trials", "fail", "inconclusive", "pass"):
        table.add_column(col, justify="left" if col in ("case", "metric") else "right")
    for (name, metric), c in sorted(totals.items(), key=lambda kv: ([n for n, _ in CASES].index(kv[0][0]), kv[0][1] == "all")):
        total = sum(c.values())
        table.add_row(name, metric, str(total), *(f"{c[k] / total:.2%}" for k in ("fail", "inconclusive", "pass")),
                      style="bold" if metric == "all" else None)
    console.print(table)

    def rate(name: str, key: str) -> float:
        c = totals[(name, "all")]
        return c[key] / sum(c.values())

    real_pairs(docs, console)
    false_rollback, detection = rate("no regression", "fail"), rate("5% drop", "fail")
    ok_fr, ok_det = false_rollback <= MAX_FALSE_ROLLBACK, detection >= MIN_DETECTION
    console.print(f"false rollbacks (no regression -> fail): {false_rollback:.2%} (worst series "
                  f"{worst_fail['no regression']:.2%}), target <= {MAX_FALSE_ROLLBACK:.0%}: {'PASS' if ok_fr else 'MISS'}")
    console.print(f"detection of a 5% drop (-> fail): {detection:.2%} (worst series {worst_detect['5% drop']:.2%}), "
                  f"target >= {MIN_DETECTION:.0%}: {'PASS' if ok_det else 'MISS'}")
    console.print(f"inconclusive: no regression {rate('no regression', 'inconclusive'):.2%}, "
                  f"3% drop {rate('3% drop', 'inconclusive'):.2%}, 5% drop {rate('5% drop', 'inconclusive'):.2%}; "
                  f"detection of a 3% drop {rate('3% drop', 'fail'):.2%} (no target: 3% is the GEMM limit itself)")
    return 0 if ok_fr and ok_det else 1


if __name__ == "__main__":
    sys.exit(main())
