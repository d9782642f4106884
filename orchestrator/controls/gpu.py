"""The GPUs one by one: count, ECC, memory health, MIG, PCIe, clocks, Xid, recovery actions."""

from __future__ import annotations

from .base import failed, live_gpus, not_applicable, passed, severity_rank, warned
from .registry import control


@control("gpu.count", "Expected GPUs visible", "critical", ("gpus",),
         "check for a GPU that fell off the bus (Xid 79), reseat or RMA; a reboot may bring it back",
         roles=("health", "judged_by_verify"))
def gpu_count(facts, policy):
    if facts["driver"]["state"] != "loaded":
        return not_applicable("the driver is not answering")
    expected = policy.get("gpus", {}).get("count")
    on_bus = len(facts["host"].get("pci_gpus", []))
    seen = len(live_gpus(facts))
    lost = [g["index"] for g in facts["gpus"] if g.get("lost")]
    want = max(expected or 0, on_bus)  # a GPU on the PCI bus that the driver does not see is missing too
    if seen < want or lost:
        return failed(f"{seen} GPUs answer, {want} expected ({on_bus} on the PCI bus)"
                      + (f"; GPU {', '.join(map(str, lost))} lost" if lost else ""),
                      visible=seen, expected=want, on_pci_bus=on_bus, lost=lost)
    return passed(f"{seen} GPUs visible", visible=seen, expected=want, on_pci_bus=on_bus)


@control("gpu.ecc", "ECC mode", "high", ("gpus",),
         "nvidia-smi -e 1 (or 0), then reset the GPU or reboot for it to take effect",
         roles=("health",))
def gpu_ecc(facts, policy):
    wanted = policy.get("gpus", {}).get("ecc")
    gpus = live_gpus(facts)
    if wanted is None or not gpus:
        return None if wanted is None else not_applicable("no GPU visible")
    wrong = [g["index"] for g in gpus if g["ecc"]["enabled"] is not None and g["ecc"]["enabled"] != wanted]
    pending = [g["index"] for g in gpus if g["ecc"]["pending"] is not None and g["ecc"]["pending"] != g["ecc"]["enabled"]]
    if wrong:
        return failed(f"ECC is {'off' if wanted else 'on'} on GPU {', '.join(map(str, wrong))}"
                      + (" (a change is pending a reset)" if pending else ""), gpus=wrong, pending=pending)
    return passed(f"ECC {'on' if wanted else 'off'} on all {len(gpus)} GPUs")


@control("gpu.ecc_errors", "No uncorrectable ECC errors", "critical", ("gpus",),
         "drain the host and reset the GPU; repeated uncorrectable errors mean RMA",
         roles=("health",))
def gpu_ecc_errors(facts, policy):
    gpus = [g for g in live_gpus(facts) if g["ecc"]["enabled"]]
    if not gpus:
        return not_applicable("no GPU with ECC on")
    bad = {g["index"]: g["ecc"]["uncorrected_volatile"] for g in gpus if (g["ecc"]["uncorrected_volatile"] or 0) > 0}
    if bad:
        return failed(f"uncorrectable ECC errors since the last reset on GPU {', '.join(map(str, bad))}",
                      uncorrected_volatile=bad)
    aggregate = {g["index"]: g["ecc"]["uncorrected_aggregate"] for g in gpus if (g["ecc"]["uncorrected_aggregate"] or 0) > 0}
    if aggregate:
        return warned("no uncorrectable ECC errors since the last reset, but some in the GPU's lifetime",
                      uncorrected_aggregate=aggregate)
    return passed(f"no uncorrectable ECC errors on {len(gpus)} GPUs")


@control("gpu.remapped_rows", "Row remapping healthy", "high", ("gpus",),
         "a pending remap needs a GPU reset; a remap failure means the GPU should be RMA'd",
         roles=("health",))
def gpu_remapped_rows(facts, policy):
    limit = policy.get("gpus", {}).get("max_uncorrectable_remapped_rows")
    gpus = [g for g in live_gpus(facts) if g.get("remapped_rows")]
    if not gpus:
        return not_applicable("row remapping not supported or no GPU visible")
    failure = [g["index"] for g in gpus if g["remapped_rows"]["failure"]]
    pending = [g["index"] for g in gpus if g["remapped_rows"]["pending"]]
    over = {g["index"]: g["remapped_rows"]["uncorrectable"] for g in gpus
            if limit is not None and (g["remapped_rows"]["uncorrectable"] or 0) > limit}
    if failure:
        return failed(f"row remapping FAILED on GPU {', '.join(map(str, failure))}", failure=failure)
    if pending:
        return failed(f"row remap pending (reset needed) on GPU {', '.join(map(str, pending))}", pending=pending)
    if over:
        return warned(f"uncorrectable remapped rows above {limit}: {over}", uncorrectable=over, limit=limit)
    return passed(f"no pending or failed row remaps on {len(gpus)} GPUs")


@control("gpu.retired_pages", "Retired pages within limit", "high", ("gpus",),
         "a pending retirement needs a reboot; many retired pages mean RMA",
         roles=("health",))
def gpu_retired_pages(facts, policy):
    limit = policy.get("gpus", {}).get("max_retired_pages")
    gpus = [g for g in live_gpus(facts) if g.get("retired_pages")]
    if limit is None:
        return None
    if not gpus:
        return not_applicable("page retirement not used on these GPUs (row remapping replaces it)")
    over = {g["index"]: g["retired_pages"]["single_bit"] + g["retired_pages"]["double_bit"] for g in gpus
            if g["retired_pages"]["single_bit"] + g["retired_pages"]["double_bit"] > limit}
    pending = [g["index"] for g in gpus if g["retired_pages"]["pending"]]
    if over or pending:
        return failed(f"retired pages over {limit} on {sorted(over)} / pending on {pending}", over=over, pending=pending)
    return passed(f"retired pages within {limit}")


@control("gpu.mig", "MIG mode as expected", "medium", ("gpus",),
         "nvidia-smi -mig 1 (or 0) on each GPU, then reset it",
         roles=("health",))
def gpu_mig(facts, policy):
    wanted = policy.get("gpus", {}).get("mig")
    if wanted is None:
        return None
    gpus = [g for g in live_gpus(facts) if g.get("mig")]
    if not gpus:
        return not_applicable("MIG not supported or no GPU visible")
    wrong = [g["index"] for g in gpus if g["mig"]["current"] != wanted]
    if wrong:
        return failed(f"MIG is {'off' if wanted else 'on'} on GPU {', '.join(map(str, wrong))}", gpus=wrong)
    return passed(f"MIG {'on' if wanted else 'off'} on {len(gpus)} GPUs")


@control("gpu.pcie", "PCIe link at full width", "medium", ("gpus",),
         "reseat the GPU or riser; a degraded link width costs host-device bandwidth",
         roles=("health",))
def gpu_pcie(facts, policy):
    if not policy.get("gpus", {}).get("pcie_full_width"):
        return None
    gpus = [g for g in live_gpus(facts) if g.get("pcie") and g["pcie"].get("width") and g["pcie"].get("width_max")]
    if not gpus:
        return not_applicable("no PCIe link readable")
    narrow = {g["index"]: f"x{g['pcie']['width']}/x{g['pcie']['width_max']}" for g in gpus if g["pcie"]["width"] < g["pcie"]["width_max"]}
    if narrow:
        return failed(f"PCIe link below full width: {narrow}", links=narrow)
    # An idle GPU lowers its link generation to save power: that alone is not a fault.
    return passed(f"PCIe links at full width on {len(gpus)} GPUs")


@control("gpu.clocks", "No hardware slowdown", "low", ("gpus",),
         "check cooling and power delivery (HW slowdown / thermal / power brake)",
         roles=("health",))
def gpu_clocks(facts, policy):
    gpus = [g for g in live_gpus(facts) if g.get("clock_event_reasons")]
    if not gpus:
        return not_applicable("no clock-event reasons readable")
    hw = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}
    slowed = {g["index"]: sorted(hw & set(g["clock_event_reasons"]["active"])) for g in gpus
              if hw & set(g["clock_event_reasons"]["active"])}
    if slowed:
        return warned(f"clocks held down by {slowed}", reasons=slowed)
    return passed("no hardware or thermal slowdown")


@control("gpu.xid", "No Xid errors since boot", "critical", ("xid",),
         "read the event's action; drain and reset for critical Xids, check the job for application Xids",
         roles=("health",))
def gpu_xid(facts, policy):
    threshold = policy.get("xid", {}).get("fail_on", "high")
    events = facts["xid"]["events"]
    if not events:
        return passed("no Xid events in the kernel log since boot")
    bad = [e for e in events if severity_rank(e["severity"]) >= severity_rank(threshold)]
    summary = sorted({(e["code"], e["name"] or "", e["severity"]) for e in events})
    evidence = {"events": [{k: e.get(k) for k in ("code", "pci_bus_id", "gpu_instance", "class", "severity", "source", "raw")}
                           for e in events[-20:]], "count": len(events)}
    codes = ", ".join(f"{code} ({name})" for code, name, _ in summary)
    if bad:
        action = next((e["action"] for e in bad if e.get("action")), "")
        return failed(f"{len(bad)} Xid event(s) at or above {threshold}: {codes}" + (f" -> {action}" if action else ""), **evidence)
    return warned(f"{len(events)} Xid event(s) below {threshold}: {codes}", **evidence)


@control("gpu.recovery_action", "No GPU recovery action pending", "high", ("gpus",),
         "do what the driver asks: reset the GPU, reboot, or drain and reset",
         roles=("health",))
def gpu_recovery_action(facts, policy):
    gpus = [g for g in live_gpus(facts) if g.get("recovery_action") is not None]
    if not gpus:
        return not_applicable("recovery action not reported by this driver")
    pending = {g["index"]: g["recovery_action"] for g in gpus if g["recovery_action"] != "None"}
    if pending:
        return failed(f"the driver asks for recovery: {pending}", actions=pending)
    return passed("no recovery action pending")
