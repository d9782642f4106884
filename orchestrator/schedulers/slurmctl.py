"""Slurm's view of its nodes, and the node-state changes fleetctl makes (issue 23).

One `sinfo --json` call reads every node (Slurm 22.05 has no `scontrol show node --json`; `sinfo --json` is the
machine-readable form its own REST API uses, where `scontrol -o show node` puts a Reason with spaces in free text).
Changes go through `scontrol update` (a campaign's reboot: `scontrol reboot`, run on the node itself). Every
command runs with a timeout and honours SLURM_CONF; whatever goes wrong (a command missing, a timeout, a refusal,
output fleetctl cannot read) is one SlurmError line, never a traceback.

The jobs that ended are read from Slurm's job completion log (below), the record the campaign's soak counts failed
jobs from. Maintenance reservations (`--drain-mode reservation`) are read with `scontrol -o show reservation` (one
line each) and made, changed and deleted with `scontrol create|update|delete reservation`.

fleetctl recognises its own drains by the reason it wrote: `fleetctl campaign N: A -> B` for a campaign's,
`fleetctl check: CONTROL: DETAIL` for `fleetctl check --slurm`'s (LBNL NHC's rule: only a drain with your own
prefix is yours to resume). A node Slurm shows as drained or down for any other reason belongs to someone else.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import SlurmError
from ..sanitize import one_line

TIMEOUT_S = 15.0  # each scontrol/sinfo call: slurmctld answers in milliseconds, or it is not answering
MAX_OUTPUT_BYTES = 64 << 20  # `sinfo --json` is ~2 KiB a node: room for 30,000 nodes, and a bound
REASON_MAX = 160  # characters of a reason fleetctl writes (Slurm keeps any length; sinfo shows the first ~20)
CAMPAIGN_PREFIX = "fleetctl campaign "
CHECK_PREFIX = "fleetctl check: "
BUSY_STATES = ("ALLOCATED", "MIXED")  # base states with jobs on the node (COMPLETING is a flag)
_WORD = re.compile(r"[A-Z][A-Z_]{0,39}")  # a state or flag as Slurm spells it (IDLE, NOT_RESPONDING, ...)
_NAME = re.compile(r"[^\s=]{1,255}")


@dataclass(frozen=True)
class Node:
    """One node as Slurm reports it: STATE is the full state as scontrol shows it ("IDLE+DRAIN", "MIXED",
    "DOWN+NOT_RESPONDING"), BASE its first word, FLAGS the rest; REASON None when no reason is set."""

    name: str
    state: str
    base: str
    flags: frozenset[str]
    reason: str | None

    @property
    def busy(self) -> bool:
        """Jobs are allocated on the node (or still completing)."""
        return self.base in BUSY_STATES or "COMPLETING" in self.flags

    @property
    def drained_or_draining(self) -> bool:
        """DRAIN, or FAIL (the same to the scheduler: no new job starts; fleetctl's reboot sets FAIL: below)."""
        return bool(self.flags & {"DRAIN", "FAIL"})

    @property
    def reboot_pending(self) -> bool:
        """A reboot asked of Slurm that it has not started (REBOOT_REQUESTED: it waits for the node's jobs)."""
        return "REBOOT_REQUESTED" in self.flags

    @property
    def drained(self) -> bool:
        """Slurm's DRAINED: drain set and no job left on the node (what a reboot may wait for)."""
        return self.drained_or_draining and not self.busy

    @property
    def draining(self) -> bool:
        """Slurm's DRAINING: drain set, jobs still running."""
        return self.drained_or_draining and self.busy

    @property
    def down(self) -> bool:
        return self.base == "DOWN"

    @property
    def responding(self) -> bool:
        """slurmctld hears from the node's slurmd (no NOT_RESPONDING flag)."""
        return "NOT_RESPONDING" not in self.flags

    @property
    def maintenance(self) -> bool:
        """In a reservation (a MAINT one, MAINTENANCE as 22.05 spells it, or any other): promised to someone."""
        return bool(self.flags & {"MAINT", "MAINTENANCE", "RESERVED"})

    @property
    def taken_out(self) -> bool:
        """Drained, draining, down or reserved: not a node to schedule work on or to change."""
        return self.drained_or_draining or self.down or self.maintenance

    def describe(self) -> str:
        """'IDLE+DRAIN (RMA: GPU 3 ECC)': the state and reason as one line for a person."""
        return self.state + (f" ({one_line(self.reason, REASON_MAX)})" if self.reason else "")


# -- reasons ------------------------------------------------------------------------------------------------------

def reason_text(text: str) -> str:
    """TEXT as a reason fleetctl may write: one line, printable, at most REASON_MAX characters."""
    return one_line(text, REASON_MAX - 3)


def campaign_reason(campaign_id: int, from_version: str | None, to_version: str) -> str:
    """`fleetctl campaign N: A -> B`, the reason a campaign drains with (A '?' when the host's version is unknown)."""
    return reason_text(f"{CAMPAIGN_PREFIX}{campaign_id}: {from_version or '?'} -> {to_version}")


def check_reason(control: str, detail: str) -> str:
    """`fleetctl check: CONTROL: DETAIL`, the reason `fleetctl check --slurm` drains with."""
    return reason_text(f"{CHECK_PREFIX}{control}: {detail}")


def owned_by_campaign(node: Node, campaign_id: int) -> bool:
    """The node is drained (or draining) with campaign CAMPAIGN_ID's own reason, still."""
    return node.drained_or_draining and (node.reason or "").startswith(f"{CAMPAIGN_PREFIX}{campaign_id}: ")


def owned_by_check(node: Node) -> bool:
    """The node is drained (or draining) with `fleetctl check`'s reason: `fleetctl check` may resume it."""
    return node.drained_or_draining and (node.reason or "").startswith(CHECK_PREFIX)


# -- reading ------------------------------------------------------------------------------------------------------

def _words(value: Any, what: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(w, str) and _WORD.fullmatch(w.upper()) for w in items):
        raise SlurmError(f"sinfo --json: node {what}: unexpected state {one_line(json.dumps(value), 80)}")
    return [w.upper() for w in items]


def node_from_json(entry: Any) -> Node:
    """One element of `sinfo --json`'s "nodes": 22.05 gives "state": "idle" and "state_flags": ["DRAIN"];
    23.02 and later give "state": ["IDLE", "DRAIN"]."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not _NAME.fullmatch(entry["name"]):
        raise SlurmError(f"sinfo --json: a node without a valid name: {one_line(json.dumps(entry)[:80], 80)}")
    name = entry["name"]
    state = _words(entry.get("state"), name)
    if not state:
        raise SlurmError(f"sinfo --json: node {name}: no state")
    flags = state[1:] + _words(entry.get("state_flags") or [], name)
    reason = entry.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise SlurmError(f"sinfo --json: node {name}: reason is not text")
    return Node(name=name, state="+".join([state[0], *flags]), base=state[0], flags=frozenset(flags),
                reason=reason or None)


def parse_nodes(text: str) -> dict[str, Node]:
    """`sinfo --json`'s output -> {name: Node}. Anything else (an error answer, not JSON, a shape Slurm never
    printed) is one SlurmError."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise SlurmError(f"sinfo --json did not print JSON: {e}") from None
    if not isinstance(doc, dict):
        raise SlurmError("sinfo --json printed JSON that is not an object")
    errors = doc.get("errors") or []
    if errors:
        first = errors[0]
        said = first.get("description") or first.get("error") if isinstance(first, dict) else first
        raise SlurmError(f"sinfo --json: {one_line(said, 200)}")
    if not isinstance(doc.get("nodes"), list):
        raise SlurmError("sinfo --json printed no list of nodes")
    nodes = (node_from_json(e) for e in doc["nodes"])
    return {n.name: n for n in nodes}


def _run(argv: list[str], timeout: float = TIMEOUT_S) -> str:
    """ARGV's stdout (at most MAX_OUTPUT_BYTES); SlurmError when it is missing, slow, fails or says too much."""
    shown = " ".join(argv[:3])
    with tempfile.TemporaryFile() as out:  # the size is known before the output is read into memory
        try:
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                  timeout=timeout, env={**os.environ, "LC_ALL": "C"})
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} is not installed (not on PATH): Slurm's client commands are needed") \
                from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{shown} did not answer within {timeout:g}s (is slurmctld up?)") from None
        except OSError as e:
            raise SlurmError(f"{argv[0]}: cannot run: {e.strerror}") from None
        if proc.returncode != 0:
            said = one_line(proc.stderr.decode("utf-8", "replace")[-2000:], 300) or "no message"
            raise SlurmError(f"{shown} exited {proc.returncode}: {said}")
        size = os.fstat(out.fileno()).st_size
        if size > MAX_OUTPUT_BYTES:
            raise SlurmError(f"{shown} printed {size} bytes, more than fleetctl reads ({MAX_OUTPUT_BYTES})")
        out.seek(0)
        return out.read().decode("utf-8", "replace")


def nodes(names: list[str] | None = None, timeout: float = TIMEOUT_S) -> dict[str, Node]:
    """Every node Slurm knows (NAMES: only those; a name Slurm does not know is simply absent), from one
    `sinfo --json` call."""
    found = parse_nodes(_run(["sinfo", "--json"], timeout))
    return found if names is None else {n: found[n] for n in names if n in found}


def node(name: str, timeout: float = TIMEOUT_S) -> Node:
    """NAME's state; SlurmError when Slurm has no such node."""
    found = nodes([name], timeout)
    if name not in found:
        raise SlurmError(f"Slurm has no node {name}")
    return found[name]


# -- changing -----------------------------------------------------------------------------------------------------

def _node_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise SlurmError(f"not a Slurm node name: {one_line(name, 80)!r}")
    return name


def _update(name: str, *settings: str, timeout: float = TIMEOUT_S) -> None:
    _run(["scontrol", "update", f"nodename={_node_name(name)}", *settings], timeout)


def drain(name: str, reason: str, timeout: float = TIMEOUT_S) -> None:
    """Drain NAME with REASON (one line, bounded): running jobs finish, no new job starts."""
    _update(name, "state=drain", f"reason={reason_text(reason) or 'fleetctl'}", timeout=timeout)


def resume(name: str, timeout: float = TIMEOUT_S) -> None:
    """Return NAME to service (Slurm refuses a node that is neither drained nor down: a SlurmError)."""
    _update(name, "state=resume", timeout=timeout)


def reboot_command(name: str, reason: str) -> str:
    """The shell command that reboots node NAME through Slurm, run on the node itself (root on a node may change
    it): slurmctld shows it REBOOT_ISSUED, runs its RebootProgram, and keeps it out of service with REASON until it is
    resumed. FAIL first, not DRAIN: Slurm clears DRAIN when the reboot completes, and `nextstate=DOWN` alone holds
    no node where ReturnToService=2 returns it at slurmd's next ping. Slurm 22.05 accepts only nextstate=DOWN or
    RESUME; it refuses the reboot without a RebootProgram in slurm.conf ("RebootProgram isn't defined")."""
    node, why = shlex.quote(_node_name(name)), shlex.quote(f"reason={reason_text(reason) or 'fleetctl'}")
    return (f"scontrol update nodename={node} state=fail {why} && "
            f"scontrol reboot nextstate=DOWN {why} {node}")


def cancel_reboot(name: str, timeout: float = TIMEOUT_S) -> None:
    """Withdraw NAME's reboot that Slurm has not done yet (REBOOT_REQUESTED); its state and reason stay."""
    _run(["scontrol", "cancel_reboot", _node_name(name)], timeout)


# -- jobs that ended: the job completion log -----------------------------------------------------------------------
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


# -- maintenance reservations (--drain-mode reservation) ------------------------------------------------------------
# MAINT: a maintenance reservation (slurmctld accounts it so, and it may overlap an operator's). IGNORE_JOBS: jobs
# already running on the nodes do not refuse it (without it, Slurm 22.05 answers "Requested nodes are busy" for a
# node whose job's time limit reaches past the start); they run to their end all the same. Until its start,
# backfill starts on the nodes only jobs whose time limit ends before it.
RESERVATION_FLAGS = "maint,ignore_jobs"
RESERVATION_USERS = "root"  # Slurm wants someone a reservation is for: only root's jobs may run inside it
_RESV_FIELD = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True)
class Reservation:
    """One reservation as `scontrol -o show reservation` shows it: STATE ACTIVE or INACTIVE (not started yet),
    START the controller's local time as Slurm prints it, NODELIST in Slurm's compressed form (`h100-[02-03]`)."""

    name: str
    state: str
    start: str
    nodelist: str
    flags: frozenset[str]

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


def parse_reservations(text: str) -> dict[str, Reservation]:
    """`scontrol -o show reservation`'s lines -> {name: Reservation} ("No reservations in the system": {})."""
    out = {}
    for line in text.splitlines():
        fields = dict(_RESV_FIELD.findall(line))
        if "ReservationName" not in fields:
            continue
        out[fields["ReservationName"]] = Reservation(
            name=fields["ReservationName"], state=fields.get("State", "?"), start=fields.get("StartTime", "?"),
            nodelist=fields.get("Nodes", ""), flags=frozenset(f for f in fields.get("Flags", "").split(",") if f))
    return out


def reservations() -> dict[str, Reservation]:
    """Every reservation Slurm holds."""
    return parse_reservations(_run(["scontrol", "-o", "show", "reservation"]))


def _node_list(nodes: list[str]) -> str:
    bad = next((n for n in nodes if not _NAME.fullmatch(n)), None)
    if bad is not None or not nodes:
        raise SlurmError(f"not a Slurm node name: {one_line(bad or '(none)', 80)!r}")
    return ",".join(nodes)


def create_reservation(name: str, start: datetime, nodes: list[str]) -> None:
    """A maintenance reservation NAME of NODES from START on (now if START has passed), until it is deleted."""
    when = "now" if start <= datetime.now(timezone.utc) else \
        start.astimezone().strftime("%Y-%m-%dT%H:%M:%S")  # scontrol reads the local time
    _run(["scontrol", "create", "reservation", f"reservationname={name}", f"starttime={when}",
          "duration=UNLIMITED", f"nodes={_node_list(nodes)}", f"users={RESERVATION_USERS}",
          f"flags={RESERVATION_FLAGS}"])


def update_reservation(name: str, nodes: list[str]) -> None:
    """NAME now holds NODES (and no other node)."""
    _run(["scontrol", "update", f"reservationname={name}", f"nodes={_node_list(nodes)}"])


def delete_reservation(name: str) -> None:
    _run(["scontrol", "delete", f"reservationname={name}"])
