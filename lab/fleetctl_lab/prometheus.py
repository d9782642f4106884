"""The lab's Prometheus: `fleetctl lab up --prometheus`, `fleetctl lab prometheus stop|start` (docs/lab.md).

Debian's prometheus (/usr/bin/prometheus) runs on the controller's side (the root network namespace), listening on
127.0.0.1 at a port chosen free at `up` and recorded in lab.json (the same port after a stop and a start), and
scrapes every lab host's DCGM exporter (exporter.py, on the host's address, port 9400) every SCRAPE_INTERVAL, each
host's series labelled instance=<host name>. Its configuration, storage (kept across a stop and a start) and log are
in $LAB/prometheus; its command line names $LAB, so `lab down` (and the lab tests' leftover checks) find it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from orchestrator.errors import OperationError
from . import state
from .exporter import PORT as EXPORTER_PORT

PROGRAM = "/usr/bin/prometheus"
PACKAGE = "prometheus"
JOB = "dcgm"
SCRAPE_INTERVAL, SCRAPE_TIMEOUT = "2s", "1s"  # short, so a test sees a change within seconds
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0  # it writes its head block's checkpoint on SIGTERM


class PrometheusError(OperationError):
    """The lab's Prometheus could not be started or stopped: one line."""


def home(lab_dir: Path) -> Path:
    return lab_dir / "prometheus"


def config_path(lab_dir: Path) -> Path:
    return home(lab_dir) / "prometheus.yml"


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def free_port() -> int:
    """A localhost TCP port nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def targets(lab: state.Lab) -> dict[str, str]:
    """Host name -> its exporter's address:port."""
    return {h.name: f"{h.address}:{EXPORTER_PORT}" for h in lab.hosts}


def scrape_config(hosts: dict[str, str]) -> str:
    """prometheus.yml: one job scraping HOSTS (name -> address:port), each target's series labelled instance=name."""
    return yaml.safe_dump({
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_TIMEOUT},
        "scrape_configs": [{"job_name": JOB, "static_configs": [
            {"targets": [target], "labels": {"instance": name}} for name, target in hosts.items()]}],
    }, sort_keys=False)


def start(lab: state.Lab) -> str:
    """Start the lab's Prometheus (nothing when it runs); its URL."""
    if lab.prometheus is None:
        raise PrometheusError("this lab has no Prometheus: bring it up with `fleetctl lab up --prometheus`")
    launch(lab.dir, lab.prometheus, targets(lab))
    return url(lab.prometheus)


def launch(lab_dir: Path, port: int, hosts: dict[str, str]) -> None:
    """Prometheus for LAB_DIR on 127.0.0.1:PORT scraping HOSTS, detached; returns once it answers /-/ready."""
    if pids(lab_dir):
        return
    if not os.path.exists(PROGRAM):
        raise PrometheusError(f"the lab's Prometheus needs {PROGRAM}: apt-get install {PACKAGE}")
    directory = home(lab_dir)
    (directory / "data").mkdir(parents=True, exist_ok=True)
    config_path(lab_dir).write_text(scrape_config(hosts))
    log = directory / "prometheus.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([PROGRAM, f"--config.file={config_path(lab_dir)}",
                                 f"--storage.tsdb.path={directory / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                cwd=directory, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    (directory / "prometheus.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(lab_dir)
            last = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise PrometheusError(f"the lab's Prometheus did not start on 127.0.0.1:{port}: {last[-200:]} "
                                  f"(log: {log})")
        time.sleep(0.2)


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(url(port) + "/-/ready", timeout=2) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


def pids(lab_dir: Path) -> list[int]:
    """The live prometheus processes of the lab in LAB_DIR (their command line names its configuration)."""
    needle = f"--config.file={config_path(lab_dir)}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            zombie = (entry / "stat").read_text().rsplit(")", 1)[1].startswith(" Z")
        except OSError:
            continue
        if needle in argv and not zombie:
            found.append(int(entry.name))
    return found


def stop(lab_dir: Path) -> bool:
    """SIGTERM, then SIGKILL, the lab's Prometheus; True when one ran. Safe to repeat."""
    found = running = pids(lab_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in running:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (running := pids(lab_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not running:
            break
    (home(lab_dir) / "prometheus.pid").unlink(missing_ok=True)
    return bool(found)
