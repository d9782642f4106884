"""Several execution nodes at once (issue 37): the config file's execution_nodes each run their hosts' playbooks
through an ansible-runner worker, every node at once. Here each worker is a real `ansible-runner worker` on this
machine and the hosts are inventory names of this machine (ansible_connection=local): the findings are an in-process
audit's; a worker killed mid-run leaves its hosts unreachable, naming it, while the other node's hosts complete, and
nothing it started (its ansible-playbook is reparented when it dies) outlives fleetctl's return; a signal stops every
part, leaving nothing behind."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.fleet import execution_nodes, inventory, runner
from tests.helpers.cli import REPO, runs, tagged

RUNNER = Path(sys.executable).parent / "ansible-runner"


def lab(tmp_path: Path, slow: tuple[str, ...] = (), pause: dict[str, float] | None = None) -> Path:
    """An inventory of this machine: a1, a2 (group rack1), b1, b2 (rack2), c1 (no node's). The SLOW hosts' Python
    says it started (tmp_path/started-HOST) and waits for tmp_path/release, a minute at most; a host of PAUSE's
    sleeps its seconds first."""
    def host(name: str) -> str:
        python = tmp_path / f"python-{name}"
        python.write_text(f'#!/bin/sh\ntouch "{tmp_path}/started-{name}"\ni=0\n'
                          f'while [ ! -e "{tmp_path}/release" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n'
                          f'exec {sys.executable} "$@"\n')
        if name in (pause or {}):
            python.write_text(f'#!/bin/sh\nsleep {pause[name]}\nexec {sys.executable} "$@"\n')
        python.chmod(0o755)
        interpreter = python if name in slow or name in (pause or {}) else sys.executable
        return f"{name} ansible_connection=local ansible_python_interpreter={interpreter}"
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("\n".join(["[rack1]", host("a1"), host("a2"), "[rack2]", host("b1"), host("b2"),
                                    "[rest]", host("c1")]) + "\n")
    return inventory


def worker(tmp_path: Path, name: str) -> str:
    """A local `ansible-runner worker` keeping its job in tmp_path/NAME, its pid in tmp_path/NAME.pid."""
    script = tmp_path / f"worker-{name}"
    script.write_text(f'#!/bin/sh\necho $$ > "{tmp_path}/{name}.pid"\n'
                      f'exec {RUNNER} worker --private-data-dir "{tmp_path}/{name}"\n')
    script.chmod(0o755)
    return str(script)


def nodes(tmp_path: Path, *entries: dict, **keys: str) -> Path:
    config = tmp_path / "config.yml"
    config.write_text(json.dumps({"execution_nodes": list(entries), **keys}))  # JSON is YAML
    return config


def env(tmp_path: Path, config: Path | str = os.devnull, **more: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "FLEETCTL_WORKER"}
    return dict(out, FLEETCTL_HOME=str(tmp_path / "home"), FLEETCTL_CONFIG=str(config),
                FLEETCTL_TEST_TAG=f"{tmp_path.name}-{os.getpid()}", **more)


def audit(tmp_path: Path, inventory: Path, environment: dict[str, str], memory: int | None = None) -> subprocess.Popen:
    """fleetctl audit, in a session of its own; under an address-space limit of MEMORY bytes (and so is what it
    starts)."""
    def limit() -> None:
        os.setsid()
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "audit", "-i", str(inventory),
                             "--no-preflight", "--format", "json"], env=environment, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=limit)


def finished(proc: subprocess.Popen) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=180)
    return proc.returncode, json.loads(out) if out else {}, err


def findings(report: dict) -> dict[str, dict[str, str]]:
    return {h["name"]: {f["control"]: f["status"] for f in h["findings"]} for h in report["hosts"]}


def job(node_dir: Path) -> tuple[str, str]:
    """The --limit and --forks of the one job NODE_DIR's worker ran."""
    (command,) = node_dir.glob("artifacts/*/command")
    args = json.loads(command.read_text())["command"]
    return args[args.index("--limit") + 1], args[args.index("--forks") + 1]


def wait_for(path: Path, proc: subprocess.Popen, within: float = 90) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)


def left_running(tmp_path: Path) -> list[str]:
    """The command lines of what the audit of env(tmp_path) started that still runs, wherever it was reparented."""
    return tagged(f"{tmp_path.name}-{os.getpid()}")


def test_an_audit_through_two_execution_nodes_finds_what_an_in_process_one_finds(tmp_path):
    """Each node gets its hosts alone, with forks for them; a host two nodes serve goes to the first; a host no node
    serves goes through $FLEETCTL_WORKER as before. One run in the history."""
    inventory = lab(tmp_path)
    config = nodes(tmp_path, {"name": "rack1", "worker": worker(tmp_path, "n1"), "hosts": "rack1"},
                   {"name": "rack2", "worker": worker(tmp_path, "n2"), "hosts": ["rack2", "a*"]})
    rc, fanned, err = finished(audit(tmp_path, inventory, env(
        tmp_path, config, FLEETCTL_WORKER=f"{RUNNER} worker --private-data-dir {tmp_path / 'default'}")))
    assert rc == 1, err
    assert (job(tmp_path / "n1"), job(tmp_path / "n2"), job(tmp_path / "default")) == \
        (("a1,a2", "2"), ("b1,b2", "2"), ("c1", "1"))
    rc, in_process, err = finished(audit(tmp_path, inventory, env(tmp_path)))
    assert rc == 1, err
    assert findings(fanned) == findings(in_process) and findings(fanned)["b2"]["driver.installed"] == "fail"
    assert all(h["reachable"] and not h["error"] for h in fanned["hosts"])
    assert [(r["kind"], r["status"]) for r in runs(tmp_path / "home")] == [("audit", "done"), ("audit", "done")]


def test_a_worker_killed_mid_run_leaves_its_hosts_unreachable_and_the_other_node_completes(tmp_path):
    inventory = lab(tmp_path, slow=("b1", "b2"))
    rack2 = worker(tmp_path, "n2")
    config = nodes(tmp_path, {"name": "rack1", "worker": worker(tmp_path, "n1"), "hosts": "rack1"},
                   {"name": "rack2", "worker": rack2, "hosts": "rack2"})
    proc = audit(tmp_path, inventory, env(tmp_path, config))
    try:
        wait_for(tmp_path / "started-b1", proc)  # rack2's playbook is on its hosts
        os.kill(int((tmp_path / "n2.pid").read_text()), signal.SIGKILL)
        rc, report, err = finished(proc)
        left = left_running(tmp_path)  # the killed worker's ansible-playbook too: fleetctl stopped it
    finally:
        (tmp_path / "release").touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 3, err  # unreachable hosts, not a failed run
    errors = {h["name"]: h["error"] for h in report["hosts"]}
    assert errors == {"a1": None, "a2": None, "c1": None,
                      "b1": f"execution node rack2 ({rack2}): exited -9: no result (error)",
                      "b2": f"execution node rack2 ({rack2}): exited -9: no result (error)"}
    assert report["summary"]["unreachable"] == 2 and findings(report)["a1"]["driver.installed"] == "fail"
    assert [(r["kind"], r["status"], r["exit_code"]) for r in runs(tmp_path / "home")] == [("audit", "done", 3)]
    assert left == []


def test_what_a_killed_local_worker_started_is_stopped_before_fleetctl_returns(tmp_path, monkeypatch):
    """Its ansible-playbook, Ansible's workers and the hosts' commands (reparented when it died) are gone, and none is
    left a zombie of fleetctl's, when run_playbook returns; the other node's hosts and the in-process one complete."""
    monkeypatch.delenv("FLEETCTL_WORKER", raising=False)
    fleet = inventory.load(str(lab(tmp_path, slow=("b1", "b2"))))
    playbooks = runner.Runner(execution_nodes.RunnerConfig(execution_nodes.parse(
        [{"name": "rack1", "worker": worker(tmp_path, "n1"), "hosts": "rack1"},
         {"name": "rack2", "worker": worker(tmp_path, "n2"), "hosts": "rack2"}], "config.yml")))
    started: dict[psutil.Process, str] = {}  # what rack2's worker had started, with its command line

    def kill_rack2() -> None:
        deadline = time.monotonic() + 90
        while not (tmp_path / "started-b1").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        rack2 = psutil.Process(int((tmp_path / "n2.pid").read_text()))
        started.update((p, " ".join(p.cmdline())) for p in rack2.children(recursive=True))
        rack2.kill()

    killer = threading.Thread(target=kill_rack2)
    killer.start()
    try:
        outcomes = playbooks.run_playbook("audit.yml", fleet, [h.name for h in fleet.hosts])
        left = [command for p, command in started.items() if p.is_running()]
        zombies = [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    finally:
        killer.join()
        (tmp_path / "release").touch()
    assert any("ansible-playbook" in command for command in started.values()), started
    assert (left, zombies) == ([], [])
    assert {h: o.status for h, o in outcomes.items()} == {"a1": "ok", "a2": "ok", "b1": "unreachable",
                                                          "b2": "unreachable", "c1": "ok"}


def test_a_worker_that_cannot_start_leaves_its_hosts_unreachable(tmp_path):
    config = nodes(tmp_path, {"name": "gone", "worker": str(tmp_path / "no-such-worker"), "hosts": "rack2"})
    rc, report, err = finished(audit(tmp_path, lab(tmp_path), env(tmp_path, config)))
    assert rc == 3 and err == "", err
    assert {h["name"]: h["error"] for h in report["hosts"] if h["error"]} == {
        name: f"execution node gone ({tmp_path / 'no-such-worker'}): No such file or directory"
        for name in ("b1", "b2")}


SILENCE = 10  # these tests' worker_silence (s): each worker is asked for a keepalive every 2 s
NOTHING = r"sent nothing for 10s \(no event, no keepalive\)"
HUNG = {  # what rack2's worker does (None: a real worker, stopped once its hosts' playbook has started) -> its line
    "answers nothing": ("exec sleep 300", NOTHING),
    "trickles": ("while :; do printf x; sleep 1; done", r"sent \d+ bytes in 10s but no whole event"),
    "stops answering": (None, NOTHING),
    "prints a 3 GB line": (f"exec {sys.executable} -c 'import sys\nfor _ in range(3 << 10): "
                           f"sys.stdout.buffer.write(b\"x\" * 2 ** 20)'", r"sent a line of more than 64 MiB"),
}


def over_ssh(tmp_path: Path, name: str) -> str:
    """A local `ansible-runner worker` started as ssh starts one: given the arguments fleetctl added to its command,
    without what fleetctl put in its environment."""
    script = tmp_path / f"worker-{name}"
    script.write_text(f'#!/bin/sh\nexec env -u ANSIBLE_RUNNER_KEEPALIVE_SECONDS {RUNNER} worker '
                      f'--private-data-dir "{tmp_path}/{name}" "$@"\n')
    script.chmod(0o755)
    return str(script)


def hung(tmp_path: Path, body: str) -> str:
    script = tmp_path / "worker-hung"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("fault", HUNG)
def test_a_hung_worker_fails_only_its_hosts_and_the_audit_is_recorded(tmp_path, fault):
    """A worker that sends no whole line (an event, a status or a keepalive) for worker_silence fails its hosts with
    one line, and so does one sending a line past the bound on a line (read in bounded memory: fleetctl and what it
    starts run under a 2 GiB address-space limit), as a killed worker does: it is stopped, the other node's and the
    in-process hosts keep their results, and the run is recorded done. Where rack2's real worker stops answering,
    rack1's a1 says nothing for longer than the bound: the keepalives fleetctl asked for on its worker's command line
    (as over ssh) keep it."""
    script, said = HUNG[fault]
    inventory = lab(tmp_path, slow=("b1", "b2"), pause={"a1": SILENCE * 1.5} if script is None else None)
    rack2 = worker(tmp_path, "n2") if script is None else hung(tmp_path, script)
    config = nodes(tmp_path, {"name": "rack1", "worker": over_ssh(tmp_path, "n1"), "hosts": "rack1"},
                   {"name": "rack2", "worker": rack2, "hosts": "rack2"}, worker_silence=f"{SILENCE}s")
    proc = audit(tmp_path, inventory, env(tmp_path, config), memory=2 * 1024 ** 3)
    try:
        if script is None:
            wait_for(tmp_path / "started-b1", proc)
            os.kill(int((tmp_path / "n2.pid").read_text()), signal.SIGSTOP)
        rc, report, err = finished(proc)  # within 180 s: the test of "not for ever"
        left = left_running(tmp_path)
    finally:
        (tmp_path / "release").touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (rc, err) == (3, ""), err[-3000:]
    errors = {h["name"]: h["error"] for h in report["hosts"]}
    assert {h: errors.pop(h) for h in ("a1", "a2", "c1")} == {"a1": None, "a2": None, "c1": None}
    assert all(re.fullmatch(re.escape(f"execution node rack2 ({rack2}): ") + said, e) for e in errors.values()), errors
    assert sorted(errors) == ["b1", "b2"] and findings(report)["a1"]["driver.installed"] == "fail"
    assert [(r["kind"], r["status"], r["exit_code"]) for r in runs(tmp_path / "home")] == [("audit", "done", 3)]
    assert left == []


@pytest.mark.parametrize("signals", [(signal.SIGTERM,), (signal.SIGINT, signal.SIGINT)], ids=["once", "twice"])
def test_a_signal_stops_every_part(tmp_path, signals):
    """A second signal is raised at once: the parts are stopped before the run is recorded all the same."""
    inventory = lab(tmp_path, slow=("a1", "b1"))
    config = nodes(tmp_path, {"name": "rack1", "worker": worker(tmp_path, "n1"), "hosts": "rack1"},
                   {"name": "rack2", "worker": worker(tmp_path, "n2"), "hosts": "rack2"})
    proc = audit(tmp_path, inventory, env(tmp_path, config))
    try:
        wait_for(tmp_path / "started-a1", proc)
        wait_for(tmp_path / "started-b1", proc)
        sent = time.monotonic()
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.02)  # the second well before run_playbook looks for the first (CANCEL_POLL_S)
        rc, report, err = finished(proc)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    name = signal.Signals(signals[-1]).name
    assert (rc, err, report) == (128 + signals[-1], f"fleetctl: interrupted ({name})\n", {}) and took < 30, took
    assert [(r["kind"], r["status"]) for r in runs(tmp_path / "home")] == [("audit", "interrupted")]
    assert left_running(tmp_path) == []  # not a worker, its ansible-playbook, nor a host's Python
