"""README.md's ten-minute tour, pasted as a newcomer would: the shell block between its `tour` markers, run as it is
in a fresh directory (its own $LAB and history). It ends with a rolled-back campaign (exit 4) and an HTML report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.lab import REPO_ROOT, kill_processes_mentioning


pytestmark = pytest.mark.lab


def tour() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    return text.split("[start:tour]", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_readme_tour_ends_rolled_back_with_an_html_report(tmp_path):
    """From the checkout, as README.md says (its PATH line finds .venv/bin there); only the lab's directory and
    the temporary directory the tour's history is made in are the test's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "SLURM_", "FLEETCTL_"))}
    env.update(FLEETCTL_LAB_DIR=str(tmp_path / "lab"), FLEETCTL_CONFIG=os.devnull, TMPDIR=str(tmp_path),
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    try:
        proc = subprocess.run(["bash", "-c", tour()], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "lab", "down"], env=env, capture_output=True,
                       timeout=120, stdin=subprocess.DEVNULL)
        kill_processes_mentioning(str(tmp_path / "cp"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]  # the last line, `fleetctl lab down`
    assert re.search(r"^campaign 1 to 570\.86\.15: rolled_back .*; exit 4$", proc.stdout, re.M), out[-3000:]
    report = Path(re.search(r"^open (\S+)$", proc.stdout, re.M)[1])
    assert report.parent.parent == tmp_path  # made by mktemp -d: not the user's history
    show = subprocess.run([sys.executable, "-m", "orchestrator.cli", "campaign", "show", "1", "--format", "json"],
                          env=dict(env, FLEETCTL_HOME=str(report.parent)), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    doc = json.loads(show.stdout)
    assert doc["campaign"]["state"] == "rolled_back"
    assert {h["name"]: h["state"] for h in doc["hosts"]} == {"h100-01": "rolled_back", "h100-02": "not_started"}
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>") and "rolled_back" in html
