#!/usr/bin/env python3
"""Audit cost as the fleet grows: `fleetctl audit` against the SSH floor and a task-per-check playbook (root).

Usage: sudo .venv/bin/python bench/audit_scale.py [--sizes 8,32,64] [--reps 2] [--driver 570.86.15]
           [--skip per-check,...] [--compare ../checkout-before]

Brings up one lab of max(sizes) H100 hosts, then for each size N (the first N hosts), in the same run and
interleaved, measures wall time and the controller's CPU seconds (user+sys of every process it waited for) of:
  floor       one `ssh host python3 -c pass` per host, all in parallel (a cold SSH connection and a Python start)
  fleetctl    `fleetctl audit -l <N hosts>` (one module call per host, pipelining, no fact gathering)
  per-check   ansible-playbook bench/playbooks/task_per_check_audit.yml: gather_facts + one task per check
  ping        ansible-playbook bench/playbooks/ping.yml: one `ansible.builtin.ping` per host, fleetctl's settings
              (pipelining, multiplexing): the least any Ansible module costs, the floor of a module-based audit
  raw         ansible-playbook bench/playbooks/raw.yml: one `ansible.builtin.raw: true` per host: ansible-playbook's
              own cost per host, no module and no Python on the host
  +mitogen    `fleetctl audit` with mitogen's strategy, when `import ansible_mitogen` works (pip install mitogen)
  +2nodes     `fleetctl audit` through two execution nodes (config execution_nodes): two local `ansible-runner
              worker`s, each serving half the hosts
  @NAME       with --compare DIR: `fleetctl audit` from the checkout DIR (named by its last part), e.g. the code before
              a change, alternated with this checkout's in the same lab
Every run starts cold: a fresh SSH control directory, its masters told to exit afterwards. The lab's hosts share this
machine's cores with the controller, so the figures include their sshd and Python time on the same CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "lab"))  # the lab distribution (lab/fleetctl_lab), also when not installed

import ssh_masters  # noqa: E402 - bench/ssh_masters.py, beside this script
from fleetctl_lab import state  # noqa: E402
from orchestrator.fleet.runner import ANSIBLE_ENV  # noqa: E402

FLEETCTL = [sys.executable, "-m", "orchestrator.cli"]
PER_CHECK_PLAYBOOK = REPO / "bench" / "playbooks" / "task_per_check_audit.yml"
PING_PLAYBOOK = REPO / "bench" / "playbooks" / "ping.yml"
RAW_PLAYBOOK = REPO / "bench" / "playbooks" / "raw.yml"


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(start, workdir: Path) -> tuple[float, float]:
    """Wall and controller CPU seconds of START(env) -> list of Popen, with a fresh SSH control directory."""
    control = Path(tempfile.mkdtemp(prefix="cp-", dir=workdir))
    env = dict(os.environ, ANSIBLE_SSH_CONTROL_PATH_DIR=str(control))
    cpu0, t0 = cpu_of_children(), time.perf_counter()
    procs = start(env)
    for p in procs:
        p.wait()
        if p.returncode not in (0, 1, 3):  # 3: a host unreachable, named by check_audit
            raise SystemExit(f"{p.args[:4]}... exited {p.returncode}: {p.stderr.read()[-400:] if p.stderr else ''}")
    wall, cpu = time.perf_counter() - t0, cpu_of_children() - cpu0
    ssh_masters.close(control)
    shutil.rmtree(control, ignore_errors=True)
    return wall, cpu


def floor(lab: state.Lab, hosts: list[state.HostRecord]):
    def start(env):
        return [subprocess.Popen(["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={lab.known_hosts}",
                                  "-o", "IdentitiesOnly=yes", "-i", str(lab.client_key), f"root@{h.address}",
                                  "python3", "-c", "pass"], stdin=subprocess.DEVNULL, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for h in hosts]
    return start


def fleetctl_audit(lab: state.Lab, hosts: list[state.HostRecord], home: Path, extra_env: dict[str, str],
                   checkout: Path = REPO):
    def start(env):
        env = dict(env, FLEETCTL_HOME=str(home), **extra_env)
        if checkout != REPO:
            env["PYTHONPATH"] = str(checkout)
        return [subprocess.Popen(FLEETCTL + ["audit", "-i", str(lab.inventory), "-l", ",".join(h.name for h in hosts),
                                             "--format", "json", "-o", str(home / "last.json")],
                                 env=env, cwd=checkout, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)]
    return start


def playbook(lab: state.Lab, hosts: list[state.HostRecord], path: Path):
    def start(env):
        env = dict(env, **{k: v for k, v in ANSIBLE_ENV.items() if k != "ANSIBLE_GATHERING"})
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return [subprocess.Popen(["ansible-playbook", "-i", str(lab.inventory), "-l",
                                  ",".join(h.name for h in hosts), "-f", str(len(hosts)), str(path)],
                                 env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)]
    return start


def mitogen_env() -> dict[str, str] | None:
    try:
        import ansible_mitogen
    except ImportError:
        return None
    strategy = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(strategy), "ANSIBLE_STRATEGY": "mitogen_linear"}


def two_nodes(hosts: list[state.HostRecord], workdir: Path) -> dict[str, str]:
    """The environment of a config file whose two execution nodes, local workers, each serve half of HOSTS."""
    halves = [hosts[:len(hosts) // 2], hosts[len(hosts) // 2:]]
    worker = f"{Path(sys.executable).parent / 'ansible-runner'} worker"
    nodes = [{"name": f"node{i}", "worker": worker, "hosts": [h.name for h in half]}
             for i, half in enumerate(halves, 1)]
    config = workdir / f"two-nodes-{len(hosts)}.yml"
    config.write_text(json.dumps({"execution_nodes": nodes}))
    return {"FLEETCTL_CONFIG": str(config)}


def check_audit(home: Path, n: int) -> None:
    report = json.loads((home / "last.json").read_text())
    reached = sum(1 for h in report["hosts"] if h["reachable"] and not h["error"])
    if reached != n:
        errors = {h["name"]: h["error"] for h in report["hosts"] if h["error"]}
        raise SystemExit(f"audit reached {reached} of {n} hosts: {list(errors.items())[:3]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,32,64")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--driver", default="570.86.15")
    parser.add_argument("--skip", default="", help="methods to leave out, e.g. per-check (the slow one)")
    parser.add_argument("--compare", type=Path, help="a checkout whose `fleetctl audit` runs too (method @NAME)")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    mitogen = mitogen_env()
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-") as tmp:
        work = Path(tmp)
        (work / "home").mkdir()
        env = dict(os.environ, FLEETCTL_LAB_DIR=str(work / "lab"))
        t0 = time.perf_counter()
        up = subprocess.run(FLEETCTL + ["lab", "up", "--spec", f"{sizes[-1]}xh100-sxm@{args.driver}"], env=env,
                            cwd=REPO, capture_output=True, text=True)
        try:
            if up.returncode != 0:
                raise SystemExit(f"lab up failed: {up.stderr.strip()}")
            print(f"lab up: {sizes[-1]} hosts with driver {args.driver} in {time.perf_counter() - t0:.1f} s")
            lab = state.load(work / "lab")
            results: dict[tuple[int, str], list[tuple[float, float]]] = {}
            for n in sizes:
                hosts = lab.hosts[:n]
                methods = {"floor": floor(lab, hosts),
                           "fleetctl": fleetctl_audit(lab, hosts, work / "home", {}),
                           "raw": playbook(lab, hosts, RAW_PLAYBOOK),
                           "ping": playbook(lab, hosts, PING_PLAYBOOK),
                           "per-check": playbook(lab, hosts, PER_CHECK_PLAYBOOK)}
                if mitogen:
                    methods["fleetctl+mitogen"] = fleetctl_audit(lab, hosts, work / "home", mitogen)
                methods["fleetctl+2nodes"] = fleetctl_audit(lab, hosts, work / "home", two_nodes(hosts, work))
                if args.compare:
                    methods["@" + args.compare.resolve().name] = fleetctl_audit(lab, hosts, work / "home", {},
                                                                                 args.compare.resolve())
                for name in args.skip.split(","):
                    methods.pop(name, None)
                for _ in range(args.reps):
                    for name, start in methods.items():
                        results.setdefault((n, name), []).append(measured(start, work))
                        if name.startswith(("fleetctl", "@")):
                            check_audit(work / "home", n)
            report(sizes, results, [name for name in methods])
        finally:
            subprocess.run(FLEETCTL + ["lab", "down"], env=env, cwd=REPO, capture_output=True)


def report(sizes: list[int], results, names: list[str]) -> None:
    with_mitogen = "fleetctl+mitogen" in names
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in results.items()}
    print(f"\n{'hosts':>5} {'method':<17} {'wall s':>8} {'CPU s':>8} {'CPU s/host':>10} {'x floor':>8} {'x ping':>7} "
          f"{'per-check / this':>16}")
    for n in sizes:
        for name in names:
            wall, cpu = med[(n, name)]
            print(f"{n:>5} {name:<17} {wall:>8.2f} {cpu:>8.2f} {cpu / n:>10.3f} {wall / med[(n, 'floor')][0]:>8.2f} "
                  + (f"{wall / med[(n, 'ping')][0]:>7.2f} " if (n, "ping") in med else f"{'-':>7} ")
                  + (f"{med[(n, 'per-check')][0] / wall:>16.2f}" if (n, "per-check") in med else f"{'-':>16}"))
    if len(sizes) > 1:
        print("\ngrowth from the smallest to the largest fleet (seconds per added host):")
        lo, hi = sizes[0], sizes[-1]
        for name in names:
            slope_wall = (med[(hi, name)][0] - med[(lo, name)][0]) / (hi - lo)
            slope_cpu = (med[(hi, name)][1] - med[(lo, name)][1]) / (hi - lo)
            print(f"  {name:<17} wall +{slope_wall:.3f} s/host, controller CPU +{slope_cpu:.3f} s/host")
    if not with_mitogen:
        print("\nmitogen: not installed (pip install mitogen) - not measured")


if __name__ == "__main__":
    main()
