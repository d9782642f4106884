"""fleetctl report drivers: which driver is best, by the fleet's own incident rates (docs/hosts.md, "Which driver is
best").

From the ledger (orchestrator/history/ledger.py), per driver version and GPU model: the hosts observed on it, the
GPU-days observed (Ledger.gpu_days: each gap between two observations of a host, at most MAX_GAP_S, times the GPUs that
answered at the first, credited to the first's driver) and the incidents of each class per 1,000 GPU-days with the
exact Poisson 95% interval (Garwood's, from the chi-square distribution). Then each version against the one it
replaced on that GPU model (replaced()), per class with incidents on either, as a rate ratio: given the two counts'
sum n, the newer's count is binomial(n, p = t_new / (t_new + t_old)) where the rates are equal; the exact test of
that (scipy.stats.binomtest) gives the p-value, and the Clopper-Pearson interval of p, each bound q made
q / (1 - q) * t_old / t_new, the ratio's interval.
"""

from __future__ import annotations

import csv
import io
import math
import re
from datetime import timedelta
from typing import Any

from scipy import stats

from . import __version__, schemas
from .history import chain, timefmt
from .history.ledger import CLASSES, MAX_GAP_S, Ledger
from .report import cell, environment
from .sanitize import clean_data
from .history.store import operator

PER = 1000  # rates per this many GPU-days
LEVEL = 0.95
CSV_FIELDS = ("driver", "model", "hosts", "gpu_days", "class", "incidents", "per_1000_gpu_days", "low", "high",
              "replaced", "ratio", "ratio_low", "ratio_high", "p")


def version_key(version: str) -> tuple:
    """'580.95.05' -> (580, 95, 5): versions in their numeric order (a part that is not a number after those that
    are)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.\-]", version))


def poisson_interval(count: int, gpu_days: float) -> tuple[float, float]:
    """The exact (Garwood) LEVEL interval of a Poisson rate, per PER GPU-days, of COUNT incidents in GPU_DAYS."""
    alpha = 1 - LEVEL
    low = stats.chi2.ppf(alpha / 2, 2 * count) / 2 if count else 0.0
    high = stats.chi2.ppf(1 - alpha / 2, 2 * count + 2) / 2
    return PER * low / gpu_days, PER * high / gpu_days


def rate_ratio(k_new: int, t_new: float, k_old: int, t_old: float) -> dict[str, Any]:
    """The newer's rate over the older's (K incidents in T GPU-days each): ratio, low, high (the LEVEL interval) and
    p (two-sided), by the exact conditional test (module docstring). None where unbounded (no incidents on the
    older: the ratio and its upper bound are infinite)."""
    n = k_new + k_old
    test = stats.binomtest(k_new, n, t_new / (t_new + t_old))
    ci = test.proportion_ci(LEVEL, method="exact")

    def ratio(q: float) -> float | None:
        return None if q >= 1 else q / (1 - q) * t_old / t_new
    return {"ratio": ratio(k_new / n), "low": ratio(ci.low) or 0.0, "high": ratio(ci.high), "p": float(test.pvalue)}


def number(value: float | None) -> str:
    """Two significant figures (3.1, 0.31, 7.0, 12, 140); None: inf."""
    if value is None or math.isinf(value):
        return "inf"
    if value == 0:
        return "0"
    return f"{value:.0f}" if value >= 100 else f"{value:#.2g}".rstrip(".")


def ratio_text(c: dict[str, Any]) -> str:
    """'x3.1 (95% CI 1.4-7.2), p=0.003'."""
    p = "p<0.001" if c["p"] < 0.001 else f"p={c['p']:.2g}"
    return f"x{number(c['ratio'])} ({LEVEL:.0%} CI {number(c['low'])}-{number(c['high'])}), {p}"


def replaced(model_rows: list[dict[str, Any]], moves: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each version of one GPU model -> (the version it replaced, how that was decided): the older version most of
    its hosts moved from (consecutive observations of a host: 'moves'; a move to an older version, a rollback, is no
    replacement), else the one before it in version order ('version order'). Only versions observed in the
    window."""
    versions = sorted((r["driver"] for r in model_rows), key=version_key)
    out = {}
    for i, version in enumerate(versions):
        older = set(versions[:i])
        came = sorted(((m["hosts"], version_key(m["from"]), m["from"]) for m in moves
                       if m["to"] == version and m["from"] in older), reverse=True)
        if came:
            out[version] = (came[0][2], "moves")
        elif i:
            out[version] = (versions[i - 1], "version order")
    return out


def build(ledger: Ledger, since: str | None = None, within_s: float | None = None) -> dict[str, Any]:
    """The report of the window: from SINCE (a timestamp), or the last WITHIN_S seconds before now, or the whole
    history."""
    now = timefmt.now()
    if within_s is not None:
        since = timefmt.stamp(timefmt.parse(now) - timedelta(seconds=within_s))
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for g in ledger.gpu_days(since):
        if g["driver"] is None or not g["gpu_days"]:
            continue
        r = rows.setdefault((g["model"] or "unknown", g["driver"]), {
            "driver": g["driver"], "model": g["model"] or "unknown", "hosts": 0, "gpu_days": 0.0})
        r["hosts"] += 1
        r["gpu_days"] += g["gpu_days"]
    counts = {(c["model"] or "unknown", c["driver"], c["class"]): c["count"] for c in ledger.incident_counts(since)}
    for (model, driver), r in rows.items():
        r["gpu_days"] = round(r["gpu_days"], 3)
        r["incidents"] = {}
        for cls in CLASSES:
            k = counts.get((model, driver, cls), 0)
            low, high = poisson_interval(k, r["gpu_days"])
            r["incidents"][cls] = {"count": k, "rate": round(PER * k / r["gpu_days"], 6), "low": round(low, 6),
                                   "high": round(high, 6)}
    moves = ledger.moves(since)
    comparisons = []
    for model in sorted({m for m, _ in rows}):
        model_rows = [r for (m, _), r in rows.items() if m == model]
        for version, (old, how) in replaced(model_rows, [m for m in moves if m["model"] == model]).items():
            new_row, old_row = rows[model, version], rows[model, old]
            new_row["replaced"], new_row["replaced_how"] = old, how
            for cls in CLASSES:
                k_new, k_old = new_row["incidents"][cls]["count"], old_row["incidents"][cls]["count"]
                if k_new + k_old == 0:
                    continue
                c = rate_ratio(k_new, new_row["gpu_days"], k_old, old_row["gpu_days"])
                c = {k: v if v is None or k == "p" else round(v, 6) for k, v in c.items()}
                comparisons.append({"model": model, "driver": version, "replaced": old, "class": cls,
                                    "count": k_new, "gpu_days": new_row["gpu_days"], "replaced_count": k_old,
                                    "replaced_gpu_days": old_row["gpu_days"], **c,
                                    "line": f"{version} vs {old}, {cls}: {ratio_text(c)}"})
    ordered = sorted(rows.values(), key=lambda r: (r["model"], version_key(r["driver"])))
    for r in ordered:
        r.setdefault("replaced", None)
        r.setdefault("replaced_how", None)
    report = {"schema_version": 1, "tool": {"name": "fleetctl", "version": __version__},
              "generated": {"at": now, "operator": operator(), "since": since, "within_s": within_s},
              "chain": chain.head(ledger.store.db), "per_gpu_days": PER, "level": LEVEL, "max_gap_s": MAX_GAP_S,
              "drivers": ordered, "comparisons": comparisons}
    schemas.check("drivers-report", report, "fleetctl's own drivers report (a bug: please report it)")
    return report


def classes_text(r: dict[str, Any]) -> str:
    """A row's incidents for a table: 'xid_79 30: 0.25 (0.17-0.36); 0 of each other class (< 0.031)'."""
    seen = [f"{cls} {i['count']}: {number(i['rate'])} ({number(i['low'])}-{number(i['high'])})"
            for cls, i in r["incidents"].items() if i["count"]]
    none = [i["high"] for i in r["incidents"].values() if not i["count"]]
    if none:
        seen.append(f"0 of {'each other class' if seen else 'every class'} (< {number(none[0])})")
    return "; ".join(seen)


def to_csv(report: dict[str, Any]) -> str:
    """One row per driver, GPU model and class, with the comparison against the version it replaced where either
    had incidents of the class (inf: unbounded)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    versus = {(c["model"], c["driver"], c["class"]): c for c in report["comparisons"]}
    for r in report["drivers"]:
        for cls, i in r["incidents"].items():
            c = versus.get((r["model"], r["driver"], cls))
            row = {"driver": r["driver"], "model": r["model"], "hosts": r["hosts"], "gpu_days": r["gpu_days"],
                   "class": cls, "incidents": i["count"], "per_1000_gpu_days": i["rate"], "low": i["low"],
                   "high": i["high"], "replaced": r["replaced"] or ""}
            if c:
                row |= {"ratio": "inf" if c["ratio"] is None else c["ratio"], "ratio_low": c["low"],
                        "ratio_high": "inf" if c["high"] is None else c["high"], "p": c["p"]}
            writer.writerow({k: cell(v) for k, v in row.items()})
    buf.write(f"# chain head {report['chain']['digest']} ({report['chain']['records']} records)\n")
    return buf.getvalue()


def to_html(report: dict[str, Any]) -> str:
    """One self-contained page (no script, nothing fetched)."""
    env = environment()
    env.filters["classes"] = classes_text
    return env.get_template("drivers.html.j2").render(r=clean_data(report))
