"""The probe's command engine: the contract a canary workload (and the lab's benchmark) follows."""

from __future__ import annotations

import sys

import pytest
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_throughput import EngineError, command, measure

PER_RUN = """
import json, os, pathlib
runs = pathlib.Path(__file__).with_suffix(".runs")
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
print("warming up...")
print(json.dumps({"metrics": {"tokens_per_s": {"value": 5000 + n, "unit": "tokens/s", "higher_is_better": True},
                              "step_ms": {"value": 100.0 + n, "unit": "ms", "higher_is_better": False}}}))
"""
SERIES = """
import json, os
n = int(os.environ["FLEETCTL_PROBE_SAMPLES"])
print(json.dumps({"metrics": {"gemm_tflops": {"unit": "TFLOP/s", "higher_is_better": True}},
                  "trial_s": os.environ["FLEETCTL_PROBE_TRIAL_S"],
                  "samples": [{"gpu": g, "gemm_tflops": 600.0 + i} for i in range(n) for g in (0, 1)]}, indent=1))
"""


def canary(tmp_path, body, name="canary.py"):
    path = tmp_path / name
    path.write_text(body)
    return f"{sys.executable} {path} --token s3cr3t"


def test_a_per_run_canary_is_warmed_up_then_run_n_times(tmp_path):
    rows, spec, device = command(canary(tmp_path, PER_RUN), samples=4)
    assert (tmp_path / "canary.runs").read_text() == "5"  # 1 warm-up + 4 samples
    assert [r["value"] for r in rows if r["metric"] == "tokens_per_s"] == [5002, 5003, 5004, 5005]
    assert spec["step_ms"] == {"unit": "ms", "higher_is_better": False}
    assert device == "command: " + sys.executable.rsplit("/", 1)[1]  # arguments (a token here) are not reported


def test_a_canary_that_measures_a_series_runs_once_with_the_protocol_in_its_environment(tmp_path):
    result, errors = measure("command", 3, 0.0, 0.25, [0, 1], canary(tmp_path, SERIES))
    assert errors == {} and result["engine"] == "command"
    assert [(r["gpu"], r["value"]) for r in result["samples"]] == [(0, 600.0), (1, 600.0), (0, 601.0), (1, 601.0),
                                                                   (0, 602.0), (1, 602.0)]
    assert result["metrics"] == {"gemm_tflops": {"unit": "TFLOP/s", "higher_is_better": True}}


@pytest.mark.parametrize("body,expected", [
    ("import sys; sys.exit(3)", "exited 3"),
    ("print('all good, 5512 tokens/s')", "no JSON object with a 'metrics' object"),
    ("print(json.dumps({'metrics': {}}))", "no JSON object"),
])
def test_a_broken_canary_is_an_engine_error(tmp_path, body, expected):
    with pytest.raises(EngineError, match=expected):
        command(canary(tmp_path, "import json\n" + body), samples=2)
