"""A lab host's emulated kernel modules and kernel log (docs/lab.md): what /sys/module and /proc/driver show, and
loading or unloading the nvidia modules as the host's modprobe/rmmod ask (through its supervisor).

The rules are the kernel's: a module loads after what it depends on; it unloads only when no module holds it and
nothing uses it (rmmod's "Module nvidia is in use"); loading nvidia brings the version installed in the host's root.

Standard library only: the supervisor uses it.
"""

from __future__ import annotations

import os
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
