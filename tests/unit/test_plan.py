"""`fleetctl plan`: ramp parsing, wave building, skip/exclude reasons, budgets, the schema, and the CLI on localhost.

Host entries are built the way the plan builds them (audit.evaluate_host on a gpu_facts result), from the facts a
real H100 host returned (tests/testdata/h100-580.159.04-audit), changed one fact at a time.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import sys
from pathlib import Path

import pytest

from orchestrator import baseline as baseline_mod, plan, schemas, settings
from orchestrator.errors import InputError

from tests.helpers.cli import fleetctl, runs
from tests.helpers.facts import DEFAULT, entry, on


# ---- ramp ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("eligible,sizes", [
    (0, []), (1, [1]), (2, [1, 1]), (7, [1, 1, 2, 3]), (40, [1, 3, 16, 20]), (100, [1, 9, 40, 50]),
])
def test_default_ramp_is_cumulative(eligible, sizes):
    ramp = plan.parse_ramp(settings.WAVES.default)
    assert [str(s) for s in ramp] == ["1", "10%", "50%", "100%"]
    got = plan.wave_sizes(ramp, eligible)
    assert got == sizes and sum(got) == eligible and all(s >= 1 for s in got)


@pytest.mark.parametrize("spec,eligible,sizes", [
    ("1,5,100%", 20, [1, 4, 15]),
    ("1,5,100%", 3, [1, 2]),            # the count reaches past the fleet: capped, later waves empty and dropped
    ("2,10,100%", 30, [2, 8, 20]),
    ("5,10%,100%", 20, [5, 1, 14]),     # 10% of 20 is behind the 5 already moved: one more host
    ("10%,100%", 30, [3, 27]),          # exact arithmetic: 10% of 30 is 3, not ceil(3.0000000000000004)
    ("12.5%,100%", 8, [1, 7]),
    (" 1 , 25% ,100%", 4, [1, 1, 2]),  # 25% of 4 is the 1 already moved: one more host
    ("100%", 5, [5]),
])
def test_absolute_counts_and_percentages(spec, eligible, sizes):
    assert plan.wave_sizes(plan.parse_ramp(spec), eligible) == sizes


@pytest.mark.parametrize("spec,expected", [
    ("", "empty ramp"),
    (" ", "empty ramp"),
    ("0,100%", "entry 1 '0': a wave target must be above zero"),
    ("1,0%,100%", "entry 2 '0%': a wave target must be above zero"),
    ("1,150%", "entry 2 '150%' is over 100%"),
    ("1,50%,10%,100%", "entry 3 '10%' is not above the earlier '50%'"),
    ("5,2,100%", "entry 2 '2' is not above the earlier '5'"),
    ("1,100%,100%", "entry 3 '100%' is not above the earlier '100%'"),
    ("1,10%,50%", "the last entry is '50%'; it must be 100%"),
    ("1,10", "the last entry is '10'; it must be 100%"),
    ("1,,100%", "entry 2 '' is neither a host count"),
    ("-1,100%", "entry 1 '-1' is neither"),
    ("1.5,100%", "entry 1 '1.5' is neither"),
    ("ten%,100%", "entry 1 'ten%' is neither"),
])
def test_bad_ramps_are_one_line_input_errors(spec, expected):
    with pytest.raises(InputError) as e:
        plan.parse_ramp(spec)
    message = str(e.value)
    assert message.startswith(f"--waves {spec!r}: ") and expected in message and "\n" not in message


@pytest.mark.parametrize("version,ok", [
    ("570.86.15", True), ("580.159.04", True), ("550.54", True), ("570", False), ("570.86.15.1", False),
    ("v570.86.15", False), ("latest", False), ("5700.1.1", False), ("570.1234.1", False), ("", False),
])
def test_target_version(version, ok):
    if ok:
        assert plan.parse_target(version) == version
    else:
        with pytest.raises(InputError, match=r"^--to .*: not a driver version"):
            plan.parse_target(version)


# ---- host entries from real facts ----------------------------------------------------------------


def names(waves):
    return [[h["name"] for h in w["hosts"]] for w in waves]


def test_round_robin_across_groups_canary_first(device_facts):
    facts = on(device_facts, "550.163.01")
    entries = ([entry(f"h100-{i}", ["gpu", "h100"], facts) for i in (10, 2, 1, 3, 4, 5, 6, 7, 8, 9)]
               + [entry(f"l40s-{i}", ["gpu", "l40s"], facts) for i in (1, 2)]
               + [entry("a100-1", ["gpu", "a100"], facts)])
    p = plan.build("570.86.15", plan.parse_ramp(settings.WAVES.default), entries, DEFAULT)
    assert p["group_order"] == ["h100", "l40s", "a100"]  # inventory order, not alphabetical
    assert names(p["waves"]) == [
        ["h100-1"],                                                             # canary: first group, first name
        ["l40s-1"],                                                             # 10% of 13 -> 2: one of each SKU next
        ["a100-1", "h100-2", "h100-3", "h100-4", "h100-5"],                     # 50% -> 7
        ["h100-6", "l40s-2", "h100-7", "h100-8", "h100-9", "h100-10"],          # the small group's 2nd host mid-way
    ]
    first = p["waves"][0]
    assert first["budget"]["canary"] and first["budget"]["fail_at"] == 1 and first["cumulative"] == 1
    assert p["waves"][-1]["cumulative"] == 13
    host = first["hosts"][0]
    assert host == {"name": "h100-1", "groups": ["gpu", "h100"], "from_version": "550.163.01", "change": "upgrade",
                    "domain": None, "gpus": 1, "gpu_model": "NVIDIA H100 80GB HBM3"}  # the canary metrics' cohort
    assert p["skipped"] == [] and p["excluded"] == []


def test_order_spreads_a_small_group_over_the_ramp():
    hosts = [{"name": f"big-{i:02d}", "groups": ["big"]} for i in range(20)] + \
            [{"name": f"small-{i}", "groups": ["small"]} for i in range(2)]
    seq = [h["name"] for h in plan.order(hosts, ["big", "small"])]
    assert seq[:3] == ["big-00", "small-0", "big-01"]
    assert seq.index("small-1") == 12  # i/n = 1/2: after big-10, half-way through
    ungrouped = [{"name": "b", "groups": []}, {"name": "a", "groups": ["ungrouped"]}]
    assert [h["name"] for h in plan.order(ungrouped, ["all", "ungrouped"])] == ["b", "a"]


def test_one_host_one_wave(device_facts):
    p = plan.build("570.86.15", plan.parse_ramp(settings.WAVES.default), [entry("solo", [], on(device_facts, "550.163.01"))],
                   DEFAULT)
    assert names(p["waves"]) == [["solo"]] and p["waves"][0]["budget"]["canary"]


# (code, reason fragment, change to the facts); the host is otherwise the real H100 on 550.163.01
EXCLUSIONS = [
    ("unhealthy", "unhealthy: driver.loaded: the driver is installed but the nvidia kernel module is not loaded",
     lambda f: (f["driver"].update(state="not_loaded", module_version=None, module_flavor=None), f.update(gpus=[]))),
    ("unhealthy", "unhealthy: driver.version_match: Driver/library version mismatch: module 550.163.01 is loaded",
     lambda f: f["driver"].update(state="version_mismatch", userspace_version="570.86.15")),
    ("unhealthy", "unhealthy: gpu.count: 1 GPUs answer, 1 expected (1 on the PCI bus); GPU 1 lost",
     lambda f: f["gpus"].append({"index": 1, "lost": True})),
    ("unhealthy", "unhealthy: gpu.ecc_errors: uncorrectable ECC errors since the last reset on GPU 0",
     lambda f: f["gpus"][0]["ecc"].update(uncorrected_volatile=2, uncorrected_aggregate=2)),
    ("unhealthy", "unhealthy: gpu.xid: 1 Xid event(s) at or above high: 79 (GPU has fallen off the bus)",
     lambda f: f["xid"]["events"].append({
         "code": 79, "pci_bus_id": "00000000:00:06.0", "gpu_instance": None, "pid": None, "process": None,
         "message": "GPU has fallen off the bus.", "recovery_action": None, "seq": 400, "uptime_s": 60.0,
         "raw": "NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.", "name": "GPU has fallen off the bus",
         "class": "critical", "severity": "critical", "action": "drain and reset", "source": "NVIDIA"})),
    ("unhealthy", "health not verifiable: gpu.count: could not read the facts this control needs",
     lambda f: f.update(errors={"gpus[0].ecc": "NVML: Unknown Error"})),
    ("boot_at_risk", "next boot at risk: nouveau.not_loaded: the nouveau module is loaded",
     lambda f: f["nouveau"].update(loaded=True)),
    ("boot_at_risk", "next boot at risk: nouveau.blacklisted: ",
     lambda f: f["nouveau"].update(blacklisted=False, blacklist_files=[])),
    ("no_driver", "no NVIDIA driver installed: no version to move from or to roll back to",
     lambda f: (f["driver"].update(state="not_installed", module_version=None, module_flavor=None,
                                   userspace_version=None, nvml_version=None, cuda_driver_version=None, branch=None),
                f.update(gpus=[]))),
]


@pytest.mark.parametrize("code,reason,change", EXCLUSIONS, ids=[r.split(":")[1].strip() if ":" in r else c
                                                                for c, r, _ in EXCLUSIONS])
def test_unhealthy_and_driverless_hosts_are_excluded_with_the_reason(device_facts, code, reason, change):
    bad = on(device_facts, "550.163.01")
    change(bad)
    assert schemas.first_error("host-facts", bad) is None
    entries = [entry("good", ["h100"], on(device_facts, "550.163.01")), entry("bad", ["h100"], bad)]
    p = plan.build("570.86.15", plan.parse_ramp(settings.WAVES.default), entries, DEFAULT)
    assert names(p["waves"]) == [["good"]]
    (excluded,) = p["excluded"]
    assert (excluded["name"], excluded["code"]) == ("bad", code)
    assert excluded["reason"].startswith(reason), excluded["reason"]


def test_warnings_and_non_health_drift_do_not_exclude(device_facts):
    f = on(device_facts, "550.163.01")  # as captured, persistenced down (real drift)
    f["gpus"][0]["pcie"]["width"] = 8  # gpu.pcie fails, but at medium severity
    f["gpus"][0]["ecc"]["uncorrected_aggregate"] = 3  # gpu.ecc_errors warns
    e = entry("h", ["h100"], f)
    assert {x["control"] for x in e["findings"] if x["status"] == "fail"} >= {"gpu.pcie", "persistence.daemon"}
    p = plan.build("570.86.15", plan.parse_ramp("100%"), [e], DEFAULT)
    assert names(p["waves"]) == [["h"]]


def test_a_baseline_severity_override_decides_what_is_critical(device_facts):
    f = on(device_facts, "550.163.01")
    f["gpus"][0]["ecc"].update(uncorrected_volatile=1, uncorrected_aggregate=1)
    lenient = baseline_mod.Baseline(Path("lenient.yml"), "lenient", "sha256:" + "0" * 64,
                                    {"all": {"severity": {"gpu.ecc_errors": "high"}}})
    p = plan.build("570.86.15", plan.parse_ramp("100%"), [entry("h", [], f, lenient)], lenient)
    assert names(p["waves"]) == [["h"]]
    # a module that is not loaded stays out even where the baseline lowered driver.loaded: nothing to move from
    unloaded = on(device_facts, "550.163.01")
    unloaded["driver"].update(state="not_loaded", module_version=None, module_flavor=None)
    unloaded["gpus"] = []
    lenient.groups["all"]["severity"]["driver.loaded"] = "low"
    p = plan.build("570.86.15", plan.parse_ramp("100%"), [entry("h", [], unloaded, lenient)], lenient)
    assert p["waves"] == [] and p["excluded"][0]["reason"].startswith("unhealthy: no nvidia kernel module loaded")


def test_skipped_unreachable_no_facts_and_downgrade(device_facts):
    entries = [
        entry("current", ["h100"], on(device_facts, "570.86.15")),
        entry("gone", ["h100"], status="unreachable", message="pre-flight: connection refused"),
        entry("garbage", ["h100"], status="failed", message="MODULE FAILURE"),
        entry("newer", ["h100"], on(device_facts, "580.159.04")),
        entry("older", ["h100"], on(device_facts, "550.163.01")),
    ]
    p = plan.build("570.86.15", plan.parse_ramp(settings.WAVES.default), entries, DEFAULT)
    assert p["skipped"] == [{"name": "current", "groups": ["h100"], "code": "on_target",
                             "reason": "already running 570.86.15"}]
    reasons = {h["name"]: (h["code"], h["reason"]) for h in p["excluded"]}
    assert reasons == {"gone": ("unreachable", "unreachable: pre-flight: connection refused"),
                       "garbage": ("no_facts", "fact collection failed: MODULE FAILURE")}
    moved = {h["name"]: (h["from_version"], h["change"]) for w in p["waves"] for h in w["hosts"]}
    assert moved == {"newer": ("580.159.04", "downgrade"), "older": ("550.163.01", "upgrade")}


def test_hosts_whose_baseline_does_not_bless_the_target_are_excluded(device_facts, tmp_path):
    # the driver rules of inventory/baseline.example.yml (its other rules would hold this 1-GPU host unhealthy)
    path = tmp_path / "matrix.yml"
    path.write_text("schema_version: 1\ngroups:\n  all: {driver: {branches: ['550', '570']}}\n"
                    "  h100: {driver: {versions: ['570.86.15', '570.124.06']}}\n"
                    "  l40s: {driver: {branches: ['550']}}\n")
    base = baseline_mod.load(path)
    facts = on(device_facts, "550.163.01")
    entries = [entry("h100-1", ["gpu", "h100"], facts, base), entry("l40s-1", ["gpu", "l40s"], facts, base)]
    p = plan.build("570.86.15", plan.parse_ramp("100%"), entries, base)
    assert names(p["waves"]) == [["h100-1"]]
    (l40s,) = p["excluded"]
    assert (l40s["code"], l40s["reason"]) == (
        "not_blessed", "baseline does not bless 570.86.15 for group l40s (driver.branches: 550)")
    p = plan.build("570.133.20", plan.parse_ramp("100%"), entries, base)
    assert p["waves"] == []
    assert [h["reason"] for h in p["excluded"]] == [
        "baseline does not bless 570.133.20 for group h100 (driver.versions: 570.86.15, 570.124.06)",
        "baseline does not bless 570.133.20 for group l40s (driver.branches: 550)"]
    assert plan.build("535.247.01", plan.parse_ramp("100%"), entries[:1], base)["excluded"][0]["reason"] == \
        "baseline does not bless 535.247.01 for group h100 (driver.versions: 570.86.15, 570.124.06)"
    assert plan.blessing_problem(DEFAULT, ["h100"], "535.247.01") is None
    assert plan.blessing_problem(DEFAULT, [], "590.10.01") == \
        "baseline does not bless 590.10.01 for group all (driver.branches: 535, 550, 570, 580)"


# ---- failure budget ------------------------------------------------------------------------------

@pytest.mark.parametrize("size,fail_at", [(1, 1), (2, 2), (5, 2), (19, 2), (20, 2), (21, 3), (50, 5), (100, 10)])
def test_default_budget_of_later_waves(size, fail_at):
    b = plan.budget(2, size, [DEFAULT.policy_for([])])
    assert (b["canary"], b["fail_at"], b["budget_hosts"], b["budget_percent"]) == (False, fail_at, 2, 10)
    assert b["rule"].endswith(f"= {fail_at} failed host" + ("s" if fail_at != 1 else ""))


def test_canary_fails_on_any_host_whatever_its_size():
    assert plan.budget(1, 5, [{"campaign": {"budget_hosts": 4}}])["fail_at"] == 1


def test_budget_from_the_baseline_the_strictest_group_wins(tmp_path):
    path = tmp_path / "b.yml"
    path.write_text("schema_version: 1\ngroups:\n  all:\n    campaign: {budget_hosts: 3, budget_percent: 20}\n"
                    "  h100:\n    campaign: {budget_percent: 5.5}\n")
    base = baseline_mod.load(path)
    assert plan.budget(2, 40, [base.policy_for([])])["fail_at"] == 8                       # max(3, 20% of 40)
    assert plan.budget(2, 40, [base.policy_for(["h100"])])["fail_at"] == 3                 # max(3, ceil(2.2))
    mixed = plan.budget(2, 100, [base.policy_for([]), base.policy_for(["h100"])])
    assert (mixed["fail_at"], mixed["budget_hosts"], mixed["budget_percent"]) == (6, 3, 5.5)
    path.write_text("schema_version: 1\ngroups:\n  all:\n    campaign: {budget_hosts: 0}\n")
    with pytest.raises(InputError, match=r"\$\.groups\.all\.campaign\.budget_hosts: 0 is less than the minimum of 1"):
        baseline_mod.load(path)
    path.write_text("schema_version: 1\ngroups:\n  all:\n    campaign: {max_failures: 2}\n")
    with pytest.raises(InputError, match=r"\$\.groups\.all\.campaign: Additional properties"):
        baseline_mod.load(path)


# ---- schema --------------------------------------------------------------------------------------

def test_a_built_plan_is_valid_against_the_schema(device_facts):
    facts = on(device_facts, "550.163.01")
    entries = [entry(f"h-{i}", ["gpu", "h100" if i % 3 else "l40s"], facts) for i in range(12)]
    entries += [entry("gone", ["gpu", "h100"], status="unreachable", message="no route"),
                entry("current", ["gpu", "h100"], on(device_facts, "570.86.15"))]
    p = plan.build("570.86.15", plan.parse_ramp(settings.WAVES.default), entries, DEFAULT)
    report = {
        "schema_version": 1, "tool": {"name": "fleetctl", "version": "0"},
        "run": {"id": 1, "uuid": "7b0c6f4e-1d1e-4a43-9a0e-2f6f0f1c2d3e", "kind": "plan",
                "started_at": "2026-01-01T00:00:00.000Z", "finished_at": "2026-01-01T00:00:04.000Z",
                "operator": "ops", "control_node": "cn", "inventory": "hosts.ini", "limit": None,
                "baseline": {"name": DEFAULT.name, "path": str(DEFAULT.path), "digest": DEFAULT.digest}},
        "summary": {"hosts": 14, "eligible": 12, "waves": len(p["waves"]), "skipped": 1, "excluded": 1,
                    "unreachable": 1, "exit_code": 3, "duration_s": 4.0},
        **p,
    }
    assert schemas.first_error("campaign-plan", report) is None
    assert [w["size"] for w in p["waves"]] == [1, 1, 4, 6]
    for broken in ({"target": "570"}, {"ramp": []}, {"waves": [dict(p["waves"][0], hosts=[])]},
                   {"summary": dict(report["summary"], exit_code=1)},
                   {"excluded": [{"name": "x", "groups": [], "code": "bored", "reason": "r"}]}):
        assert schemas.first_error("campaign-plan", {**report, **broken}) is not None, broken


# ---- the command line, on this machine (no NVIDIA driver) ---------------------------------------

@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("fleetctl-plan-home")


def test_plan_of_localhost_excludes_it_for_having_no_driver(home, tmp_path):
    out = tmp_path / "plan.json"
    proc = fleetctl("plan", "--to", "570.86.15", "--format", "json", "-o", str(out), home=home)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    report = json.loads(out.read_text())
    assert schemas.first_error("campaign-plan", report) is None
    assert report["waves"] == [] and report["skipped"] == []
    assert report["excluded"] == [{"name": "localhost", "groups": ["ungrouped"], "code": "no_driver",
                                   "reason": "no NVIDIA driver installed: no version to move from or to roll back to"}]
    assert report["summary"]["exit_code"] == 0 and report["ramp"] == ["1", "10%", "50%", "100%"]
    row = next(r for r in runs(home) if r["id"] == report["run"]["id"])
    assert (row["kind"], row["status"], row["exit_code"]) == ("plan", "done", 0)
    assert row["baseline_digest"] == report["run"]["baseline"]["digest"]
    assert json.loads(row["summary"])["plan"]["excluded"] == report["excluded"]
    with sqlite3.connect(home / "history.sqlite3") as c:  # the facts the plan was made from, as an audit keeps them
        facts = json.loads(c.execute("SELECT facts FROM host_results WHERE run_id=?", (row["id"],)).fetchone()[0])
    assert facts["driver"]["state"] == "not_installed"


def test_table_and_an_unreachable_host_exit_3(home, tmp_path):
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"[gpu]\nlocal ansible_connection=local ansible_python_interpreter={sys.executable}\n"
                   "ghost ansible_host=127.0.0.1 ansible_port=1\n")
    proc = fleetctl("plan", "--to", "570.86.15", "-i", str(inv), "--waves", "1,100%", home=home)
    assert proc.returncode == 3, proc.stderr
    assert "fleetctl plan to 570.86.15" in proc.stdout and "no host to move" in proc.stdout
    assert "excluded (unreachable)" in proc.stdout and "excluded (no_driver)" in proc.stdout
    assert "2 hosts: 0 in 0 waves, 0 already on target, 2 excluded (1 unreachable); ramp 1,100%" in proc.stdout
    assert "exit 3" in proc.stdout


@pytest.mark.parametrize("args,expected", [
    (["plan", "--to", "latest"], "--to 'latest': not a driver version"),
    (["plan", "--to", "570.86.15", "--waves", "1,10%,50%"], "it must be 100%"),
    (["plan", "--to", "570.86.15", "--waves", "0,100%"], "a wave target must be above zero"),
    (["plan", "--to", "570.86.15", "--waves", "50%,10%,100%"], "is not above the earlier '50%'"),
    (["plan"], "Missing option '--to'"),
    (["plan", "--to", "570.86.15", "--format", "yaml"], "'yaml' is not one of 'table', 'json'"),
    (["plan", "--to", "570.86.15", "-i", "/nonexistent/hosts.ini"], "/nonexistent/hosts.ini: inventory not found"),
])
def test_bad_input_is_one_line_exit_2_and_records_nothing(home, args, expected):
    before = [tuple(r) for r in runs(home)]
    proc = fleetctl(*args, home=home, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("fleetctl: error: ") and expected in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and proc.stdout == ""
    assert [tuple(r) for r in runs(home)] == before


def test_the_campaign_precheck_refuses_a_host_whose_next_boot_became_at_risk_after_the_plan(device_facts, monkeypatch):
    """The plan saw a clean host; by the time its wave starts, nouveau is loaded again (or its blacklist went):
    the precheck, on fresh facts, fails it before anything is touched."""
    from types import SimpleNamespace
    from orchestrator.campaign import steps
    clean = on(device_facts, "550.163.01")
    drifted = copy.deepcopy(clean)
    drifted["nouveau"].update(blacklisted=False, blacklist_files=[])
    fresh = {"clean": entry("clean", ["h100"], clean), "drifted": entry("drifted", ["h100"], drifted)}
    monkeypatch.setattr(steps, "facts_of", lambda ctx, hosts: {h: fresh[h] for h in hosts})
    out = steps.precheck(SimpleNamespace(base=DEFAULT, target="570.86.15"), ["clean", "drifted"])
    assert "next boot" not in (out["clean"].reason or "")  # (the captured VM's driver is not package-managed)
    assert out["drifted"].outcome == "fail"
    assert out["drifted"].reason.startswith("pre-check: next boot at risk: nouveau.blacklisted: "), out["drifted"].reason


# ---- the target judged by the matrix (issue 26) ----------------------------------------------------------

def matrix(tmp_path, text: str):
    path = tmp_path / "matrix.yml"
    path.write_text("schema_version: 1\ngroups:\n" + text)
    return baseline_mod.load(path)


def test_a_target_whose_cuda_is_below_the_workloads_is_excluded_per_group(device_facts, tmp_path):
    """Workloads of group gpu need CUDA 12.8, group legacy's 12.2; all bless 550, 570 and 580. On 570 both pass
    driver.cuda_support today: to 550 (CUDA 12.4) only legacy may go, with the message the audit would give after."""
    base = matrix(tmp_path, "  all: {driver: {branches: ['550', '570', '580']}, workloads: {cuda: ['12.8']}}\n"
                            "  legacy: {workloads: {cuda: ['12.2']}}\n")
    facts = on(device_facts, "570.86.15")
    entries = [entry("h100-1", ["gpu"], facts, base), entry("old-1", ["legacy"], facts, base)]
    today = {f["control"]: f["status"] for f in entries[0]["findings"]}
    assert today["driver.cuda_support"] == "pass"
    p = plan.build("550.163.01", plan.parse_ramp("100%"), entries, base)
    assert names(p["waves"]) == [["old-1"]]
    (h,) = p["excluded"]
    assert (h["name"], h["code"]) == ("h100-1", "target_not_blessed")
    assert h["reason"] == ("550.163.01 fails this host's baseline: driver.cuda_support high: driver 550.163.01 "
                           "supports CUDA up to 12.4; workloads need 12.8")
    assert p["target_groups"] == [
        {"group": "gpu", "hosts": 1, "refused": 1, "takes_target": False, "reason": h["reason"]},
        {"group": "legacy", "hosts": 1, "refused": 0, "takes_target": True, "reason": None}]
    assert names(plan.build("580.159.04", plan.parse_ramp("100%"), entries, base)["waves"]) == [["h100-1", "old-1"]]
    # a group may lower the control below the campaign's severity (campaign.fail_on): then it may go
    base = matrix(tmp_path, "  all: {driver: {branches: ['550', '570']}, workloads: {cuda: ['12.8']},"
                            " campaign: {fail_on: critical}}\n")
    assert names(plan.build("550.163.01", plan.parse_ramp("100%"), [entry("h100-1", ["gpu"], facts, base)],
                            base)["waves"]) == [["h100-1"]]


def test_a_target_whose_packages_would_change_the_flavor_is_excluded(device_facts, tmp_path):
    """The baseline wants the open module. A host on nvidia-driver-570-open keeps it on 580; a host whose open
    module came with Ubuntu's plain nvidia-driver-570 name would get the proprietary nvidia-driver-580."""
    base = matrix(tmp_path, "  all: {driver: {branches: ['570', '580'], flavor: open}}\n")

    def host(package):
        facts = on(device_facts, "570.86.15")
        facts["driver"].update(module_flavor="open", packages=[
            {"name": package, "version": "570.86.15-0ubuntu1", "manager": "dpkg", "role": "driver", "held": True}])
        return facts
    entries = [entry("open-1", ["gpu"], host("nvidia-driver-570-open"), base),
               entry("plain-1", ["gpu"], host("nvidia-driver-570"), base)]
    assert all({f["control"]: f["status"] for f in e["findings"]}["driver.flavor"] == "pass" for e in entries)
    p = plan.build("580.159.04", plan.parse_ramp("100%"), entries, base)
    assert names(p["waves"]) == [["open-1"]]
    (h,) = p["excluded"]
    assert h["code"] == "target_not_blessed" and "driver.flavor medium: the proprietary kernel module is loaded; " \
        "the baseline wants open" in h["reason"]
    assert p["target_groups"][0]["takes_target"]  # one host of the group can


def test_the_target_version_and_the_fabric_manager_are_judged_as_they_would_be(device_facts):
    facts = on(device_facts, "570.86.15")
    facts["fabric_manager"].update(nvswitch_present=True, package_version="570.86.15-1", running=True)
    facts["driver"]["packages"] = [
        {"name": "nvidia-driver-570-open", "version": "570.86.15-1", "manager": "dpkg", "role": "driver", "held": True},
        {"name": "nvidia-fabricmanager-570", "version": "570.86.15-1", "manager": "dpkg", "role": "fabricmanager",
         "held": True}]
    after = plan.on_target(facts, "570.86.15", "580.159.04")
    assert after["fabric_manager"]["package_version"] == "580.159.04-1"
    assert (after["driver"]["module_version"], after["driver"]["branch"], after["driver"]["cuda_driver_version"]) == \
        ("580.159.04", "580", None)
    assert facts["driver"]["module_version"] == "570.86.15"  # the host's own facts are left as they are
    facts["driver"]["packages"] = facts["driver"]["packages"][:1]  # NVSwitch, no fabric manager package to move
    assert plan.on_target(facts, "570.86.15", "580.159.04")["fabric_manager"]["package_version"] == "570.86.15-1"


def test_verify_fails_a_control_that_passed_at_the_precheck_and_judges_the_targets_against_the_target():
    from orchestrator.campaign import steps

    def finding(control, status, message="m"):
        return {"control": control, "status": status, "message": message}
    before = {"findings": {"persistence.daemon": "pass", "runtime.cdi": "pass", "gpu.pcie": "fail",
                           "driver.cuda_support": "fail", "gpu.count": "pass", "persistence.mode": "pass"}}
    entry_ = {"findings": [finding("persistence.daemon", "fail", "nvidia-persistenced is not running"),
                           finding("runtime.cdi", "error", "unread"), finding("gpu.pcie", "fail", "x8"),
                           finding("driver.cuda_support", "fail", "driver 550 supports CUDA up to 12.4"),
                           finding("gpu.count", "fail", "1 of 2"), finding("persistence.mode", "pass")]}
    assert steps.changed_controls(entry_, before) == [
        "persistence.daemon: nvidia-persistenced is not running (it was pass at the pre-check)",
        "driver.cuda_support: driver 550 supports CUDA up to 12.4"]
    assert steps.changed_controls(entry_, {}) == []  # a campaign recorded before the precheck kept every finding


def six_refusing_hosts(tmp_path) -> Path:
    """Six hosts whose SSH port refuses every connection."""
    inv = tmp_path / "refusing.ini"
    inv.write_text("[gpu]\n" + "".join(f"gpu{n} ansible_host=127.0.0.1 ansible_port=1\n" for n in range(6)))
    return inv


@pytest.mark.parametrize("command", [["plan"], ["upgrade", "--dry-run"], ["upgrade", "--yes"]])
@pytest.mark.parametrize("where", ["localhost", "refusing"])
def test_a_target_no_baseline_blesses_is_refused_before_any_host_is_contacted(home, tmp_path, command, where):
    """`upgrade --dry-run && upgrade --yes` cannot pass on a target the matrix refuses: the target is judged against
    each host's groups in the baseline before the SSH pre-flight, and no run is recorded."""
    inventory = ["-i", str(six_refusing_hosts(tmp_path))] if where == "refusing" else []
    before = [tuple(r) for r in runs(home)]
    proc = fleetctl(*command, "--to", "999.99.99", *inventory, home=home, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("fleetctl: error: no host may take 999.99.99: baseline does not bless 999.99.99 "
                                  "for group all (driver.branches: 535, 550, 570, 580)"), proc.stderr
    assert ("(6 of 6 hosts; others alike)" in proc.stderr) == (where == "refusing")
    assert [tuple(r) for r in runs(home)] == before and proc.stdout == ""


def test_a_dry_run_exits_with_the_code_its_plan_implies(home, tmp_path):
    """Six unreachable hosts: 3, as `fleetctl plan` says, not 0 ("0 hosts in 0 waves"); localhost without a driver,
    left out: 1, as the run itself would end."""
    unreachable = fleetctl("upgrade", "--to", "580.95.05", "--dry-run", "-i", str(six_refusing_hosts(tmp_path)),
                           home=home, timeout=120)
    assert unreachable.returncode == 3, unreachable.stdout + unreachable.stderr
    assert "0 hosts in 0 waves" in unreachable.stdout and unreachable.stdout.count("unreachable") == 6
    planned = fleetctl("plan", "--to", "580.95.05", "-i", str(six_refusing_hosts(tmp_path)), home=home, timeout=120)
    assert planned.returncode == 3
    left_out = fleetctl("upgrade", "--to", "580.95.05", "--dry-run", home=home, timeout=120)
    real = fleetctl("upgrade", "--to", "580.95.05", "--yes", home=home, timeout=120)
    assert left_out.returncode == real.returncode == 1, left_out.stderr + real.stderr
