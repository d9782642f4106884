"""The lab's Slurm cluster (`fleetctl lab up --slurm`): Debian's slurmctld and munged on the controller, munged and
slurmd in every host, driven from the controller with srun, sbatch, sinfo and scontrol (root only). One lab for the
module."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.lab.conftest import fleetctl_lab
from fleetctl_lab import state

pytestmark = pytest.mark.lab

SPECS = ("2xh100-sxm/2",)
NODES = ("h100-01", "h100-02")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with fleetctl_lab(tmp_path_factory.mktemp("slurm"), SPECS, slurm=True) as handle:
        yield handle


def slurm(cluster, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A Slurm client command on the controller, with the lab's environment (SLURM_CONF)."""
    proc = subprocess.run(argv, capture_output=True, text=True, env=cluster.env, timeout=timeout,
                          stdin=subprocess.DEVNULL)
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


def test_down_leaves_nothing(cluster, leftovers):
    directory = Path(cluster.env["FLEETCTL_LAB_DIR"])
    lab = state.load(directory)
    down = cluster.fleetctl("lab", "down")
    assert down.returncode == 0, down.stderr
    assert leftovers(directory, lab) == []
