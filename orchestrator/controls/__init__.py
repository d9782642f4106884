"""The controls: one host's facts + its baseline policy -> findings.

One module per family (driver, nouveau, persistence, runtime, fabric, gpu, interconnect, imex); each control is one
small function registered with @control (registry.py): a stable id, a default severity, the facts it needs (paths of
schemas/host-facts.schema.json, checked by a test), a remediation hint and its roles (registry.ROLES: what plan,
precheck, verify and rollback use it for; they ask with_role). A control returns a Check (status, message, evidence)
or None when its baseline key is not set (not_applicable). When a fact it needs could not be read on the host, the
finding is `error` instead of a guess.

A control registered with reference=True also gets the host's reference facts: the facts of its latest recorded
audit in which that same control passed (audit.collect looks them up in the history, one query for the whole
fleet), or None when there is none. A control registered with peers=FUNCTION compares a host with other hosts: those
of its inventory group, or with peers_by="nvlink_domain" those of its NVLink domain (domains.group); the audit calls
FUNCTION once per group with the hosts and their facts and hands its answer to the control (gpu.firmware_uniform: the
group's majority firmware per GPU model; nvlink.domain_uniform: the domain's driver versions). evaluate() stays pure:
the caller hands the reference and the peers in.
"""

from __future__ import annotations

from .base import (SEVERITIES, STATUSES, Check, Control, failed, live_gpus, not_applicable, passed, running_version,
                   severity_rank, unread, unread_message, version_tuple, warned)
from .registry import CONTROLS, ROLES, control, error_finding, evaluate, peer_controls, reference_controls, with_role
# The families, in the order their findings are listed (importing one registers its controls).
from . import driver, nouveau, persistence, runtime, fabric, gpu, interconnect, imex  # noqa: E402,F401  isort: skip
from .driver import CUDA_BY_BRANCH
from .interconnect import (FABRIC_802, FABRIC_HEALTH, NVLINK_ERROR_COUNTERS, NVLINK_ERRORS_WARN, gpu_label, gpu_labels,
                           interconnect_of, link_counts, nvlink_errors, nvlinks, same_gpu, short_pci)

FAMILIES = (driver, nouveau, persistence, runtime, fabric, gpu, interconnect, imex)

__all__ = ["CONTROLS", "CUDA_BY_BRANCH", "Check", "Control", "FABRIC_802", "FABRIC_HEALTH", "FAMILIES",
           "NVLINK_ERRORS_WARN", "NVLINK_ERROR_COUNTERS", "ROLES", "SEVERITIES", "STATUSES", "control",
           "error_finding", "evaluate", "failed", "gpu_label", "gpu_labels", "interconnect_of", "link_counts",
           "live_gpus", "not_applicable", "nvlink_errors", "nvlinks", "passed", "peer_controls", "reference_controls",
           "running_version", "same_gpu", "severity_rank", "short_pci", "unread", "unread_message", "version_tuple", "warned", "with_role"]
