"""Prometheus output: `audit|probe --format prometheus`, `fleetctl metrics` from a real history, the atomic -o
write node_exporter's textfile collector needs, the shipped alert rules (promtool) and the Grafana dashboard.

Reports are the real H200 captures (tests/testdata) with faults planted in copies of their hosts; the history is
written by the real Store and campaign engine (scripted steps, as in helpers.campaign)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import statistics
import subprocess
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import controls, prometheus
from orchestrator.files import write_atomically
from orchestrator.history.store import Store
from tests.helpers.cli import REPO, fleetctl
from orchestrator.campaign import journal as journal_mod, soak
from tests.helpers.campaign import Clock, Clocked, Script, start

TESTDATA = REPO / "tests" / "testdata" / "h200x2-580.159.04-audit"
RULES = REPO / "monitoring" / "prometheus" / "fleetctl-alerts.yml"
RULES_TEST = REPO / "monitoring" / "prometheus" / "fleetctl-alerts.test.yml"
DASHBOARD = REPO / "monitoring" / "grafana" / "fleetctl-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package prometheus)")


def xid(code: int, cls: str, seq: int) -> dict:
    return {"code": code, "pci_bus_id": "00000000:00:06.0", "gpu_instance": None, "pid": None, "process": None,
            "message": "", "recovery_action": None, "seq": seq, "uptime_s": 10.0 + seq, "raw": f"NVRM: Xid {code}",
            "name": None, "class": cls, "severity": "critical" if cls == "critical" else "info", "action": None,
            "source": "test"}


def set_status(host: dict, control: str, status: str) -> None:
    next(f for f in host["findings"] if f["control"] == control)["status"] = status


@pytest.fixture(scope="module")
def audit_report() -> dict:
    """The real 2x H200 audit as gpu-a; gpu-b: an unblessed driver, a stuck fabric and Xids 79, 79, 13; gpu-c:
    unreachable."""
    report = json.loads((TESTDATA / "audit-nvml.json").read_text())
    real = report["hosts"][0]
    a = dict(copy.deepcopy(real), name="gpu-a", groups=["h200"])
    b = dict(copy.deepcopy(real), name="gpu-b", groups=["h200"])
    set_status(b, "driver.version_allowed", "fail")
    set_status(b, "gpu.fabric", "fail")
    set_status(b, "gpu.xid", "fail")
    b["facts"]["xid"]["events"] = [xid(79, "critical", 1), xid(79, "critical", 2), xid(13, "application", 3)]
    c = {"name": "gpu-c", "groups": ["l40s"], "reachable": False, "error": "ssh: timed out", "facts": None,
         "findings": [controls.error_finding("host.reachable", "Host reachable", "ssh: timed out")]}
    report["hosts"] = [a, b, c]
    return report


@pytest.fixture(scope="module")
def probe_report() -> dict:
    """The real 2x H200 probe (GEMM, copy, all-reduce, P2P) as gpu-a; gpu-b: a new Xid 79; gpu-c: no result."""
    report = json.loads((TESTDATA / "probe-default.json").read_text())
    real = report["hosts"][0]
    a = dict(copy.deepcopy(real), name="gpu-a", groups=["h200"])
    b = dict(copy.deepcopy(real), name="gpu-b", groups=["h200"], health={"status": "fail", "reasons": ["Xid 79"]})
    b["probe"]["health"]["xid"]["events"] = [xid(79, "critical", 400)]
    b["probe"]["throughput"] = None
    c = {"name": "gpu-c", "groups": ["l40s"], "reachable": False, "error": "ssh: timed out", "probe": None,
         "health": {"status": "error", "reasons": ["ssh: timed out"]}}
    report["hosts"] = [a, b, c]
    return report


def samples(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample in an exposition, parsed by prometheus_client's own parser."""
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def value(text: str, name: str, **labels) -> float | None:
    found = [v for n, lab, v in samples(text) if n == name and all(lab.get(k) == str(w) for k, w in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


# -- what one run saw -----------------------------------------------------------------------------------------

def test_audit_report_as_metrics(audit_report):
    text = prometheus.report_text(audit_report)
    assert value(text, "fleetctl_control_status", host="gpu-b", control="driver.version_allowed", severity="high",
                 status="fail") == 1
    # one series per control: its current status, nothing for the statuses it does not have
    assert value(text, "fleetctl_control_status", host="gpu-b", control="driver.version_allowed", status="pass") is None
    assert value(text, "fleetctl_control_status", host="gpu-a", control="driver.version_allowed", status="pass") == 1
    assert value(text, "fleetctl_control_status", host="gpu-a", control="nouveau.blacklisted", status="fail") == 1
    assert value(text, "fleetctl_driver_info", host="gpu-a", version="580.159.04", flavor="open", branch="580",
                 state="loaded") == 1
    assert value(text, "fleetctl_gpus", host="gpu-a") == 2
    assert value(text, "fleetctl_xid_events", host="gpu-b", code=79, **{"class": "critical"}) == 2
    assert value(text, "fleetctl_xid_events", host="gpu-b", code=13, **{"class": "application"}) == 1
    assert value(text, "fleetctl_xid_events", host="gpu-a") is None
    assert value(text, "fleetctl_host_reachable", host="gpu-c") == 0
    assert value(text, "fleetctl_control_status", host="gpu-c", control="host.reachable", status="error") == 1
    assert value(text, "fleetctl_driver_info", host="gpu-c") is None  # no facts: no driver guessed
    assert value(text, "fleetctl_last_audit_timestamp_seconds", host="gpu-a") == \
        prometheus.unix(audit_report["run"]["started_at"]) == 1795413126.955
    assert not any(n.startswith("fleetctl_probe") for n, _, _ in samples(text))


def test_probe_report_as_metrics(probe_report, audit_report):
    text = prometheus.report_text(probe_report)
    tp = probe_report["hosts"][0]["probe"]["throughput"]
    gemm0 = statistics.median(s["value"] for s in tp["samples"] if s["gpu"] == 0 and s["metric"] == "gemm_tflops")
    assert value(text, "fleetctl_probe_median", host="gpu-a", gpu=0, metric="gemm_tflops", unit="TFLOP/s") == \
        pytest.approx(gemm0) == pytest.approx(665.55, abs=0.01)
    assert value(text, "fleetctl_probe_median", host="gpu-a", gpu=0, peer=1, metric="p2p_gbs") == \
        pytest.approx(387.19, abs=0.01)
    assert value(text, "fleetctl_probe_median", host="gpu-a", gpu="", metric="allreduce_busbw_gbs") == \
        pytest.approx(328.16, abs=0.01)  # host-wide: no GPU
    assert len([n for n, lab, _ in samples(text) if n == "fleetctl_probe_median"]) == 7  # 2 GPUs x 3 + all-reduce
    assert value(text, "fleetctl_probe_status", host="gpu-a", status="pass") == 1
    assert value(text, "fleetctl_probe_status", host="gpu-b", status="fail") == 1
    assert value(text, "fleetctl_probe_status", host="gpu-c", status="error") == 1
    assert value(text, "fleetctl_probe_xid_events", host="gpu-b", code=79, **{"class": "critical"}) == 1
    assert value(text, "fleetctl_probe_gpus", host="gpu-a") == 2
    assert value(text, "fleetctl_probe_gpus", host="gpu-c") is None
    # disjoint from the audit's names: an audit file and a probe file can share node_exporter's textfile directory
    audit = {n for n, _, _ in samples(prometheus.report_text(audit_report))}
    assert audit and not {n for n, _, _ in samples(text)} & audit


def test_a_failed_trial_is_left_out_of_the_median(probe_report):
    report = copy.deepcopy(probe_report)
    report["hosts"] = report["hosts"][:1]
    series = [s for s in report["hosts"][0]["probe"]["throughput"]["samples"]
              if s["gpu"] == 1 and s["metric"] == "bandwidth_gbs"]
    series[0]["value"] = None
    expected = statistics.median(s["value"] for s in series[1:])
    assert value(prometheus.report_text(report), "fleetctl_probe_median", host="gpu-a", gpu=1,
                 metric="bandwidth_gbs") == pytest.approx(expected)


# -- the history ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def history(tmp_path_factory, audit_report, probe_report):
    """Real runs in a real history: an older audit (gpu-b still clean), the audit above, a probe, then campaign 1
    (gpu-a, gpu-c: done, each host out of service 55 minutes a month ago) and campaign 2 (gpu-a held after two inconclusive gates: the campaign halts)."""
    home = tmp_path_factory.mktemp("metrics-history")
    with pytest.MonkeyPatch.context() as monkeypatch, Store(home / "history.sqlite3") as store:
        older = copy.deepcopy(audit_report["hosts"][:2])
        older[1] = dict(copy.deepcopy(older[0]), name="gpu-b")
        for hosts in (older, audit_report["hosts"]):
            run_id, _ = store.begin_run("audit", [], "test", None, None)
            store.finish_run(run_id, 1, {"exit_code": 1}, hosts)
        run_id, _ = store.begin_run("probe", [], "test", None, None)
        store.finish_probe(run_id, 1, {"exit_code": 1}, probe_report["hosts"])
        with pytest.MonkeyPatch.context() as clocked:  # each host drained 55 minutes (helpers.campaign.Clocked)
            clock = Clock(datetime.now(timezone.utc) - timedelta(days=30))
            clocked.setattr(journal_mod, "now", clock)
            _, _, engine = start(store, Clocked(clock), ["gpu-a"], ["gpu-c"])
            assert engine.run() == "done"
        held = Script({("gpu-a", "probe_after"): "inconclusive", ("gpu-a", "probe_again"): "inconclusive"})
        _, _, engine = start(store, held, ["gpu-a"])
        assert engine.run() == "halted"
        # campaign 3: gpu-d soaking after its wave, one check recorded (its canary run failed), then a crash
        checks = []

        def observe(ctx, hosts, final):
            if checks:
                raise KeyboardInterrupt("crash")
            checks.append(hosts)
            return {h: soak.Observation("ok", None, {"canary": {"ok": False, "error": "exited 1"}}) for h in hosts}
        _, _, engine = start(store, Script(), ["gpu-d"], ["gpu-e"], soak_s=[3600], soak_interval_s=0.01,
                             observe=observe, capacity_budget_node_hours=12)
        with pytest.raises(KeyboardInterrupt):
            engine.run()
    return home


def test_metrics_from_the_history_are_each_hosts_latest_state(history):
    with Store(history / "history.sqlite3") as store:
        started = store.runs("audit")[-1]["started_at"]
        text = prometheus.history_text(store)
    assert value(text, "fleetctl_control_status", host="gpu-b", control="driver.version_allowed", status="fail") == 1
    assert value(text, "fleetctl_control_status", host="gpu-b", control="driver.version_allowed", status="pass") is None
    assert value(text, "fleetctl_driver_info", host="gpu-b", version="580.159.04", flavor="open") == 1
    assert value(text, "fleetctl_xid_events", host="gpu-b", code=79, **{"class": "critical"}) == 2
    assert value(text, "fleetctl_gpus", host="gpu-a") == 2
    assert value(text, "fleetctl_host_reachable", host="gpu-c") == 0
    assert value(text, "fleetctl_last_audit_timestamp_seconds", host="gpu-b") == prometheus.unix(started)
    assert value(text, "fleetctl_probe_median", host="gpu-a", gpu=1, metric="gemm_tflops") == pytest.approx(669.14,
                                                                                                           abs=0.01)
    assert value(text, "fleetctl_probe_status", host="gpu-b", status="fail") == 1
    assert value(text, "fleetctl_last_probe_timestamp_seconds", host="gpu-c") > 0
    # each host's latest campaign
    assert value(text, "fleetctl_campaign_host_state", campaign=2, host="gpu-a", state="held") == 1
    assert value(text, "fleetctl_campaign_host_state", campaign=1, host="gpu-c", state="done") == 1
    assert value(text, "fleetctl_campaign_host_state", campaign=1, host="gpu-a") is None
    assert value(text, "fleetctl_campaign_state", campaign=2, target="570.86.15", state="halted") == 1
    assert value(text, "fleetctl_campaign_state", campaign=1, state="done") == 1
    assert 3500 < value(text, "fleetctl_campaign_soak_remaining_seconds", campaign=3) <= 3600
    assert value(text, "fleetctl_campaign_soak_host_status", campaign=3, host="gpu-d", kind="check", status="ok") == 1
    assert value(text, "fleetctl_campaign_soak_canary_failed_runs", campaign=3, host="gpu-d") == 1
    assert value(text, "fleetctl_campaign_state", campaign=3, state="soaking") == 1
    # what each campaign cost in capacity (node-seconds): campaign 1's hosts each busy 40 minutes, idle 1, in change 14
    assert [value(text, "fleetctl_campaign_capacity_node_seconds", campaign=1, kind=k)
            for k in ("busy", "idle", "change")] == [2 * 2400, 2 * 60, 2 * 840]
    assert value(text, "fleetctl_campaign_capacity_node_seconds", campaign=3, kind="idle") >= 0
    assert value(text, "fleetctl_campaign_capacity_budget_node_seconds", campaign=3) == 12 * 3600
    assert value(text, "fleetctl_campaign_capacity_budget_node_seconds", campaign=1) is None  # none given
    assert value(text, "fleetctl_history_chain_records") > 20
    assert 0 <= value(text, "fleetctl_history_chain_head_age_seconds") < 60
    assert {n for n, _, _ in samples(text)} == set(prometheus.METRICS)  # every metric fleetctl documents, made


def test_limit_selects_hosts_or_groups(history):
    with Store(history / "history.sqlite3") as store:
        for limit, expected in (("gpu-b", {"gpu-b"}), ("l40s", {"gpu-c"}), ("h200,gpu-c", {"gpu-a", "gpu-b", "gpu-c"}),
                                ("gpu-[ab]", {"gpu-a", "gpu-b"}), ("nothing", set())):
            text = prometheus.history_text(store, limit)
            assert {lab["host"] for _, lab, _ in samples(text) if "host" in lab} == expected, limit
            assert value(text, "fleetctl_history_chain_records") > 20


def test_chain_head_age_is_measured_from_the_newest_record(history):
    with Store(history / "history.sqlite3") as store:
        at = store.db.execute("SELECT at FROM chain ORDER BY seq DESC LIMIT 1").fetchone()[0]
        text = prometheus.history_text(store, now=prometheus.unix(at) + 90)
    assert value(text, "fleetctl_history_chain_head_age_seconds") == pytest.approx(90)
    assert value(text, "fleetctl_history_chain_head_timestamp_seconds") == prometheus.unix(at)


def test_fleetctl_metrics_command(history, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(history, home)
    proc = fleetctl("metrics", "-l", "gpu-a", home=home)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert value(proc.stdout, "fleetctl_campaign_host_state", host="gpu-a", state="held") == 1
    assert {lab.get("host") for _, lab, _ in samples(proc.stdout)} == {"gpu-a", None}
    assert fleetctl("report", "verify", home=home).returncode == 0  # read only: the chain is as it was


def test_an_empty_history_is_a_valid_nearly_empty_exposition(tmp_path):
    proc = fleetctl("metrics", home=tmp_path / "new")
    assert proc.returncode == 0, proc.stderr
    assert samples(proc.stdout) == [("fleetctl_history_chain_records", {}, 0.0)]


# -- -o FILE: atomic, for node_exporter's textfile collector ------------------------------------------------------

def test_o_replaces_the_file_atomically_and_leaves_no_temporary_file(history, tmp_path):
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    out = textfiles / "fleetctl.prom"
    out.write_text("old\n")
    os.chmod(out, 0o600)
    inode = out.stat().st_ino
    proc = fleetctl("metrics", "-o", str(out), home=history)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr
    assert os.listdir(textfiles) == ["fleetctl.prom"]
    assert out.stat().st_ino != inode  # a new file renamed over the old one, not rewritten in place
    assert out.stat().st_mode & 0o777 == 0o600  # the file's own mode (reports may hold what not everyone reads)
    assert value(out.read_text(), "fleetctl_host_reachable", host="gpu-a") == 1


def test_o_at_a_symlink_replaces_the_link_never_its_target(tmp_path):
    real = tmp_path / "real.prom"
    real.write_text("old\n")
    link = tmp_path / "link.prom"
    link.symlink_to(real)
    write_atomically(link, "new\n")  # a final symlink is never followed (issue 21: one planted in /tmp)
    assert not link.is_symlink() and link.read_text() == "new\n" and real.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["link.prom", "real.prom"]


def test_a_reader_never_sees_half_a_file(tmp_path):
    out = tmp_path / "fleetctl.prom"
    versions = [f"# {i}\n" + f"fleetctl_gpus{{host=\"h{i}\"}} 8\n" * 20000 for i in range(2)]
    write_atomically(out, versions[0])
    seen, done = set(), threading.Event()

    def read():
        while not done.is_set():
            seen.add(out.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(40):
            write_atomically(out, versions[i % 2])
    finally:
        done.set()
        reader.join()
    assert seen <= set(versions) and seen
    assert os.listdir(tmp_path) == ["fleetctl.prom"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    out = tmp_path / "fleetctl.prom"
    out.write_text("old\n")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        write_atomically(out, "new\n")
    assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["fleetctl.prom"]


@pytest.mark.parametrize("where", ["missing/fleetctl.prom", "."])
def test_o_where_nothing_can_be_written_is_one_line_and_exit_2(tmp_path, where):
    proc = fleetctl("metrics", "-o", str(tmp_path / where), home=tmp_path / "home")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("fleetctl: error: ")
    assert "cannot write" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_audit_of_this_machine_as_prometheus_metrics(tmp_path):
    """End to end: a real audit of localhost (no NVIDIA driver here) written for the textfile collector."""
    out = tmp_path / "fleetctl.prom"
    proc = fleetctl("audit", "--format", "prometheus", "-o", str(out), "--fail-on", "never", home=tmp_path / "home")
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    text = out.read_text()
    assert value(text, "fleetctl_control_status", host="localhost", control="driver.installed", severity="critical",
                 status="fail") == 1
    assert value(text, "fleetctl_driver_info", host="localhost", version="", state="not_installed") == 1
    assert value(text, "fleetctl_gpus", host="localhost") == 0
    assert value(text, "fleetctl_host_reachable", host="localhost") == 1
    assert sorted(os.listdir(tmp_path)) == ["fleetctl.prom", "home"]
    bad = fleetctl("probe", "--format", "prometheus", "-o", str(tmp_path / "no/such/dir.prom"), home=tmp_path / "home")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


# -- names, the rules and the dashboard -----------------------------------------------------------------------------

def test_names_follow_the_prometheus_conventions():
    for name, (doc, labels) in prometheus.METRICS.items():
        assert re.fullmatch(r"fleetctl_[a-z0-9_]+", name) and not name.endswith("_total"), name
        assert doc.endswith(".") and all(re.fullmatch(r"[a-z][a-z0-9_]*", label) for label in labels), name
        assert not re.search(r"_(ms|milliseconds|minutes|hours|days|bytes_kb|mb|gb)$", name), name
        if "timestamp" in name or "age" in name:
            assert name.endswith("_seconds"), name
    assert [n for n in prometheus.METRICS if n.endswith("_info")] == ["fleetctl_driver_info"]


PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (strings, label matchers, grouping labels, functions dropped)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    return {t for t in re.findall(r"\b[A-Za-z_:][A-Za-z0-9_:]*\b(?!\s*\()", expr) if t.lower() not in PROMQL_WORDS}


def test_metric_names_in_promql():
    assert metric_names('count(count by (host) (fleetctl_xid_events{host=~"$host", class="critical"} > 0)) or '
                        'vector(0)') == {"fleetctl_xid_events"}
    assert metric_names("time() - fleetctl_last_audit_timestamp_seconds > 26 * 3600") == \
        {"fleetctl_last_audit_timestamp_seconds"}


def dashboard_exprs(dashboard: dict) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        for p in [panel, *panel.get("panels", [])]:  # rows may hold panels
            out += [t["expr"] for t in p.get("targets", []) if "expr" in t]
    return out


def test_dashboard_reads_only_what_fleetctl_emits():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) > 10
    # label_values(METRIC, LABEL): the variables' queries read METRIC
    exprs += [re.fullmatch(r"label_values\((.+), *[a-z_]+\)", v["query"]["query"])[1]
              for v in variables.values() if v["type"] == "query"]
    used = set().union(*(metric_names(e) for e in exprs))
    assert used <= set(prometheus.METRICS), used - set(prometheus.METRICS)
    assert {"fleetctl_control_status", "fleetctl_driver_info", "fleetctl_xid_events", "fleetctl_probe_median",
            "fleetctl_campaign_host_state"} <= used
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["targets"], panel["title"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_rules_read_only_what_fleetctl_emits():
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    used = set().union(*(metric_names(r["expr"]) for r in rules))
    assert used <= set(prometheus.METRICS), used - set(prometheus.METRICS)
    assert {r["alert"] for r in rules} >= {"FleetctlDriverDrift", "FleetctlXidCritical", "FleetctlFabricNotReady",
                                           "FleetctlCampaignHalted", "FleetctlAuditStale"}


@needs_promtool
def test_promtool_checks_the_rules_and_runs_their_unit_tests():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    test = subprocess.run([PROMTOOL, "test", "rules", RULES_TEST.name], capture_output=True, text=True,
                          cwd=RULES_TEST.parent)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


@needs_promtool
def test_the_alerts_fire_on_what_fleetctl_metrics_renders_from_a_history(history, tmp_path):
    """Every series of `fleetctl metrics` (the history above) fed to promtool: exactly the alerts a person would
    expect fire, with the labels fleetctl gave them."""
    with Store(history / "history.sqlite3") as store:
        text = prometheus.history_text(store)
    series = [{"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}",
               "values": f"{value!r}x30"} for name, labels, value in samples(text)]
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # their text is tested by fleetctl-alerts.test.yml
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))

    def alert(name, **labels):
        return {"eval_time": "20m", "alertname": name, "exp_alerts": [{"exp_labels": labels}] if labels else []}

    expected = [
        alert("FleetctlDriverDrift", severity="critical", host="gpu-b", control="driver.version_allowed",
              status="fail"),
        {"eval_time": "20m", "alertname": "FleetctlControlFailing", "exp_alerts": [  # as captured on the real H200s
            {"exp_labels": {"severity": "warning", "host": h, "control": "nouveau.blacklisted", "status": "fail"}}
            for h in ("gpu-a", "gpu-b")]},
        alert("FleetctlXidCritical", severity="critical", host="gpu-b"),
        alert("FleetctlFabricNotReady", severity="critical", host="gpu-b", control="gpu.fabric", status="fail"),
        alert("FleetctlCampaignHalted", severity="warning", campaign="2", target="570.86.15", state="halted"),
        alert("FleetctlCampaignHostHeld", severity="warning", campaign="2", host="gpu-a", state="held"),
        alert("FleetctlCampaignHostRolledBack"),
        alert("FleetctlHostUnreachable", severity="warning", host="gpu-c"),
        {"eval_time": "20m", "alertname": "FleetctlProbeUnhealthy", "exp_alerts": [
            {"exp_labels": {"severity": "warning", "host": "gpu-b", "status": "fail"}},
            {"exp_labels": {"severity": "warning", "host": "gpu-c", "status": "error"}}]},
        alert("FleetctlAuditStale"),  # just audited
        alert("FleetctlMetricsAbsent"),
    ]
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": expected}]}))
    proc = subprocess.run([PROMTOOL, "test", "rules", "test.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout[-4000:] + proc.stderr


# -- captured on a real H100 (driver 580.159.04) by scripts/device-collection-proof.sh -------------------------

REAL = REPO / "tests/testdata/prometheus/h100-580.159.04"


def test_real_h100_captures_parse_and_say_what_the_host_had():
    audit, probe, latest = ((REAL / name).read_text() for name in ("audit.prom", "probe.prom", "metrics.prom"))
    assert value(audit, "fleetctl_driver_info", host="localhost", version="580.159.04", flavor="open", branch="580") == 1
    assert value(audit, "fleetctl_gpus", host="localhost") == 1
    assert value(audit, "fleetctl_control_status", host="localhost", control="nouveau.blacklisted", status="fail") == 1
    gemm = value(probe, "fleetctl_probe_median", host="localhost", gpu="0", metric="gemm_tflops", unit="TFLOP/s")
    assert 600 < gemm < 1000  # bf16 8192^3 on an H100 SXM
    assert value(probe, "fleetctl_probe_status", host="localhost", status="pass") == 1
    audit_names = {name for name, _, _ in samples(audit)}
    probe_names = {name for name, _, _ in samples(probe)}
    assert not audit_names & probe_names  # both files can sit in one textfile directory
    assert audit_names | probe_names <= {name for name, _, _ in samples(latest)}  # `metrics` holds both
    assert value(latest, "fleetctl_history_chain_records") >= 2


def test_a_new_o_file_gets_the_umask_mode_and_a_stream_is_written_in_place(history, tmp_path):
    old = os.umask(0o022)
    try:
        write_atomically(tmp_path / "new.prom", "x 1\n")
    finally:
        os.umask(old)
    assert (tmp_path / "new.prom").stat().st_mode & 0o777 == 0o644
    read, write = os.pipe()
    with os.fdopen(read) as reader:
        write_atomically(Path(f"/proc/self/fd/{write}"), "through the pipe\n")
        os.close(write)
        assert reader.read() == "through the pipe\n"
