"""`--format json` reports: the layout json.dumps(indent=2) gives, written by orjson (orchestrator/cli/output.py
indented_json; docs/benchmarks.md says what it saves), and valid JSON where json would write NaN."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli.output import write_report

AUDITS = ("h200x2-580.159.04-audit/audit-nvml.json", "h200x2-580.159.04-audit/audit-smi.json",
          "h100-580.159.04-audit/audit-nvml.json")


def strict(text: str):
    """TEXT as a strict JSON parser (jq, a browser) reads it: no NaN, no Infinity."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("capture", AUDITS)
def test_a_real_audit_report_is_written_as_json_lays_it_out(testdata, tmp_path, capture):
    report = json.loads((testdata / capture).read_text())
    write_report(report, "json", str(tmp_path / "report.json"), None)
    assert (tmp_path / "report.json").read_text() == json.dumps(report, indent=2) + "\n"


def test_text_outside_ascii_and_huge_integers_are_written_as_json_writes_them(tmp_path):
    report = {"hosts": [{"name": "gpu-ñ-01", "error": "nvidia-smi: « no device »", "facts": {"seq": 2 ** 70}}],
              "summary": {"hosts": 1, "ratio": 1e-05}}
    write_report(report, "json", str(tmp_path / "report.json"), None)
    assert (tmp_path / "report.json").read_text() == json.dumps(report, indent=2) + "\n"


def test_a_nan_in_a_report_is_written_as_null_and_the_report_stays_json(tmp_path):
    """A host's facts may carry NaN (Python's json reads it): the report is still JSON that jq reads."""
    report = {"hosts": [{"name": "h100-01", "facts": {"gpus": [{"power_w": float("nan"), "temperature_c": 31}]}}],
              "summary": {"ratio": float("inf")}}
    write_report(report, "json", str(tmp_path / "report.json"), None)
    assert strict((tmp_path / "report.json").read_text()) == {
        "hosts": [{"name": "h100-01", "facts": {"gpus": [{"power_w": None, "temperature_c": 31}]}}],
        "summary": {"ratio": None}}
