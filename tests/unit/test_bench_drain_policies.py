"""bench/drain_policies.py on a tiny trace: fleetctl's own plan and engine drive a campaign over a simulated Slurm
cluster, and per-host pipelines waste less than the wave batch where the batch must wait for a wave's longest job.
The figures themselves are the bench's (docs/benchmarks.md), not this test's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("drain_policies", REPO / "bench/drain_policies.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def swf_job(number: int, submit: int, run: int, processors: int) -> str:
    """One line of the Standard Workload Format: 18 fields, -1 where unknown."""
    return f"{number} {submit} 0 {run} {processors} -1 -1 {processors} {run} -1 1 1 1 1 1 1 -1 -1"


def test_per_host_pipelines_waste_less_than_the_batch_where_a_wave_waits_for_its_longest_job(bench, tmp_path):
    # 16 nodes, each running one job from the start: node i's ends after i x 10 minutes. A wave's batch waits for its
    # last job with every other host drained and idle; a host of its own goes on as soon as its job has ended.
    trace = tmp_path / "trace.swf"
    trace.write_text("; Version: 2.2\n; MaxNodes: 16\n"
                     + "\n".join(swf_job(i, 0, i * 600, 1) for i in range(1, 17)) + "\n")
    args = bench.parse(["--nodes", "16", "--swf", str(trace), "--policies", "wave,host", "--warmup", "1m",
                        "--soak", "0", "--probe", "1m", "--install", "1m", "--activate", "1m", "--verify", "1m"])
    rows = {r.policy: r for r in bench.measure(args)}
    wave, host = rows["wave"], rows["host"]
    assert wave.state == host.state == "done"
    # waves 1+1+6+8 (settings.WAVES): in the batch, waves 3 and 4 (drained at 26 and 86 min) wait for the jobs of
    # nodes 8 and 16 (80 and 160 min): 150 + 280 node-minutes idle
    assert wave.idle_node_h > 6
    assert host.idle_node_h < wave.idle_node_h / 5
    assert host.busy_node_h > 0 and host.change_node_h == pytest.approx(wave.change_node_h, rel=0.05)
    # no job waits for the campaign in either: each node's only job started at once
    assert wave.delayed == host.delayed == 0


def test_a_trace_that_is_not_swf_is_one_line_and_exit_2(bench, tmp_path, capsys):
    trace = tmp_path / "trace.swf"
    trace.write_text(swf_job(1, 0, 60, 1) + "\n1 0 0 60 1\n")
    assert bench.main(["--nodes", "16", "--swf", str(trace)]) == 2
    err = capsys.readouterr().err
    assert f"{trace}:2: not a Standard Workload Format line: 5 fields, SWF has 18" in err
    assert len(err.strip().splitlines()) == 1
