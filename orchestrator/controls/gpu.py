"""The GPUs one by one: count, ECC, memory health, MIG, PCIe, clocks, Xid, recovery actions, PCIe errors, leaked
memory, and firmware against the rest of the host's inventory group."""

from __future__ import annotations

from typing import Any

from .. import resources
from .base import failed, live_gpus, not_applicable, passed, severity_rank, warned
from .registry import control

_GPUS = resources.module_utils("fleetctl_gpus")  # the host side's leak limit, shared with gpu_users' wait_idle
LEAK_MIB, leaked_mib = _GPUS.LEAK_MIB, _GPUS.leaked_mib


@control("gpu.count", "Expected GPUs visible", "critical", ("gpus",),
         "check for a GPU that fell off the bus (Xid 79), reseat or RMA; a reboot may bring it back",
         roles=("health", "judged_by_verify"))
def gpu_count(facts, policy):
    """Fails when fewer GPUs answer than expected (baseline count, and every NVIDIA GPU on the PCI bus)."""
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
    """Fails when ECC mode differs from the baseline."""
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
    """Fails on uncorrectable ECC errors since the last reset (warns: only in the GPU's lifetime)."""
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
    """Fails when a row remap is pending or failed (warns: uncorrectable remaps over the limit)."""
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
    """Fails when retired pages are over the limit or pending (pre-Ampere GPUs)."""
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
    """Fails when MIG mode differs from the baseline."""
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
    """Fails when a PCIe link is narrower than its maximum (a lower generation alone is idle power saving)."""
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
    """Warns when HW slowdown, thermal slowdown or power brake is active."""
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
    """Fails on Xid events since boot at or above the baseline's `xid.fail_on` (warns below it)."""
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
    """Fails when the driver reports a pending GPU recovery action (NVML)."""
    gpus = [g for g in live_gpus(facts) if g.get("recovery_action") is not None]
    if not gpus:
        return not_applicable("recovery action not reported by this driver")
    pending = {g["index"]: g["recovery_action"] for g in gpus if g["recovery_action"] != "None"}
    if pending:
        return failed(f"the driver asks for recovery: {pending}", actions=pending)
    return passed("no recovery action pending")


# ---- PCIe errors, leaked memory, firmware (issue 24) -------------------------------------------------------------

def aer_counts(gpu: dict[str, Any], kind: str) -> tuple[int, dict[str, int]]:
    """(total, non-zero errors by name) of one AER file of a GPU's facts; (0, {}) where it was not read."""
    entry = ((gpu.get("pcie") or {}).get("aer") or {}).get(kind) or {}
    return entry.get("total") or 0, entry.get("errors") or {}


@control("gpu.pcie_errors", "No PCIe link errors", "high", ("gpus[*].pcie",),
         "drain the host; reseat the GPU or riser and check the slot (the kernel's AER log names the error); "
         "a link that keeps replaying or reports uncorrectable errors needs hardware service",
         roles=("health",))
def gpu_pcie_errors(facts, policy):
    """Fails when the kernel counted fatal or non-fatal (uncorrectable) AER errors on a GPU's PCI device
    (`/sys/bus/pci/devices/DEV/aer_dev_fatal`, `aer_dev_nonfatal`; named in the message), or NVML's PCIe replay counter
    is over the baseline's `gpus.max_pcie_replays` (default baseline 100); warn on correctable AER errors; not
    applicable where neither is readable (a VM without AER and without NVML). The probe's gate fails a host whose GPUs
    counted new fatal/non-fatal AER errors, or more new replays than that limit, across the change."""
    limit = policy.get("gpus", {}).get("max_pcie_replays")
    gpus = [g for g in live_gpus(facts) if g.get("pcie")]
    read = [g for g in gpus if g["pcie"].get("aer") or g["pcie"].get("replay_count") is not None]
    if not read:
        return not_applicable("no PCIe replay counter or AER counters readable")
    fails, warns, evidence = [], [], {}
    for g in read:
        for kind, label in (("fatal", "fatal"), ("nonfatal", "non-fatal")):
            total, errors = aer_counts(g, kind)
            if total:
                named = ", ".join(f"{name} {n}" for name, n in sorted(errors.items()))
                fails.append(f"GPU {g['index']} ({g.get('pci_bus_id')}): {total} {label} uncorrectable PCIe "
                             f"error(s) (AER{': ' + named if named else ''})")
                evidence.setdefault("aer", {})[f"{g['index']}.{kind}"] = total
        replays = g["pcie"].get("replay_count")
        if replays is not None:
            evidence.setdefault("replays", {})[g["index"]] = replays
            if limit is not None and replays > limit:
                fails.append(f"GPU {g['index']} ({g.get('pci_bus_id')}): {replays} PCIe replays since its last reset, "
                             f"over the baseline's {limit}")
        correctable, errors = aer_counts(g, "correctable")
        if correctable:
            warns.append(f"GPU {g['index']}: {correctable} correctable PCIe error(s)"
                         + (f" ({', '.join(f'{k} {n}' for k, n in sorted(errors.items()))})" if errors else ""))
    if fails:
        return failed("; ".join(fails + warns), **evidence)
    if warns:
        return warned("; ".join(warns), **evidence)
    return passed(f"no uncorrectable PCIe errors on {len(read)} GPUs"
                  + (f", replays within {limit}" if limit is not None else ""), **evidence)


@control("gpu.memory_leak", "No GPU memory held without a process", "high", ("gpus[*].memory",),
         "a context leaked (its process is gone, its memory is not): drain the host and reset the GPU "
         "(nvidia-smi -r -i N) or reboot",
         roles=("health", "not_soaked"))
def gpu_memory_leak(facts, policy):
    """Fails when a GPU holds more memory than `gpus.max_unowned_memory_mib` (default 256 MiB) beyond the driver's
    reserved memory (NVML's v2 memory info, nvidia-smi's `reserved` line) while NVML lists no process on it: a leaked
    context, reset the GPU. A campaign's `wait_idle` does not call such a GPU idle either."""
    limit = policy.get("gpus", {}).get("max_unowned_memory_mib", LEAK_MIB)
    gpus = [g for g in live_gpus(facts) if g.get("memory") and g["memory"].get("used_bytes") is not None]
    if not gpus:
        return not_applicable("GPU memory in use not readable (NVML's v2 memory info, or nvidia-smi's reserved line)")
    leaks = {g["index"]: leaked_mib(g["memory"], limit) for g in gpus}
    leaks = {i: mib for i, mib in leaks.items() if mib is not None}
    if leaks:
        return failed("; ".join(f"GPU {i} holds {mib} MiB with no process: a leaked context, reset the GPU"
                                for i, mib in sorted(leaks.items())), leaked_mib=leaks, limit_mib=limit)
    return passed(f"no GPU holds more than {limit} MiB without a process on {len(gpus)} GPUs")


FIRMWARE = (("vbios", "VBIOS"), ("inforom_image", "InfoROM image"))


def firmware_census(group: dict[Any, dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
    """The firmware of a group's GPUs: {GPU model: {"hosts": N, "vbios"|"inforom_image": {version: GPUs}}}."""
    census: dict[str, dict[str, Any]] = {}
    for facts in filter(None, group.values()):
        seen: set[str] = set()
        for g in live_gpus(facts):
            if not g.get("name"):
                continue
            model = census.setdefault(g["name"], {"hosts": 0, **{key: {} for key, _ in FIRMWARE}})
            seen.add(g["name"])
            for key, _ in FIRMWARE:
                if g.get(key):
                    model[key][g[key]] = model[key].get(g[key], 0) + 1
        for name in seen:
            census[name]["hosts"] += 1
    return census


def majority(counts: dict[str, int]) -> str | None:
    """The version more than half of the counted GPUs run, or None."""
    total = sum(counts.values())
    return next((v for v, n in counts.items() if 2 * n > total), None)


@control("gpu.firmware_uniform", "GPU firmware as on the rest of the group", "medium",
         ("gpus[*].vbios", "gpus[*].inforom_image"),
         "flash the GPU's firmware to the group's version (the vendor's firmware update package), or pin the "
         "versions in the baseline's gpus.vbios",
         roles=("health",), peers=firmware_census)
def gpu_firmware_uniform(facts, policy, peers):
    """Fails when a GPU's VBIOS or InfoROM image differs from the majority of the GPUs of the same model in the host's
    inventory group (its most specific one; the message names the majority version), or its VBIOS is not in the
    baseline's `gpus.vbios`; warn when the group has no majority; not applicable on a host with no other host of its GPU
    model in its group."""
    pinned = policy.get("gpus", {}).get("vbios")
    gpus = [g for g in live_gpus(facts) if g.get("name")]
    if not gpus:
        return not_applicable("no GPU visible")
    group, census = peers if peers else (None, {})
    fails, warns, compared = [], [], 0
    for g in gpus:
        if pinned is not None and g.get("vbios") and g["vbios"] not in pinned:
            fails.append(f"GPU {g['index']}: VBIOS {g['vbios']} is not one the baseline allows ({', '.join(pinned)})")
        model = census.get(g["name"])
        if not model or model["hosts"] < 2:
            continue  # the only host of its model in its group: nothing to compare with
        compared += 1
        for key, label in FIRMWARE:
            if not g.get(key):
                continue
            most = majority(model[key])
            total = sum(model[key].values())
            if most is None:
                shown = ", ".join(f"{v} on {n}" for v, n in sorted(model[key].items()))
                warns.append(f"GPU {g['index']}: {label} {g[key]}; the {g['name']} GPUs of group {group} have no "
                             f"majority version ({shown})")
            elif g[key] != most:
                fails.append(f"GPU {g['index']}: {label} {g[key]}, the group {group}'s {g['name']} GPUs run {most} "
                             f"({model[key][most]} of {total})")
    evidence = {key: sorted({g[key] for g in gpus if g.get(key)}) for key, _ in FIRMWARE}
    if group:
        evidence["group"] = group
    if fails:
        return failed("; ".join(fails + warns), **evidence)
    if warns:
        return warned("; ".join(warns), **evidence)
    if not compared and pinned is None:
        return not_applicable("no other host with the same GPUs in its inventory group to compare with", **evidence)
    return passed(f"VBIOS {', '.join(evidence['vbios']) or 'unread'} and InfoROM "
                  f"{', '.join(evidence['inforom_image']) or 'unread'}"
                  + (f" as on the group {group}'s other hosts" if compared else "")
                  + (" and allowed by the baseline" if pinned is not None else ""), **evidence)
