"""The part every other part of a lab host uses: its directory and config, the state the controller reads, the
GPUs' hardware file, and the helpers that run commands and write files (see fleetctl_lab.host)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from ..kernel import Modules

HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_ENV = {"PATH": HOST_PATH, "LANG": "C.UTF-8", "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive"}
POLL_S = 0.1


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S ") + message, flush=True)


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip() or proc.returncode}")
    return proc


def mount(*args: str) -> None:
    run("mount", *args)


def write_in_place(path: Path, text: str) -> None:
    """Rewrite a file keeping its inode (it may be bind-mounted somewhere)."""
    with open(path, "w") as f:
        f.write(text)


def clear_dir(path: Path) -> None:
    """Empty PATH but keep the directory itself (it is bind-mounted)."""
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write PATH in the host root as a new regular file (never through a symlink into the machine's files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


class HostBase:
    """A lab host's identity, directories and state; the parts (fleetctl_lab.host) add what it does."""

    def __init__(self, hostdir: Path):
        self.dir = hostdir.resolve()
        self.config = json.loads((self.dir / "host.json").read_text())
        self.name: str = self.config["name"]
        self.address: str = self.config["address"]
        self.root = self.dir / "root"
        self.kernel = self.dir / "kernel"
        self.hw = self.dir / "hw"
        self.control = self.dir / "control"
        self.kernel_modules = Modules(self.kernel, bool(self.config.get("nvswitch")))  # the emulated kernel's modules
        self.stopping = False
        self.boots = 0
        self.sshd_pid: int | None = None
        self.boot_id = ""
        self.release = os.uname().release  # the kernel this boot started (a planted kernel update: its release)

    # -- state for the controller -------------------------------------------------------------------------------
    def set_state(self, phase: str, **extra) -> None:
        data = {"phase": phase, "boots": self.boots, "boot_id": self.boot_id, "time": time.time(), **extra}
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(data) + "\n")
        tmp.replace(self.dir / "state.json")

    # -- the hardware: every GPU's line in hw/gpus.conf ---------------------------------------------------------
    def set_every_gpu(self, **reset: str) -> None:
        hw_path = self.hw / "gpus.conf"
        lines = []
        for line in hw_path.read_text().splitlines():
            m = re.match(r"^(gpu\.\d+\.)(\w+)=", line)
            lines.append(f"{m.group(1)}{m.group(2)}={reset[m.group(2)]}" if m and m.group(2) in reset else line)
        write_in_place(hw_path, "\n".join(lines) + "\n")
