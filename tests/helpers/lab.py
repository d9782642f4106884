"""A lab brought up and driven through the fleetctl CLI, as an operator would; its campaigns read and checked through
the CLI and on the hosts: versions, steps, events, processes."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator import schemas

REPO_ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = Path(sys.executable).with_name("ansible")
FROM, TO = "550.163.01", "570.86.15"
FAST = ("--yes", "--soak", "0", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--idle-timeout", "20")
UPGRADE_STEPS = ["precheck", "probe_before", "drain", "wait_idle", "install", "activate", "verify", "probe_after",
                 "undrain"]
ROLLBACK_STEPS = ["rollback_drain", "rollback_wait_idle", "rollback_install", "rollback_activate", "rollback_verify",
                  "rollback_probe", "rollback_undrain"]


def show(lab, cid: int = 1) -> dict:
    proc = lab.fleetctl("campaign", "show", str(cid), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def driver_state(lab, host: str) -> dict:
    """What is on the host: installed NVIDIA driver packages (version, held) and the loaded module."""
    out = lab.ssh(host, "dpkg-query -W -f='${Package} ${Version} ${Status}\\n' 'nvidia-driver-*' "
                        "'nvidia-persistenced' 'nvidia-fabricmanager-*' 2>/dev/null; "
                        "echo module $(cat /sys/module/nvidia/version 2>/dev/null)").stdout
    pkgs, module = {}, None
    for line in out.splitlines():
        words = line.split()
        if words and words[0] == "module":
            module = words[1] if len(words) > 1 else None
        elif len(words) >= 5 and words[-1] == "installed":
            pkgs[words[0]] = (words[1], words[2] == "hold")
    return {"packages": pkgs, "module": module}


def assert_on(lab, host: str, version: str) -> None:
    """Exactly one driver version on HOST: every driver package at it and held, and the module running it."""
    s = driver_state(lab, host)
    drivers = {n: v for n, v in s["packages"].items() if n.startswith("nvidia-driver-")}
    assert len(drivers) == 1, (host, s)
    assert all(v.startswith(version + "-") and held for v, held in s["packages"].values()), (host, s)
    assert s["module"] == version, (host, s)


def hosts_of(doc: dict) -> dict[str, dict]:
    return {h["name"]: h for h in doc["hosts"]}


def steps_of(host: dict) -> list[str]:
    return [s["step"] for s in host["steps"]]


def write_baseline(path: Path, budget_hosts: int) -> str:
    path.write_text("schema_version: 1\nname: lab-upgrade\ngroups:\n  all:\n"
                    "    driver: {branches: ['550', '570'], held: true}\n"
                    f"    campaign: {{budget_hosts: {budget_hosts}, budget_percent: 10, fabric_wait_s: 15}}\n")
    return str(path)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL PID and everything it started (ansible-playbook, ssh): what systemd's KillMode=control-group does."""
    for _ in range(3):  # children forked while we walk the tree are caught by the next pass
        for child in reversed(descendants(pid)):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def events(lab, cid: int) -> list[dict]:
    path = Path(lab.env["FLEETCTL_HOME"]) / "campaigns" / f"{cid}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(lab, cid: int, proc: subprocess.Popen, what, within: float = 600) -> list[dict]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        seen = events(lab, cid)
        if any(what(e) for e in seen):
            return seen
        assert proc.poll() is None, f"fleetctl ended early ({proc.returncode}): {[e['event'] for e in seen]}"
        time.sleep(0.5)
    raise AssertionError(f"campaign {cid}: no such event within {within}s")


def next_campaign(lab) -> int:
    """The id the next campaign will get (each test can run alone)."""
    return len(list((Path(lab.env["FLEETCTL_HOME"]) / "campaigns").glob("*.jsonl"))) + 1


def boots(lab) -> dict[str, int]:
    rows = json.loads(lab.fleetctl("lab", "status", "--format", "json").stdout)
    return {r["name"]: r["boots"] for r in rows}


def kill_processes_mentioning(text: str) -> None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), 9)
            except OSError:
                pass


def lab_env(text: str) -> dict[str, str]:
    """The variables of `fleetctl lab env`'s `export K=V` lines."""
    return dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in text.splitlines()
                if line.startswith("export "))


@dataclass
class Fleet:
    env: dict[str, str]
    inventory: str
    workdir: Path

    def fleetctl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, cwd=REPO_ROOT, stdin=subprocess.DEVNULL)

    def audit(self, *args: str) -> tuple[int, dict]:
        proc = self.fleetctl("audit", "-i", self.inventory, "--format", "json", *args)
        assert proc.returncode in (0, 1, 3), proc.stderr
        report = json.loads(proc.stdout)
        assert schemas.first_error("audit-report", report) is None
        return proc.returncode, report

    def drift(self, *args: str) -> dict[str, dict[str, str]]:
        _, report = self.audit(*args)
        return {h["name"]: {f["control"]: f["status"] for f in h["findings"]
                            if f["status"] not in ("pass", "not_applicable")}
                for h in report["hosts"]}

    def facts(self, host: str) -> dict:
        _, report = self.audit("-l", host)
        return report["hosts"][0]["facts"]

    def inject(self, host: str, *fault: str) -> str:
        proc = self.fleetctl("lab", "inject", host, *fault, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def ssh(self, host: str, command: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        """COMMAND on HOST over SSH (STDIN: what it reads, else nothing)."""
        address = next(line.split("ansible_host=")[1].split()[0]
                       for line in Path(self.inventory).read_text().splitlines() if line.startswith(host + " "))
        lab = Path(self.env["FLEETCTL_LAB_DIR"])
        proc = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(lab / "ssh/id_ed25519"), "-o", "BatchMode=yes",
                               "-o", f"UserKnownHostsFile={lab / 'ssh/known_hosts'}", "-o", "StrictHostKeyChecking=yes",
                               "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5", f"root@{address}", command],
                              capture_output=True, text=True, timeout=120, input=stdin,
                              stdin=subprocess.DEVNULL if stdin is None else None)
        assert not check or proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def reboot(self, host: str) -> float:
        started = time.monotonic()
        proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "-i", self.inventory, host,
                               "-m", "ansible.builtin.reboot"], capture_output=True, text=True, env=self.env,
                              timeout=300, cwd=self.workdir, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stdout[-2000:]
        return time.monotonic() - started


@contextmanager
def fleetctl_lab(workdir: Path, specs: tuple[str, ...], slurm: bool = False, prometheus: bool = False):
    """`fleetctl lab up --spec ...` in WORKDIR (its own $LAB, history and SSH control dir); always torn down.
    SLURM: `--slurm`, and the handle's env carries what `fleetctl lab env` exports (SLURM_CONF), so srun, sbatch,
    sinfo and scontrol run with it talk to the lab's cluster. PROMETHEUS: `--prometheus` (the env carries
    FLEETCTL_LAB_PROMETHEUS, the server's URL)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "SLURM_"))}
    env.update(FLEETCTL_LAB_DIR=str(workdir / "lab"), FLEETCTL_HOME=str(workdir / "home"), FLEETCTL_CONFIG=os.devnull,
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(workdir / "cp"), ANSIBLE_LOCAL_TEMP=str(workdir / "tmp"))
    handle = Fleet(env, "", workdir)
    try:
        up = handle.fleetctl("lab", "up", *[a for s in specs for a in ("--spec", s)], *(["--slurm"] if slurm else []),
                             *(["--prometheus"] if prometheus else []), timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        handle.inventory = handle.fleetctl("lab", "inventory").stdout.strip()
        handle.env.update(lab_env(handle.fleetctl("lab", "env").stdout))
        yield handle
    finally:
        handle.fleetctl("lab", "down")
        kill_processes_mentioning(str(workdir / "cp"))
