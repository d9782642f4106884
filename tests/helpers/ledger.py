"""A host's history for the ledger: audit entries made by the real controls, recorded at given times (the test
clock)."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_kernel_log as klog
from orchestrator import audit, baseline as baseline_mod
from orchestrator.fleet import inventory
from orchestrator.history import timefmt

START = datetime(2026, 3, 2, 8, 0, tzinfo=timezone.utc)
BASE = baseline_mod.load(None)
# As the lab's (and a real host's) kernel log shows them: dmesg's bracketed uptime, then the driver's message.
XID_79 = "[ 2411.020114] NVRM: Xid (PCI:0000:00:06): 79, pid=1234, name=python3, GPU has fallen off the bus."
XID_48 = ("[ 2533.170092] NVRM: Xid (PCI:0000:00:06): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
          "error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.")


def at(days: float = 0, hours: float = 0) -> str:
    return timefmt.stamp(START + timedelta(days=days, hours=hours))


def host(name, facts, catalog, boot="boot-1", kernel_log=(), lost=False):
    """NAME's audit entry as the audit makes it (the real controls on FACTS), with KERNEL_LOG lines parsed into Xid
    events as gpu_facts does, and its GPU lost where LOST."""
    facts = copy.deepcopy(facts)
    facts["host"]["boot_id"] = boot
    records = klog.parse_bracketed("\n".join(kernel_log))
    for n, r in enumerate(records):
        r["seq"] = n + 1
    facts["xid"]["events"] = klog.xid_events(records, catalog)
    if lost:
        facts["gpus"][0] = {"index": 0, "lost": True}  # as NVML reports a GPU it cannot open
    return audit.evaluate_facts(inventory.Host(name, ("all",)), facts, BASE)


def record(store, monkeypatch, when, hosts):
    """An audit run of HOSTS, recorded through the Store at WHEN (the test clock)."""
    monkeypatch.setenv(timefmt.TEST_CLOCK, when)
    run_id, _ = store.begin_run("audit", ["audit"], "inventory", None, BASE)
    store.finish_run(run_id, 0, {}, hosts)
    return run_id
