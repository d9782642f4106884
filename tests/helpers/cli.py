"""Running fleetctl as a user would (a subprocess), with its own history, and reading that history back."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def fleetctl(*args, home, timeout=180, env=None):
    """ENV: variables set for it besides the history's."""
    env = dict(os.environ, FLEETCTL_HOME=str(home), COLUMNS="200", FLEETCTL_CONFIG=os.devnull,  # no user's config
               **(env or {}))
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)


def interrupt(proc: subprocess.Popen, sig: int, timeout: float) -> tuple[str, str, float]:
    """Sends SIG to PROC and waits up to TIMEOUT seconds for it to end: its stdout, its stderr, and the seconds from
    the signal to the end."""
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return out, err, time.monotonic() - sent


def runs(home):
    db = home / "history.sqlite3"
    if not db.exists():
        return []
    with sqlite3.connect(db) as c:
        c.row_factory = sqlite3.Row
        return c.execute("SELECT * FROM runs ORDER BY id").fetchall()


def tagged(value: str) -> list[str]:
    """Command lines of the processes whose environment carries FLEETCTL_TEST_TAG=VALUE: everything the command
    started inherits it, wherever it was reparented to (Ansible's workers and their ssh run in sessions of their own)."""
    needle = f"FLEETCTL_TEST_TAG={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, FLEETCTL_HOME=str(tmp_path / "home"), FLEETCTL_CONFIG=os.devnull,
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               FLEETCTL_TEST_TAG=tag(tmp_path))
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def tag(tmp_path: Path) -> str:
    return f"{tmp_path.name}-{os.getpid()}"
