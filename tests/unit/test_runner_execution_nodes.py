"""The config file's execution nodes (issue 37): which node serves which host, and a bad declaration refused in one
line before anything runs. Playbooks through them: tests/integration/test_execution_nodes.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.fleet import execution_nodes, inventory, runner
from orchestrator import settings
from tests.helpers.cli import REPO, runs

NODES = [{"name": "rack1", "worker": "ssh exec01 ansible-runner worker", "hosts": "rack1"},
         {"name": "gpu", "worker": "ssh exec02 ansible-runner worker", "hosts": ["gpu-0*", "rack3"]}]


@pytest.fixture
def fleet(tmp_path) -> inventory.Fleet:
    path = tmp_path / "hosts.ini"
    path.write_text("[rack1]\ngpu-01\ncpu-01\n[rack2]\ngpu-02\ncpu-02\n[rack3:children]\nrack4\n[rack4]\nold-01\n")
    return inventory.load(str(path))


def test_a_host_goes_to_the_first_node_that_serves_it_by_group_or_name(fleet):
    nodes = execution_nodes.parse(NODES, "config.yml")
    assert [str(n) for n in nodes] == ["execution node rack1 (ssh exec01 ansible-runner worker)",
                                       "execution node gpu (ssh exec02 ansible-runner worker)"]
    parts = execution_nodes.RunnerConfig(nodes).split(fleet.hosts)
    assert {(n.name if n else None): hosts for n, hosts in parts.items()} == {
        "rack1": ["gpu-01", "cpu-01"],  # gpu-01 is the second node's too: the first wins
        "gpu": ["gpu-02", "old-01"],  # old-01 by its parent group
        None: ["cpu-02"]}  # in-process, or $FLEETCTL_WORKER
    assert execution_nodes.RunnerConfig().split(fleet.hosts) == {None: [h.name for h in fleet.hosts]}


def audit(tmp_path, config: str) -> subprocess.CompletedProcess:
    (tmp_path / "config.yml").write_text(config)
    env = dict(os.environ, FLEETCTL_HOME=str(tmp_path / "home"), FLEETCTL_CONFIG=str(tmp_path / "config.yml"))
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "audit"], capture_output=True, text=True,
                          env=env, timeout=60, cwd=REPO)


@pytest.mark.parametrize("config,said", [
    ("execution_nodes:\n- {name: a, worker: w, hosts: x}\n- {name: a, worker: v, hosts: y}\n",
     "$.execution_nodes[1]: execution node a is named twice"),
    ("execution_nodes:\n- {name: a, worker: \"ssh 'exec01\", hosts: x}\n",
     "$.execution_nodes[0].worker: No closing quotation"),
    ("execution_nodes:\n- {name: a, worker: ' ', hosts: x}\n", "$.execution_nodes[0].worker: no command"),
    ("execution_nodes:\n- {name: a, hosts: x}\n", "$.execution_nodes[0]: 'worker' is a required property"),
    ("execution_nodes:\n- {name: rack 1, worker: w, hosts: x}\n",
     "$.execution_nodes[0].name: a string that fails the schema's 'pattern' rule"),
    ("worker_silence: 2s\n", "$.worker_silence: '2s' is not at least 4s"),  # a keepalive a second at least
])
def test_a_bad_execution_node_is_one_line_before_anything_runs(tmp_path, config, said):
    proc = audit(tmp_path, config)
    assert proc.returncode == 2 and proc.stderr.startswith(f"fleetctl: error: {tmp_path / 'config.yml'}: {said}")
    assert len(proc.stderr.splitlines()) == 1 and runs(tmp_path / "home") == []


def test_config_show_names_each_node(tmp_path):
    (tmp_path / "config.yml").write_text("execution_nodes:\n" + "".join(
        f"- {{name: {n['name']}, worker: {n['worker']}, hosts: {n['hosts']}}}\n".replace("'", "") for n in NODES))
    env = dict(os.environ, FLEETCTL_CONFIG=str(tmp_path / "config.yml"))
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "config", "show"], capture_output=True,
                          text=True, env=env, timeout=60, cwd=REPO)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("execution_nodes"))
    assert line.split(None, 1)[1] == ("rack1 (ssh exec01 ansible-runner worker): rack1, "
                                      f"gpu (ssh exec02 ansible-runner worker): gpu-0*,rack3  ({tmp_path}/config.yml)")


def test_two_commands_in_one_process_each_run_their_playbooks_as_configured(fleet, monkeypatch):
    """Nothing of one runner is left for another: the execution nodes, the worker silence and the work to do
    meanwhile are each command's own, whichever ran first (a campaign and an audit in one process, a test suite)."""
    parts: list[tuple[str, str | None, tuple[str, ...], float]] = []

    def run_part(name, fleet, node, outcomes, extravars, forks, cancel, heard, silence):
        heard()
        parts.append((name, node.name if node else None, tuple(outcomes), silence))
        for outcome in outcomes.values():
            outcome.results["fleetctl.gpu.gpu_facts"] = {}

    monkeypatch.setattr(runner, "run_part", run_part)
    warmed: list[str] = []
    racked = runner.Runner(execution_nodes.RunnerConfig(execution_nodes.parse(NODES, "config.yml"), silence=7))
    racked.meanwhile(lambda: warmed.append("racked"))
    plain = runner.Runner()
    hosts = [h.name for h in fleet.hosts]
    plain.run_playbook("audit.yml", fleet, hosts)
    assert parts == [("audit.yml", None, tuple(hosts), settings.WORKER_SILENCE.value)] and warmed == []
    parts.clear()
    racked.run_playbook("probe.yml", fleet, hosts)
    assert sorted(parts, key=str) == sorted([("probe.yml", "rack1", ("gpu-01", "cpu-01"), 7),
                                             ("probe.yml", "gpu", ("gpu-02", "old-01"), 7),
                                             ("probe.yml", None, ("cpu-02",), 7)], key=str)
    assert warmed == ["racked"]
    parts.clear()
    plain.run_playbook("audit.yml", fleet, hosts)
    assert parts == [("audit.yml", None, tuple(hosts), settings.WORKER_SILENCE.value)] and warmed == ["racked"]
