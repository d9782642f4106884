"""(jobs part; merged into helper-9's slurm.py)"""
from __future__ import annotations

import os
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import OperationError


class SlurmError(OperationError):
    pass


TIMEOUT_S = 30.0


def _run(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: not found (install slurm-client on this machine)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]}: no answer in {TIMEOUT_S:g}s") from None
    if proc.returncode != 0:
        raise SlurmError(f"{' '.join(argv[:3])}: {(proc.stderr or proc.stdout).strip()[:300] or 'failed'}")
    return proc.stdout


# ---- jobs that ended: the job completion log ---------------------------------------------------------------
# Slurm's own record of every job's end (JobCompType=jobcomp/filetxt, JobCompLoc=FILE): one line per job, with its
# end state and nodes. Chosen over sacct because it needs no slurmdbd (no database to run), it is written by
# slurmctld for every job whatever the accounting setup, and it survives slurmctld restarts; it is read where
# fleetctl's Slurm commands run (the controller, or a node that mounts the file).
JOBCOMP_TAIL_BYTES = 8 << 20  # jobs since a node's undrain are at the end of the log: only its tail is read
_FIELD = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


def jobcomp_path() -> Path:
    """The job completion log of this cluster, from slurmctld's configuration (`scontrol show config`)."""
    config = dict(line.split("=", 1) for line in _run(["scontrol", "show", "config"]).splitlines() if " = " in line)
    config = {k.strip(): v.strip() for k, v in config.items()}
    if config.get("JobCompType") != "jobcomp/filetxt" or not config.get("JobCompLoc"):
        raise SlurmError(f"Slurm keeps no job completion log here (JobCompType={config.get('JobCompType', '?')}; "
                         "set JobCompType=jobcomp/filetxt and JobCompLoc= in slurm.conf)")
    return Path(config["JobCompLoc"])


def _read_tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - JOBCOMP_TAIL_BYTES))
            data = f.read(JOBCOMP_TAIL_BYTES)
    except OSError as e:
        raise SlurmError(f"job completion log {path}: {e.strerror}") from None
    text = data.decode("utf-8", "replace")
    return text if size <= JOBCOMP_TAIL_BYTES else text.split("\n", 1)[-1]  # a cut first line is dropped


def _when(text: str) -> datetime | None:
    """Slurm's times are the controller's local time, without a zone."""
    try:
        return datetime.fromisoformat(text).astimezone(timezone.utc)
    except ValueError:
        return None


def parse_jobcomp(text: str) -> list[dict[str, Any]]:
    """The job completion log's lines: [{id, name, state, exit_code, end (UTC datetime), nodelist}]."""
    jobs = []
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line.strip()))
        end = _when(fields.get("EndTime", ""))
        if "JobId" not in fields or "JobState" not in fields or end is None:
            continue
        jobs.append({"id": fields["JobId"], "name": fields.get("Name", "")[:100], "state": fields["JobState"],
                     "exit_code": fields.get("ExitCode", "?"), "end": end, "nodelist": fields.get("NodeList", "")})
    return jobs


def hostnames(nodelist: str) -> list[str]:
    """A Slurm host list (`gpu-[01-03],login1`) as node names: Slurm's own expansion."""
    if not nodelist or nodelist == "(null)":
        return []
    return _run(["scontrol", "show", "hostnames", nodelist]).split()


def finished_jobs(since: datetime, states: tuple[str, ...]) -> list[dict[str, Any]]:
    """Jobs that ended at or after SINCE in one of STATES, each with its `nodes` (names)."""
    jobs = [j for j in parse_jobcomp(_read_tail(jobcomp_path())) if j["end"] >= since and j["state"] in states]
    expanded = {n: hostnames(n) for n in {j["nodelist"] for j in jobs}}
    return [{**j, "nodes": expanded[j["nodelist"]]} for j in jobs]
