"""The lab's Slurm cluster (`fleetctl lab up --slurm`): Debian's slurmctld and munged on the controller, munged and
slurmd in every host, driven from the controller with srun, sbatch, sinfo and scontrol (root only); then fleetctl
on it: campaigns with the drains fleetctl owns (--drain-preset slurm) and `fleetctl check --slurm` as every node's
HealthCheckProgram. One lab for the module."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from orchestrator.schedulers import slurmctl as slurm_mod
from orchestrator.history.timefmt import parse
from tests.helpers.lab import FROM, REPO_ROOT, TO, assert_on, driver_state, fleetctl_lab, hosts_of, show, write_baseline
from fleetctl_lab import state

pytestmark = pytest.mark.lab

SPECS = (f"5xh100-sxm/2@{FROM}",)
NODES = ("h100-01", "h100-02", "h100-03", "h100-04", "h100-05")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with fleetctl_lab(tmp_path_factory.mktemp("slurm"), SPECS, slurm=True) as handle:
        yield handle


def slurm(cluster, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A Slurm client command on the controller, with the lab's environment (SLURM_CONF), run from / : a job's working
    directory (and its default output file) is the submitter's, and a checkout under /tmp does not exist on a lab
    host (its /tmp is its own)."""
    proc = subprocess.run(argv, capture_output=True, text=True, env=cluster.env, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd="/")
    assert proc.returncode == 0, f"{' '.join(argv)}: rc={proc.returncode}\n{proc.stdout}{proc.stderr}"
    return proc


def nodes(cluster) -> dict[str, tuple[str, str]]:
    """Each node's (state, GRES) as sinfo shows them."""
    out = slurm(cluster, "sinfo", "--noheader", "--Node", "--format=%N %T %G").stdout
    return {name: (node_state, gres) for name, node_state, gres in (line.split() for line in out.splitlines())}


def wait_until(predicate, timeout: float, what: str, seen=None):
    """PREDICATE's first true value within TIMEOUT s; else fail saying WHAT, and what SEEN() shows then."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}" + (f" ({seen()})" if seen else "")
        time.sleep(0.5)
    return value


def test_nodes_register_idle_with_their_gpus(cluster):
    assert cluster.env["SLURM_CONF"] == str(Path(cluster.env["FLEETCTL_LAB_DIR"]) / "slurm" / "slurm.conf")
    wait_until(lambda: nodes(cluster) == {n: ("idle", "gpu:2") for n in NODES}, 60, "every node idle with gpu:2",
               lambda: nodes(cluster))
    conf = Path(cluster.env["SLURM_CONF"]).read_text()
    assert cluster.ssh("h100-01", "cat /etc/slurm/slurm.conf").stdout == conf  # one text for all


def test_srun_runs_on_the_named_node(cluster):
    for node in NODES:
        assert slurm(cluster, "srun", "-N1", "-w", node, "hostname").stdout.strip() == node
    step = slurm(cluster, "srun", "-w", "h100-02", "--gpus=2", "sh", "-c",
                 "echo $SLURM_STEP_GPUS $CUDA_VISIBLE_DEVICES; stat -c %t:%T /run/nvidia-lab/dev/nvidia1").stdout
    assert step.split() == ["0,1", "0,1", "c3:1"]  # the GPUs Slurm hands out: char devices 195:<i>


def test_a_batch_job_ends_completed_in_the_job_completion_log(cluster):
    job = slurm(cluster, "sbatch", "--parsable", "-w", "h100-01", "--wrap", "sleep 5").stdout.strip()
    log = Path(cluster.env["FLEETCTL_LAB_DIR"]) / "slurm" / "jobcomp.log"
    line = wait_until(lambda: next((entry for entry in (log.read_text().splitlines() if log.exists() else [])
                                    if entry.startswith(f"JobId={job} ")), None), 60, f"job {job} in {log}")
    assert " JobState=COMPLETED " in line and " NodeList=h100-01 " in line


def test_a_rebooted_node_comes_back_idle(cluster):
    before = cluster.ssh("h100-02", "cat /proc/sys/kernel/random/boot_id").stdout
    cluster.reboot("h100-02")
    assert cluster.ssh("h100-02", "cat /proc/sys/kernel/random/boot_id").stdout != before
    wait_until(lambda: nodes(cluster)["h100-02"] == ("idle", "gpu:2"), 60, "h100-02 idle again",
               lambda: nodes(cluster))
    assert slurm(cluster, "srun", "-w", "h100-02", "hostname").stdout.strip() == "h100-02"


# ---- fleetctl on the cluster: drains fleetctl owns (--drain-preset slurm) --------------------------------------

CAMPAIGN = ("--yes", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--drain-preset", "slurm",
            "--waves", "1,100%")


def in_service(cluster, name: str) -> tuple[str, bool, str | None]:
    """What an operator and fleetctl set of node NAME: (base state, drained or draining, reason); not the flags
    Slurm sets on its own (NOT_RESPONDING between two pings of a busy controller)."""
    node = slurm_mod.parse_nodes(slurm(cluster, "sinfo", "--json").stdout)[name]
    return node.base, node.drained_or_draining, node.reason


def job_states(cluster) -> dict[str, str]:
    """job id -> end state, from the job completion log."""
    log = Path(cluster.env["FLEETCTL_LAB_DIR"]) / "slurm" / "jobcomp.log"
    return {j["id"]: j["state"] for j in slurm_mod.parse_jobcomp(log.read_text() if log.exists() else "")}


def submit(cluster, node: str, command: str) -> str:
    return slurm(cluster, "sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", command).stdout.strip()


@contextmanager
def watching(cluster) -> Iterator[list[slurm_mod.Node]]:
    """Every node as slurmctld shows it, every 0.3 s while the block runs (what an operator's `sinfo` saw)."""
    seen: list[slurm_mod.Node] = []
    done = threading.Event()

    def look():
        while not done.wait(0.3):
            proc = subprocess.run(["sinfo", "--json"], capture_output=True, text=True, env=cluster.env, timeout=30)
            if proc.returncode == 0:
                seen.extend(slurm_mod.parse_nodes(proc.stdout).values())
    watcher = threading.Thread(target=look, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def boot_time(cluster, name: str) -> datetime:
    """When slurmctld says node NAME last booted (slurmd's uptime at its registration)."""
    line = slurm(cluster, "scontrol", "-o", "show", "node", name).stdout
    return datetime.fromisoformat(line.split(" BootTime=")[1].split()[0]).astimezone(timezone.utc)


def test_an_admins_drain_is_left_and_each_node_moves_as_its_own_job_ends(cluster, tmp_path):
    """One wave of four busy nodes (jobs of 20, 60, 120 and 180 s) and one an admin drained: each busy node is
    upgraded and back in service as soon as its own job has ended, none killed, and what it cost is recorded. Each
    reboot goes through Slurm (scontrol reboot), and the node stays out of service until fleetctl resumes it."""
    baseline = write_baseline(tmp_path / "b.yml", 1)
    slurm(cluster, "scontrol", "update", "nodename=h100-03", "state=drain", "reason=RMA: GPU 3 ECC (ticket 4411)")
    lengths = {"h100-01": 20, "h100-02": 60, "h100-04": 120, "h100-05": 180}
    jobs = {node: submit(cluster, node, f"sleep {s}") for node, s in lengths.items()}
    wait_until(lambda: all(in_service(cluster, n)[0] in ("ALLOCATED", "MIXED") for n in lengths), 60,
               "the jobs running", lambda: {n: in_service(cluster, n) for n in lengths})
    try:
        with watching(cluster) as seen:
            proc = cluster.fleetctl("upgrade", "--to", TO, "-i", cluster.inventory, "-b", baseline, *CAMPAIGN[:-2],
                                    "--waves", "100%", "--soak", "0", timeout=900)
        doc = show(cluster, 1)
        assert proc.returncode == 1, proc.stdout + proc.stderr  # done, and a host left out at plan: off the target
        # left out at plan with the admin's state and reason, and left as it was
        (excluded,) = doc["plan"]["excluded"]
        assert (excluded["name"], excluded["code"]) == ("h100-03", "drained_elsewhere")
        assert "IDLE+DRAIN (RMA: GPU 3 ECC (ticket 4411))" in excluded["reason"]
        assert in_service(cluster, "h100-03") == ("IDLE", True, "RMA: GPU 3 ECC (ticket 4411)")
        assert_on(cluster, "h100-03", FROM)
        # every job ran to its end (COMPLETED, never killed by a reboot)
        ended = {j["id"]: j for j in slurm_mod.parse_jobcomp(
            (Path(cluster.env["FLEETCTL_LAB_DIR"]) / "slurm" / "jobcomp.log").read_text())}
        assert {n: ended[j]["state"] for n, j in jobs.items()} == {n: "COMPLETED" for n in lengths}
        hosts = hosts_of(doc)
        steps = {n: {s["step"]: s for s in hosts[n]["steps"]} for n in lengths}
        assert steps["h100-01"]["drain"]["detail"]["slurm"]["reason"] == f"fleetctl campaign 1: {FROM} -> {TO}"
        assert steps["h100-05"]["drain"]["detail"]["slurm"]["before"]["state"] in ("ALLOCATED", "MIXED")
        # the node whose job ended first was upgraded, verified and back in service before the longest job ended
        back = parse(steps["h100-01"]["undrain"]["finished_at"])
        assert steps["h100-01"]["verify"]["status"] == "ok" and back < ended[jobs["h100-05"]]["end"], \
            (back, ended[jobs["h100-05"]]["end"])
        for n in lengths:  # and no node's install began before its own job had ended
            assert parse(steps[n]["install"]["started_at"]) >= ended[jobs[n]]["end"], n
        # what each node cost: drained while its job ran (busy), drained and idle (the waste), in change
        passes = {p["host"]: p for p in doc["capacity"]["passes"]}
        assert passes["h100-05"]["busy_s"] > passes["h100-01"]["busy_s"] + 60
        assert all(passes[n]["idle_s"] < 60 and passes[n]["change_s"] > 0 for n in lengths), passes
        text = " ".join(cluster.fleetctl("campaign", "show", "1").stdout.split())  # as a terminal wraps it
        assert "capacity in all: busy" in text and "(4 hosts, a node each)" in text, text
        # each node's reboot was Slurm's: slurmctld issued it with the campaign's reason, the node booted after its
        # own job (its BootTime, from the new boot's slurmd: the reboot completed), and no job was let onto it before
        # the resume. (The sinfo looks, 0.3 s apart under CI's load, may miss the seconds between the reboot's
        # completion and the resume: "reboot complete" is asserted for some node, a reboot asked of Slurm for each.)
        ours = f"fleetctl campaign 1: {FROM} -> {TO}"
        for n in lengths:
            states = [s for s in seen if s.name == n and (s.reason or "").startswith(ours)]
            assert any("FAIL" in s.flags and ({"REBOOT_REQUESTED", "REBOOT_ISSUED"} & s.flags
                                               or s.reason.endswith(": reboot complete")) for s in states), \
                (n, {(s.state, s.reason) for s in states})
            assert all(s.drained_or_draining for s in states), (n, {(s.state, s.reason) for s in states})
            assert boot_time(cluster, n) >= ended[jobs[n]]["end"] - timedelta(seconds=1), n
        assert any(s.reason == f"{ours} : reboot issued : reboot complete" and "FAIL" in s.flags for s in seen), \
            {(s.name, s.state, s.reason) for s in seen if (s.reason or "").startswith(ours)}
        # every node fleetctl drained is in service again, on the target
        for name in lengths:
            assert in_service(cluster, name) == ("IDLE", False, None)
            assert_on(cluster, name, TO)
    finally:
        slurm(cluster, "scontrol", "update", "nodename=h100-03", "state=resume")


def test_a_job_failing_on_the_canary_during_the_soak_rolls_it_back_and_every_node_is_as_it_was(cluster, tmp_path):
    baseline = write_baseline(tmp_path / "b.yml", 1)
    before = {n: in_service(cluster, n) for n in NODES}
    on = driver_state(cluster, "h100-01")["module"]
    target = FROM if on == TO else TO
    cid = 1 + len(list((Path(cluster.env["FLEETCTL_HOME"]) / "campaigns").glob("*.jsonl")))  # the next campaign
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "upgrade", "--to", target, "-i",
                             cluster.inventory, "-b", baseline, *CAMPAIGN, "--soak", "10m", "--soak-interval", "5",
                             "--idle-timeout", "60"], env=cluster.env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: cluster.fleetctl("campaign", "show", str(cid)).returncode == 0
                   and show(cluster, cid)["campaign"]["state"] == "soaking", 300, "the soak after the canary wave")
        job = submit(cluster, "h100-01", "exit 3")
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 4, out[-3000:]  # rolled back
    assert job_states(cluster)[job] == "FAILED"
    doc = show(cluster, cid)
    hosts = hosts_of(doc)
    assert hosts["h100-01"]["state"] == "rolled_back"
    assert f"Slurm job {job} (wrap) ended FAILED, exit 3:0" in doc["campaign"]["reason"], doc["campaign"]["reason"]
    assert hosts["h100-02"]["state"] == "not_started" and hosts["h100-02"]["steps"] == []
    # the rollback drained and resumed the canary's node with the campaign's own reason; no node is changed
    steps = {s["step"]: s for s in hosts["h100-01"]["steps"]}
    assert steps["rollback_drain"]["detail"]["slurm"]["reason"] == \
        f"fleetctl campaign {cid}: {target} -> {on} (rollback)"
    assert steps["rollback_undrain"]["detail"]["slurm"]["resumed"] is True
    assert {n: in_service(cluster, n) for n in NODES} == before
    assert_on(cluster, "h100-01", on)


def reservations(cluster, cid: int) -> dict[str, slurm_mod.Reservation]:
    """Campaign CID's reservations as Slurm holds them."""
    held = slurm_mod.parse_reservations(slurm(cluster, "scontrol", "-o", "show", "reservation").stdout)
    return {name: r for name, r in held.items() if name.startswith(f"fleetctl-c{cid}-")}


def test_reservation_mode_holds_the_next_wave_while_the_canary_soaks_and_lets_go_after_a_crash_and_an_abort(
        cluster, tmp_path):
    baseline = write_baseline(tmp_path / "b.yml", 1)
    target = FROM if driver_state(cluster, "h100-01")["module"] == TO else TO
    cid = 1 + len(list((Path(cluster.env["FLEETCTL_HOME"]) / "campaigns").glob("*.jsonl")))  # the next campaign
    argv = [sys.executable, "-m", "orchestrator.cli", "upgrade", "--to", target, "-i", cluster.inventory, "-l",
            "h100-01,h100-02,h100-03", "-b", baseline, *CAMPAIGN, "--drain-mode", "reservation", "--rollback-scope",
            "wave", "--soak", "30s", "--soak-interval", "1h"]
    started = []

    def start(*extra: str) -> subprocess.Popen:
        started.append(subprocess.Popen([*argv, *extra], env=cluster.env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL))
        return started[-1]
    slurm(cluster, "scontrol", "create", "reservation", "reservationname=rma-ticket-4411", "starttime=now",
          "duration=30", "nodes=h100-03", "users=root", "flags=maint")  # an operator's: h100-03 is left out
    try:
        proc = start("--lead", "5s")
        wait_until(lambda: cluster.fleetctl("campaign", "show", str(cid)).returncode == 0
                   and show(cluster, cid)["campaign"]["state"] == "soaking", 300, "the soak after the canary wave")
        doc = show(cluster, cid)
        assert [[h["name"] for h in w["hosts"]] for w in doc["plan"]["waves"]] == [["h100-01"], ["h100-02"]]
        canary = {s["step"]: s for s in hosts_of(doc)["h100-01"]["steps"]}
        assert parse(canary["drain"]["started_at"]) >= parse(doc["campaign"]["created_at"]) + timedelta(seconds=5)
        # while the canary soaks, wave 2's node is held from when its drain is due: the soak's end plus what the
        # canary's checks before its drain took
        (held,) = reservations(cluster, cid).values()
        assert (held.name, held.nodelist, held.state) == (f"fleetctl-c{cid}-w2", "h100-02", "INACTIVE")
        assert {"MAINT", "IGNORE_JOBS"} <= held.flags
        checks = sum((parse(canary[s]["finished_at"]) - parse(canary[s]["started_at"])
                      for s in ("precheck", "probe_before")), timedelta())
        assert abs(datetime.fromisoformat(held.start).astimezone(timezone.utc) - parse(doc["soak"]["until"])
                   - checks) <= timedelta(seconds=1)
        # a job that would still run then does not start on it, and squeue says why
        job = slurm(cluster, "sbatch", "--parsable", "-w", "h100-02", "--time=10", "-o", "/dev/null", "--wrap",
                    "sleep 1").stdout.strip()
        pending = lambda: slurm(cluster, "squeue", "-h", "-j", job, "-o", "%T|%r").stdout.strip()  # noqa: E731
        wait_until(lambda: "reserved" in pending(), 30, f"job {job} pending for the reservation", pending)
        assert pending() == "PENDING|ReqNodeNotAvail, May be reserved for other job"
        slurm(cluster, "scancel", job)
        # an admin drains that node meanwhile; then the campaign's process dies: its reservation outlives it
        slurm(cluster, "scontrol", "update", "nodename=h100-02", "state=drain", "reason=IB cable flapping")
        proc.kill()
        proc.wait()
        assert list(reservations(cluster, cid)) == [f"fleetctl-c{cid}-w2"]
        # resumed, the campaign takes its reservation up again, leaves the admin's node (wave 2 fails: rolled back,
        # nothing changed in it) and lets the reservation go; the operator's is never touched
        resumed = cluster.fleetctl("campaign", "resume", str(cid), timeout=300)
        assert resumed.returncode == 4, resumed.stdout[-3000:] + resumed.stderr
        assert "taken out of service in Slurm since the plan" in hosts_of(show(cluster, cid))["h100-02"]["reason"]
        assert reservations(cluster, cid) == {}
        assert in_service(cluster, "h100-02") == ("IDLE", True, "IB cable flapping")
        slurm(cluster, "scontrol", "update", "nodename=h100-02", "state=resume")
        # an abort while the next campaign waits for its canary's reservation lets that one go too
        proc = start("--lead", "10m")
        (held,) = wait_until(lambda: reservations(cluster, cid + 1).values(), 120, "the canary's reservation")
        assert (held.name, held.nodelist, held.state) == (f"fleetctl-c{cid + 1}-w1", "h100-02", "INACTIVE")
        aborted = cluster.fleetctl("campaign", "abort", str(cid + 1))
        assert aborted.returncode == 0 and "abort requested" in aborted.stdout, aborted.stdout + aborted.stderr
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 5, out[-3000:]
        assert reservations(cluster, cid + 1) == {}
        assert all(s["step"] in ("precheck", "probe_before") for h in show(cluster, cid + 1)["hosts"]
                   for s in h["steps"])  # nothing was touched: the canary's checks ran while it waited
        assert slurm_mod.parse_reservations(slurm(cluster, "scontrol", "-o", "show", "reservation").stdout)[
            "rma-ticket-4411"].nodelist == "h100-03"
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run(["scontrol", "update", "nodename=h100-02", "state=resume"], env=cluster.env,
                       capture_output=True, timeout=30)  # refused when it is in service already
        slurm(cluster, "scontrol", "delete", "reservationname=rma-ticket-4411")


# ---- Slurm runs fleetctl: `fleetctl check --slurm` as the HealthCheckProgram ------------------------------------

CHECK_PACKAGES = ("attr", "attrs", "click", "idna", "jsonschema", "jsonschema_specifications", "pynvml.py",
                  "referencing", "rpds", "typing_extensions.py", "yaml")  # what `fleetctl check` imports


def install_check(cluster, node: str) -> None:
    """fleetctl's code (orchestrator, schemas, the collection) and the packages `fleetctl check` imports, from this
    checkout and its venv, into NODE's /opt/fleetctl, for the node's own python3: as a node carries fleetctl, and
    whatever the lab host sees of the controller's disks (its root is an overlay of the machine's root filesystem
    only, with its own /tmp)."""
    site = Path(yaml.__file__).resolve().parents[1]
    skip = lambda info: None if "__pycache__" in info.name or "/tests/output" in info.name else info  # noqa: E731
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name in ("orchestrator", "schemas", "collections"):
            tar.add(REPO_ROOT / name, arcname=f"repo/{name}", filter=skip)
        for name in CHECK_PACKAGES:
            tar.add(site / name, arcname=f"site/{name}", filter=skip)
    cluster.ssh(node, "rm -rf /opt/fleetctl && mkdir -p /opt/fleetctl && base64 -d | tar xz -C /opt/fleetctl",
                stdin=base64.b64encode(data.getvalue()).decode())


def test_fleetctl_check_as_health_check_drains_a_faulty_node_resumes_it_fixed_and_leaves_an_admins_drain(cluster,
                                                                                                          tmp_path):
    write_baseline(tmp_path / "b.yml", 1)
    program = ("#!/bin/sh\n# slurmd's HealthCheckProgram: fleetctl's controls on this node, NHC's drain rules\n"
               "exec env PYTHONPATH=/opt/fleetctl/repo:/opt/fleetctl/site python3 -m orchestrator.cli check --slurm "
               "-b /etc/fleetctl/baseline.yml >> /var/log/fleetctl-check.log 2>&1\n")
    for node in ("h100-01", "h100-02"):
        install_check(cluster, node)
        cluster.ssh(node, f"mkdir -p /etc/fleetctl && cat > /etc/fleetctl/baseline.yml <<'EOF'\n"
                          f"{(tmp_path / 'b.yml').read_text()}EOF\ncat > /etc/slurm/health-check.new <<'EOF'\n"
                          f"{program}EOF\nchmod 755 /etc/slurm/health-check.new && "
                          "mv /etc/slurm/health-check.new /etc/slurm/health-check")
    slurm(cluster, "scontrol", "update", "nodename=h100-01", "state=drain", "reason=IB cable flapping")
    try:
        cluster.inject("h100-02", "ecc", "--volatile", "2")
        wait_until(lambda: (in_service(cluster, "h100-02")[2] or "").startswith("fleetctl check: gpu.ecc_errors: "),
                   90, "h100-02 drained by its health check", lambda: in_service(cluster, "h100-02"))
        assert in_service(cluster, "h100-02")[:2] == ("IDLE", True)
        cluster.inject("h100-02", "ecc", "--volatile", "0", "--aggregate", "0")
        wait_until(lambda: in_service(cluster, "h100-02") == ("IDLE", False, None), 90, "h100-02 resumed once healthy",
                   lambda: in_service(cluster, "h100-02"))
        # the admin's drain outlived every health check on its (healthy) node
        ran = cluster.ssh("h100-01", "grep -c 'h100-01: healthy' /var/log/fleetctl-check.log").stdout.strip()
        assert int(ran) >= 2, ran
        assert in_service(cluster, "h100-01") == ("IDLE", True, "IB cable flapping")
    finally:
        for node in ("h100-01", "h100-02"):
            cluster.ssh(node, "printf '#!/bin/sh\\nexit 0\\n' > /etc/slurm/health-check", check=False)
        slurm(cluster, "scontrol", "update", "nodename=h100-01", "state=resume")


def test_down_leaves_nothing(cluster, leftovers):
    directory = Path(cluster.env["FLEETCTL_LAB_DIR"])
    lab = state.load(directory)
    down = cluster.fleetctl("lab", "down")
    assert down.returncode == 0, down.stderr
    assert leftovers(directory, lab) == []
