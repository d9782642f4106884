"""The lab's emulated IMEX (nvidia-imex-<branch> packages: the nvidia-imex daemon and nvidia-imex-ctl) without
namespaces: each tray a fake root with the package unpacked, its daemon on an address of its own (127.0.0.x), the
domain as `nvidia-imex-ctl -N -j` reports it (docs/lab.md: NVLink domains and IMEX)."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fleetctl_lab import packages

from tests.helpers.emu import MISSING, deb, dpkg_deb

pytestmark = pytest.mark.skipif(bool(MISSING), reason="building the lab packages needs %s" % ", ".join(MISSING))
OLD, NEW = "570.86.15", "580.95.05"
PORT = 40000 + os.getpid() % 10000  # the server port; the command service one above: away from other test runs


def alive(pid):
    """PID runs (a daemon that exited stays a zombie until whoever adopted it reaps it)."""
    try:
        return Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Tray:
    """A fake root with nvidia-imex-<branch> at VERSION unpacked, the driver LOADED, and the domain's node list."""

    def __init__(self, repo, path, address, nodes, version=OLD, loaded=OLD):
        self.root, self.address = path, address
        dpkg_deb("-x", deb(repo, "nvidia-imex-%s" % version.split(".")[0], version), path)
        config = path / packages.IMEX_CONFIG
        config.write_text(config.read_text().replace("SERVER_PORT=50000", "SERVER_PORT=%d" % PORT)
                          .replace("IMEX_CMD_PORT=50005", "IMEX_CMD_PORT=%d" % (PORT + 1)))
        (path / "etc/nvidia-imex/nodes_config.cfg").write_text("".join(n + "\n" for n in nodes))
        (path / "proc/driver/nvidia").mkdir(parents=True)
        (path / "proc/driver/nvidia/version").write_text(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (lab@fleetctl)\n" % loaded)
        self.env = dict(os.environ, NVIDIA_LAB_ROOT=str(path), NVIDIA_LAB_IMEX_ADDRESS=address)

    def run(self, name, *args):
        return subprocess.run([str(self.root / "usr/bin" / name), *args], env=self.env, capture_output=True,
                              text=True, timeout=30)

    def pid(self):
        try:
            return int((self.root / "var/run/nvidia-imex/nvidia-imex.pid").read_text())
        except OSError:
            return None

    def stop(self):
        pid = self.pid()
        if pid:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)

    def domain(self, settle=lambda d: True):
        """`nvidia-imex-ctl -N -j -H` once SETTLE(domain) holds (the daemons reconnect every fraction of a second)."""
        deadline = time.monotonic() + 5
        while True:
            out = self.run("nvidia-imex-ctl", "-N", "-j", "-H")
            assert out.returncode == 0, out.stderr
            domain = json.loads(out.stdout)
            if settle(domain) or time.monotonic() > deadline:
                return domain


@pytest.fixture
def trays(repo, tmp_path):
    made = []

    def make(count=3, versions=()):
        nodes = ["127.0.0.%d" % (10 + i) for i in range(count)]
        for i, address in enumerate(nodes):
            version = versions[i] if i < len(versions) else OLD
            made.append(Tray(repo, tmp_path / ("tray%d" % i), address, nodes, version, version))
        return made
    yield make
    for tray in made:
        tray.stop()


def connections(domain):
    return [c["status"] for n in domain["nodes"].values() for c in n["connections"].values()]


def test_the_trays_of_a_domain_form_it_and_a_lost_one_shows(trays):
    a, b, c = trays(3)
    assert a.run("nvidia-imex", "--version").stdout == "IMEX version is: %s\n" % OLD
    for tray in (a, b, c):
        assert tray.run("nvidia-imex", "-c", "/etc/nvidia-imex/config.cfg").returncode == 0
    domain = a.domain(lambda d: d["status"] == "UP")
    assert domain["status"] == "UP" and sorted(domain) == ["nodes", "status", "timestamp"]
    assert [(n["status"], n["host"], n["version"]) for n in domain["nodes"].values()] == [
        ("READY", t.address, OLD) for t in (a, b, c)]
    assert set(connections(domain)) == {"CONNECTED"} and len(connections(domain)) == 9
    b.stop()  # its daemon down: UNAVAILABLE, and nobody's connection to it holds
    domain = a.domain(lambda d: d["nodes"]["0"]["connections"]["1"]["status"] == "INVALID")
    assert domain["status"] == "DEGRADED"
    assert domain["nodes"]["1"]["status"] == "UNAVAILABLE"
    assert set(c["status"] for c in domain["nodes"]["1"]["connections"].values()) == {"INVALID"}
    assert domain["nodes"]["0"]["connections"]["1"]["status"] == "INVALID"
    assert "Domain State: DEGRADED" in a.run("nvidia-imex-ctl", "-N").stdout
    assert b.run("nvidia-imex-ctl", "-q").stdout == "UNAVAILABLE\n"
    started = time.monotonic()
    assert b.run("nvidia-imex").returncode == 0  # back (a reboot): the domain re-forms within a second or two
    assert a.domain(lambda d: d["status"] == "UP")["status"] == "UP"
    assert time.monotonic() - started < 3
    for tray in (a, b, c):
        tray.stop()
    assert a.domain()["status"] == "DOWN"


def test_a_peer_on_another_version_is_not_connected(trays):
    a, b = trays(2, versions=(OLD, NEW))
    for tray in (a, b):
        assert tray.run("nvidia-imex").returncode == 0
    domain = a.domain(lambda d: d["nodes"]["0"]["connections"]["1"]["status"] != "INVALID")
    assert domain["status"] == "DEGRADED"
    assert domain["nodes"]["1"]["version"] == NEW
    assert domain["nodes"]["0"]["connections"]["1"]["status"] == "VERSION_MISMATCH"


def test_imex_refuses_a_driver_of_another_version_and_a_config_it_cannot_read(repo, tmp_path):
    tray = Tray(repo, tmp_path / "tray", "127.0.0.10", ["127.0.0.10"], OLD, loaded=NEW)
    out = tray.run("nvidia-imex")
    assert out.returncode == 1 and tray.pid() is None
    assert "NvGpu Library version %s is not matching with current GPU driver version %s" % (OLD, NEW) in out.stderr
    (tray.root / "etc/nvidia-imex/nodes_config.cfg").unlink()
    assert tray.run("nvidia-imex-ctl", "-N", "-j").returncode == 255


def test_a_planted_fault_keeps_imex_down(repo, tmp_path):
    tray = Tray(repo, tmp_path / "tray", "127.0.0.10", ["127.0.0.10"])
    hw = tray.root / "var/lib/nvidia-lab/hw"
    hw.mkdir(parents=True)
    (tray.root / "proc/sys/kernel/random").mkdir(parents=True)
    (tray.root / "proc/sys/kernel/random/boot_id").write_text("boot-2\n")
    (hw / "faults.conf").write_text("imex_down_boot=boot-2\n")  # inject imex-down --next-boot, at that boot
    out = tray.run("nvidia-imex")
    assert out.returncode == 1 and "imex-down" in out.stderr
    (tray.root / "proc/sys/kernel/random/boot_id").write_text("boot-3\n")  # the boot after: IMEX comes up
    assert tray.run("nvidia-imex").returncode == 0
    tray.stop()


def test_the_repository_has_imex_at_every_driver_version(repo):
    path, built = repo
    for version in packages.DRIVER_VERSIONS:
        package = deb(repo, "nvidia-imex-%s" % version.split(".")[0], version)
        info = dpkg_deb("--info", package)
        assert "Version: %s-%s" % (version, packages.REVISION) in info
        assert "/etc/nvidia-imex/config.cfg" in dpkg_deb("-I", package, "conffiles")
        contents = dpkg_deb("--contents", package)
        for wanted in ("nvidia-imex", "nvidia-imex-ctl"):
            assert "./usr/bin/%s\n" % wanted in contents
        assert "./lib/systemd/system/nvidia-imex.service" in contents
