"""A lab host's kernel: each boot's kernel state (modules loaded, nouveau or nvidia, PCI devices, the kernel log,
faults planted for a driver version) and the host's modprobe, rmmod and modinfo, answered by the supervisor with
the kernel's rules (fleetctl_lab.kernel.Modules)."""

from __future__ import annotations

import os
import re
import time
import uuid

from ..conf import read_conf, write_conf
from ..faults import apply_link_faults, apply_next_boot_faults, xid_line
from ..kernel import STACK, append_kmsg, ib_boot, load_messages, sysfs_pci_name, write_aer, write_infiniband
from .base import clear_dir, write_in_place
from .daemons import UNITS

MODULE_FILE = "usr/lib/nvidia-lab/modules/nvidia.version"
PCI_DEVICE_IDS = {"h100-sxm": "0x2330", "h200-sxm": "0x2335", "a100-sxm": "0x20b2", "a100-pcie": "0x20b5",
                  "l40s": "0x26b9", "gb200-nvl": "0x2941"}
PCIE_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}


class KernelModules:
    """Uses set_every_gpu (HostBase) and daemon_pids (InitSystem)."""

    # -- the emulated kernel (each boot) ------------------------------------------------------------------------
    def boot_kernel(self) -> None:
        hw = read_conf(self.hw / "gpus.conf")
        self.release = read_conf(self.hw / "faults.conf").get("kernel_update") or os.uname().release
        module = self.module()
        nouveau = not self.nouveau_blacklisted()
        if module and nouveau and not self.nvidia_in_initramfs(module):
            # An un-blacklisted nouveau loads at boot and holds the GPUs; nvidia's probe finds none and its module
            # does not load, unless the initramfs loaded it first.
            module = None
        nouveau = nouveau and module is None
        self.booted_module = module
        self.boot_id = str(uuid.uuid4())
        write_in_place(self.kernel / "boot_id", self.boot_id + "\n")
        write_in_place(self.kernel / "booted_at", f"{time.time():.3f}\n")
        faults = read_conf(self.hw / "faults.conf")
        if apply_next_boot_faults(hw, faults, self.boot_id):  # IMEX down this boot, a tray back in another clique
            write_in_place(self.hw / "gpus.conf", "".join(f"{k}={v}\n" for k, v in hw.items()))
            write_conf(self.hw / "faults.conf", faults)
        extra = self.boot_faults(hw, module)
        self.write_modules(module, nouveau)
        self.write_pci(hw)
        booted = ib_boot(hw)  # (hw as boot_faults left it)
        if booted != hw:  # the HCAs' counters restart
            write_in_place(self.hw / "gpus.conf", "".join(f"{k}={v}\n" for k, v in booted.items()))
        write_infiniband(self.kernel / "class-infiniband", booted)
        write_in_place(self.kernel / "kmsg", "".join(
            f"{prio},{seq},{usec},-;{msg}\n"
            for seq, (prio, usec, msg) in enumerate(boot_log(hw, module, nouveau, self.release) + extra)))

    def boot_faults(self, hw: dict[str, str], module: tuple[str, str] | None) -> list[tuple[int, int, str]]:
        """Faults planted for boots with the loaded driver version (lab inject xid/fall-off-bus --at-boot), and the
        NVLinks training as that driver loads: error counters restart, planted links train down, a planted
        fabric_stuck holds the fabric (faults.apply_link_faults)."""
        faults = read_conf(self.hw / "faults.conf")
        if module is None:
            return []
        lines = []
        xid = faults.get(f"boot_xid.{module[0]}")
        if xid:
            code, gpu = xid.split(":")
            lines.append((3, 3100000, xid_line(int(code), hw[f"gpu.{gpu}.pci"])))
        lost = faults.get(f"boot_lost.{module[0]}")
        if lost and hw.get(f"gpu.{lost}.lost") != "1":
            hw[f"gpu.{lost}.lost"] = "1"
            write_in_place(self.hw / "gpus.conf", "".join(f"{k}={v}\n" for k, v in hw.items()))
            lines.append((3, 3200000, xid_line(79, hw[f"gpu.{lost}.pci"])))
        if apply_link_faults(hw, faults, module[0]):
            write_in_place(self.hw / "gpus.conf", "".join(f"{k}={v}\n" for k, v in hw.items()))
        return lines

    def module(self) -> tuple[str, str] | None:
        """(version, flavor) of the driver's kernel module in the host root, or None: the lab packages' module file,
        else a DKMS module of the driver that the host's dkms has registered (Debian's nvidia-tesla-470-kernel-dkms
        and kin: /var/lib/dkms/nvidia-tesla-470/470.256.02/source). The lab's kernel stands for a host with the
        kernel headers: what DKMS registered is what boots, built (docs/lab.md). None after a boot into a planted
        kernel update (faults.conf kernel_update) with no nvidia.ko under /lib/modules/<release>."""
        if self.release != os.uname().release and not any((self.root / "lib/modules" / self.release).rglob("nvidia.ko*")):
            return None  # booted a kernel updated without a module built for it: the driver is gone
        try:
            words = (self.root / MODULE_FILE).read_text().split()
        except OSError:
            words = []
        if words:
            return words[0], words[1] if len(words) > 1 else "open"
        registered = [(tuple(int(p) for p in tree.name.split(".")), tree.name,
                       "open" if "open" in tree.parent.name else "proprietary")
                      for tree in (self.root / "var/lib/dkms").glob("nvidia*/*")  # source: a link into the host
                      if re.fullmatch(r"\d+\.\d+(\.\d+)?", tree.name) and (tree / "source").is_symlink()]
        return max(registered)[1:] if registered else None

    def nvidia_in_initramfs(self, module: tuple[str, str]) -> bool:
        """Whether the initramfs loads MODULE's version before nouveau can: the one made when the host was set up
        holds the driver it was set up with; the package manager rebuilds it on a driver change without nvidia in it
        (Debian's and Ubuntu's default), so from the first boot into another driver version on, nouveau wins."""
        record = self.kernel / "initramfs-nvidia"
        if self.boots <= 1 and not record.exists():
            write_in_place(record, module[0] + "\n")
        held = record.read_text().strip() if record.exists() else ""
        if held and held != module[0]:
            record.unlink()
            held = ""
        return held == module[0]

    def nouveau_blacklisted(self) -> bool:
        for directory in ("etc/modprobe.d", "run/modprobe.d", "usr/lib/modprobe.d", "lib/modprobe.d"):
            for conf in (self.root / directory).glob("*.conf"):
                try:
                    text = conf.read_text(errors="replace")
                except OSError:
                    continue
                if any(line.split()[:2] == ["blacklist", "nouveau"] for line in text.splitlines() if line.strip()):
                    return True
        return False

    def write_modules(self, module: tuple[str, str] | None, nouveau: bool) -> None:
        modules = self.kernel_modules
        clear_dir(modules.sys_module)
        clear_dir(modules.proc_driver)
        if module:
            for name in ("nvidia_drm", "nvidia_uvm"):
                modules.load(name, module)  # with what they depend on; boot_log writes the boot's lines
        elif nouveau:
            (modules.sys_module / "nouveau").mkdir()
            (modules.sys_module / "nouveau/initstate").write_text("live\n")

    def write_pci(self, hw: dict[str, str]) -> None:
        pci = self.kernel / "pci-devices"
        clear_dir(pci)
        device_id = PCI_DEVICE_IDS.get(hw.get("sku", ""), "0x2330")
        for i in range(int(hw.get("count", "0"))):
            bus_id = hw.get(f"gpu.{i}.pci", "")
            if not bus_id:
                continue
            dev = pci / sysfs_pci_name(bus_id)
            dev.mkdir()
            gen = int(hw.get(f"gpu.{i}.pcie_gen", "4"))
            gen_max = int(hw.get(f"gpu.{i}.pcie_gen_max", str(gen)))
            for name, value in (("vendor", "0x10de"), ("device", device_id), ("class", "0x030200"),
                                ("subsystem_vendor", "0x10de"), ("current_link_speed", PCIE_SPEED.get(gen, "")),
                                ("max_link_speed", PCIE_SPEED.get(gen_max, "")),
                                ("current_link_width", hw.get(f"gpu.{i}.pcie_width", "16")),
                                ("max_link_width", hw.get(f"gpu.{i}.pcie_width_max", "16"))):
                (dev / name).write_text(value + "\n")
            write_aer(dev)  # counted since boot: every boot starts at 0 (lab inject pcie-errors plants some)

    # -- the host's modprobe, rmmod and modinfo (REQUEST_SHIM) --------------------------------------------------
    def modprobe(self, args: list[str]) -> tuple[int, str, str]:
        names = [a.replace("-", "_") for a in args if not a.startswith("-")]
        if not names:
            return 1, "", "modprobe: ERROR: missing module name.\n"
        if "-r" in args or "--remove" in args:
            return self.rmmod([n for n in names if self.kernel_modules.loaded(n)])
        messages: list[tuple[int, str]] = []
        for name in names:
            nvidia_before = self.kernel_modules.loaded("nvidia")
            try:
                messages += self.kernel_modules.load(name, self.module())
            except OSError as e:
                return 1, "", f"modprobe: {e}\n"
            if not nvidia_before and self.kernel_modules.loaded("nvidia"):
                # A driver load is what a boot with it does to the GPUs: volatile counters restart, faults planted
                # for this version happen (a GPU that fell off the bus stays lost).
                self.set_every_gpu(ecc_unc_volatile="0", pcie_replays="0", mem_used_mib="0")
                hw = read_conf(self.hw / "gpus.conf")
                messages += [(prio, msg) for prio, _usec, msg in self.boot_faults(hw, self.module())]
        append_kmsg(self.kernel, messages)
        return 0, "", ""

    def modinfo(self, args: list[str]) -> tuple[int, str, str]:
        """modinfo [-F version] M: what modprobe would load (the version installed in the root)."""
        names = [a for a in args if not a.startswith("-") and a != "version"]
        module = self.module()
        if len(names) != 1 or module is None or names[0].replace("-", "_") not in STACK:
            return 1, "", f"modinfo: ERROR: Module {names[0] if names else '?'} not found.\n"
        return 0, (module[0] + "\n" if "-F" in args else f"version:        {module[0]}\n"), ""

    def rmmod(self, args: list[str]) -> tuple[int, str, str]:
        for name in (a.replace("-", "_") for a in args if not a.startswith("-")):
            rc, err = self.kernel_modules.unload(name, self.module_users)
            if rc:
                return rc, "", err + "\n"
            if name == "nvidia":
                self.set_every_gpu(persistence="0")
        return 0, "", ""

    def module_users(self, name: str) -> list[str]:
        """What holds a module open: the driver's daemons and GPU processes (/dev/nvidia*), a console on nvidia_drm."""
        users = []
        if name in ("nvidia", "nvidia_uvm"):
            hw = read_conf(self.hw / "gpus.conf")
            users += [f"pid {v}" for k, v in hw.items()
                      if k.endswith(".process") and v.isdigit() and v != "0" and (self.root / "proc" / v).exists()]
        if name == "nvidia":
            users += [os.path.basename(p) for p in UNITS.values() if self.daemon_pids(p)]
        if name == "nvidia_drm" and read_conf(self.hw / "faults.conf").get("drm_in_use") == "1":
            users.append("fbcon")
        return users


def boot_log(hw: dict[str, str], module: tuple[str, str] | None, nouveau: bool,
             release: str) -> list[tuple[int, int, str]]:
    """(priority, usec, message) of a boot's kernel log, as the real kernel and driver write it."""
    lines = [(5, 0, f"Linux version {release} (fleetctl-lab) #1 SMP PREEMPT_DYNAMIC"),
             (6, 0, f"Command line: BOOT_IMAGE=/boot/vmlinuz-{release} root=/dev/vda ro quiet"),
             (6, 1200, "DMI: fleetctl lab host, BIOS 1.0 01/01/2025")]
    usec = 210000
    device_id = PCI_DEVICE_IDS.get(hw.get("sku", ""), "0x2330")[2:]
    bus_ids = [hw[f"gpu.{i}.pci"] for i in range(int(hw.get("count", "0"))) if hw.get(f"gpu.{i}.pci")]
    for bus in bus_ids:
        usec += 137
        lines.append((6, usec, f"pci {sysfs_pci_name(bus)}: [10de:{device_id}] type 00 class 0x030200 PCIe Endpoint"))
    if module:
        version, flavor = module
        at = {"nvidia": (440013, 512498, 512506), "nvidia_modeset": (601233,), "nvidia_drm": (604871,),
              "nvidia_uvm": (612004,)}
        for name, times in at.items():
            lines += [(prio, usec, msg) for usec, (prio, msg) in zip(times, load_messages(name, version, flavor))]
        for i, bus in enumerate(bus_ids):  # a GPU that fell off the bus does not come back with a warm reboot
            if hw.get(f"gpu.{i}.lost") == "1":
                lines.append((3, 650000 + i, f"NVRM: GPU {sysfs_pci_name(bus)}: RmInitAdapter failed! (0x22:0x56:897)"))
    elif nouveau:
        for i, bus in enumerate(bus_ids):
            lines.append((3, 700000 + i * 1500, f"nouveau {sysfs_pci_name(bus)}: unknown chipset (180000a1)"))
    lines.append((6, 2100000, "systemd[1]: Reached target multi-user.target - Multi-User System."))
    return lines
