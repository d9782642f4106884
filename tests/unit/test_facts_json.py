"""The audit's facts sent as one JSON text (gpu_facts as_json: playbooks/audit.yml): decoded by fleetctl with the
same bounds and schema as a dictionary, on a real H200's facts (tests/testdata/h200-580.159.04-audit-json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import audit, inputs
from orchestrator.fleet.runner import HostOutcome

REAL = json.loads((Path(__file__).parents[1] / "testdata/h200-580.159.04-audit-json/audit-nvml.json").read_text())
FACTS = REAL["hosts"][0]["facts"]
ACTION = "fleetctl.gpu.gpu_facts"


def outcome(result: dict) -> HostOutcome:
    return HostOutcome("gpu-01", results={ACTION: result})


def test_facts_sent_as_json_text_are_the_facts_sent_as_a_dictionary():
    as_text = audit.outcome_facts(outcome({"facts_json": json.dumps(FACTS, separators=(",", ":"))}))
    assert as_text == audit.outcome_facts(outcome({"facts": FACTS})) == (FACTS, None)


@pytest.mark.parametrize("text, said", [
    ('{"schema_version": 1', "$: not JSON: "),
    ("[" * 100_000 + "]" * 100_000, "$: "),  # the decoder's recursion, or result_problem's depth: never a crash
    (17, "$: a int where a JSON text was expected"),
    ("x" * (inputs.MAX_RESULT_CHARS + 1), "$: more than 8 MiB of text"),
    ('{"schema_version": 1}', "$: 'collector' is a required property"),  # the schema's shallowest problem
])
def test_a_json_text_that_cannot_be_trusted_is_one_problem_line(text, said):
    facts, problem = audit.outcome_facts(outcome({"facts_json": text}))
    assert problem.startswith(said) and "\n" not in problem


def test_a_real_hosts_json_text_is_judged_as_the_audit_judged_it():
    facts, problem = audit.outcome_facts(outcome({"facts_json": json.dumps(FACTS)}))
    assert problem is None
    assert {f["control"]: f["status"] for f in REAL["hosts"][0]["findings"]}["nouveau.blacklisted"] == "fail"
