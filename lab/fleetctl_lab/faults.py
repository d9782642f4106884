"""`fleetctl lab inject HOST FAULT ...`: faults planted at the interfaces a real GPU host shows them.

Hardware faults (ECC, row remaps, a GPU off the bus, throughput, a PCIe link downgrade, persistence) go into the
host's emulated hardware (hw/gpus.conf, hw/faults.conf) and survive reboots as real ones would; kernel-log lines go
into the host's /dev/kmsg (kernel/kmsg) and are gone after a reboot, like a real ring buffer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from orchestrator.errors import InputError
from . import state
from .conf import read_conf, write_conf
from .kernel import (IB_LANE_DECI_GBPS, IB_WIDTHS, NVSWITCHES, append_kmsg, ib_ports, ib_rate_gbps, sysfs_pci_name,
                     write_aer, write_infiniband)
from .skus import DOMAIN_CLIQUE, SKUS

# Real driver wording for the Xids the lab plants (kernel logs in bug reports and NVIDIA's catalog).
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2b_c0000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark row for remapping.",
    74: "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801348 0x204).",
    120: "GSP task exception: GSP FATAL ERROR (0x0).",
    154: "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
}
XID_FORMS = ("pci", "legacy", "mig", "bare")


def update_conf(path: Path, **changes: object) -> None:
    values = read_conf(path)
    values.update({k.replace("__", "."): str(v) for k, v in changes.items()})
    write_conf(path, values)


class Host:
    """One lab host as seen from the controller, for planting faults."""

    def __init__(self, lab: state.Lab, name: str):
        try:
            self.record = lab.host(name)
        except KeyError as e:
            raise InputError(str(e.args[0])) from None
        self.lab = lab
        self.dir = lab.host_dir(name)
        self.gpus_conf = self.dir / "hw" / "gpus.conf"
        self.faults_conf = self.dir / "hw" / "faults.conf"
        self.kmsg = self.dir / "kernel" / "kmsg"

    def gpu_key(self, gpu: int, key: str) -> str:
        count = int(read_conf(self.gpus_conf).get("count", "0"))
        if not 0 <= gpu < count:
            raise InputError(f"{self.record.name} has GPUs 0..{count - 1}, not {gpu}")
        return f"gpu.{gpu}.{key}"

    def set_gpu(self, gpu: int, **values: object) -> None:
        conf = read_conf(self.gpus_conf)
        for key, value in values.items():
            conf[self.gpu_key(gpu, key)] = str(value)
        write_conf(self.gpus_conf, conf)

    def pci(self, gpu: int) -> str:
        return read_conf(self.gpus_conf)[self.gpu_key(gpu, "pci")]

    def kernel_log(self, message: str, priority: int = 3) -> None:
        """Append one record to the host's /dev/kmsg, numbered after the last one."""
        append_kmsg(self.dir / "kernel", [(priority, message)])


def xid_line(code: int, pci: str, form: str = "pci", pid: int = 40213, process: str = "python3") -> str:
    """One NVRM Xid line in the given log form; PCI is NVML's bus id (00000000:18:00.0)."""
    domain, bus, rest = pci.split(":")
    short = f"{domain[-4:]}:{bus}:{rest.split('.')[0]}"
    text = XID_TEXT.get(code, "Unknown Error")
    if form == "bare":
        return f"NVRM: GPU {domain[-4:]}:{bus}:{rest}: GPU has fallen off the bus."
    if form == "legacy":
        return f"NVRM: Xid ({short}): {code}, {text}"
    where = f"PCI:{short}" + (" GPU-I:05" if form == "mig" else "")
    if code == 154:
        return f"NVRM: Xid ({where}): {code}, {text}"
    return f"NVRM: Xid ({where}): {code}, pid={pid}, name={process}, {text}"


# ---- the faults ------------------------------------------------------------------------------

def xid(host: Host, code: int, gpu: int = 0, form: str = "pci") -> str:
    line = xid_line(code, host.pci(gpu), form)
    host.kernel_log(line)
    if code == 154:
        host.set_gpu(gpu, recovery_action=4)
    return line


def check_version(version: str) -> str:
    if not re.match(r"^\d{3}\.\d{1,3}(\.\d{1,3})?$", version):
        raise InputError(f"{version!r} is not a driver version (like 570.86.15)")
    return version


def kmsg(host: Host, line: str) -> str:
    if any(ord(ch) < 32 for ch in line):
        raise InputError("a kernel log line is one line of printable text")
    host.kernel_log(line)
    return line


def ecc(host: Host, gpu: int, volatile: int, aggregate: int | None = None) -> str:
    host.set_gpu(gpu, ecc_unc_volatile=volatile, ecc_unc_aggregate=aggregate if aggregate is not None else volatile)
    return f"GPU {gpu}: {volatile} uncorrectable ECC errors"


def remap(host: Host, gpu: int, uncorrectable: int = 1, pending: bool = True, failure: bool = False) -> str:
    host.set_gpu(gpu, remap_unc=uncorrectable, remap_pending=int(pending), remap_failure=int(failure))
    if pending:
        host.kernel_log(xid_line(63, host.pci(gpu)))
    if failure:
        host.kernel_log(xid_line(64, host.pci(gpu)))
    return f"GPU {gpu}: {uncorrectable} uncorrectable remapped rows, pending={pending}, failure={failure}"


def fall_off_bus(host: Host, gpu: int) -> str:
    """The GPU stops answering (NVML: GPU is lost) and the driver logs Xid 79 and the bare line."""
    host.set_gpu(gpu, lost=1)
    host.kernel_log(xid_line(79, host.pci(gpu)))
    host.kernel_log(xid_line(79, host.pci(gpu), form="bare"))
    return f"GPU {gpu} ({host.pci(gpu)}) fell off the bus"


def throughput(host: Host, factor: float, driver: str | None = None) -> str:
    if not 0 < factor <= 2:
        raise InputError(f"throughput factor must be in (0, 2], not {factor}")
    update_conf(host.faults_conf, **{f"throughput__{check_version(driver) if driver else 'any'}": factor})
    return f"throughput x{factor} on driver {driver or 'any'}"


def metric(host: Host, name: str, factor: float | None, driver: str | None = None, restore: bool = False) -> str:
    """The DCGM exporter's metric NAME on this host scaled by FACTOR (only while DRIVER is loaded, when given), on
    top of the throughput factor; RESTORE: that fault gone (exporter.py)."""
    from .exporter import SCALED

    if name not in SCALED:
        raise InputError(f"no lab metric {name!r} to scale (metrics: {', '.join(SCALED)})")
    key = f"metric.{name}.{check_version(driver) if driver else 'any'}"
    faults = read_conf(host.faults_conf)
    if restore:
        faults.pop(key, None)
    elif factor is None or not 0 < factor <= 2:
        raise InputError(f"a metric's factor must be in (0, 2], not {factor}")
    else:
        faults[key] = str(factor)
    write_conf(host.faults_conf, faults)
    return f"{name} " + ("as the workload makes it" if restore else f"x{factor}") + f" on driver {driver or 'any'}"


def drift(lab: state.Lab, factor: float | None, restore: bool = False) -> str:
    """A fleet-wide drift (a warm afternoon, a slow shared filesystem): every host's workload, canary and control
    alike, at FACTOR of its throughput (the DCGM exporter's levels and nvidia-lab-bench) until RESTORE."""
    if not restore and (factor is None or not 0 < factor <= 2):
        raise InputError(f"a drift's factor must be in (0, 2], not {factor}")
    for record in lab.hosts:
        path = Host(lab, record.name).faults_conf
        faults = read_conf(path)
        if restore:
            faults.pop("drift", None)
        else:
            faults["drift"] = str(factor)
        write_conf(path, faults)
    return (f"every host ({len(lab.hosts)}): " +
            ("the drift is over" if restore else f"the workload at x{factor} of its throughput"))


def pcie_downgrade(host: Host, gpu: int, width: int | None = 8, gen: int | None = None) -> str:
    """GPU's PCIe link trains narrower (WIDTH lanes) and/or slower (Gen GEN) than it can (a bad riser or slot): NVML
    and nvidia-smi report the current link, and the benchmark's host<->device copies fall with it (skus.py). The
    hardware stays so across reboots."""
    conf = read_conf(host.gpus_conf)
    sku = SKUS.get(conf.get("sku", ""))
    width_max = int(conf.get(host.gpu_key(gpu, "pcie_width_max")) or (sku.pcie_width if sku else 16))
    gen_max = int(conf.get(host.gpu_key(gpu, "pcie_gen_max")) or (sku.pcie_gen if sku else 5))
    width = width_max if width is None else width
    gen = gen_max if gen is None else gen
    if width not in (1, 2, 4, 8, 16) or width > width_max:
        raise InputError(f"--width must be 1, 2, 4, 8 or 16 lanes, at most GPU {gpu}'s x{width_max}, not {width}")
    if not 1 <= gen <= gen_max:
        raise InputError(f"--gen must be 1..{gen_max} (GPU {gpu}'s Gen{gen_max}), not {gen}")
    host.set_gpu(gpu, pcie_width=width, pcie_gen=gen)
    return f"GPU {gpu}: PCIe link Gen{gen} x{width} (of Gen{gen_max} x{width_max})"


def at_boot(host: Host, driver: str, kind: str, code: int, gpu: int) -> str:
    """Hardware that breaks when DRIVER loads: at every boot with it, the GPU logs Xid CODE (kind xid) or falls
    off the bus (kind lost: it stays lost, as a GPU that fell off does until a cold reset)."""
    host.gpu_key(gpu, "pci")
    version = check_version(driver)
    if kind == "xid":
        update_conf(host.faults_conf, **{f"boot_xid__{version}": f"{code}:{gpu}"})
        return f"Xid {code} on GPU {gpu} at every boot with driver {version}"
    update_conf(host.faults_conf, **{f"boot_lost__{version}": gpu})
    return f"GPU {gpu} falls off the bus at the next boot with driver {version}"


# ---- NVLink and the NVSwitch fabric (docs/lab.md) -----------------------------------------------------------
#
# The hardware state is in gpus.conf: gpu.N.nvlink_down ("3,7": links trained down), gpu.N.nvlink_<counter>
# ("LINK:COUNT,...": replay, recovery, crc_flit, crc_data, symbol, effective, recovery_failed) and fabric_stuck.
# Link training happens at a driver load: the supervisor then rewrites that state from faults.conf (apply_link_faults):
#   nvlink_down.<version|any>=G:L,...     links that train down with that driver (every load)
#   nvlink_errors.<version|any>=G:L:N,... links that count N errors right after each load with that driver
#   fabric_stuck.<version|any>=1          the fabric never completes with that driver
# so a link that trained down stays down across reboots under that driver, and comes back with another one.

NVLINK_ERROR_KEYS = ("crc_flit", "replay", "symbol", "effective")  # what nvlink-errors adds N to


def add_link(spec: str, link: int) -> str:
    """'3,7' + link -> the comma list with LINK in it (sorted, once)."""
    links = {int(p) for p in spec.split(",") if p.strip().isdigit()} | {link}
    return ",".join(str(n) for n in sorted(links))


def add_link_count(spec: str, link: int, count: int) -> str:
    """'LINK:COUNT,...' with COUNT added to LINK's."""
    counts: dict[int, int] = {}
    for part in spec.split(","):
        where, _, n = part.partition(":")
        if where.strip().isdigit() and n.strip().isdigit():
            counts[int(where)] = counts.get(int(where), 0) + int(n)
    counts[link] = counts.get(link, 0) + count
    return ",".join(f"{k}:{v}" for k, v in sorted(counts.items()))


def planted(faults: dict[str, str], kind: str, version: str) -> list[list[int]]:
    """The entries of faults.conf's KIND.<version> and KIND.any, each as its ':'-separated numbers."""
    out = []
    for key in (f"{kind}.{version}", f"{kind}.any"):
        for entry in faults.get(key, "").split(","):
            numbers = entry.strip().split(":")
            if entry.strip() and all(n.isdigit() for n in numbers):
                out.append([int(n) for n in numbers])
    return out


def apply_link_faults(hw: dict[str, str], faults: dict[str, str], version: str) -> bool:
    """What the links and the fabric look like right after driver VERSION loaded: counters restart at 0, the links
    planted for VERSION train down, the planted error bursts are counted, a planted fabric_stuck holds the fabric.
    Changes HW (gpus.conf as a dict) in place; True when it changed."""
    before = dict(hw)
    for key in [k for k in hw if re.match(r"^gpu\.\d+\.nvlink_", k)]:
        del hw[key]
    for gpu, link in (e[:2] for e in planted(faults, "nvlink_down", version) if len(e) == 2):
        key = f"gpu.{gpu}.nvlink_down"
        hw[key] = add_link(hw.get(key, ""), link)
    for gpu, link, count in (e for e in planted(faults, "nvlink_errors", version) if len(e) == 3):
        for counter in NVLINK_ERROR_KEYS:
            key = f"gpu.{gpu}.nvlink_{counter}"
            hw[key] = add_link_count(hw.get(key, ""), link, count)
    stuck = any(faults.get(f"fabric_stuck.{v}") == "1" for v in (version, "any"))
    if stuck or "fabric_stuck" in hw:
        hw["fabric_stuck"] = "1" if stuck else "0"
    return hw != before


def loaded_driver(host: Host) -> str | None:
    try:
        return (host.dir / "kernel" / "sys-module" / "nvidia" / "version").read_text().strip() or None
    except OSError:
        return None


def nvlink_gpu(host: Host, gpu: int, link: int | None = None):
    """The host's SKU, after checking that GPU (and LINK) exist and have NVLink."""
    conf = read_conf(host.gpus_conf)
    sku = SKUS.get(conf.get("sku", ""))
    host.gpu_key(gpu, "pci")
    if sku is None or not sku.nvlinks:
        raise InputError(f"{host.record.name} ({sku.name if sku else conf.get('sku')}) has no NVLink")
    if link is not None and not 0 <= link < sku.nvlinks:
        raise InputError(f"GPU {gpu} of {host.record.name} has NVLinks 0..{sku.nvlinks - 1}, not {link}")
    return sku


def plant(host: Host, kind: str, version: str, entry: str) -> None:
    faults = read_conf(host.faults_conf)
    key = f"{kind}.{version}"
    entries = [e for e in faults.get(key, "").split(",") if e]
    if entry not in entries:
        entries.append(entry)
    update_conf(host.faults_conf, **{key.replace(".", "__"): ",".join(entries)})


def nvlink_down(host: Host, gpu: int, link: int, driver: str | None = None) -> str:
    """Link LINK of GPU trains down: with DRIVER, at every load of that driver; else now (Xid 74 in the kernel log)
    and at every later load of the driver loaded now (of any driver when none is loaded)."""
    nvlink_gpu(host, gpu, link)
    if driver:
        plant(host, "nvlink_down", check_version(driver), f"{gpu}:{link}")
        return f"NVLink {link} of GPU {gpu} trains down at every load of driver {driver}"
    version = loaded_driver(host) or "any"
    plant(host, "nvlink_down", version, f"{gpu}:{link}")
    conf = read_conf(host.gpus_conf)
    host.set_gpu(gpu, nvlink_down=add_link(conf.get(f"gpu.{gpu}.nvlink_down", ""), link))
    host.kernel_log(xid_line(74, host.pci(gpu)).replace("link 4(", f"link {link}("))
    return f"NVLink {link} of GPU {gpu} down (and at every load of driver {version})"


def nvlink_errors(host: Host, gpu: int, count: int, link: int = 0, driver: str | None = None) -> str:
    """COUNT errors on link LINK of GPU: its CRC (flit), replay, symbol and effective error counters grow by COUNT -
    now (volatile: a reboot or driver load restarts them at 0), or with DRIVER right after every load of it."""
    if count < 0:
        raise InputError(f"--count must be 0 or more, not {count}")
    nvlink_gpu(host, gpu, link)
    if driver:
        plant(host, "nvlink_errors", check_version(driver), f"{gpu}:{link}:{count}")
        return f"{count} NVLink errors on link {link} of GPU {gpu} after every load of driver {driver}"
    conf = read_conf(host.gpus_conf)
    host.set_gpu(gpu, **{f"nvlink_{c}": add_link_count(conf.get(f"gpu.{gpu}.nvlink_{c}", ""), link, count)
                         for c in NVLINK_ERROR_KEYS})
    return f"{count} NVLink CRC and replay errors on link {link} of GPU {gpu}"


def fabric_stuck(host: Host, driver: str | None = None) -> str:
    """The NVSwitch fabric stays in progress whatever the fabric manager does: with DRIVER, from its next load on;
    else now and under the driver loaded now (any driver when none is)."""
    conf = read_conf(host.gpus_conf)
    sku = SKUS.get(conf.get("sku", ""))
    if sku is None or not sku.nvswitch:
        raise InputError(f"{host.record.name} ({sku.name if sku else conf.get('sku')}) has no NVSwitch fabric")
    if driver:
        update_conf(host.faults_conf, **{f"fabric_stuck__{check_version(driver)}": 1})
        return f"the NVSwitch fabric stays in progress from the next load of driver {driver}"
    version = loaded_driver(host) or "any"
    update_conf(host.faults_conf, **{f"fabric_stuck__{version}": 1})
    update_conf(host.gpus_conf, fabric_stuck=1)
    return f"the NVSwitch fabric stays in progress (driver {version})"


# ---- NVLink domains and IMEX (docs/lab.md) ----------------------------------------------------------------------
#
# faults.conf: imex_down=1 (IMEX does not run and will not start), imex_down_next_boot=1 (the same at the next boot
# only: the boot turns it into imex_down_boot=<its boot id>), clique_next_boot=N (the tray comes back from its next
# boot in clique N: gpus.conf fabric.clique_id, until restored). The node list is the tray's own file.

IMEX_NODES = "/etc/nvidia-imex/nodes_config.cfg"


def apply_next_boot_faults(hw: dict[str, str], faults: dict[str, str], boot_id: str) -> bool:
    """What the faults planted for the next boot do at the boot BOOT_ID: changes HW (gpus.conf) and FAULTS
    (faults.conf) in place; True when they changed."""
    changed = False
    if faults.pop("imex_down_next_boot", "0") == "1":
        faults["imex_down_boot"] = boot_id
        changed = True
    clique = faults.pop("clique_next_boot", "")
    if clique:
        hw["fabric.clique_id"] = clique
        changed = True
    return changed


def domain_tray(host: Host) -> str:
    """The NVLink domain HOST is a tray of (InputError if none)."""
    domain = read_conf(host.gpus_conf).get("fabric.domain")
    if not domain:
        raise InputError(f"{host.record.name} is not a tray of an NVLink domain (lab spec +domain=NAME)")
    return domain


def imex_unit(host: Host, verb: str) -> str:
    """`systemctl VERB nvidia-imex` in the host; '' when it worked, else why not."""
    try:
        run_in_host(host, ["systemctl", verb, "nvidia-imex"])
        return ""
    except (RuntimeError, subprocess.SubprocessError) as e:
        return f" (IMEX not {verb}ed: {str(e).splitlines()[-1][-120:]})"


def imex_down(host: Host, next_boot: bool = False, restore: bool = False) -> str:
    """IMEX down on the tray: now (stopped, and it will not start), or with NEXT_BOOT after the tray's next boot,
    for that boot only (a tray failing after its reboot). RESTORE clears both and starts IMEX."""
    domain_tray(host)
    if restore:
        update_conf(host.faults_conf, imex_down=0, imex_down_next_boot=0, imex_down_boot="")
        return "IMEX may run again" + imex_unit(host, "start")
    if next_boot:
        update_conf(host.faults_conf, imex_down_next_boot=1)
        return "IMEX does not come up after the next boot"
    update_conf(host.faults_conf, imex_down=1)
    return "IMEX down: stopped, and it will not start" + imex_unit(host, "stop")


def clique_change(host: Host, clique: int | None = None, restore: bool = False) -> str:
    """The tray comes back from its next boot in another NVLink clique (CLIQUE, default the domain's - 1), and stays
    there; RESTORE puts it back in the domain's clique now."""
    domain_tray(host)
    if restore:
        update_conf(host.faults_conf, clique_next_boot="")
        update_conf(host.gpus_conf, fabric__clique_id=DOMAIN_CLIQUE)
        return f"back in clique {DOMAIN_CLIQUE}"
    clique = DOMAIN_CLIQUE - 1 if clique is None else clique
    if not 0 < clique < 2 ** 32 or clique == DOMAIN_CLIQUE:
        raise InputError(f"--clique must be a clique id other than the domain's {DOMAIN_CLIQUE}, not {clique}")
    update_conf(host.faults_conf, clique_next_boot=clique)
    return f"comes back from the next boot in clique {clique}"


def imex_node_missing(host: Host, peer: str, restore: bool = False) -> str:
    """PEER (a tray of the same domain) is missing from the tray's IMEX node list, and IMEX restarted on it (as after
    an edit by hand); RESTORE writes the domain's list again."""
    domain = domain_tray(host)
    nodes = json.loads((host.dir / "host.json").read_text()).get("imex_nodes") or []
    if not restore:
        try:
            other = host.lab.host(peer)
        except KeyError:
            raise InputError(f"no lab host {peer!r}") from None
        if other.spec.domain != domain or other.name == host.record.name:
            raise InputError(f"{peer} is not another tray of {host.record.name}'s domain {domain}")
        nodes = [a for a in nodes if a != other.address]
    run_in_host(host, ["sh", "-c", f'printf "%s\\n" "$@" > {IMEX_NODES}', "sh", *nodes])
    what = "node list restored" if restore else f"{peer} ({host.lab.host(peer).address}) missing from the node list"
    return what + imex_unit(host, "restart")


# ---- NVSwitch SXids and InfiniBand ports (docs/lab.md) --------------------------------------------------------

# The nvswitch driver's headlines for the SXids the lab plants, as real hosts logged them
# (tests/testdata/kernel-log/sxid-forms.dmesg): code -> (link, text). The headline starts with the error's class
# (Fatal / Non-fatal), then "Link NN" and the text; "Severity N Engine instance NN ..." (1: fatal, 0: not) and
# "Data {...}" lines follow. A code without a headline here logs its Severity and Data lines only, as the driver
# does for part of its errors (the same file: 10002, 12028).
SXID_HEADLINES = {
    20034: (48, "LTSSM Fault Up"),
    22013: (44, "Minion Link DLREQ interrupt"),
    19084: (29, "AN1 Heartbeat Timeout Error (First)"),
}
SXID_FATAL = {20034: True, 22013: False, 19084: False}  # the class these headlines were logged with


def sxid_lines(code: int, switch: int = 0, fatal: bool | None = None) -> list[str]:
    """The lines one SXid error logs on nvidia-nvswitchSWITCH (FATAL: the class; default the headline's, else
    fatal)."""
    fatal = SXID_FATAL.get(code, True) if fatal is None else fatal
    head = f"nvidia-nvswitch{switch}: SXid (PCI:{NVSWITCHES[switch]}): {code:05d}, "
    link, text = SXID_HEADLINES.get(code, (None, None))
    engine = link or 0
    lines = [head + f"{'Fatal' if fatal else 'Non-fatal'}, Link {link:02d} {text}"] if text else []
    return lines + [head + f"Severity {int(fatal)} Engine instance {engine:02d} Sub-engine instance 00",
                    head + "Data {" + ", ".join(f"0x{v:08x}" for v in (engine, engine, 0, engine) + (0,) * 5) + "}"]


def sxid(host: Host, code: int, switch: int = 0, fatal: bool | None = None) -> str:
    """An NVSwitch SXid error in the host's kernel log (a board with NVSwitches only)."""
    conf = read_conf(host.gpus_conf)
    sku = SKUS.get(conf.get("sku", ""))
    if sku is None or not sku.nvswitch:
        raise InputError(f"{host.record.name} ({sku.name if sku else conf.get('sku')}) has no NVSwitch")
    if not 0 <= switch < len(NVSWITCHES):
        raise InputError(f"{host.record.name} has NVSwitches 0..{len(NVSWITCHES) - 1}, not {switch}")
    lines = sxid_lines(code, switch, fatal)
    for line in lines:
        host.kernel_log(line)
    return lines[0]


def ib_port_down(host: Host, port: int, rate: float | None = None) -> str:
    """Port PORT (mlx5_PORT port 1) loses its link: state DOWN, physical state Disabled, link_downed counts it. With
    RATE (Gb/s): it comes back trained below the board's rate (ACTIVE, LinkUp, RATE). It stays so across reboots
    (a cable or transceiver fault); the counters restart at each boot."""
    conf = read_conf(host.gpus_conf)
    ports = ib_ports(conf)
    if not ports:
        raise InputError(f"{host.record.name} ({conf.get('sku')}) has no InfiniBand port")
    if not 0 <= port < len(ports):
        raise InputError(f"{host.record.name} has InfiniBand ports 0..{len(ports) - 1} (mlx5_N), not {port}")
    this = ports[port]
    changes = {f"ib.{port}.link_downed": this["counters"]["link_downed"] + 1}
    if rate is None:
        changes[f"ib.{port}.down"] = 1
        what = f"{this['device']} port 1 DOWN (Disabled)"
    else:
        width, speed = int(conf.get("ib.width", "4")), conf.get("ib.speed", "NDR")
        full = ib_rate_gbps(width, speed)
        trained = ib_trained(rate, width, speed)
        if not 0 < rate < full or trained is None:
            raise InputError(f"--rate {rate:g}: not a rate below the port's {full:g} Gb/s that {width} lanes of "
                             f"{speed} or fewer or slower ones train at")
        changes.update({f"ib.{port}.down": 0, f"ib.{port}.width": trained[0], f"ib.{port}.speed": trained[1]})
        what = f"{this['device']} port 1 went down and came back at {rate:g} Gb/s ({trained[0]}X {trained[1]})"
    update_conf(host.gpus_conf, **{k.replace(".", "__"): v for k, v in changes.items()})
    write_infiniband(host.dir / "kernel" / "class-infiniband", read_conf(host.gpus_conf))
    return what


def ib_trained(rate: float, width: int, speed: str) -> tuple[int, str] | None:
    """How a port of WIDTH lanes at SPEED runs at RATE Gb/s: fewer lanes at its speed, else its lanes at a slower
    speed; None when neither gives RATE."""
    deci = round(rate * 10)
    for w in IB_WIDTHS:
        if w < width and IB_LANE_DECI_GBPS[speed] * w == deci:
            return w, speed
    for name, lane in IB_LANE_DECI_GBPS.items():
        if lane < IB_LANE_DECI_GBPS[speed] and lane * width == deci:
            return width, name
    return None


# ---- PCIe errors, leaked memory, firmware (issue 24) ---------------------------------------------------------

def pcie_errors(host: Host, gpu: int, replays: int = 0, fatal: int = 0, nonfatal: int = 0, correctable: int = 0) -> str:
    """GPU's link misbehaves: NVML's PCIe replay counter reads REPLAYS (until the next driver load) and the kernel's
    AER counters of its PCI device (/sys/bus/pci/devices/DEV/aer_dev_*) count the errors (until the next boot), with
    the AER line the kernel logs for the worst of them."""
    if min(replays, fatal, nonfatal, correctable) < 0:
        raise InputError("PCIe error counts are 0 or more")
    pci = host.pci(gpu)
    host.set_gpu(gpu, pcie_replays=replays)
    dev = host.dir / "kernel" / "pci-devices" / sysfs_pci_name(pci)
    if dev.is_dir():
        write_aer(dev, correctable=correctable, nonfatal=nonfatal, fatal=fatal)
    worst = ("Uncorrected (Fatal)" if fatal else "Uncorrected (Non-Fatal)" if nonfatal else
             "Corrected" if correctable else None)
    if worst:
        host.kernel_log(f"pcieport 0000:00:01.0: AER: {worst} error message received from {sysfs_pci_name(pci)}")
    return (f"GPU {gpu} ({pci}): {replays} PCIe replays, AER fatal {fatal}, non-fatal {nonfatal}, "
            f"correctable {correctable}")


def leaked_memory(host: Host, gpu: int, mib: int) -> str:
    """A context leaked on GPU: NVML (and nvidia-smi) show MIB in use beyond the reserved memory with no process
    listed, until a reboot (or a driver load) frees it."""
    if mib < 0:
        raise InputError(f"--mib must be 0 or more, not {mib}")
    host.set_gpu(gpu, mem_used_mib=mib)
    return f"GPU {gpu} holds {mib} MiB with no process"


def vbios(host: Host, version: str, gpu: int | None = None, inforom: str | None = None) -> str:
    """The GPU's firmware was flashed to VERSION (every GPU of the host without --gpu), and its InfoROM image to
    INFOROM when given: what NVML and nvidia-smi report from now on."""
    for text in (version, inforom or "0"):
        if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z._-]{0,30}", text):
            raise InputError(f"{text!r} is not a firmware version (like 96.00.99.00.01)")
    count = int(read_conf(host.gpus_conf).get("count", "0"))
    for index in [gpu] if gpu is not None else range(count):
        host.set_gpu(index, vbios=version, **({"inforom": inforom} if inforom else {}))
    return ("VBIOS " + version + (f", InfoROM {inforom}" if inforom else "")
            + (f" on GPU {gpu}" if gpu is not None else " on every GPU"))


def gpu_in_use(host: Host, gpu: int) -> str:
    """A job keeps running on GPU: a process in the host that NVML lists as the GPU's compute process (until it
    exits or the host reboots)."""
    host.gpu_key(gpu, "process")
    proc = run_in_host(host, ["sh", "-c", "sleep 86400 </dev/null >/dev/null 2>&1 & echo $!"])
    pid = int(proc.stdout.split()[-1])
    host.set_gpu(gpu, process=pid)
    return f"GPU {gpu} in use by pid {pid} (sleep)"


def drm_in_use(host: Host, restore: bool = False) -> str:
    """A console holds nvidia_drm (fbcon on an nvidia-drm framebuffer): the modules cannot be unloaded, only a
    reboot loads another driver."""
    update_conf(host.faults_conf, drm_in_use=0 if restore else 1)
    return "nvidia_drm " + ("free again" if restore else "held by the console (fbcon)")


def newer_release(release: str) -> str:
    """The kernel release an unattended update would install next: 6.18.44-fc-v782 -> 6.18.45-fc-v782."""
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)(.*)$", release)
    if not m:
        raise InputError(f"cannot tell the next release after {release!r}: give --release")
    return f"{m[1]}.{m[2]}.{int(m[3]) + 1}{m[4]}"


def kernel_update(host: Host, release: str | None = None, restore: bool = False) -> str:
    """An unattended kernel update that DKMS could not build the nvidia module for: /boot gets the running kernel's
    image and a newer one, /lib/modules/<newer> has no nvidia module; the next boot starts the newer kernel and
    comes up without the driver. --restore removes the newer kernel again (the next boot is the old one)."""
    running = os.uname().release
    planted = read_conf(host.faults_conf).get("kernel_update", "")
    new = release or planted or newer_release(running)
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+~_-]*", new) or new == running:
        raise InputError(f"--release {new!r}: not a kernel release other than the running {running}")
    if restore:
        run_in_host(host, ["rm", "-rf", f"/boot/vmlinuz-{new}", f"/boot/initrd.img-{new}", f"/lib/modules/{new}",
                           f"/boot/vmlinuz-{running}"])  # the lab's hosts have no kernel image of their own
        update_conf(host.faults_conf, kernel_update="")
        return f"kernel {new} removed: the next boot starts {running}"
    run_in_host(host, ["sh", "-c", f"mkdir -p /boot /lib/modules/{new}/kernel && touch /boot/vmlinuz-{running} "
                                   f"/boot/vmlinuz-{new} /boot/initrd.img-{new} /lib/modules/{new}/modules.dep"])
    update_conf(host.faults_conf, kernel_update=new)
    return f"kernel {new} installed without an nvidia module: the next boot starts it"


def slow_reboot(host: Host, seconds: float) -> str:
    update_conf(host.faults_conf, slow_reboot=seconds)
    return f"reboots take {seconds}s longer"


def install_failure(host: Host, driver: str) -> str:
    update_conf(host.faults_conf, install_fail=check_version(driver))
    return f"installing driver {driver} fails"


def nouveau(host: Host) -> str:
    """nouveau is loaded now (it comes back after a reboot only if it is not blacklisted)."""
    (host.dir / "kernel" / "sys-module" / "nouveau").mkdir(parents=True, exist_ok=True)
    host.kernel_log("nouveau 0000:18:00.0: NVIDIA GH100 (180000a1)", priority=6)
    return "nouveau loaded"


def persistence_off(host: Host, gpu: int | None = None) -> str:
    count = int(read_conf(host.gpus_conf).get("count", "0"))
    for index in [gpu] if gpu is not None else range(count):
        host.set_gpu(index, persistence=0)
    kill_in_host(host, "nvidia-persistenced")
    return "persistence mode off" + (f" on GPU {gpu}" if gpu is not None else "") + ", nvidia-persistenced stopped"


def runtime_misconfigured(host: Host) -> str:
    """Somebody replaced containerd's config: no nvidia runtime any more."""
    run_in_host(host, ["sh", "-c", "mkdir -p /etc/containerd && rm -f /etc/containerd/conf.d/99-nvidia.toml && "
                                   "printf 'version = 2\\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\\n"
                                   "  default_runtime_name = \"runc\"\\n' > /etc/containerd/config.toml"])
    return "containerd config without the nvidia runtime"


def unreachable(host: Host, mode: str = "link", restore: bool = False) -> str:
    if mode == "link":
        subprocess.run(["ip", "link", "set", host.record.veth, "up" if restore else "down"], check=True)
        return f"link {host.record.veth} {'up' if restore else 'down'}"
    if restore:
        raise InputError("sshd comes back with the host's next reboot (fleetctl lab reboot HOST)")
    kill_in_host(host, "sshd")
    return "sshd stopped"


# ---- reaching into a host --------------------------------------------------------------------

def host_pids(host: Host) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", host.record.netns], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def kill_in_host(host: Host, program: str) -> None:
    for pid in host_pids(host):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if os.path.basename(argv0.split(" ", 1)[0]) == program or argv0.startswith(f"{program}:"):
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass


def run_in_host(host: Host, argv: list[str]) -> subprocess.CompletedProcess:
    """Run a command inside the host (its mount, UTS and network namespaces, chrooted into its root)."""
    pid = host.record.supervisor_pid
    root = host.dir / "root"
    proc = subprocess.run(["nsenter", f"--target={pid}", "--mount", "--uts", "--net", "--pid", "--", "chroot", str(root), *argv],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {host.record.name}: {proc.stderr.strip()[-300:]}")
    return proc
