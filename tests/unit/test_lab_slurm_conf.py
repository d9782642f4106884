"""The lab's Slurm cluster without root: slurm.conf and gres.conf as `fleetctl lab up --slurm` writes them, the
files in $LAB/slurm, a lab.json that remembers Slurm, and `fleetctl lab env`'s lines."""

from __future__ import annotations

import stat
from pathlib import Path

from click.testing import CliRunner

from fleetctl_lab import cli, hosts, network, slurm, state
from fleetctl_lab.state import HostSpec


def lab_in_slot(tmp_path: Path, slot: int, with_slurm: bool = True) -> state.Lab:
    specs = [HostSpec("h100-01", gpus=2), HostSpec("l40s-01", sku="l40s"), HostSpec("cpu-01", gpus=0)]
    return hosts.plan(specs, tmp_path / "lab", network.names(slot), with_slurm)


def conf_lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith(("#", "NodeName",
                                                                                                    "PartitionName")))


def test_slurm_conf_for_slot_3(tmp_path):
    cluster = hosts.slurm_cluster(lab_in_slot(tmp_path, 3))
    text = cluster.slurm_conf()
    values = conf_lines(text)
    assert values["SlurmctldHost"] == "localhost(10.216.0.1)"
    assert values["SlurmctldPort"] == "16820"  # 16817 + slot: two labs' controllers side by side
    assert values["AuthInfo"] == "socket=/run/fleetctl-lab/slurm-3/munge.socket"
    assert values["JobCompType"] == "jobcomp/filetxt"
    assert values["JobCompLoc"] == str(tmp_path / "lab/slurm/jobcomp.log")
    assert values["StateSaveLocation"] == str(tmp_path / "lab/slurm/state")
    assert values["SlurmctldPidFile"] == str(tmp_path / "lab/slurm/slurmctld.pid")
    assert values["SlurmdPidFile"] == "/run/fleetctl-lab/slurm-3/slurmd.pid"  # in the host's own /run
    assert (values["ProctrackType"], values["TaskPlugin"], values["SlurmUser"], values["ReturnToService"]) == \
        ("proctrack/linuxproc", "task/none", "root", "2")
    assert int(values["MinJobAge"]) >= 600 and int(values["SlurmdTimeout"]) <= 60
    assert "cgroup" not in text
    assert "NodeName=h100-01 NodeAddr=10.216.0.10 CPUs=1 RealMemory=1024 Gres=gpu:2 State=UNKNOWN" in text
    assert "NodeName=l40s-01 NodeAddr=10.216.0.11 CPUs=1 RealMemory=1024 Gres=gpu:4 State=UNKNOWN" in text
    assert "NodeName=cpu-01 NodeAddr=10.216.0.12 CPUs=1 RealMemory=1024 State=UNKNOWN" in text
    assert "PartitionName=gpu Nodes=h100-01,l40s-01,cpu-01 Default=YES MaxTime=INFINITE State=UP" in text
    assert cluster.gres_conf().splitlines()[1:] == [
        "NodeName=h100-01 Name=gpu Count=2 File=/run/nvidia-lab/dev/nvidia[0-1]",
        "NodeName=l40s-01 Name=gpu Count=4 File=/run/nvidia-lab/dev/nvidia[0-3]"]


def test_two_slots_never_share_a_port_or_a_socket(tmp_path):
    a, b = (hosts.slurm_cluster(lab_in_slot(tmp_path / str(n), n)) for n in (0, 1))
    assert a.port != b.port and a.socket != b.socket


def test_files_in_lab_slurm_and_the_host_records(tmp_path):
    lab = lab_in_slot(tmp_path, 0)
    cluster = hosts.slurm_cluster(lab)
    cluster.write_files()
    assert stat.S_IMODE(cluster.key.stat().st_mode) == 0o400 and len(cluster.key.read_bytes()) == 128
    assert cluster.conf.read_text() == cluster.slurm_conf()
    assert (lab.slurm_dir / "gres.conf").read_text() == cluster.gres_conf()
    state.save(lab)
    assert state.load(lab.dir).slurm is True
    plain = lab_in_slot(tmp_path / "plain", 0, with_slurm=False)
    state.save(plain)
    assert state.load(plain.dir).slurm is False


def test_lab_env_exports_slurm_conf_only_for_a_slurm_lab(tmp_path, monkeypatch):
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    for with_slurm in (True, False):
        lab = lab_in_slot(tmp_path / str(with_slurm), 0, with_slurm)
        state.save(lab)
        monkeypatch.setenv(state.LAB_ENV, str(lab.dir))
        out = CliRunner().invoke(cli.lab, ["env"]).output.splitlines()
        expected = [f"export FLEETCTL_LAB_DIR={lab.dir}"]
        if with_slurm:
            expected.append(f"export SLURM_CONF={lab.dir / 'slurm/slurm.conf'}")
        assert out == expected


def test_daemons_command_lines():
    assert slurm.slurmd_argv("h100-01") == ["/usr/sbin/slurmd", "-D", "-N", "h100-01", "-f", "/etc/slurm/slurm.conf"]
    assert slurm.munged_argv("/run/fleetctl-lab/slurm-0", "/etc/munge/munge.key", "/run/fleetctl-lab/slurm-0") == [
        "/usr/sbin/munged", "-F", "--socket=/run/fleetctl-lab/slurm-0/munge.socket",
        "--key-file=/etc/munge/munge.key", "--pid-file=/run/fleetctl-lab/slurm-0/munged.pid",
        "--seed-file=/run/fleetctl-lab/slurm-0/munged.seed"]
