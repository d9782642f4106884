"""The health gate: is this host healthy on its new driver? Two probe results of the SAME host, before and after.

Health (judge_health) fails on anything a person would drain the host for: a GPU gone, a new Xid at or above the
baseline's `xid.fail_on`, new uncorrectable ECC errors, a row remap pending or failed, a recovery action asked for,
new fatal or non-fatal PCIe AER errors, more new PCIe replays than the baseline's `gpus.max_pcie_replays`.

Throughput (judge_throughput) compares each (GPU, metric) series with itself, never with other hosts (same-SKU
hosts differ by 8-22%). With drop = relative loss of the median in the metric's good direction:
  - drop > 1 - floor                                      -> fail (below the floor; strict '>', see FLOOR_SLACK)
  - drop >= max_drop and one-sided exact Mann-Whitney p < alpha -> fail
  - drop >= max_drop and (p >= alpha or < min_samples a side)   -> inconclusive (measure again, then a person)
  - otherwise                                             -> pass (a significant but small change is no regression)
A drop of exactly 1 - floor (a 5% drop with the default floor 0.95) is NOT a floor failure: the test decides.

scipy's method="exact" makes no correction for ties: it reads the tied statistic against the no-ties null
distribution (and truncates a half-integer U), without a warning. With all values equal it gives p=0.51, not 1.
So when the pooled samples hold ties, p comes from the exact permutation distribution of the rank sum given
those ties (exact_p_with_ties); without ties it is scipy's exact p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from typing import Any


from .. import resources
from ..controls import nvlink_errors, severity_rank


@dataclass(frozen=True)
class MetricGate:
    max_drop: float  # the default limit (the baseline's gate.max_drop overrides it)
    gated: bool = True  # False: judged and shown in the figures, but never fails or holds up a host


# The builtin engine's metrics (collections/.../module_utils/fleetctl_throughput.py METRICS, the lab bench's too).
# A command engine's metrics not named here are gated with the policy's default limit.
METRICS = {
    "gemm_tflops": MetricGate(0.03),
    "bandwidth_gbs": MetricGate(0.02),
    # Interconnect limits from real 2x H200 series (tests/testdata/probe/h200x2-580.159.04-*): the all-reduce busbw
    # medians of 15 separate probes spread 1.2% (min to max), so 3% leaves 2.5x that; one NVLink of 18 lost is 5.6%.
    "allreduce_busbw_gbs": MetricGate(0.03),
    "p2p_gbs": MetricGate(0.03),
    # Pinned host<->device copies, every GPU at once after a warm-up (the figure gated: the GPU alone from cold had
    # CV 12.5-12.9% on a real H100, at once after warm-up 0.21% H2D / 0.79% D2H; a real H200 0.13% / 0.23%, issue 24):
    # 3% is ~4x the worst CV; a link trained at x8 or a Gen4 link halves them (the floor).
    "h2d_gbs": MetricGate(0.03),
    "d2h_gbs": MetricGate(0.03),
    # GEMM per-iteration times (real H100: 300 iterations, median 1.610 ms, p99 1.737 ms, p99/median 1.079). The
    # median is gemm_tflops seen per iteration: reported only. The p99 is reported until its run-to-run spread is
    # measured on a real GPU (scripts/device-probe-series.py, bench/gate_replay.py); gating it is gated=True here.
    "gemm_median_ms": MetricGate(0.03, gated=False),
    "gemm_p99_ms": MetricGate(0.05, gated=False),
}
DEFAULT_MAX_DROP = {name: m.max_drop for name, m in METRICS.items()}
FLOOR_SLACK = 1e-9  # float rounding at the boundaries: a drop of exactly 1 - floor (or max_drop) is not 'more'


@dataclass(frozen=True)
class GatePolicy:
    alpha: float = 0.01
    min_samples: int = 5
    floor: float = 0.95
    max_drop: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MAX_DROP))
    default_max_drop: float = 0.03  # metrics not named in max_drop (e.g. a command engine's)
    xid_fail_on: str = "high"
    xid_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    nvlink_errors_fail: int | None = None  # the baseline's interconnect.nvlink.errors_fail: errors counted since
    pcie_replays_fail: int | None = None  # the baseline's gpus.max_pcie_replays: new replays a GPU may count

    def max_drop_for(self, metric: str) -> float:
        return self.max_drop.get(metric, self.default_max_drop)

    def gated(self, metric: str) -> bool:
        return METRICS[metric].gated if metric in METRICS else True


DEFAULTS = GatePolicy()


def gate_policy(policy: dict[str, Any]) -> GatePolicy:
    """A host's baseline policy ('gate' and 'xid' keys) -> GatePolicy; keys left out take DEFAULTS."""
    gate, xid = policy.get("gate", {}), policy.get("xid", {})
    drops = dict(DEFAULTS.max_drop, **gate.get("max_drop", {}))
    default_drop = drops.pop("default", DEFAULTS.default_max_drop)
    return GatePolicy(alpha=gate.get("alpha", DEFAULTS.alpha), min_samples=gate.get("min_samples", DEFAULTS.min_samples),
                      floor=gate.get("floor", DEFAULTS.floor), max_drop=drops, default_max_drop=default_drop,
                      xid_fail_on=xid.get("fail_on", DEFAULTS.xid_fail_on), xid_overrides=xid.get("overrides", {}),
                      nvlink_errors_fail=policy.get("interconnect", {}).get("nvlink", {}).get("errors_fail"),
                      pcie_replays_fail=policy.get("gpus", {}).get("max_pcie_replays"))


# What can fail a gate (or a soak check), the worst first: a summary names the worst problem and counts the rest.
# An Xid names the cause of what the GPU count and a lost GPU show. The canary metrics (the canary against its
# control cohort over the same time) come before the self-comparisons (throughput, the canary command's last run
# against its first): a drift the whole fleet shares fails those too, and is not excused while a canary metric fails.
KINDS = ("driver", "Xid", "GPU lost", "GPU count", "reboot", "ECC", "row remap", "recovery action", "interconnect",
         "control", "PCIe", "canary metrics", "throughput", "canary command", "canary runs", "could not check")


@dataclass(frozen=True)
class Problem:
    """One thing that failed (or left a verdict inconclusive): its KIND (one of KINDS), its TEXT in full (a reason),
    and SHORT where a summary says it in fewer words."""
    kind: str
    text: str
    status: str = "fail"  # fail | inconclusive
    weight: int = 0  # within a kind, the larger the worse (an Xid's severity rank)
    short: str | None = None

    def rank(self) -> tuple[bool, int, int]:
        return self.status != "fail", KINDS.index(self.kind), -self.weight


def one_line(problems: list[Problem]) -> str | None:
    """The problems in one line: the worst, then how many more and of which kinds, e.g.
    "new Xid 79 (GPU has fallen off the bus) on 00000000:18:00.0: severity critical (+2 more: Xid, throughput)"."""
    if not problems:
        return None
    first, *rest = sorted(problems, key=Problem.rank)
    line = first.short or first.text
    if rest:
        line += f" (+{len(rest)} more: {', '.join(dict.fromkeys(p.kind for p in sorted(rest, key=Problem.rank)))})"
    return line


@dataclass
class Verdict:
    status: str  # pass | fail | inconclusive
    reasons: list[str] = field(default_factory=list)
    figures: dict[tuple[int | None, str], dict[str, Any]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)  # what failed or is inconclusive: summary()

    def summary(self) -> str:
        """What a person reads first: the problems in one line (one_line); a verdict without any, its first reason."""
        return one_line(self.problems) or (self.reasons[0] if self.reasons else self.status)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly: figures as a list, each naming its gpu and metric."""
        return {"status": self.status, "summary": self.summary(), "reasons": list(self.reasons),
                "figures": [{"gpu": gpu, "metric": metric, **f} for (gpu, metric), f in self.figures.items()]}


def worst(statuses: list[str]) -> str:
    return "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"


# ---- the rank test -----------------------------------------------------------------------------

def exact_p_with_ties(x: np.ndarray, y: np.ndarray) -> float:
    """P(rank sum of x >= observed) when every split of the pooled values into |x| and |y| is equally likely.

    Exact and conditional on the tie pattern: a dynamic programme over the groups of equal values, counting the
    ways to take j of a group's t members (comb(t, j)) by (how many taken, doubled rank sum; doubled midranks are
    integers).
    """
    import numpy as np  # 0.2 s to import: only where samples are judged, not on every command
    m = len(x)
    values, counts = np.unique(np.concatenate([x, y]), return_counts=True)
    ends = np.cumsum(counts)
    rank2 = (ends - counts + 1) + ends  # 2 x midrank of each group
    observed = int(rank2[np.searchsorted(values, x)].sum())
    width = int(rank2.max()) * m + 1
    ways = np.zeros((m + 1, width))
    ways[0, 0] = 1.0
    for t, r in zip(counts.tolist(), rank2.tolist()):
        nxt = np.zeros_like(ways)
        for j in range(min(t, m) + 1):
            nxt[j:, j * r:] += math.comb(t, j) * ways[:m + 1 - j, :width - j * r]
        ways = nxt
    return float(ways[m, observed:].sum() / ways[m].sum())


def warm() -> None:
    """What a gate imports (scipy.stats and numpy, 0.7 s), imported ahead: a campaign has it done while its first
    playbook runs (runner.meanwhile)."""
    import scipy.stats  # noqa: F401


def one_sided_p(x: np.ndarray, y: np.ndarray) -> tuple[float, str]:
    """(p, test) for 'x is stochastically greater than y': x = before for higher-is-better metrics, else after."""
    import numpy as np  # 0.2 s to import: only where samples are judged, not on every command
    if len(np.unique(np.concatenate([x, y]))) == len(x) + len(y):
        from scipy.stats import mannwhitneyu  # 1.3 s to import: only where a gate is decided, not on every command

        return float(mannwhitneyu(x, y, alternative="greater", method="exact").pvalue), "exact"
    return exact_p_with_ties(x, y), "exact (ties)"


# ---- throughput --------------------------------------------------------------------------------

def _finite(values: list[Any]) -> np.ndarray:
    import numpy as np  # 0.2 s to import: only where samples are judged, not on every command
    return np.array([float(v) for v in values if v is not None and math.isfinite(v)], dtype=float)


def series_label(gpu: int | None, metric: str) -> str:
    return f"GPU {gpu} {metric}" if gpu is not None else f"host {metric}"


def median_text(v: float) -> str:
    """A median for a reason: one decimal (712.3 TFLOP/s, 54.8 GB/s), 3 significant digits under 10 (1.61 ms)."""
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"


def _p_text(p: float) -> str:
    return f"{p:.3g}" if p >= 0.001 else f"{p:.1e}"


def _figure(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1%}" if percent else f"{value:.4g}"


def metric_figures(m: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """A canary metric's verdict (judge/canary/) as `campaign show` and the HTML report show it: canary, control, change,
    its 95% interval and p, "-" for what it does not have."""
    ci = m.get("ci")
    return (_figure(m.get("canary")), _figure(m.get("control")), _figure(m.get("change"), percent=True),
            f"{_figure(ci[0], True)} .. {_figure(ci[1], True)}" if ci else "-",
            f"{m['p_value']:.2g}" if m.get("p_value") is not None else "-")


def judge_series(label: str, metric: str, before_values: list[Any], after_values: list[Any],
                 higher_is_better: bool, unit: str, pol: GatePolicy) -> tuple[str, str | None, dict[str, Any]]:
    """One (GPU, metric) series -> (status, reason or None for a plain pass, figures)."""
    import numpy as np  # 0.2 s to import: only where samples are judged, not on every command
    b, a = _finite(before_values), _finite(after_values)
    fig: dict[str, Any] = {"n_before": len(b), "n_after": len(a), "dropped_before": len(before_values) - len(b),
                           "dropped_after": len(after_values) - len(a), "median_before": None, "median_after": None,
                           "change": None, "drop": None, "p_value": None, "test": None, "status": None}
    notes = [f"{n} failed trial(s) {side} left out" for n, side in
             ((fig["dropped_before"], "before"), (fig["dropped_after"], "after")) if n]

    def out(status: str, reason: str | None, rule: str | None = None) -> tuple[str, str | None, dict[str, Any]]:
        fig["status"] = status
        if rule:
            fig["rule"] = rule  # why it failed or is inconclusive: a key of RULES
        if notes and reason is None:
            reason = f"{label}: {'; '.join(notes)}"
        elif notes:
            reason += f" ({'; '.join(notes)})"
        return status, reason, fig

    if len(a) == 0:
        return out("fail", f"{label}: no valid samples after ({len(after_values)} trial(s), none gave a value)",
                   "no samples")
    if len(b) == 0:
        return out("pass", f"{label}: no valid samples before: nothing to compare")
    mb, ma = float(np.median(b)), float(np.median(a))
    fig.update(median_before=mb, median_after=ma)
    if mb <= 0:
        return out("inconclusive", f"{label}: median before is {mb:g} {unit}: no relative change to judge",
                   "zero median")
    change = (ma - mb) / mb
    drop = -change if higher_is_better else change
    fig.update(change=change, drop=drop)
    limit, floor_drop = pol.max_drop_for(metric), 1 - pol.floor
    head = f"{label}: median {median_text(mb)} -> {median_text(ma)} {unit} ({change:+.1%})"
    if len(b) >= 2 and len(a) >= 2:
        p, test = one_sided_p(b, a) if higher_is_better else one_sided_p(a, b)
        fig.update(p_value=p, test=test)
    test_name = "one-sided exact Mann-Whitney" + (" (tie-corrected)" if fig["test"] == "exact (ties)" else "")

    if drop > floor_drop + FLOOR_SLACK:
        if higher_is_better:
            return out("fail", f"{head}, below the floor of {pol.floor:g}x its own median before", "floor")
        return out("fail", f"{head}, past the floor: more than {floor_drop:.0%} worse than its own median before",
                   "ceiling")
    if drop < limit - FLOOR_SLACK:
        if fig["p_value"] is not None and fig["p_value"] < pol.alpha and drop > 0:
            return out("pass", f"{head}: significant (p={_p_text(fig['p_value'])}) but under the {limit * 100:g}% limit")
        return out("pass", None)
    if min(len(b), len(a)) < pol.min_samples:
        return out("inconclusive", f"{head} but only {len(b)} sample(s) before and {len(a)} after: "
                                   f"{pol.min_samples} a side are needed to reach p<{pol.alpha:g}; measure again",
                   "few samples")
    if fig["p_value"] < pol.alpha:
        return out("fail", f"{head}, {test_name} p={_p_text(fig['p_value'])} < {pol.alpha:g}", "limit")
    return out("inconclusive", f"{head} but {test_name} p={_p_text(fig['p_value'])} >= {pol.alpha:g}: "
                               f"too noisy to call; measure again", "noisy")


def _series(throughput: dict[str, Any]) -> dict[tuple[int | None, str], list[Any]]:
    out: dict[tuple[int | None, str], list[Any]] = {}
    for s in throughput["samples"]:
        out.setdefault((s["gpu"], s["metric"]), []).append(s["value"])
    return out


def judge_throughput(before: dict[str, Any] | None, after: dict[str, Any] | None, pol: GatePolicy = DEFAULTS,
                     broken: dict[str, str] | None = None, what: str = "throughput") -> Verdict:
    """The probe results' "throughput" objects (either may be None) -> Verdict. BROKEN: the after probe's
    throughput.* errors: a series missing after because its measurement broke is inconclusive, not a regression.
    WHAT: the kind its problem is named by (KINDS: "canary command" for the canary command's runs)."""
    if before is None or after is None or not before["samples"] or not after["samples"]:
        side = " and ".join(s for s, t in (("before", before), ("after", after)) if t is None or not t["samples"])
        return Verdict("pass", [f"no throughput samples to compare (none {side})"])
    sb, sa = _series(before), _series(after)
    verdict = Verdict("pass")
    statuses, plain = [], []
    for key in sorted(sb.keys() | sa.keys(), key=lambda k: (k[1], -1 if k[0] is None else k[0])):
        gpu, metric = key
        label = series_label(gpu, metric)
        if key not in sa and not pol.gated(metric):
            verdict.reasons.append(f"{label}: no samples after (reported, not gated)")
            continue
        if key not in sa:
            status = "inconclusive" if broken else "fail"
            statuses.append(status)
            verdict.reasons.append(f"{'GPU ' + str(gpu) if gpu is not None else 'the host'} gave no {metric} samples after"
                                   + (f" (the measurement broke: {'; '.join(sorted(broken.values()))}; measure again)"
                                      if broken else ""))
            verdict.figures[key] = {"n_before": len(sb[key]), "n_after": 0, "status": status,
                                    "rule": "broken" if broken else "no samples"}
            continue
        if key not in sb:
            verdict.reasons.append(f"{label}: new after the change, nothing to compare with")
            continue
        spec_b, spec_a = before["metrics"].get(metric), after["metrics"].get(metric)
        spec = spec_a or spec_b or {"unit": "", "higher_is_better": True}
        if spec_b and spec_a and spec_b != spec_a:
            statuses.append("inconclusive")
            verdict.reasons.append(f"{label}: the metric changed definition ({spec_b} -> {spec_a}); cannot compare")
            verdict.figures[key] = {"status": "inconclusive", "rule": "definition"}
            continue
        status, reason, fig = judge_series(label, metric, sb[key], sa[key], spec["higher_is_better"], spec["unit"], pol)
        verdict.figures[key] = fig
        if not pol.gated(metric):
            fig["gated"] = False
            if status != "pass":
                verdict.reasons.append(f"{reason} (reported, not gated: would be {status})")
            continue
        statuses.append(status)
        if reason:
            verdict.reasons.append(reason)
        else:
            plain.append((fig["drop"], label))
    if plain:
        biggest = max(plain)
        verdict.reasons.append(f"{len(plain)} throughput series within limits (largest drop {max(0.0, biggest[0]):.1%}: "
                               f"{biggest[1]})")
    verdict.status = worst(statuses)
    if verdict.status != "pass":
        verdict.problems.append(throughput_problem(verdict, pol, what))
    return verdict


# Why a series failed or is inconclusive (its figure's "rule"), the worst first, as a summary says it of several.
RULES = {"no samples": "without valid samples after", "floor": "below {floor:g}x their median before",
         "ceiling": "more than {drop:.0%} above their median before", "limit": "past their limit (p < {alpha:g})",
         "broken": "without samples after (the measurement broke)", "definition": "with a changed definition",
         "zero median": "with a median before of 0 or less",
         "few samples": "past their limit on fewer than {min_samples} samples a side",
         "noisy": "past their limit but too noisy to call (p >= {alpha:g})"}


def throughput_problem(verdict: Verdict, pol: GatePolicy, what: str = "throughput") -> Problem:
    """A throughput verdict that did not pass in one line: how many of the gated series, by which rule, and the
    worst, e.g. "throughput: 13 of 13 series below 0.95x their median before; worst GPU 0 d2h_gbs -8.5%"."""
    gated = {k: f for k, f in verdict.figures.items() if f.get("gated", True)}
    bad = sorted((f for f in gated.items() if f[1]["status"] == verdict.status),
                 key=lambda kf: (list(RULES).index(kf[1]["rule"]), -(kf[1].get("drop") or 0)))
    said = {rule: RULES[rule].format(floor=pol.floor, drop=1 - pol.floor, alpha=pol.alpha, min_samples=pol.min_samples)
            for rule in RULES if any(f["rule"] == rule for _, f in bad)}
    how = next(iter(said.values())) if len(said) == 1 else (
        f"{'failed' if verdict.status == 'fail' else 'inconclusive'} ("
        + ", ".join(f"{sum(f['rule'] == rule for _, f in bad)} {text.split(' (')[0]}" for rule, text in said.items())
        + ")")
    (gpu, metric), f = bad[0]
    change = f" {f['change']:+.1%}" if f.get("change") is not None else f" ({f['rule']})"
    return Problem(what, f"{what}: {len(bad)} of {len(gated)} series {how}; worst {series_label(gpu, metric)}{change}",
                   verdict.status)


# ---- health ------------------------------------------------------------------------------------

@cache
def xid_catalog() -> dict[int, dict[str, Any]]:
    """The Xid table the hosts classify with (collections/ansible_collections/fleetctl/gpu/roles/gpu_facts/defaults/main.yml), for NVML-delivered codes."""
    return {int(e["code"]): e for e in resources.xid_catalog()}


def classify_override(event: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The event with the baseline's xid.overrides for its code laid over its classification (a copy)."""
    change = overrides.get(str(event["code"]))
    if not change or str(event.get("source") or "").startswith("baseline override"):
        return dict(event)  # no override, or the host's classifier already applied it
    merged = dict(event, **change)
    if "source" not in change:
        merged["source"] = f"baseline override of: {event.get('source') or 'none'}"
    return merged


def _nvml_event(code: int, gpu: str) -> dict[str, Any]:
    entry = xid_catalog().get(code, {})
    return {"code": code, "gpu": gpu, "name": entry.get("name", f"unknown Xid {code}"),
            "severity": entry.get("severity", "high"), "class": entry.get("class", "unknown"),
            "action": entry.get("action"), "source": entry.get("source", "fleetctl default for codes not in the table")}


def _xid_lines(after: dict[str, Any], pol: GatePolicy) -> tuple[list[Problem], list[str]]:
    """New Xid events after the change -> (failing ones, warning lines)."""
    health = after["health"]
    events = [dict(classify_override(e, pol.xid_overrides), gpu=e["pci_bus_id"]) for e in health["xid"]["events"]]
    pci_by_uuid = {g.get("uuid"): g.get("pci_bus_id") for g in health["gpus"] if g.get("uuid")}
    seen = {(e["code"], e["gpu"]) for e in events}
    for n in health["nvml_xid_events"]:  # the same event often arrives both ways: count it once
        gpu = pci_by_uuid.get(n["gpu_uuid"]) or n["gpu_uuid"] or "unknown GPU"
        if (n["code"], gpu) not in seen:
            seen.add((n["code"], gpu))
            events.append(classify_override(_nvml_event(n["code"], gpu), pol.xid_overrides))
    bad, low = [], []
    for e in events:
        short = f"new Xid {e['code']} ({e.get('name') or 'unnamed'}) on {e['gpu']}: severity {e['severity']}"
        line = short + f" [{e.get('source') or 'no source'}]" + (f" -> {e['action']}" if e.get("action") else "")
        if severity_rank(e["severity"]) >= severity_rank(pol.xid_fail_on):
            bad.append(Problem("Xid", line, weight=severity_rank(e["severity"]), short=short))
        else:
            low.append(f"{line} (below {pol.xid_fail_on}: warning)")
    return bad, low


FABRIC_OK = ("completed", "not_supported")


def interconnect_lines(before: dict[str, Any] | None, after: dict[str, Any] | None, same_driver_load: bool = False,
                       errors_fail: int | None = None) -> list[str]:
    """A fabric not completed now (CUDA error 802 for every multi-GPU program), NVLink links up before and not
    now, and with the baseline's errors_fail, more NVLink errors counted since the previous probe (since the driver
    loaded when it reloaded in between: the counters restart): the faults that leave single-GPU checks green."""
    if not after:
        return []
    fails = []
    def key(g: dict[str, Any]) -> Any:  # the same GPU after a reboot: by its PCI slot, as NVML's order may change
        return g.get("pci_bus_id") or g["index"]

    was = {key(g): g for g in (before or {}).get("gpus", [])}
    for g in after["gpus"]:
        fabric = g.get("fabric") or {}
        if fabric.get("state") not in (None, *FABRIC_OK) or fabric.get("status") not in (None, "success"):
            fails.append(f"GPU {g['index']}: fabric {(fabric.get('state') or 'state unknown').replace('_', ' ')}"
                         + (f" ({fabric['status']})" if fabric.get("status") else "")
                         + ": multi-GPU CUDA programs fail (error 802) until it completes")
        now, prev = g.get("nvlink") or {}, (was.get(key(g)) or {}).get("nvlink") or {}
        if prev.get("up") is not None and now.get("up") is not None and now["up"] < prev["up"]:
            down = [str(link["link"]) for link in now.get("links", []) if link["state"] != "up"]
            fails.append(f"GPU {g['index']}: NVLink links up {prev['up']} -> {now['up']}"
                         + (f" (down: {', '.join(down)})" if down else ""))
        if errors_fail is not None:
            counted = nvlink_errors(g) - (nvlink_errors(was.get(key(g)) or {}) if same_driver_load else 0)
            if counted > errors_fail:
                fails.append(f"GPU {g['index']}: {counted} NVLink errors (replay, recovery, CRC) since "
                             + ("the previous probe" if same_driver_load else "the driver loaded")
                             + f", over the baseline's {errors_fail}")
    return fails


def pcie_lines(prev: dict[str, Any] | None, g: dict[str, Any], same_boot: bool, same_driver_load: bool,
               replays_fail: int | None) -> tuple[list[str], list[str]]:
    """(failing, warning) lines for the PCIe errors a GPU counted across the change: the kernel's AER counters run
    since boot, NVML's replay counter since the GPU's last reset (a driver load); counted since then otherwise."""
    fails, notes = [], []
    now_pcie, was_pcie = g.get("pcie") or {}, ((prev or {}).get("pcie") or {})
    for kind, label in (("fatal", "fatal"), ("nonfatal", "non-fatal"), ("correctable", "correctable")):
        now = ((now_pcie.get("aer") or {}).get(kind) or {}).get("total") or 0
        was = ((was_pcie.get("aer") or {}).get(kind) or {}).get("total") or 0 if same_boot else 0
        if now > was:
            (notes if kind == "correctable" else fails).append(
                f"GPU {g['index']}: {label} PCIe AER errors {was} -> {now}" + (" (warning)" if kind == "correctable" else ""))
    now, was = now_pcie.get("replay_count"), was_pcie.get("replay_count") if same_driver_load else 0
    if replays_fail is not None and now is not None and now - (was or 0) > replays_fail:
        fails.append(f"GPU {g['index']}: {now - (was or 0)} PCIe replays since "
                     + ("the previous probe" if same_driver_load else "the driver loaded")
                     + f", over the baseline's {replays_fail}")
    return fails, notes


def judge_health(before: dict[str, Any], after: dict[str, Any], pol: GatePolicy = DEFAULTS,
                 expected_gpus: int | None = None) -> Verdict:
    """Probe results (whole documents) -> Verdict on their "health"; Xid events after are already new."""
    fails: list[Problem] = []
    notes = []
    hb, ha = before["health"], after["health"]
    if after["driver"]["state"] != "loaded":
        fails.append(Problem("driver", f"the driver is {after['driver']['state'].replace('_', ' ')}"))
    want = max(hb["gpu_count"], expected_gpus or 0)
    if ha["gpu_count"] < want:
        fails.append(Problem("GPU count", f"{ha['gpu_count']} GPUs answer after, {want} expected ({hb['gpu_count']} before"
                             + (f", {expected_gpus} in the baseline)" if expected_gpus else ")")))
    lost_before = {g["index"] for g in hb["gpus"] if g.get("lost")}
    for g in ha["gpus"]:
        if g.get("lost"):
            fails.append(Problem("GPU lost", f"GPU {g['index']} is lost (NVML counts it but cannot open it)"
                                 + (" - lost before the change too" if g["index"] in lost_before else "")))
    bad, low = _xid_lines(after, pol)
    fails += bad
    notes += low

    same_boot = after["host"]["boot_id"] is not None and before["host"]["boot_id"] == after["host"]["boot_id"]
    same_driver_load = same_boot and before["driver"]["module_version"] == after["driver"]["module_version"]
    old = {g.get("uuid") or g["index"]: g for g in hb["gpus"] if not g.get("lost")}
    for g in (g for g in ha["gpus"] if not g.get("lost")):
        prev = old.get(g.get("uuid") or g["index"])
        # Volatile counters restart when the driver reloads: then every error after is new.
        was = (prev["ecc"]["uncorrected_volatile"] or 0) if prev and same_driver_load else 0
        now = g["ecc"]["uncorrected_volatile"] or 0
        if now > was:
            fails.append(Problem("ECC", f"GPU {g['index']}: uncorrectable ECC errors {was} -> {now}", weight=now - was))
        rows, prev_rows = g.get("remapped_rows") or {}, (prev or {}).get("remapped_rows") or {}
        for flag, what, weight in (("failure", "row remapping FAILED", 1),
                                   ("pending", "row remap pending (reset needed)", 0)):
            if prev_rows.get(flag) and rows.get(flag):
                notes.append(f"GPU {g['index']}: {what} - already before the change")
            elif rows.get(flag):
                fails.append(Problem("row remap", f"GPU {g['index']}: {what}", weight=weight))
        if g.get("recovery_action") not in (None, "None"):
            fails.append(Problem("recovery action",
                                 f"GPU {g['index']}: the driver asks for recovery action '{g['recovery_action']}'"))
        bad, low = pcie_lines(prev, g, same_boot, same_driver_load, pol.pcie_replays_fail)
        fails += [Problem("PCIe", line, weight=int(": fatal " in line)) for line in bad]
        notes += low
    fails += [Problem("interconnect", line) for line in
              interconnect_lines(hb.get("interconnect"), ha.get("interconnect"), same_driver_load,
                                 pol.nvlink_errors_fail)]
    reasons = [p.text for p in fails] + notes
    return Verdict("fail" if fails else "pass", reasons or ["GPU health unchanged: no new faults"], problems=fails)


def judge(before: dict[str, Any], after: dict[str, Any], pol: GatePolicy = DEFAULTS,
          expected_gpus: int | None = None) -> Verdict:
    """Both probe results of one host -> one Verdict: fail if any part fails, inconclusive if throughput is."""
    health = judge_health(before, after, pol, expected_gpus)
    broken = {k: v for k, v in after.get("errors", {}).items() if k.startswith("throughput")}
    tp = judge_throughput(before["throughput"], after["throughput"], pol, broken)
    status = worst([health.status, tp.status])
    reasons, problems = health.reasons + tp.reasons, health.problems + tp.problems
    blind = {k: v for k, v in after.get("errors", {}).items() if k in ("nvml", "xid")}
    # Nothing read is not the same as nothing wrong; nor is a throughput measured before and broken after.
    unread = [Problem("could not check", f"could not check {k}: {v}", "inconclusive") for k, v in blind.items()]
    if before["throughput"] and before["throughput"]["samples"] and after["throughput"] is None and broken:
        unread += [Problem("throughput", f"throughput could not be measured after: {k}: {v}", "inconclusive")
                   for k, v in broken.items()]
    if unread:
        status = worst([status, "inconclusive"])
        reasons += [p.text for p in unread]
    return Verdict(status, reasons, tp.figures, problems + unread)
