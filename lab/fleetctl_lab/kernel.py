"""A lab host's emulated kernel modules and kernel log (docs/lab.md): what /sys/module and /proc/driver show, and
loading or unloading the nvidia modules as the host's modprobe/rmmod ask (through its supervisor).

The rules are the kernel's: a module loads after what it depends on; it unloads only when no module holds it and
nothing uses it (rmmod's "Module nvidia is in use"); loading nvidia brings the version installed in the host's root.

Standard library only: the supervisor uses it.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable

# module -> the modules it depends on (they hold it)
STACK = {"nvidia": (), "nvidia_modeset": ("nvidia",), "nvidia_uvm": ("nvidia",), "nvidia_drm": ("nvidia_modeset",)}
NVSWITCHES = ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")  # an HGX board's four NVSwitches


def nvrm_banner(version: str, flavor: str) -> str:
    built = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime(1735689600))
    if flavor == "open":
        return f"NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  (lab@fleetctl)  {built}"
    return f"NVIDIA UNIX x86_64 Kernel Module  {version}  {built}"


def load_messages(name: str, version: str, flavor: str) -> list[tuple[int, str]]:
    """(priority, message) the real modules log when they load."""
    return {
        "nvidia": [(4, "nvidia: loading out-of-tree module taints kernel."),
                   (6, "nvidia-nvlink: Nvlink Core is being initialized, major device number 240"),
                   (3, f"NVRM: loading {nvrm_banner(version, flavor)}")],
        "nvidia_modeset": [(6, f"nvidia-modeset: Loading NVIDIA UNIX {'Open ' if flavor == 'open' else ''}Kernel "
                               f"Mode Setting Driver for x86_64  {version}  Release Build  (lab@fleetctl)")],
        "nvidia_drm": [(6, "[drm] [nvidia-drm] [GPU ID 0x00001800] Loading driver")],
        "nvidia_uvm": [(6, "nvidia_uvm: module uses symbols nvUvmInterfaceDisableAccessCntr from proprietary "
                           "module nvidia, inheriting taint.")],
    }[name]


# The PCI device's AER counters (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats): one "NAME COUNT" line per
# error bit, then the TOTAL_ERR_* line; the lab counts its planted errors on one bit of each file.
AER_BITS = {
    "aer_dev_correctable": ("TOTAL_ERR_COR", "Receiver Error",
                            ("Receiver Error", "Bad TLP", "Bad DLLP", "RELAY_NUM Rollover", "Replay Timer Timeout",
                             "Advisory Non-Fatal", "Corrected Internal Error", "Header Log Overflow")),
    "aer_dev_nonfatal": ("TOTAL_ERR_NONFATAL", "Completion Timeout",
                         ("Undefined", "Data Link Protocol", "Surprise Down Error", "Poisoned TLP",
                          "Flow Control Protocol", "Completion Timeout", "Completer Abort", "Unexpected Completion",
                          "Receiver Overflow", "Malformed TLP", "ECRC", "Unsupported Request", "ACS Violation",
                          "Uncorrectable Internal Error", "MC Blocked TLP", "AtomicOp Egress Blocked",
                          "TLP Prefix Blocked Error", "Poison TLP Egress Blocked")),
}
AER_BITS["aer_dev_fatal"] = ("TOTAL_ERR_FATAL", "Surprise Down Error", AER_BITS["aer_dev_nonfatal"][2])


def sysfs_pci_name(bus_id: str) -> str:
    """NVML's 00000000:18:00.0 -> sysfs 0000:18:00.0."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def write_aer(dev: Path, correctable: int = 0, nonfatal: int = 0, fatal: int = 0) -> None:
    """The three AER files of one PCI device directory, with COUNT errors on each file's planted bit."""
    for name, count in (("aer_dev_correctable", correctable), ("aer_dev_nonfatal", nonfatal), ("aer_dev_fatal", fatal)):
        total, bit, bits = AER_BITS[name]
        lines = [f"{b} {count if b == bit else 0}" for b in bits] + [f"{total} {count}"]
        (dev / name).write_text("\n".join(lines) + "\n")


def append_kmsg(kernel: Path, messages: list[tuple[int, str]]) -> None:
    """Append records to the host's /dev/kmsg (kernel/kmsg), numbered after the last one, timed since boot."""
    kmsg, last_seq = kernel / "kmsg", -1
    if kmsg.exists():
        for line in kmsg.read_text(errors="replace").splitlines():
            head = line.split(";", 1)[0].split(",")
            if len(head) >= 3 and head[1].isdigit():
                last_seq = int(head[1])
    try:
        booted = float((kernel / "booted_at").read_text())
    except (OSError, ValueError):
        booted = time.time()
    usec = int((time.time() - booted) * 1e6)
    with open(kmsg, "a") as f:
        for i, (priority, message) in enumerate(messages):
            f.write(f"{priority},{last_seq + 1 + i},{usec + i},-;{message}\n")


class Modules:
    """The nvidia modules of one host's kernel directory (kernel/sys-module, kernel/proc-driver)."""

    def __init__(self, kernel: Path, nvswitch: bool):
        self.kernel = kernel
        self.sys_module = kernel / "sys-module"
        self.proc_driver = kernel / "proc-driver"
        self.nvswitch = nvswitch

    def loaded(self, name: str) -> bool:
        return (self.sys_module / name / "initstate").exists()

    def version(self, name: str) -> str | None:
        try:
            return (self.sys_module / name / "version").read_text().strip()
        except OSError:
            return None

    def write_refcnt(self, users: Callable[[str], list[str]]) -> None:
        """Each loaded module's refcnt: the modules holding it plus what uses it (open device files, a console)."""
        for path in self.sys_module.iterdir():
            if (path / "initstate").exists() and path.name in STACK:
                count = str(len(self.holders(path.name)) + len(users(path.name))) + "\n"
                if not (path / "refcnt").exists() or (path / "refcnt").read_text() != count:
                    (path / "refcnt").write_text(count)

    def holders(self, name: str) -> list[str]:
        try:
            return sorted(os.listdir(self.sys_module / name / "holders"))
        except OSError:
            return []

    def load(self, name: str, module: tuple[str, str] | None) -> list[tuple[int, str]]:
        """Load NAME (and what it depends on) from the installed driver MODULE (version, flavor); the kernel log
        lines it writes. OSError when the module is not installed."""
        if module is None or name not in STACK:
            raise OSError(f"FATAL: Module {name} not found in directory /lib/modules/{os.uname().release}")
        if self.loaded(name):
            return []
        messages = []
        for dependency in STACK[name]:
            messages += self.load(dependency, module)
        version, flavor = module
        for dependency in STACK[name]:
            theirs = self.version(dependency)
            if theirs not in (None, version):  # the new module's symbols do not match the loaded one's
                raise OSError(f"ERROR: could not insert '{name}': Invalid argument "
                              f"({name} {version} disagrees about version of symbol with {dependency} {theirs})")
        path = self.sys_module / name
        (path / "holders").mkdir(parents=True, exist_ok=True)
        if name != "nvidia_drm":
            (path / "version").write_text(version + "\n")
        (path / "initstate").write_text("live\n")
        for dependency in STACK[name]:
            link = self.sys_module / dependency / "holders" / name
            if not os.path.lexists(link):
                os.symlink(f"../../{name}", link)
        if name == "nvidia":
            (self.proc_driver / "nvidia").mkdir(parents=True, exist_ok=True)
            (self.proc_driver / "nvidia/version").write_text(
                f"NVRM version: {nvrm_banner(version, flavor)}\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n")
            if self.nvswitch:
                for switch in NVSWITCHES:
                    (self.proc_driver / "nvidia-nvswitch/devices" / switch).mkdir(parents=True, exist_ok=True)
        return messages + load_messages(name, version, flavor)

    def unload(self, name: str, users: Callable[[str], list[str]]) -> tuple[int, str]:
        """rmmod NAME: refused while held by a module or used (USERS(name): what holds it open)."""
        if not self.loaded(name):
            return 1, f"rmmod: ERROR: Module {name} is not currently loaded"
        held_by = self.holders(name)
        if held_by:
            return 1, f"rmmod: ERROR: Module {name} is in use by: {' '.join(held_by)}"
        if users(name):
            return 1, f"rmmod: ERROR: Module {name} is in use"
        shutil.rmtree(self.sys_module / name)
        for dependency in STACK.get(name, ()):
            link = self.sys_module / dependency / "holders" / name
            if os.path.lexists(link):
                link.unlink()
        if name == "nvidia":
            for entry in ("nvidia", "nvidia-nvswitch"):
                shutil.rmtree(self.proc_driver / entry, ignore_errors=True)
            append_kmsg(self.kernel, [(6, "nvidia-nvlink: Unregistered Nvlink Core, major device number 240")])
        return 0, ""


# ---- InfiniBand (/sys/class/infiniband, docs/lab.md) --------------------------------------------------------------
# The files and formats of the kernel's drivers/infiniband/core/sysfs.c (Documentation/ABI/stable/
# sysfs-class-infiniband): <device>/ports/<n>/state "%d: %s", phys_state "%u: %s", rate "%d%s Gb/sec (%dX%s)" (from
# the lanes' active width and speed), link_layer, lid "0x%x", counters/<name> "%llu". The hardware state is in
# gpus.conf: ib.count (single-port HCAs mlx5_0.., one per GPU on an HGX board), ib.width and ib.speed (what every port
# trains at), and per port ib.<i>.down=1, ib.<i>.width / ib.<i>.speed (trained below the board's rate),
# ib.<i>.link_downed / ib.<i>.symbol_error (counted since boot: an HCA reset at boot restarts them).
IB_LANE_DECI_GBPS = {"SDR": 25, "DDR": 50, "QDR": 100, "FDR10": 100, "FDR": 140, "EDR": 250, "HDR": 500, "NDR": 1000,
                     "XDR": 2000}  # rate_show's per-lane rate in deci-Gb/s
IB_WIDTHS = (1, 2, 4, 8, 12)
IB_STATE = {"down": (1, "DOWN"), "active": (4, "ACTIVE")}  # enum ib_port_state; ib_port_state_to_str
IB_PHYS_STATE = {"down": (3, "Disabled"), "active": (5, "LinkUp")}  # enum ib_port_phys_state; phys_state_to_str
IB_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
               "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
               "excessive_buffer_overrun_errors", "port_xmit_data", "port_rcv_data", "port_xmit_packets",
               "port_rcv_packets")
IB_VOLATILE = ("link_downed", "symbol_error")  # the counters gpus.conf may hold (lab inject ib-port-down)
IB_HCA_TYPE, IB_FW = "MT4129", "28.39.2048"  # ConnectX-7 (PCI device 0x1021) and a firmware of its 28.x line


def ib_rate_text(width: int, speed: str) -> str:
    """The rate file: '400 Gb/sec (4X NDR)' for 4 lanes at NDR, '2.5 Gb/sec (1X SDR)'."""
    deci = IB_LANE_DECI_GBPS[speed] * width
    return f"{deci // 10}{'.5' if deci % 10 else ''} Gb/sec ({width}X {speed})"


def ib_rate_gbps(width: int, speed: str) -> float:
    return IB_LANE_DECI_GBPS[speed] * width / 10


def ib_ports(hw: dict[str, str]) -> list[dict[str, object]]:
    """Each port of HW (gpus.conf): device, state (down/active), width, speed and its volatile counters."""
    try:
        count = int(hw.get("ib.count", "0") or 0)
    except ValueError:
        count = 0
    ports = []
    for i in range(count):
        width = int(hw.get(f"ib.{i}.width") or hw.get("ib.width") or 4)
        speed = hw.get(f"ib.{i}.speed") or hw.get("ib.speed") or "NDR"
        ports.append({"device": f"mlx5_{i}", "state": "down" if hw.get(f"ib.{i}.down") == "1" else "active",
                      "width": width, "speed": speed,
                      "counters": {c: int(hw.get(f"ib.{i}.{c}", "0") or 0) for c in IB_VOLATILE}})
    return ports


def ib_boot(hw: dict[str, str]) -> dict[str, str]:
    """HW after a boot: the ports' counters restart at 0 (the HCA is reset); a port that is down stays down."""
    return {k: v for k, v in hw.items() if not re.match(r"^ib\.\d+\.(%s)$" % "|".join(IB_VOLATILE), k)}


def write_infiniband(directory: Path, hw: dict[str, str]) -> None:
    """DIRECTORY (bind-mounted over /sys/class/infiniband) as the kernel shows HW's HCAs: emptied and rewritten,
    the directory itself kept (it is a mount point)."""
    directory.mkdir(parents=True, exist_ok=True)
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for i, port in enumerate(ib_ports(hw)):
        dev = directory / str(port["device"])
        guid = f"b83f:d203:00{i:02x}:{0x1a2b + i:04x}"
        for name, value in (("node_type", "1: CA"), ("node_guid", guid), ("sys_image_guid", guid),
                            ("hca_type", IB_HCA_TYPE), ("fw_ver", IB_FW)):
            _write(dev / name, value)
        p = dev / "ports" / "1"
        down = port["state"] == "down"
        # A port that is down has no active lanes to report; mlx5 then reads as 4X SDR (ibstat: "Rate: 10").
        width, speed = (4, "SDR") if down else (int(port["width"]), str(port["speed"]))
        state, phys = IB_STATE[str(port["state"])], IB_PHYS_STATE[str(port["state"])]
        for name, value in (("state", f"{state[0]}: {state[1]}"), ("phys_state", f"{phys[0]}: {phys[1]}"),
                            ("rate", ib_rate_text(width, speed)), ("link_layer", "InfiniBand"),
                            ("lid", "0x0" if down else f"0x{0x10 + i:x}"), ("sm_lid", "0x0" if down else "0x1"),
                            ("sm_sl", "0"), ("lid_mask_count", "0"), ("cap_mask", "0xa651e848")):
            _write(p / name, value)
        counters = dict.fromkeys(IB_COUNTERS, 0)
        counters.update(port["counters"])  # type: ignore[arg-type]
        for name, value in counters.items():
            _write(p / "counters" / name, str(value))


def _write(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")
