"""Issue 34 on real GPUs without a multi-node NVLink domain (the device tool's H100/H200: HGX boards or single GPUs):
facts.imex is null, nothing IMEX was run or read, the fabric reads as nvidia-smi printed it, and the audit says what
it said before IMEX existed. Skipped until a capture is committed: tests/testdata/<machine>-imex-null/ holding the
output of `scripts/device-interconnect-proof.sh OUT audit imex` (collector-run.json, audit-nvml.json,
audit-smi.json, nvidia-smi-interconnect.txt)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator import schemas

TESTDATA = Path(__file__).parents[1] / "testdata"
CAPTURES = sorted(TESTDATA.glob("*-imex-null"))
# The audits of the same kinds of machine taken before IMEX facts existed: (GPU name, count) -> capture.
BEFORE = {("NVIDIA H200", 2): "h200x2-580.159.04-audit", ("NVIDIA H100 80GB HBM3", 1): "h100-580.159.04-audit",
          ("NVIDIA H200", 1): "h200-580.159.04-health"}
NEW_FAMILIES = ("imex.", "nvlink.")  # the controls issue 34 adds

pytestmark = pytest.mark.skipif(not CAPTURES, reason="no tests/testdata/*-imex-null capture committed yet")


def host(capture: Path, name: str) -> dict:
    report = json.loads((capture / name).read_text())
    assert schemas.first_error("audit-report", report) is None
    return report["hosts"][0]


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_nothing_imex_is_run_or_read(capture):
    run = json.loads((capture / "collector-run.json").read_text())
    facts = run["facts"]
    assert "imex" in facts and facts["imex"] is None
    assert schemas.first_error("host-facts", facts) is None
    assert [argv for argv in run["ran"] if any("imex" in a for a in argv)] == []
    touched = run["read"] + run["listed"]
    assert [p for p in touched if "imex" in p or p in ("/proc/devices", "/proc/net/fib_trie")] == []
    assert [k for k in facts["errors"] if k.startswith("imex")] == []
    assert run["ran"], "the recording saw the collector's commands"


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_the_fabric_says_no_multi_node_domain_as_nvidia_smi_printed(capture):
    """nvidia-smi -q's Fabric section, read independently of fleetctl: no cluster UUID but zero (or N/A)."""
    text = (capture / "nvidia-smi-interconnect.txt").read_text()
    section = text.split("===== nvidia-smi -q\n", 1)[1].split("\n===== ", 1)[0]
    printed = re.findall(r"^\s+ClusterUUID\s+: (.+)$", section, re.M)
    assert printed and set(printed) <= {"00000000-0000-0000-0000-000000000000", "N/A"}
    for name in ("audit-nvml.json", "audit-smi.json"):
        facts = host(capture, name)["facts"]
        assert facts["imex"] is None
        uuids = [(g["fabric"] or {}).get("cluster_uuid") for g in facts["interconnect"]["gpus"]]
        assert uuids == [None if u == "N/A" else u.lower() for u in printed]


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_the_audit_says_what_it_said_before_imex(capture):
    """Every control the audit of the same kind of machine had before keeps its status; the new ones do not apply."""
    now = host(capture, "audit-nvml.json")
    gpus = now["facts"]["gpus"]
    before = host(TESTDATA / BEFORE[(gpus[0]["name"], len(gpus))], "audit-nvml.json")
    was = {f["control"]: f["status"] for f in before["findings"]}
    status = {f["control"]: f["status"] for f in now["findings"]}
    assert {c: (was[c], status.get(c)) for c in was if status.get(c) != was[c]} == {}
    assert {c: s for c, s in status.items() if c.startswith(NEW_FAMILIES) and s != "not_applicable"} == {}
