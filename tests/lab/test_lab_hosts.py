"""Lab hosts end to end: real namespaces, real sshd, real Ansible (root only)."""

from __future__ import annotations

import configparser
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest

from fleetctl_lab import hosts, network
from fleetctl_lab.state import HostSpec

pytestmark = pytest.mark.lab


class TestTwoHosts:
    """One lab of two hosts (h100-sxm and l40s) for the whole class."""

    def test_hosts_answer_ssh_with_strict_host_key_checking(self, two_hosts):
        for name in ("gpu-a", "gpu-b"):
            assert two_hosts.ssh(name, "hostname").stdout.strip() == name

    def test_kernel_view_without_driver(self, two_hosts):
        out = two_hosts.ssh("gpu-a", "test ! -e /sys/module/nvidia && test -d /sys/module/nouveau && echo ok; "
                                      "ls /sys/bus/pci/devices; cat /sys/bus/pci/devices/*/vendor | sort -u; "
                                      "cat /proc/sys/kernel/random/boot_id; head -1 /dev/kmsg").stdout.split()
        assert out[0] == "ok"
        assert out[1:9] == ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0",
                            "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]
        assert out[9] == "0x10de"
        assert out[10] == next(s for s in hosts.status(two_hosts.lab.dir) if s["name"] == "gpu-a")["boot_id"]
        assert out[11:13] == ["5,0,0,-;Linux", "version"]

    def test_hardware_is_per_host(self, two_hosts):
        conf_a = two_hosts.ssh("gpu-a", "cat /var/lib/nvidia-lab/hw/gpus.conf").stdout
        conf_b = two_hosts.ssh("gpu-b", "cat /var/lib/nvidia-lab/hw/gpus.conf").stdout
        assert "count=8" in conf_a and "count=4" in conf_b and "gpu.0.name=NVIDIA L40S" in conf_b
        uuids = [line for line in (conf_a + conf_b).splitlines() if ".uuid=" in line]
        assert len({u.split("=", 1)[1] for u in uuids}) == 12

    def test_root_filesystems_are_separate(self, two_hosts):
        probe = f"/etc/fleetctl-lab-probe-{uuid.uuid4().hex[:8]}"
        two_hosts.ssh("gpu-a", f"echo a > {probe}")
        assert two_hosts.ssh("gpu-a", f"cat {probe}").stdout == "a\n"
        assert two_hosts.ssh("gpu-b", f"test -e {probe}", check=False).returncode == 1
        assert not Path(probe).exists()

    def test_root_has_its_own_home_not_the_machines(self, two_hosts):
        """A fresh Debian root's dotfiles: the machine's /root (a developer's shell start-up) is not the host's."""
        out = two_hosts.ssh("gpu-a", "ls -A /root; echo kept > /root/note").stdout.split()
        assert {".bashrc", ".profile"} <= set(out) and not set(out) & set(os.listdir("/root")) - {".bashrc", ".profile",
                                                                                              ".ansible", ".ssh"}
        assert two_hosts.ssh("gpu-a", "cat /root/note").stdout == "kept\n" and not Path("/root/note").exists()
        assert two_hosts.ssh("gpu-b", "test -e /root/note", check=False).returncode == 1

    def test_the_host_sees_only_its_own_processes_and_no_lab_secrets(self, two_hosts):
        out = two_hosts.ssh("gpu-a", "ls /proc | grep -c '^[0-9]'; "
                                      f"ls {two_hosts.lab.dir}; ls /etc/ssh/ | grep -c ssh_host_").stdout.split()
        assert int(out[0]) < 20  # the supervisor, sshd and this session: not the machine's processes
        assert out[1:] == ["repo", "2"]  # only the apt repository; one host key pair

    def test_dpkg_and_apt_work_offline_from_the_lab_repo(self, two_hosts):
        assert "ii  dpkg" in two_hosts.ssh("gpu-b", "dpkg -l dpkg").stdout
        out = two_hosts.ssh("gpu-b", "cat /etc/apt/sources.list.d/*; ls /etc/apt/sources.list 2>&1; "
                                      "apt-get update -q >/dev/null && echo updated").stdout
        assert f"deb [trusted=yes] file:{two_hosts.lab.dir}/repo ./" in out
        assert "No such file" in out and out.rstrip().endswith("updated")
        assert sum(1 for line in out.splitlines() if line.startswith("deb")) == 1

    def test_inventory_is_real_ansible_ini(self, two_hosts):
        parser = configparser.ConfigParser(allow_no_value=True, delimiters=(" ",), interpolation=None)
        parser.read(two_hosts.lab.inventory)
        assert {"h100_sxm", "l40s"} <= set(parser.sections())
        text = two_hosts.lab.inventory.read_text()
        assert f"ansible_ssh_private_key_file={two_hosts.lab.client_key}" in text
        assert "StrictHostKeyChecking" not in text
        ping = two_hosts.ansible("all", "-m", "ansible.builtin.ping")
        assert ping.returncode == 0, ping.stdout + ping.stderr

    def test_ansible_reboot_gives_a_new_boot(self, two_hosts):
        before = {s["name"]: s for s in hosts.status(two_hosts.lab.dir)}
        two_hosts.ssh("gpu-a", "echo kept > /etc/fleetctl-lab-survives-reboot")
        result = two_hosts.ansible("gpu-a", "-m", "ansible.builtin.reboot")
        assert result.returncode == 0, result.stdout + result.stderr
        after = {s["name"]: s for s in hosts.status(two_hosts.lab.dir)}
        assert after["gpu-a"]["boot_id"] != before["gpu-a"]["boot_id"] and after["gpu-a"]["running"]
        assert after["gpu-a"]["boots"] == before["gpu-a"]["boots"] + 1
        assert after["gpu-b"]["boot_id"] == before["gpu-b"]["boot_id"]
        out = two_hosts.ssh("gpu-a", "cat /etc/fleetctl-lab-survives-reboot /proc/sys/kernel/random/boot_id; "
                                      "test -d /sys/module/nouveau && echo nouveau").stdout.split()
        assert out == ["kept", after["gpu-a"]["boot_id"], "nouveau"]

    def test_the_same_lab_directory_twice_is_refused(self, two_hosts, lab_dir):
        before = {s["name"]: s["boot_id"] for s in hosts.status(two_hosts.lab.dir)}
        with pytest.raises(hosts.LabError, match="this lab directory is already up"):
            hosts.up([HostSpec("gpu-x")], two_hosts.lab.dir)
        assert not (two_hosts.lab.dir / "hosts/gpu-x").exists() and not lab_dir.exists()
        after = hosts.status(two_hosts.lab.dir)
        assert {s["name"]: s["boot_id"] for s in after} == before and all(s["running"] for s in after)

    def test_a_lab_in_another_directory_lives_beside_it(self, two_hosts, lab_dir, leftovers):
        """Another slot: its own bridge, subnet, namespaces and veths; its `down` leaves the first lab running."""
        try:
            other = hosts.up([HostSpec("gpu-a")])  # the same host name as two_hosts' first host
            assert other.slot != two_hosts.lab.slot and other.bridge != two_hosts.lab.bridge
            assert other.hosts[0].address != two_hosts.lab.hosts[0].address
            assert other.hosts[0].netns != two_hosts.lab.hosts[0].netns
            assert other.hosts[0].veth != two_hosts.lab.hosts[0].veth
            assert [s["running"] for s in hosts.status()] == [True]
            assert two_hosts.ssh("gpu-a", "hostname").stdout.strip() == "gpu-a"
        finally:
            hosts.down()
        assert leftovers(lab_dir, other) == []
        assert all(s["running"] for s in hosts.status(two_hosts.lab.dir))
        assert network.link_exists(two_hosts.lab.bridge)
        assert two_hosts.ssh("gpu-b", "hostname").stdout.strip() == "gpu-b"


def test_down_leaves_nothing_even_after_kill_9(lab_dir, leftovers):
    try:
        lab = hosts.up([HostSpec("gpu-k1"), HostSpec("gpu-k2", nouveau=False, persistence_off=True)])
        status = {s["name"]: s for s in hosts.status()}
        assert all(s["running"] for s in status.values())
        assert not status["gpu-k2"]["nouveau_loaded"] and status["gpu-k1"]["nouveau_loaded"]
        assert "gpu.0.persistence=0" in (lab_dir / "hosts/gpu-k2/hw/gpus.conf").read_text()
        os.kill(status["gpu-k1"]["supervisor_pid"], signal.SIGKILL)
        time.sleep(0.2)
        assert {s["name"]: s["running"] for s in hosts.status()} == {"gpu-k1": False, "gpu-k2": True}
    finally:
        hosts.down()
    assert leftovers(lab_dir, lab) == []
    hosts.down()  # idempotent
    assert hosts.status() == []


def test_the_next_up_clears_the_remains_of_a_lab_killed_with_its_session(tmp_path, lab_dir, leftovers, capfd,
                                                                         monkeypatch):
    """A test run killed with its machine's session leaves namespaces, veths, the bridge and its slot's claim but no
    process (its files may be gone with its tmp directory): the next `up` that takes that slot removes those remains
    rather than refusing forever. Both labs are pinned to the last slot: the lowest free slot may be another (a lab
    of the other xdist worker may come and go), and a stale lowest slot would be that lab's to reclaim."""
    dead = tmp_path / "dead-lab"
    monkeypatch.setenv("FLEETCTL_LAB_SLOT", str(network.SLOTS - 1))
    try:
        dead_lab = hosts.up([HostSpec("gpu-d1"), HostSpec("gpu-d2")], dead)
        names = network.names(dead_lab.slot)
        for pid in hosts.supervisor_pids(dead, None):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while hosts.lab_alive(dead, names) and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(dead)
        assert names.namespaces() == [names.netns("gpu-d1"), names.netns("gpu-d2")]
        lab = hosts.up([HostSpec("gpu-n1")])
        assert lab.slot == dead_lab.slot
        assert f"removed the remains of a dead lab ({names.netns('gpu-d1')}, {names.netns('gpu-d2')})" \
            in capfd.readouterr().err
        assert names.namespaces() == [names.netns("gpu-n1")]
        assert [s["running"] for s in hosts.status()] == [True]
    finally:
        hosts.down()
        hosts.down(dead)
    assert leftovers(lab_dir, lab) == [] and leftovers(dead, dead_lab) == []


def test_driver_installed_before_first_boot(lab_dir, leftovers, stub_driver_repo):
    stub_driver_repo(lab_dir / "repo", "570.86.15")
    try:
        lab = hosts.up([HostSpec("gpu-d", driver="570.86.15")])
        (status,) = hosts.status()
        assert status["module_version"] == "570.86.15" and not status["nouveau_loaded"]
        kernel = lab.host_dir("gpu-d") / "kernel"
        assert (kernel / "proc-driver/nvidia/version").read_text().startswith(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (lab@fleetctl)  ")
        assert "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build" in \
            (kernel / "kmsg").read_text()
    finally:
        hosts.down()
    assert leftovers(lab_dir, lab) == []
