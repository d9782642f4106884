"""fleetctl check: the audit's controls evaluated on the node itself (issue 23), for Slurm's HealthCheckProgram, a
job prolog or a cron job: no SSH, no Ansible, no history. The facts come from the gpu_facts module's own Collector
run in this process (its code, its parameters: the role's defaults and the baseline's Xid overrides), and are judged
by the audit's own evaluate_facts, so `check` and `audit` say the same thing of the same facts. Kept quick, as Slurm
runs it on every node every few minutes: a baseline whose bytes were validated before is not validated again (the
cache: schemas.valid_marker), and the facts, made by the collector's code in this very process, are not held to the
schema again (the audit holds a remote host's answer to it; the unit tests hold the collector's).

A node is to drain (Exit.FINDINGS, as the audit's at --fail-on critical) when a control of critical severity failed or
could not be verified; its other exit codes: exitcodes.BY_COMMAND["check"].

With slurm=True the node drains itself on a critical failure, with the reason `fleetctl check: CONTROL: DETAIL`,
and resumes itself once healthy only when its drain still carries that prefix (LBNL NHC's rule: an admin's drain,
or a campaign's, is never resumed by check).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import audit, baseline as baseline_mod, resources, schemas
from .fleet import inventory
from .history import timefmt
from .errors import InputError, SlurmError
from .exitcodes import Exit
from .sanitize import one_line

if TYPE_CHECKING:
    from .schedulers import slurmctl as slurm

FAIL_ON = "critical"  # what makes a node one to drain: audit.blocking at this severity
COMMAND_TIMEOUT_S = 10.0  # each command the collector runs (dpkg-query, nvidia-smi, lsinitramfs...)
TEXTFILE_NAME = "fleetctl-check.prom"
NVLINK_CACHE = "nvlink-links.json"  # in schemas.cache_dir(): the links' versions and remote ends, for one boot


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    baseline: str | None = None
    groups: tuple[str, ...] = ()
    slurm: bool = False
    node: str | None = None
    textfile: str | None = None
    evidence: bool = True  # read the NVLink counters only the facts show (not the table: it shows no facts)


class LocalModule:
    """What the gpu_facts Collector asks of AnsibleModule, on this machine: find a command, run it (with a
    timeout: a hung nvidia-smi must not hang Slurm's health check)."""

    def __init__(self, timeout: float = COMMAND_TIMEOUT_S):
        self.timeout = timeout

    @staticmethod
    def get_bin_path(name: str, opt_dirs: list[str] | None = None) -> str | None:
        return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", os.defpath), *(opt_dirs or [])]))

    def run_command(self, argv: list[str], environ_update: dict[str, str] | None = None) -> tuple[int, str, str]:
        try:
            proc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=self.timeout,
                                  env={**os.environ, **(environ_update or {})})
        except subprocess.TimeoutExpired:
            return 124, "", f"timed out after {self.timeout:g}s"
        except OSError as e:
            return 127, "", e.strerror or str(e)
        return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def collect_facts(policy: dict[str, Any], evidence: bool = True) -> dict[str, Any]:
    """This machine's facts, by the gpu_facts module's Collector with the parameters the audit's role gives it, and
    the NVLink links' versions and remote ends kept in fleetctl's cache for the boot (asked once a boot, not every
    check). EVIDENCE False: the legacy NVLink counters no control judges are left unread (null)."""
    defaults = resources.role_defaults("gpu_facts")
    cache = schemas.cache_dir()
    params = {"xid_catalog": resources.xid_catalog(),
              "xid_overrides": policy.get("xid", {}).get("overrides", {}),
              "kmsg_since_seq": defaults["gpu_facts_kmsg_since_seq"],
              "check_initramfs": defaults["gpu_facts_check_initramfs"],
              "nvlink_evidence": evidence, "nvlink_cache": None if cache is None else str(cache / NVLINK_CACHE)}
    return resources.module("gpu_facts").Collector(LocalModule()).collect(params)


def node_name(given: str | None = None) -> str:
    """The Slurm node this is: --node, else SLURMD_NODENAME (set by slurmd for its health check and prologs), else
    the short host name."""
    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]


def critical_failures(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if audit.blocking(f, FAIL_ON)]


def drain_reason(failing: list[dict[str, Any]]) -> str:
    """`fleetctl check: CONTROL: DETAIL` of the first failing critical control (and how many more)."""
    # here, as in decide() and act_on_slurm(): a check without --slurm does not import it
    from .schedulers import slurmctl as slurm
    first = failing[0]
    more = f" (+{len(failing) - 1} more)" if len(failing) > 1 else ""
    return slurm.check_reason(first["control"], one_line(first["message"], 100) + more)


def decide(node: slurm.Node, failing: list[dict[str, Any]]) -> tuple[str, str]:
    """(action, why) for the Slurm node given the critical failures: action is drain, resume or none.
    Unhealthy: drain, unless someone else has taken the node out already (their state and reason stay), or it is
    drained by check with this very reason. Healthy: resume only a drain check made."""
    from .schedulers import slurmctl as slurm
    if failing:
        reason = drain_reason(failing)
        if slurm.owned_by_check(node):
            if node.reason == reason:
                return "none", f"already drained by fleetctl check: {node.describe()}"
            return "drain", reason  # check's own drain, another failure now: the reason says which
        if node.taken_out:
            return "none", f"left as it is, taken out by someone else: {node.describe()}"
        return "drain", reason
    if slurm.owned_by_check(node):
        return "resume", f"healthy again: resuming the drain fleetctl check made ({node.reason})"
    return "none", f"healthy; {node.describe()}"


def act_on_slurm(name: str, failing: list[dict[str, Any]]) -> dict[str, Any]:
    """Drain or resume NAME as decide() says; a Slurm failure is recorded in the result, not raised (the health
    verdict and its exit code stand on their own)."""
    from .schedulers import slurmctl as slurm
    out: dict[str, Any] = {"node": name, "state": None, "action": "none", "detail": None, "error": None}
    try:
        current = slurm.node(name)
        out["state"] = current.state
        action, detail = decide(current, failing)
        out["action"], out["detail"] = action, detail
        if action == "drain":
            slurm.drain(name, detail)
        elif action == "resume":
            slurm.resume(name)
    except SlurmError as e:
        out["error"] = str(e)
    return out


def textfile_text(entry: dict[str, Any], started_at: str) -> str:
    """The node's findings as the audit's Prometheus metrics (orchestrator/prometheus.py's names): one set of
    alert rules covers a node checked by Slurm and a fleet audited by fleetctl."""
    from . import prometheus
    families = prometheus.Families()
    prometheus.add_audit_host(families, entry, started_at)
    return prometheus.render(families)


def write_textfile(directory: str, text: str) -> Path:
    from .files import write_atomically
    path = Path(directory) / TEXTFILE_NAME
    try:
        write_atomically(path, text)
    except OSError as e:
        raise InputError(f"{path}: cannot write: {e.strerror}") from None
    return path


def run(opts: CheckOptions) -> dict[str, Any]:
    """Check this machine; drain or resume its Slurm node (opts.slurm), write the textfile (opts.textfile)."""
    started, started_at = time.monotonic(), timefmt.now()
    if opts.textfile is not None and not Path(opts.textfile).is_dir():
        raise InputError(f"--textfile {opts.textfile}: not a directory")
    base = baseline_mod.load(opts.baseline, cached=True)
    unknown = sorted(set(opts.groups) - set(base.groups))
    if unknown:
        raise InputError(f"--group {unknown[0]}: not a group of baseline {base.name}")
    host = inventory.Host(name=node_name(opts.node), groups=("all", *opts.groups))
    facts = collect_facts(base.policy_for(list(host.groups)), evidence=opts.evidence)
    entry = audit.evaluate_facts(host, facts, base, checked=True)
    failing = critical_failures(entry["findings"])
    report: dict[str, Any] = {
        "host": entry["name"], "groups": entry["groups"], "checked_at": started_at,
        "baseline": {"name": base.name, "path": str(base.path), "digest": base.digest},
        "facts": entry["facts"], "findings": entry["findings"],
        "summary": {"healthy": not failing, "failing": [f["control"] for f in failing], "fail_on": FAIL_ON,
                    "exit_code": Exit.FINDINGS if failing else Exit.OK},
    }
    if opts.slurm:
        report["slurm"] = act_on_slurm(host.name, failing)
    if opts.textfile is not None:
        report["textfile"] = str(write_textfile(opts.textfile, textfile_text(entry, started_at)))
    report["summary"]["duration_s"] = round(time.monotonic() - started, 3)
    return report
