"""`fleetctl check` and orchestrator/schedulers/slurmctl.py without a cluster: the parser on real `sinfo --json` captures
of a Slurm 22.05 node (tests/testdata/slurm, README there), the drain/resume decisions on those states, check agreeing
with the audit on the same facts, exit codes, reasons, the textfile and the cache of baselines validated before. The
Slurm commands the CLI tests meet are fakes on PATH (sinfo prints a capture, scontrol records its arguments); the real
cluster is the lab tests' part."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator import audit, baseline, check, schemas
from orchestrator.fleet import inventory
from orchestrator.schedulers import slurmctl as slurm
from orchestrator.controls import CONTROLS
from orchestrator.errors import InputError, SlurmError
from orchestrator.exitcodes import Exit
from orchestrator.fleet.runner import HostOutcome

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "testdata" / "slurm"
STATES = sorted(p.name.removesuffix(".sinfo.json") for p in CAPTURES.glob("*.sinfo.json"))


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """Each test its own empty cache (XDG_CACHE_HOME, inherited by the fleetctl it runs)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


def captured(name: str) -> slurm.Node:
    (node,) = slurm.parse_nodes((CAPTURES / f"{name}.sinfo.json").read_text()).values()
    return node


# ---- the parser, against scontrol's own words ----------------------------------------------------------

@pytest.mark.parametrize("name", STATES)
def test_the_parsed_state_and_reason_are_what_scontrol_shows(name):
    """A second real source: `scontrol -o show node` taken at the same moment (its Reason ends in [user@time])."""
    node = captured(name)
    text = (CAPTURES / f"{name}.scontrol.txt").read_text()
    assert node.name == re.search(r"NodeName=(\S+)", text).group(1)
    assert node.state == re.search(r" State=(\S+)", text).group(1)
    reason = re.search(r" Reason=(.*) \[[^\]]+\]$", text.strip())
    assert node.reason == (reason.group(1) if reason else None)


@pytest.mark.parametrize("name, drained, draining, busy, down, maintenance", [
    ("idle", False, False, False, False, False),
    ("allocated", False, False, True, False, False),
    ("drained-admin", True, False, False, False, False),
    ("draining", False, True, True, False, False),           # a job still running: DRAINING, not DRAINED
    ("drained-after-job", True, False, False, False, False),  # the same drain once the job ended
    ("down-admin", False, False, False, True, False),
    ("drain-then-down", True, False, False, True, False),
    ("down-not-responding", False, False, False, True, False),
    ("maint", False, False, False, False, True),
])
def test_the_states_slurm_reported(name, drained, draining, busy, down, maintenance):
    node = captured(name)
    assert (node.drained, node.draining, node.busy, node.down, node.maintenance) == \
        (drained, draining, busy, down, maintenance)
    assert node.drained_or_draining == (drained or draining)


def test_slurm_23_02_state_lists_read_the_same():
    doc = {"errors": [], "nodes": [{"name": "gpu-1", "state": ["MIXED", "DRAIN"], "reason": "fleetctl check: x: y"}]}
    node = slurm.parse_nodes(json.dumps(doc))["gpu-1"]
    assert node.state == "MIXED+DRAIN" and node.draining and slurm.owned_by_check(node)


@pytest.mark.parametrize("text, said", [
    ("", "did not print JSON"),
    ("[]", "not an object"),
    ('{"errors": [{"error": "Unable to contact slurm controller"}], "nodes": []}', "Unable to contact"),
    ('{"nodes": {}}', "no list of nodes"),
    ('{"nodes": [{"name": "a b", "state": "idle"}]}', "without a valid name"),
    ('{"nodes": [{"name": "n1", "state": "idle; rm -rf /"}]}', "unexpected state"),
    ('{"nodes": [{"name": "n1", "state": []}]}', "no state"),
    ('{"nodes": [{"name": "n1", "state": "idle", "reason": 7}]}', "reason is not text"),
])
def test_odd_output_is_one_slurm_error(text, said):
    with pytest.raises(SlurmError, match=re.escape(said)) as e:
        slurm.parse_nodes(text)
    assert "\n" not in str(e.value)


def test_reasons_are_recognised_and_bounded():
    reason = slurm.campaign_reason(7, "570.86.15", "580.159.04")
    assert reason == "fleetctl campaign 7: 570.86.15 -> 580.159.04" == captured("draining").reason
    assert slurm.owned_by_campaign(captured("draining"), 7) and not slurm.owned_by_campaign(captured("draining"), 70)
    assert not slurm.owned_by_campaign(captured("drained-admin"), 7)
    long = slurm.check_reason("gpu.health", "line one\nline two\x1b[31m " + "x" * 500)
    assert long.startswith("fleetctl check: gpu.health: line one line two") and "\n" not in long
    assert len(long) <= slurm.REASON_MAX and "\x1b" not in long


# ---- the decisions ---------------------------------------------------------------------------------------

FAILING = [{"control": "driver.installed", "severity": "critical", "status": "fail",
            "message": "no NVIDIA driver is installed"}]


def with_reason(node: slurm.Node, reason: str) -> slurm.Node:
    return slurm.Node(node.name, node.state, node.base, node.flags, reason)


@pytest.mark.parametrize("state, failing, action", [
    ("idle", True, "drain"),
    ("allocated", True, "drain"),              # jobs finish; no new one starts
    ("drained-admin", True, "none"),           # an admin's drain keeps its reason
    ("down-admin", True, "none"),
    ("maint", True, "none"),
    ("draining", True, "none"),                # a campaign's drain is the campaign's
    ("idle", False, "none"),
    ("drained-admin", False, "none"),          # never resume an admin's drain
    ("drained-after-job", False, "none"),      # nor a campaign's
])
def test_decide_on_real_states(state, failing, action):
    assert check.decide(captured(state), FAILING if failing else [])[0] == action


def test_check_resumes_its_own_drain_once_healthy_and_updates_its_reason():
    mine = with_reason(captured("drained-admin"), check.drain_reason(FAILING))
    assert check.decide(mine, []) == ("resume", f"healthy again: resuming the drain fleetctl check made ({mine.reason})")
    assert check.decide(mine, FAILING)[0] == "none"  # the same failure: nothing to write
    other = [dict(FAILING[0], control="gpu.count", message="7 of 8 GPUs")]
    assert check.decide(mine, other) == ("drain", "fleetctl check: gpu.count: 7 of 8 GPUs")


def test_the_drain_reason_names_the_first_failure_and_counts_the_rest():
    two = FAILING + [dict(FAILING[0], control="gpu.count", message="7 of 8")]
    assert check.drain_reason(two) == "fleetctl check: driver.installed: no NVIDIA driver is installed (+1 more)"


# ---- check and audit agree ------------------------------------------------------------------------------

def test_check_says_what_the_audit_says_of_the_same_facts(monkeypatch):
    """The facts this machine gives (no GPU here), judged by check and by the audit's evaluation of a host's
    gpu_facts result: the same findings, the same verdict."""
    base = baseline.load(None)
    facts = check.collect_facts(base.policy_for(["all"]))
    monkeypatch.setattr(check, "collect_facts", lambda policy, evidence=True: facts)
    report = check.run(check.CheckOptions(node="n1"))
    host = inventory.Host("n1", ("all",))
    entry = audit.evaluate_host(host, HostOutcome("n1", results={"fleetctl.gpu.gpu_facts": {"facts": facts}}), base)
    assert report["findings"] == entry["findings"] and report["facts"] == facts
    assert schemas.first_error("host-facts", facts) is None  # what check does not validate again, the audit does
    audit_says = audit.summarize([entry], "critical")["exit_code"]
    assert report["summary"]["exit_code"] == audit_says
    if not facts["gpus"] and facts["driver"]["state"] == "not_installed":  # this machine: no driver, no GPU
        assert report["summary"]["failing"] == ["driver.installed"] and audit_says == Exit.FINDINGS


# ---- the command ------------------------------------------------------------------------------------------

def fleetctl(*args: str, path: Path | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "lab")])}
    env.pop("SLURMD_NODENAME", None)
    if path is not None:
        env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "check", *args], capture_output=True, text=True,
                          env=env, cwd=cwd or REPO, timeout=60)


@pytest.fixture
def healthy_baseline(tmp_path) -> Path:
    """The embedded baseline with no control critical: this machine (no GPU) is healthy under it."""
    doc = yaml.safe_load(baseline.DEFAULT_PATH.read_text())
    doc["groups"]["all"]["severity"] = {c.id: "high" for c in CONTROLS if c.severity == "critical"}
    path = tmp_path / "healthy.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def fake_slurm(tmp_path):
    """sinfo printing STATE (a capture's JSON, renamed to node n1), scontrol recording its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state, calls = tmp_path / "sinfo.json", tmp_path / "scontrol.calls"
    (bin_dir / "sinfo").write_text(f"#!/bin/sh\ncat {state}\n")
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {calls}\n")
    for f in ("sinfo", "scontrol"):
        (bin_dir / f).chmod(0o755)

    def set_state(name: str, reason: str | None = None) -> None:
        doc = json.loads((CAPTURES / f"{name}.sinfo.json").read_text())
        doc["nodes"][0]["name"] = "n1"
        if reason is not None:
            doc["nodes"][0]["reason"] = reason
        state.write_text(json.dumps(doc))

    def called() -> list[str]:
        return calls.read_text().splitlines() if calls.exists() else []
    return bin_dir, set_state, called


def test_unhealthy_exit_1_and_drains_with_its_reason(fake_slurm):
    bin_dir, set_state, called = fake_slurm
    set_state("idle")
    result = fleetctl("--slurm", "--node", "n1", "--format", "json", path=bin_dir)
    report = json.loads(result.stdout)
    assert result.returncode == Exit.FINDINGS == report["summary"]["exit_code"]
    reason = check.drain_reason([f for f in report["findings"] if audit.blocking(f, "critical")])
    assert called() == [f"update nodename=n1 state=drain reason={reason}"]
    assert report["slurm"] == {"node": "n1", "state": "IDLE", "action": "drain", "detail": reason, "error": None}


def test_unhealthy_leaves_an_admins_drain_alone(fake_slurm):
    bin_dir, set_state, called = fake_slurm
    set_state("drained-admin")
    result = fleetctl("--slurm", "--node", "n1", path=bin_dir)
    assert result.returncode == 1 and called() == []
    assert "slurm node n1: none: left as it is, taken out by someone else: IDLE+DRAIN (RMA: GPU 3 ECC" in result.stdout


def test_healthy_exit_0_resumes_only_checks_own_drain(fake_slurm, healthy_baseline):
    bin_dir, set_state, called = fake_slurm
    set_state("drained-admin")
    assert fleetctl("-b", str(healthy_baseline), "--slurm", "--node", "n1", path=bin_dir).returncode == 0
    assert called() == []
    set_state("drained-admin", reason="fleetctl check: driver.installed: no NVIDIA driver is installed")
    result = fleetctl("-b", str(healthy_baseline), "--slurm", "--node", "n1", path=bin_dir)
    assert result.returncode == 0 and called() == ["update nodename=n1 state=resume"]
    assert "n1: healthy" in result.stdout


def test_slurm_unreachable_is_a_warning_and_the_verdict_stands(tmp_path, healthy_baseline):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\nexit 1\n")
    (bin_dir / "sinfo").chmod(0o755)
    result = fleetctl("-b", str(healthy_baseline), "--slurm", path=bin_dir)
    assert result.returncode == 0
    assert result.stderr == ("fleetctl: warning: slurm: sinfo --json exited 1: sinfo: error: Unable to contact "
                             "slurm controller\n")


def test_textfile_has_the_audits_metrics(tmp_path):
    result = fleetctl("--node", "n1", "--textfile", str(tmp_path))
    text = (tmp_path / check.TEXTFILE_NAME).read_text()
    assert result.returncode == 1 and [p.name for p in tmp_path.iterdir()] == [check.TEXTFILE_NAME]
    assert 'fleetctl_host_reachable{host="n1"} 1.0' in text
    assert ('fleetctl_control_status{control="driver.installed",host="n1",severity="critical",status="fail"} 1.0'
            in text)


@pytest.mark.parametrize("args, said", [
    (["--textfile", "/nonexistent"], "fleetctl: error: --textfile /nonexistent: not a directory\n"),
    (["--group", "h100"], "fleetctl: error: --group h100: not a group of baseline fleetctl-default\n"),
    (["-b", "/nonexistent.yml"], None),
])
def test_bad_input_is_one_line_and_exit_2(args, said):
    result = fleetctl(*args)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert said is None or result.stderr == said


def imported_by_check(*args: str) -> set[str]:
    """The modules (packages and their submodules) a fresh interpreter has imported once `fleetctl check ARGS` ran
    in it."""
    probe = ("import json, runpy, sys\nsys.argv = ['fleetctl', 'check', *sys.argv[1:]]\ntry:\n"
             " runpy.run_module('orchestrator.cli', run_name='__main__')\nexcept SystemExit:\n pass\n"
             "print(json.dumps(sorted(sys.modules)), file=sys.stderr)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env, timeout=60)
    return set(json.loads(result.stderr.strip().splitlines()[-1]))


def test_check_imports_no_ansible_rich_or_numpy():
    assert not imported_by_check() & {"ansible", "ansible_runner", "rich", "numpy", "paramiko", "psutil", "urllib3"}


def test_check_imports_neither_the_history_nor_slurm_where_it_needs_neither():
    """A baseline without a repeat-offender policy, no --slurm: neither the history's ledger (offenders) nor the
    Slurm client is imported (bench/check_latency.py --profile: imports are most of a check's time); nor the
    canary's statistics and the gate, which only a soak's judgement uses (the baseline asks the kinds' names)."""
    assert not imported_by_check() & {"orchestrator.history.offenders", "orchestrator.history.ledger",
                                      "orchestrator.schedulers.slurmctl", "sqlite3", "orchestrator.judge.gate",
                                      "orchestrator.judge.canary.statistics"}


def test_a_baseline_validated_before_is_not_validated_again(healthy_baseline):
    """The first check validates the baseline (jsonschema-rs says yes: jsonschema is not even imported) and
    remembers its bytes; the next ones validate nothing. The file edited is validated again: a bad edit is refused in
    the same one line as by any other command (jsonschema's)."""
    first = imported_by_check("-b", str(healthy_baseline))
    assert "jsonschema_rs" in first and "jsonschema" not in first
    assert not {"jsonschema", "jsonschema_rs"} & imported_by_check("-b", str(healthy_baseline))
    assert fleetctl("-b", str(healthy_baseline)).returncode == 0
    doc = yaml.safe_load(healthy_baseline.read_text())
    doc["groups"]["all"]["severity"]["driver.installed"] = "urgent"
    healthy_baseline.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as refused:
        baseline.load(healthy_baseline)
    result = fleetctl("-b", str(healthy_baseline))
    assert (result.returncode, result.stderr) == (Exit.USAGE, f"fleetctl: error: {refused.value}\n")
    assert "$.groups.all.severity.driver.installed" in result.stderr


def test_checks_at_once_share_the_cache_and_one_that_cannot_write_it_still_checks(tmp_path, monkeypatch):
    """Four checks started together, with an empty cache: the same verdict each, no error, one entry left. A cache
    directory that cannot be made (its parent is a file: even root cannot) is no error: the baseline is validated
    each time."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "check"], env=env, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    verdicts = {(p.wait(timeout=60), p.stderr.read()) for p in procs}
    assert len(verdicts) == 1 and verdicts <= {(Exit.OK, ""), (Exit.FINDINGS, "")}
    assert len(list((schemas.cache_dir() / "valid").iterdir())) == 1
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    assert {(r.returncode, r.stderr) for r in (fleetctl(), fleetctl())} == verdicts
    assert "jsonschema_rs" in imported_by_check()  # validated: no cache to find


def test_the_real_h100_capture_is_judged_today_as_it_was_on_the_machine(testdata):
    """tests/testdata/h100-check: `fleetctl check` on a real H100 (driver 580.159.04). Its facts, judged again by
    today's controls and the embedded baseline, give the same findings and the same verdict: healthy, with the
    container image's high and medium findings that do not drain a node."""
    captured = json.loads((testdata / "h100-check" / "check.json").read_text())
    host = inventory.Host(captured["host"], tuple(captured["groups"]))
    entry = audit.evaluate_facts(host, captured["facts"], baseline.load(None))
    today = {f["control"]: f["status"] for f in entry["findings"]}
    then = {f["control"]: f["status"] for f in captured["findings"]}
    assert {c: s for c, s in today.items() if c in then} == then
    # controls added since (issue 24) have no facts in this capture to judge: not applicable, never a finding
    assert {c: s for c, s in today.items() if c not in then} == {
        "gpu.pcie_errors": "not_applicable", "gpu.memory_leak": "not_applicable", "gpu.firmware_uniform": "not_applicable",
        "nvswitch.sxid": "not_applicable", "ib.ports": "not_applicable", "ib.rate": "not_applicable",
        # issue 34: no multi-node NVLink domain on this host; the cross-host ones are never judged by check
        **dict.fromkeys(("gpu.fabric_clique", "imex.service", "imex.version", "imex.domain", "nvlink.domain_uniform",
                         "nvlink.domain_declared"), "not_applicable")}
    assert check.critical_failures(entry["findings"]) == [] and captured["summary"]["exit_code"] == 0
    assert captured["facts"]["driver"]["module_version"] == "580.159.04"
    failing = {f["control"] for f in entry["findings"] if f["status"] == "fail"}
    assert failing == {"nouveau.blacklisted", "persistence.daemon"}


def test_a_real_h200_checks_as_it_did_when_captured():
    """The facts `fleetctl check --format json` read on a real H200 (tests/testdata/h200-580.159.04-check-profile),
    evaluated again by today's controls against the embedded baseline: the same verdict, control by control, and
    the node's NVLink read as none (a one-GPU lease: no links, no evidence asked)."""
    captured = json.loads((Path(__file__).parents[1] / "testdata" / "h200-580.159.04-check-profile" /
                           "check.json").read_text())
    host = inventory.Host(name=captured["host"], groups=("all", *captured["groups"]))
    entry = audit.evaluate_facts(host, captured["facts"], baseline.load(None), checked=True)
    assert [(f["control"], f["status"]) for f in entry["findings"]] == \
        [(f["control"], f["status"]) for f in captured["findings"]]
    assert not check.critical_failures(entry["findings"])
    (gpu,) = captured["facts"]["interconnect"]["gpus"]
    assert gpu["nvlink"] == {"supported": False, "up": 0, "total": 0, "links": []}
