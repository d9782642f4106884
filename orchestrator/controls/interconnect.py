"""Between the GPUs: NVLink, the NVSwitch fabric, the pair topology, GPUDirect RDMA (docs/interconnect.md)."""

from __future__ import annotations

import re
from typing import Any

from ..fleet import domains
from .base import Check, failed, not_applicable, passed, running_version, unread as _unread, unread_message, warned
from .registry import control


# NVLink error counters are totals since the driver loaded: an audit sees a count with no time base, and replays
# happen on healthy links (NVIDIA's DCGM counts CRC errors as significant only at 100+ per second). Judged, as
# docs/interconnect.md fixes it: what nvidia-smi nvlink -e shows (replay, recovery, crc) and failed link recoveries.
# Only shown in the evidence: the legacy crc_flit / crc_data / ecc_data counters (crc_data and ecc_data count on every
# healthy link of a real 2x H200 after traffic - 143 to 308 per GPU after 100 s - while nvidia-smi says 0:
# tests/testdata/h200x2-580.159.04-audit) and the symbol / effective counts of newer drivers. A GPU warns (which
# blocks nothing) when its links' judged counters add up to more than 100: a few replays over weeks of uptime stay
# under it, a flapping link passes it in minutes. Counters fail only over the baseline's
# interconnect.nvlink.errors_fail, which has no default.
NVLINK_ERROR_COUNTERS = ("replay", "recovery", "crc", "recovery_failed")
NVLINK_ERRORS_WARN = 100


def link_counts(link: dict[str, Any]) -> dict[str, int | None]:
    """A link's error counters, with `crc` taken from its legacy source (crc_flit) in facts from before the
    nvidia-smi-style crc counter."""
    counts = dict(link.get("errors") or {})
    if "crc" not in counts:
        counts["crc"] = counts.pop("crc_flit", None)
    return counts


def nvlink_errors(gpu: dict[str, Any]) -> int:
    """The NVLink errors nvidia-smi shows (replay, recovery, CRC) and failed recoveries, over a GPU's links."""
    return sum(v for link in (gpu.get("nvlink") or {}).get("links", [])
               for k, v in link_counts(link).items() if k in NVLINK_ERROR_COUNTERS and v)
# nvmlGpuFabricInfo_v2 healthMask: 2-bit fields, value 1 (TRUE) when the condition holds (nvml.h).
FABRIC_HEALTH = {0: "degraded bandwidth", 2: "route recovery in progress", 4: "route unhealthy",
                 6: "access timeout recovery in progress"}
FABRIC_802 = ("CUDA programs fail with error 802 until the fabric manager completes it; check nv-fabricmanager "
              "(version must equal the driver's)")
_NV = re.compile(r"NV([0-9]+)")


def short_pci(bus_id: str | None) -> str:
    """00000000:9B:00.0 -> 0000:9b:00.0, the form of lspci, sysfs and the kernel log."""
    if not bus_id:
        return "?"
    domain, sep, rest = bus_id.partition(":")
    return (domain[-4:] + sep + rest).lower() if sep else bus_id.lower()


def gpu_label(ig: dict[str, Any]) -> str:
    return f"GPU {ig['index']} ({short_pci(ig.get('pci_bus_id'))})"


def gpu_labels(gpus: list[dict[str, Any]], of: int) -> str:
    return f"all {of} GPUs" if len(gpus) == of > 1 else ", ".join(map(gpu_label, gpus))


def nvlinks(link: str | None) -> int:
    """Bonded NVLinks of a topology relation: NV18 -> 18, a PCIe relation (PIX ... SYS) -> 0."""
    m = _NV.fullmatch(link or "")
    return int(m.group(1)) if m else 0


def _pairs(n: int) -> str:
    return f"{n} GPU pair{'s' if n != 1 else ''}"


def interconnect_of(facts: dict[str, Any]) -> tuple[dict[str, Any] | None, Check | None]:
    """facts.interconnect, or why a control has nothing to judge."""
    if "interconnect" not in facts:
        return None, not_applicable("no interconnect facts (collected by a fleetctl without them)")
    if facts["interconnect"] is None:
        return None, not_applicable("the driver is not answering: no interconnect facts")
    ic = facts["interconnect"]  # a GPU off the bus is gpu.count's finding, not an unread interconnect
    return dict(ic, gpus=[g for g in ic.get("gpus") or [] if not g.get("lost")]), None


def _uuid(facts: dict[str, Any], ig: dict[str, Any]) -> str | None:
    pci = (ig.get("pci_bus_id") or "").lower()
    for g in facts.get("gpus") or []:
        if not g.get("lost") and ((pci and (g.get("pci_bus_id") or "").lower() == pci)
                                  or (not pci and g.get("index") == ig.get("index"))):
            return g.get("uuid")
    return None


def same_gpu(facts: dict[str, Any], ig: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, Any] | None:
    """REF's interconnect entry for the GPU of IG: the same uuid (facts.gpus), else the same PCI slot, else index."""
    ref_gpus = ((ref or {}).get("interconnect") or {}).get("gpus") or []
    uuid = _uuid(facts, ig)
    if uuid:
        match = next((r for r in ref_gpus if _uuid(ref, r) == uuid), None)
        if match:
            return match
    for key in ("pci_bus_id", "index"):
        value = str(ig.get(key)).lower()
        match = next((r for r in ref_gpus if ig.get(key) is not None and str(r.get(key)).lower() == value), None)
        if match:
            return match
    return None


@control("gpu.nvlink", "NVLink links up, error counters low", "high", ("interconnect.gpus[*].nvlink",),
         "drain the host; `nvidia-smi nvlink -s -i GPU` shows the links; a GPU reset or reboot retrains them, a link "
         "that stays down or keeps counting errors means reseating or replacing the GPU board (RMA). Where a board "
         "wires fewer links than the GPU reports, set interconnect.nvlink.links_up", reference=True,
         roles=("health", "interconnect", "judged_by_verify"))
def gpu_nvlink(facts, policy, reference):
    """Fails when a GPU has fewer NVLink links up than expected (baseline `interconnect.nvlink.links_up`, else what the
    same GPU had up at the host's last passing audit, else every link it reports), naming the GPU, its slot and the
    links down; its links' replay / recovery / CRC counters (as `nvidia-smi nvlink -e`) and failed recoveries over
    `errors_fail` (no default); warn over `errors_warn` (default 100: counters run since the driver loaded and healthy
    links replay now and then)."""
    ic, skip = interconnect_of(facts)
    if skip:
        return skip
    rules = policy.get("interconnect", {}).get("nvlink", {})
    gpus = ic.get("gpus") or []
    unread = [g for g in gpus if g.get("nvlink") is None]
    if unread:
        return Check("error", "NVLink state unread: " + "; ".join(
            f"{gpu_label(g)}: {unread_message(facts, f'interconnect.gpus[{i}].nvlink')}"
            for i, g in ((g["index"], g) for g in gpus) if g.get("nvlink") is None), {"gpus": [g["index"] for g in unread]})
    linked = [g for g in gpus if g["nvlink"]["supported"]]
    # A GPU that lists no link now (nvidia-smi: "all links are inActive") but had links up at the last passing audit
    # lost them all; without such a reference it is a GPU without NVLink wired.
    lost = [(g, ref_up) for g, ref_up in ((g, (((same_gpu(facts, g, reference) or {}).get("nvlink") or {}).get("up") or 0))
                                          for g in gpus if not g["nvlink"]["supported"]) if ref_up]
    if not linked and not lost:
        return not_applicable("no NVLink on this GPU" if len(gpus) == 1 else "no NVLink on this host's GPUs")
    warn_limit = rules.get("errors_warn", NVLINK_ERRORS_WARN)
    fail_limit = rules.get("errors_fail")
    problems = [f"{gpu_label(g)}: no NVLink link answers; {up} were up at the last passing audit" for g, up in lost]
    warnings, evidence, unwired = [], [], []
    for g in linked:
        nv = g["nvlink"]
        if rules.get("links_up") is not None:
            expected, source = rules["links_up"], "baseline"
        else:
            ref = same_gpu(facts, g, reference)
            ref_nv = (ref or {}).get("nvlink") or {}
            expected, source = (ref_nv["up"], "last passing audit") if ref_nv.get("supported") else (nv["total"], "all links")
        if nv["up"] == 0 and source == "all links":
            unwired.append(g["index"])  # a PCIe board without NVLink bridges lists its links, every one inactive
            continue
        down = [link["link"] for link in nv["links"] if link["state"] != "up"]
        counters: dict[str, int] = {}
        per_link: dict[int, int] = {}
        for link in nv["links"]:
            for name, value in link_counts(link).items():
                if value is not None:
                    counters[name] = counters.get(name, 0) + value
                    if name in NVLINK_ERROR_COUNTERS:
                        per_link[link["link"]] = per_link.get(link["link"], 0) + value
        errors = sum(per_link.values())
        evidence.append({"index": g["index"], "pci_bus_id": g.get("pci_bus_id"), "up": nv["up"], "total": nv["total"],
                         "expected": expected, "expected_from": source, "down": down, "errors": errors,
                         "error_counters": {k: v for k, v in counters.items() if v}})
        if nv["up"] < expected:
            why = "" if expected == nv["total"] else (
                f" ({expected} expected by the baseline)" if source == "baseline" else f" ({expected} up at the last passing audit)")
            problems.append(f"{gpu_label(g)}: {nv['up']} of {nv['total']} NVLink links up{why}; down: "
                            + (", ".join(map(str, down)) or "none listed"))
        if errors:
            worst = max(per_link, key=lambda link: per_link[link])
            detail = (f"{gpu_label(g)}: {errors} NVLink errors since the driver loaded ("
                      + ", ".join(f"{k} {v}" for k, v in sorted(counters.items(), key=lambda kv: -kv[1])
                                  if v and k in NVLINK_ERROR_COUNTERS)
                      + f"; most on link {worst}: {per_link[worst]})")
            if fail_limit is not None and errors > fail_limit:
                problems.append(f"{detail}, over the limit of {fail_limit}")
            elif warn_limit is not None and errors > warn_limit:
                warnings.append(f"{detail}, over {warn_limit}")
    no_nvlink = [g["index"] for g in gpus if not g["nvlink"]["supported"]]
    facts_of = {"gpus": evidence, "errors_warn": warn_limit, "errors_fail": fail_limit, "no_nvlink": no_nvlink,
                "no_link_up": unwired}
    if reference and any(e["expected_from"] == "last passing audit" for e in evidence):
        facts_of["reference_collected_at"] = reference.get("collected_at")
    if problems:
        return failed("; ".join(problems), **facts_of)
    if warnings:
        return warned("; ".join(warnings), **facts_of)
    if not evidence:
        return not_applicable("the GPUs list NVLink links but none is up, and neither the baseline "
                              "(interconnect.nvlink.links_up) nor a passing audit expects one: a PCIe board without "
                              "NVLink bridges", **facts_of)
    shapes = sorted({f"{e['up']} of {e['total']}" for e in evidence})
    sources = sorted({e["expected_from"] for e in evidence})
    return passed(f"NVLink: {' / '.join(shapes)} links up on {len(linked)} GPU{'s' if len(linked) > 1 else ''} "
                  f"(expected: {', '.join(sources)}), {sum(e['errors'] for e in evidence)} link errors", **facts_of)


@control("gpu.fabric", "NVSwitch fabric registration completed", "critical", (),
         "restart nv-fabricmanager at exactly the driver's version (see fabricmanager.version) and read "
         "/var/log/fabricmanager.log; a GPU that stays out of the fabric needs a GPU reset or a reboot",
         roles=("health", "interconnect", "judged_by_verify"))
def gpu_fabric(facts, policy):
    """Fails when on an NVSwitch host a GPU's fabric registration is not `completed`/`success`: in progress or not
    started (CUDA error 802 until the fabric manager finishes) or failed with a status; warn on a fabric health-mask
    condition."""
    # No `needs`: whether an unread fabric state matters depends on the host being an NVSwitch host.
    ic, skip = interconnect_of(facts)
    fm = facts.get("fabric_manager") or {}
    if skip:
        unread = any(_unread(k, "interconnect.gpus[*].fabric") for k in facts.get("errors", {}))
        if unread and fm.get("nvswitch_present"):
            return Check("error", f"fabric state unread: {unread_message(facts, 'interconnect.gpus[*].fabric')}")
        return skip
    gpus = ic.get("gpus") or []
    on_fabric = [g for g in gpus if g.get("fabric") and g["fabric"]["state"] != "not_supported"]
    switch_links = any(((link.get("remote") or {}).get("type") == "switch")
                       for g in gpus for link in ((g.get("nvlink") or {}).get("links") or []))
    if not (on_fabric or fm.get("nvswitch_present") or switch_links):
        return not_applicable("not an NVSwitch host: no GPU on an NVSwitch fabric")
    unread = [(g["index"], g) for g in gpus  # completed without a status: one NVML did not name
              if g.get("fabric") is None or (g["fabric"]["state"] == "completed" and g["fabric"].get("status") is None)]
    if unread:
        return Check("error", "fabric state unread on an NVSwitch host: " + "; ".join(
            f"{gpu_label(g)}: {unread_message(facts, f'interconnect.gpus[{i}].fabric')}" for i, g in unread),
            {"gpus": [g["index"] for _, g in unread]})
    if not on_fabric:
        return not_applicable("NVSwitch host whose GPUs report no fabric state (before Hopper NVML has none); "
                              "fabricmanager.version checks the fabric manager")
    evidence = {"fabric": {g["index"]: g["fabric"] for g in gpus}}
    by_state: dict[str, list[dict[str, Any]]] = {}
    for g in gpus:
        by_state.setdefault(g["fabric"]["state"], []).append(g)
    problems = []
    for state, words in (("not_started", "not started"), ("in_progress", "in progress")):
        if by_state.get(state):
            problems.append(f"{gpu_labels(by_state[state], len(gpus))}: fabric registration {words}: {FABRIC_802}")
    for g in by_state.get("completed", []):
        if g["fabric"].get("status") != "success":
            problems.append(f"{gpu_label(g)}: fabric registration completed with status {g['fabric'].get('status')}")
    if by_state.get("not_supported"):
        problems.append(f"{gpu_labels(by_state['not_supported'], len(gpus))}: no fabric state while "
                        f"{', '.join(str(g['index']) for g in on_fabric)} report one")
    if problems:
        version = running_version(facts)
        if fm.get("nvswitch_present") and fm.get("package_version") is None:
            problems.append("nvidia-fabricmanager is not installed")
        elif fm.get("nvswitch_present") and not fm.get("running"):
            problems.append(f"nv-fabricmanager {fm['package_version']} is not running")
        elif fm.get("package_version") and version and fm["package_version"].split("-", 1)[0] != version:
            problems.append(f"fabric manager {fm['package_version']} != driver {version}")
        return failed("; ".join(problems), **evidence)
    unhealthy = {}
    for g in gpus:
        mask = g["fabric"].get("health_mask") or 0
        flags = [name for shift, name in FABRIC_HEALTH.items() if (mask >> shift) & 0x3 == 1]
        if flags:
            unhealthy[g["index"]] = flags
    if unhealthy:
        return warned("fabric registered, but its health mask reports: " + "; ".join(
            f"GPU {i}: {', '.join(f)}" for i, f in unhealthy.items()), health=unhealthy, **evidence)
    cliques = sorted({g["fabric"].get("clique_id") for g in gpus}, key=str)
    return passed(f"fabric registration completed (success) on all {len(gpus)} GPUs, clique "
                  f"{', '.join(map(str, cliques))}", **evidence)


@control("gpu.fabric_clique", "GPUs in the fabric clique they were in", "high", (),
         "the tray came back outside its rack's NVLink domain: check its NVLink cables and the NVLink switch trays' "
         "fabric (NMX), then reset the GPUs or reboot the tray", reference=True,
         roles=("health", "judged_by_verify"))  # the verify compares with the pre-check itself
def gpu_fabric_clique(facts, policy, reference):
    """Fails when a GPU of a host in a multi-node NVLink domain is not in the fabric clique (NVML's cluster UUID and
    clique id) it had at the host's last passing audit, naming the GPU and both cliques; not applicable where neither
    now nor then the GPUs reported a multi-node domain (no IMEX facts: HGX boards, PCIe GPUs)."""
    # No `needs`: an unread fabric state matters only on a host in a multi-node domain.
    if facts.get("imex") is None and (reference or {}).get("imex") is None:
        return not_applicable("no multi-node NVLink domain, now or at the last passing audit")
    ic, skip = interconnect_of(facts)
    if skip:
        return skip
    gpus = ic.get("gpus") or []
    if any(g.get("fabric") is None for g in gpus):
        return Check("error", f"fabric clique unread: {unread_message(facts, 'interconnect.gpus[*].fabric')}")
    now, was = domains.cliques(facts), domains.cliques(reference)
    evidence: dict[str, Any] = {"cliques": now}
    shown = ", ".join(sorted(set(now.values()))) or "none"
    if not reference:
        return passed(f"{len(gpus)} GPUs in clique {shown} (no earlier passing audit to compare with: this one "
                      f"becomes the reference)", **evidence)
    moved = [f"{gpu_label(g)}: clique {now.get(pci, 'none')}, was {was.get(pci, 'none')}"
             for g in gpus for pci in [str(g.get("pci_bus_id"))] if now.get(pci) != was.get(pci)]
    evidence["reference_collected_at"] = reference.get("collected_at")
    if moved:
        return failed(f"{len(moved)} GPU{'s' if len(moved) > 1 else ''} not in the fabric clique of the last passing "
                      f"audit ({reference.get('collected_at')}): " + "; ".join(moved), **evidence)
    return passed(f"{len(gpus)} GPUs in clique {shown}, as at the last passing audit", **evidence)


@control("gpu.topology", "GPU pairs connected as expected", "high", ("interconnect.topology",),
         "a pair below its NVLinks talks over PCIe: see gpu.nvlink and gpu.fabric for the links and the fabric; "
         "`nvidia-smi topo -m` shows the matrix. Boards with different links per pair: leave interconnect.topology "
         "out and the host's last passing audit is the reference", reference=True,
         roles=("health", "interconnect", "judged_by_verify"))
def gpu_topology(facts, policy, reference):
    """Fails when a GPU pair's connection differs from the baseline's `interconnect.topology` (e.g. `NV18`), or without
    one, a pair has fewer NVLinks than at the last passing audit (NV18 -> PHB)."""
    ic, skip = interconnect_of(facts)
    if skip:
        return skip
    gpus = ic.get("gpus") or []
    pairs = ic.get("topology")
    if len(gpus) < 2:
        return not_applicable("fewer than 2 GPUs")
    if pairs is None:
        return Check("error", f"GPU topology unread: {unread_message(facts, 'interconnect.topology')}")
    counts: dict[str, int] = {}
    for p in pairs:
        counts[p["link"]] = counts.get(p["link"], 0) + 1
    shape = ", ".join(f"{link} x {n}" for link, n in sorted(counts.items(), key=lambda kv: (-nvlinks(kv[0]), kv[0])))
    evidence: dict[str, Any] = {"pairs": {f"{p['gpus'][0]}-{p['gpus'][1]}": p["link"] for p in pairs}}
    wanted = policy.get("interconnect", {}).get("topology")
    if wanted:
        wrong = [f"GPU {p['gpus'][0]}-{p['gpus'][1]} {p['link']}" for p in pairs if p["link"] != wanted]
        if wrong:
            shown = ", ".join(wrong[:8]) + (f" and {len(wrong) - 8} more" if len(wrong) > 8 else "")
            return failed(f"{len(wrong)} of {_pairs(len(pairs))} not {wanted} (the baseline's): {shown}",
                          expected=wanted, **evidence)
        return passed(f"all {_pairs(len(pairs))} {wanted}" if len(pairs) > 1 else f"the GPU pair is {wanted}",
                      expected=wanted, **evidence)
    ref_ic = (reference or {}).get("interconnect") or {}
    if not ref_ic.get("topology"):
        return passed(f"{_pairs(len(pairs))}: {shape} (no interconnect.topology in the baseline and no earlier "
                      f"passing audit to compare with: this one becomes the reference)", **evidence)
    now_index = {}
    for g in gpus:
        ref_gpu = same_gpu(facts, g, reference)
        if ref_gpu is not None:
            now_index[ref_gpu["index"]] = g["index"]
    now = {tuple(sorted(p["gpus"])): p["link"] for p in pairs}
    fell = []
    for p in ref_ic["topology"]:
        a, b = (now_index.get(i) for i in p["gpus"])
        if a is None or b is None or nvlinks(p["link"]) == 0:
            continue  # a GPU gone is gpu.count's finding; changes between PCIe relations are not this control's
        link = now.get(tuple(sorted((a, b))))
        if link is not None and nvlinks(link) < nvlinks(p["link"]):
            fell.append(f"GPU {a}-{b} {p['link']} -> {link}")
    evidence["reference_collected_at"] = reference.get("collected_at")
    if fell:
        shown = ", ".join(fell[:8]) + (f" and {len(fell) - 8} more" if len(fell) > 8 else "")
        return failed(f"{_pairs(len(fell))} lost NVLinks since the last passing audit "
                      f"({reference.get('collected_at')}): {shown}", lost=fell, **evidence)
    return passed(f"{_pairs(len(pairs))}: {shape}, none below the last passing audit", **evidence)


@control("gpudirect.peermem", "GPUDirect RDMA module loaded", "medium", ("interconnect.peermem_loaded",),
         "modprobe nvidia_peermem (it ships with the driver and needs the RDMA stack: MLNX_OFED/DOCA or rdma-core) "
         "and load it at boot: echo nvidia_peermem > /etc/modules-load.d/nvidia-peermem.conf")
def gpudirect_peermem(facts, policy):
    """Fails when the baseline's `interconnect.peermem: true` and `nvidia_peermem` (GPUDirect RDMA) is not loaded."""
    if not policy.get("interconnect", {}).get("peermem"):
        return None
    ic, skip = interconnect_of(facts)
    if skip:
        return skip
    if ic.get("peermem_loaded") is None:
        return Check("error", f"nvidia_peermem state unread: {unread_message(facts, 'interconnect.peermem_loaded')}")
    if not ic["peermem_loaded"]:
        return failed("nvidia_peermem is not loaded: no GPUDirect RDMA, so NCCL and MPI stage GPU buffers through "
                      "host memory for the network (unless they use DMA-BUF)")
    return passed("nvidia_peermem is loaded (GPUDirect RDMA)")


def _nvswitch_host(facts: dict[str, Any]) -> bool:
    """NVSwitches on this host: the nvswitch driver's devices, NVLinks to a switch, or SXids in its kernel log."""
    ic = facts.get("interconnect") or {}
    return bool((facts.get("fabric_manager") or {}).get("nvswitch_present")
                or any(((link.get("remote") or {}).get("type") == "switch")
                       for g in ic.get("gpus") or [] for link in ((g.get("nvlink") or {}).get("links") or []))
                or ((facts.get("sxid") or {}).get("events")))


def _sxid_summary(events: list[dict[str, Any]]) -> str:
    """'20034 (LTSSM fault up: ...) on nvswitch0 links 62, 63, nvswitch1 link 48' per code."""
    by_code: dict[int, dict[str, list[str]]] = {}
    names = {}
    for e in events:
        names[e["code"]] = e["name"]
        links = by_code.setdefault(e["code"], {}).setdefault(e["device"], [])
        if e.get("link") is not None and str(e["link"]) not in links:
            links.append(str(e["link"]))
    parts = []
    for code, devices in sorted(by_code.items()):
        where = ", ".join(f"{d} link{'s' if len(ls) > 1 else ''} {', '.join(sorted(ls, key=int))}" if ls else d
                          for d, ls in sorted(devices.items()))
        parts.append(f"{code} ({names[code]}) on {where}")
    return "; ".join(parts)


@control("nvswitch.sxid", "No fatal NVSwitch SXid errors since boot", "critical", (),
         "a fatal SXid stalls the NVLink traffic through that NVSwitch port: drain the host, then reset the GPUs and "
         "NVSwitches (reboot); an always-fatal one or one that recurs after the reboot means a hardware case with "
         "the vendor (nvidia-bug-report.sh)", roles=("health", "interconnect", "judged_by_verify"))
def nvswitch_sxid(facts, policy):
    """Fails on a fatal NVSwitch SXid in the kernel log since boot (the driver's Fatal / Severity 1, else the Fabric
    Manager guide's class in fleetctl's SXid table): fails naming code, meaning, switch and links; non-fatal SXids warn;
    not applicable without NVSwitches."""
    # No `needs`: an unread kernel log matters only on an NVSwitch host.
    if "sxid" not in facts:
        return not_applicable("no SXid facts (collected by a fleetctl without them)")
    nvswitch = _nvswitch_host(facts)
    unread = next((f"{k}: {m}" for k, m in facts.get("errors", {}).items() if k == "sxid"), None)
    if unread and nvswitch:
        return Check("error", f"SXids unread on an NVSwitch host: {unread}")
    events = facts["sxid"]["events"]
    if not nvswitch:
        return not_applicable("not an NVSwitch host: no NVSwitch device and no SXid in the kernel log")
    if not events:
        return passed("no NVSwitch SXid errors in the kernel log since boot")
    evidence = {"events": [{k: e.get(k) for k in ("code", "device", "pci", "link", "name", "class", "fatal",
                                                   "fatal_from", "source", "raw")} for e in events[-20:]],
                "count": len(events)}
    fatal = [e for e in events if e["fatal"]]
    if fatal:
        always = sorted({e["code"] for e in fatal if e["class"] == "always_fatal"})
        return failed(f"{len(fatal)} fatal NVSwitch SXid error(s): {_sxid_summary(fatal)}"
                      + (f"; always fatal to the whole fabric: {', '.join(map(str, always))}" if always else "")
                      + (f"; {len(events) - len(fatal)} non-fatal besides" if len(events) > len(fatal) else ""),
                      **evidence)
    unknown = [e for e in events if e["fatal"] is None]
    return warned(f"{len(events)} non-fatal NVSwitch SXid error(s): {_sxid_summary(events)}"
                  + (f" ({len(unknown)} whose class neither the log nor fleetctl's table gives)" if unknown else ""),
                  **evidence)


def _ib_label(port: dict[str, Any]) -> str:
    return f"{port['device']} port {port['port']}"


def _ib_of(facts: dict[str, Any], wanted: str) -> tuple[list[dict[str, Any]] | None, Check | None]:
    """facts.infiniband's ports, or why a control has nothing to judge."""
    if "infiniband" not in facts:
        return None, not_applicable("no InfiniBand facts (collected by a fleetctl without them)")
    if facts["infiniband"] is None:
        return None, failed(f"no InfiniBand / RoCE device in /sys/class/infiniband, while the baseline expects "
                            f"{wanted}: is the HCA driver (mlx5_ib) loaded?")
    return facts["infiniband"]["ports"], None


def _ib_down(port: dict[str, Any]) -> str:
    return f"{_ib_label(port)} {port['state'] or '?'} ({port['phys_state'] or '?'})"


@control("ib.ports", "InfiniBand / RoCE ports active", "high", ("infiniband",),
         "`ibstat` / `ibv_devinfo` show the ports: check the cable and the switch port, `ip link` for RoCE; a port "
         "that stays down after reseating needs its HCA or cable replaced", roles=("health",))
def ib_ports(facts, policy):
    """Fails when fewer InfiniBand/RoCE ports are ACTIVE (/sys/class/infiniband) than the baseline's
    `interconnect.ib.ports`, naming the ports down."""
    expected = policy.get("interconnect", {}).get("ib", {}).get("ports")
    if expected is None:
        return None
    ports, skip = _ib_of(facts, f"{expected} active ports")
    if skip:
        return skip
    active = [p for p in ports if p["state"] == "ACTIVE"]
    down = [p for p in ports if p["state"] != "ACTIVE"]
    evidence = {"active": len(active), "expected": expected, "ports": len(ports),
                "not_active": [{"device": p["device"], "port": p["port"], "state": p["state"],
                                "phys_state": p["phys_state"]} for p in down]}
    if len(active) < expected:
        return failed(f"{len(active)} of {len(ports)} InfiniBand/RoCE ports ACTIVE, the baseline expects {expected}"
                      + (f"; not active: {', '.join(map(_ib_down, down))}" if down else ""), **evidence)
    return passed(f"{len(active)} InfiniBand/RoCE ports ACTIVE (the baseline expects {expected})", **evidence)


IB_ERROR_COUNTERS = ("link_downed", "symbol_error")


@control("ib.rate", "InfiniBand / RoCE ports up at the baseline's rate", "high", ("infiniband",),
         "a port below its rate trained down (fewer lanes or a lower speed): reseat or replace the cable or "
         "transceiver; link_downed / symbol_error counting means a marginal link", roles=("health",))
def ib_rate(facts, policy):
    """Fails when a port is not ACTIVE/LinkUp or below the baseline's `interconnect.ib.rate` (Gb/s); warns on non-zero
    `link_downed` / `symbol_error` counters."""
    wanted = policy.get("interconnect", {}).get("ib", {}).get("rate")
    if wanted is None:
        return None
    ports, skip = _ib_of(facts, f"ports at {wanted:g} Gb/s")
    if skip:
        return skip
    down = [p for p in ports if p["state"] != "ACTIVE" or p["phys_state"] != "LinkUp"]
    slow = [p for p in ports if p not in down and (p["rate_gbps"] or 0) < wanted]
    noisy = {_ib_label(p): {c: p["counters"][c] for c in IB_ERROR_COUNTERS if p["counters"].get(c)}
             for p in ports if any(p["counters"].get(c) for c in IB_ERROR_COUNTERS)}
    counters = "; ".join(f"{label}: " + ", ".join(f"{c} {v}" for c, v in cs.items()) for label, cs in noisy.items())
    evidence = {"rate": wanted, "ports": [{"device": p["device"], "port": p["port"], "state": p["state"],
                                           "phys_state": p["phys_state"], "rate": p["rate"]} for p in ports],
                "counters": noisy}
    problems = ([f"down: {', '.join(map(_ib_down, down))}"] if down else []) + (
        [f"below {wanted:g} Gb/s: " + ", ".join(f"{_ib_label(p)} {p['rate'] or 'rate unread'}" for p in slow)]
        if slow else [])
    if problems:
        return failed("; ".join(problems) + (f"; error counters: {counters}" if counters else ""), **evidence)
    if noisy:
        return warned(f"all {len(ports)} ports up at {wanted:g} Gb/s or more, but error counters are not zero: "
                      f"{counters}", **evidence)
    return passed(f"all {len(ports)} ports ACTIVE, LinkUp, at {wanted:g} Gb/s or more; link_downed and "
                  f"symbol_error zero", **evidence)
