#!/usr/bin/python
# -*- coding: utf-8 -*-
# fleetctl: collect every fact the audit needs from one GPU host, in one remote process.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: NVIDIA driver, nouveau, persistence, container runtime, fabric manager, GPU health and interconnect facts
description:
  - Gathers in one process everything C(fleetctl audit) evaluates, as JSON valid against
    schemas/host-facts.schema.json (returned under C(facts)).
  - GPU facts come from NVML through pynvml when the host's Python can import it, else from
    C(nvidia-smi -q -x), else only from kernel files. Each fact says where it came from (C(sources)),
    and a fact that could not be read gets an entry in C(errors) instead of failing the module.
  - Multi-GPU interconnect (C(facts.interconnect), docs/interconnect.md) is read in the same NVML session, else from
    C(nvidia-smi nvlink -s), C(nvidia-smi nvlink -e), C(nvidia-smi topo -m) and the fabric elements of
    C(nvidia-smi -q -x); these extra nvidia-smi commands run only when pynvml cannot be imported.
  - Read-only; never changes the host.
options:
  xid_catalog:
    description: Xid classification table (code, name, class, severity, action, source).
    type: list
    elements: dict
    default: []
  xid_overrides:
    description: Per-code changes laid over I(xid_catalog).
    type: dict
    default: {}
  kmsg_since_seq:
    description: Only report Xid events after this kernel-log sequence number; -1 for all since boot.
    type: int
    default: -1
  check_initramfs:
    description: List the initramfs of the running kernel to see whether it holds nouveau.
    type: bool
    default: true
author: fleetctl
"""

RETURN = r"""
facts:
  description: The host's facts (schemas/host-facts.schema.json).
  returned: always
  type: dict
  contains:
    interconnect:
      description:
        - NVLink, NVSwitch fabric, GPU pair topology and GPUDirect RDMA (docs/interconnect.md); null when no driver
          answers. C(sources.interconnect) says whether it came from C(nvml) or C(nvidia-smi).
      returned: always
      type: dict
      contains:
        gpus:
          description:
            - Per GPU (index, pci_bus_id) its C(nvlink) (supported, up, total, links with state, version, remote
              type and PCI id, error counters replay, recovery, crc (as nvidia-smi nvlink -e shows them),
              crc_flit, crc_data, ecc_data (the legacy counters), recovery_failed, symbol, effective) and C(fabric)
              (state, status, clique_id, cluster_uuid, health_mask).
            - A part that could not be read is null, with an entry in C(errors) (C(interconnect.gpus[I].nvlink),
              C(interconnect.gpus[I].fabric)); a counter the driver does not support is null.
          returned: always
          type: list
          elements: dict
          sample: [{"index": 0, "pci_bus_id": "00000000:00:06.0",
                    "nvlink": {"supported": true, "up": 18, "total": 18, "links": []},
                    "fabric": {"state": "completed", "status": "success", "clique_id": 0,
                               "cluster_uuid": "00000000-0000-0000-0000-000000000000", "health_mask": 0}}]
        topology:
          description:
            - Each unordered GPU pair once, as nvidia-smi topo -m shows it (NV<n>, PIX, PXB, PHB, NODE, SYS) with its
              number of bonded NVLinks; empty with fewer than 2 GPUs, null when unread (C(interconnect.topology) in
              C(errors)).
          returned: always
          type: list
          elements: dict
          sample: [{"gpus": [0, 1], "link": "NV18", "nvlinks": 18}]
        peermem_loaded:
          description: The nvidia_peermem (or nv_peermem) kernel module is loaded (GPUDirect RDMA).
          returned: always
          type: bool
    boot:
      description:
        - The kernel the host boots next (C(next_kernel), and C(next_kernel_source) grubenv, grub.cfg, loader or
          newest), the kernels with an image in /boot, and for the running and the next kernel the nvidia module
          files under /lib/modules, the version modinfo reads from the first and its dkms status lines
          (module_utils/fleetctl_boot.py). C(next_kernel) is null where no kernel image is under /boot.
      returned: always
      type: dict
      sample: {"running_kernel": "6.8.0-45-generic", "kernels": ["6.8.0-45-generic", "6.8.0-47-generic"],
               "next_kernel": "6.8.0-47-generic", "next_kernel_source": "grub.cfg",
               "modules": [{"kernel": "6.8.0-45-generic", "version": "570.86.15", "dkms": null,
                            "files": ["/lib/modules/6.8.0-45-generic/updates/dkms/nvidia.ko.zst"]},
                           {"kernel": "6.8.0-47-generic", "files": [], "version": null, "dkms": null}]}
"""

import glob
import json
import os
import platform
import re
import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fleetctl_gpus import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NvmlReader,
    SmiParseError,
    parse_smi_xml,
)
from ansible.module_utils.fleetctl_interconnect import NvmlInterconnect, from_smi
from ansible.module_utils.fleetctl_boot import boot_facts
from ansible.module_utils.fleetctl_packaging import moves_with_driver, role as packaging_role
from ansible.module_utils.fleetctl_kernel_log import KernelLogUnreadable, catalog_index, read_kernel_log, xid_events

FACTS_SCHEMA_VERSION = 1
COLLECTOR_VERSION = "1.0.0"

SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e98032b8c8e5"
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64",
            "/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64")
BIN_DIRS = ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/usr/local/nvidia/bin", "/bin", "/sbin"]
MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/lib/modprobe.d", "/lib/modprobe.d")

_VERSION = r"(\d{1,9}\.\d{1,9}(?:\.\d{1,9})?)"  # bounded: int() refuses a part of thousands of digits
_PROC_VERSION = re.compile(r"NVRM version: NVIDIA UNIX (?P<open>Open )?Kernel Module(?: for \S+)?\s+" + _VERSION)
_PROC_VERSION_OLD = re.compile(r"NVRM version: NVIDIA UNIX \S+ Kernel Module\s+" + _VERSION)
_LIB_VERSION = re.compile(r"\.so\." + _VERSION + r"$")

def read_text(path, limit=1 << 20):
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def nvidia_pci_gpus(sysfs="/sys/bus/pci/devices"):
    """PCI bus ids of NVIDIA display/3D controllers, as NVML writes them: what the driver should see."""
    found = []
    for dev in sorted(glob.glob(os.path.join(sysfs, "*"))):
        try:
            vendor = read_text(os.path.join(dev, "vendor"), 64).strip()
            pci_class = read_text(os.path.join(dev, "class"), 64).strip()
        except (IOError, OSError):
            continue
        if vendor == "0x10de" and pci_class[:6] in ("0x0300", "0x0302"):
            domain, rest = os.path.basename(dev).split(":", 1)
            found.append(domain.rjust(8, "0") + ":" + rest)
    return found


def package_role(name):
    """driver, persistenced, fabricmanager, container_toolkit or None: every packaging family's names
    (module_utils/fleetctl_packaging.py)."""
    return packaging_role(name)


def parse_dpkg_query(text):
    """Output of dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n' -> fleetctl's packages."""
    packages = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        name, version, status = parts
        role = package_role(name)
        if role is None or not status.endswith(" installed"):
            continue
        packages.append({"name": name, "version": version, "manager": "dpkg", "role": role,
                         "held": status.split(" ")[0] == "hold"})
    return packages


def parse_rpm_query(text, versionlock):
    """Output of rpm -qa --qf '%{NAME}\\t%{VERSION}-%{RELEASE}\\n', with the dnf/yum versionlock list."""
    locked = set()
    for line in versionlock.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.startswith("!"):  # "!" entries exclude a version; they hold nothing
            continue
        m = re.match(r"^(?:\d+:)?(.+?)-[^-]+-[^-]+$", line)
        if m:
            locked.add(m.group(1))
    packages = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 2 or package_role(parts[0]) is None:
            continue
        packages.append({"name": parts[0], "version": parts[1], "manager": "rpm", "role": package_role(parts[0]),
                         "held": parts[0] in locked})
    return packages


def parse_proc_driver_version(text):
    """(module version, flavor) from /proc/driver/nvidia/version."""
    m = _PROC_VERSION.search(text)
    if m:
        return m.group(2), "open" if m.group("open") else "proprietary"
    m = _PROC_VERSION_OLD.search(text)
    if m:
        return m.group(1), "proprietary"
    return None, None


def driver_state(module_version, userspace_version, installed, nvml_mismatch=False):
    """loaded | version_mismatch | not_loaded | not_installed."""
    if module_version is None:
        return "not_loaded" if installed else "not_installed"
    if nvml_mismatch or (userspace_version and userspace_version != module_version):
        return "version_mismatch"
    return "loaded"


def modprobe_blacklists(files_text, cmdline):
    """Files (and the kernel command line) that keep nouveau from loading."""
    found = []
    for path, text in files_text:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if re.match(r"^blacklist\s+nouveau$", line) or re.match(r"^install\s+nouveau\s+/bin/(false|true)\b", line):
                found.append(path)
                break
    if re.search(r"(^|\s)(modprobe\.blacklist|rd\.driver\.blacklist)=\S*\bnouveau\b", cmdline):
        found.append("/proc/cmdline")
    return found


def toml_has_nvidia_runtime(text, engine):
    if engine == "crio":
        return (bool(re.search(r"^\s*\[crio\.runtime\.runtimes\.\"?nvidia\"?\]", text, re.M)),
                bool(re.search(r"^\s*default_runtime\s*=\s*\"nvidia\"", text, re.M)))
    return (bool(re.search(r"^\s*\[[^#\n]*runtimes\.[\"']?nvidia[\"']?\]", text, re.M)),
            bool(re.search(r"^\s*default_runtime_name\s*=\s*[\"']nvidia[\"']", text, re.M)))


def cdi_driver_version(text):
    """The driver version a CDI spec was generated for, from the versioned driver libraries it mounts."""
    versions = set(re.findall(r"lib(?:cuda|nvidia-ml|nvidia-ptxjitcompiler)\.so\." + _VERSION, text))
    return max(versions, key=lambda v: tuple(int(x) for x in v.split("."))) if versions else None


class Collector:
    def __init__(self, module):
        self.module = module
        self.errors = {}
        self.sources = {}
        self.processes = None
        self.smi_xml = None  # the `nvidia-smi -q -x` output parsed for the GPU facts, when that was the source
        self.interconnect = None

    # -- helpers ---------------------------------------------------------------------------------
    def run(self, argv, fact):
        """(rc, stdout) of a command; a missing command is (None, '')."""
        path = self.module.get_bin_path(argv[0], opt_dirs=BIN_DIRS)
        if path is None:
            return None, ""
        rc, out, err = self.module.run_command([path] + argv[1:], environ_update={"LC_ALL": "C"})
        if rc != 0:
            self.errors[fact] = "%s exited %d: %s" % (" ".join(argv), rc, " ".join((err or out).split())[:300])
        return rc, out

    def read(self, path, fact):
        try:
            return read_text(path)
        except (IOError, OSError) as e:
            if getattr(e, "errno", None) != 2:  # absent files are facts in themselves, not errors
                self.errors[fact] = "%s: %s" % (path, e.strerror or e)
            return None

    def running(self, name):
        if self.processes is None:
            self.processes = set()
            for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
                try:
                    argv0 = read_text(cmdline, 4096).split("\0", 1)[0]
                except (IOError, OSError):
                    continue
                if argv0:
                    self.processes.add(os.path.basename(argv0.split(" ", 1)[0]))
        return name in self.processes

    @staticmethod
    def unit_enabled(unit):
        """True/False from systemd's wants links; None on a host without systemd unit directories."""
        if not any(os.path.isdir(d) for d in ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")):
            return None
        return bool(glob.glob("/etc/systemd/system/*.wants/" + unit) or glob.glob("/usr/lib/systemd/system/*.wants/" + unit)
                    or glob.glob("/lib/systemd/system/*.wants/" + unit))

    # -- sections --------------------------------------------------------------------------------
    def host(self):
        os_release = {}
        text = self.read("/etc/os-release", "host.os") or self.read("/usr/lib/os-release", "host.os") or ""
        for line in text.splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                os_release[k.strip()] = v.strip().strip('"')
        if not os.path.isdir("/sys/firmware/efi"):
            secure_boot = "unsupported"
        else:
            try:
                with open(SECURE_BOOT_VAR, "rb") as f:
                    data = f.read()
                secure_boot = "enabled" if data[-1:] == b"\x01" else "disabled"
            except (IOError, OSError):
                secure_boot = "unknown"
        uptime = self.read("/proc/uptime", "host.uptime_s")
        return {
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
            "arch": platform.machine(),
            "os": {"id": os_release.get("ID"), "version_id": os_release.get("VERSION_ID"),
                   "pretty_name": os_release.get("PRETTY_NAME")},
            "boot_id": (self.read("/proc/sys/kernel/random/boot_id", "host.boot_id") or "").strip() or None,
            "uptime_s": float(uptime.split()[0]) if uptime else None,
            "secure_boot": secure_boot,
            "python": platform.python_version(),
            "pci_gpus": nvidia_pci_gpus(),
        }

    def packages(self):
        packages = []
        rc, out = self.run(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${Status}\n"], "driver.packages")
        if rc == 0:
            packages += parse_dpkg_query(out)
            self.sources["packages"] = "dpkg"
        rc, out = self.run(["rpm", "-qa", "--qf", "%{NAME}\t%{VERSION}-%{RELEASE}\n"], "driver.packages")
        if rc == 0:
            lock = (self.read("/etc/dnf/plugins/versionlock.list", "driver.packages") or "") + \
                   (self.read("/etc/yum/pluginconf.d/versionlock.list", "driver.packages") or "")
            packages += parse_rpm_query(out, lock)
            self.sources["packages"] = "rpm" if "packages" not in self.sources else "dpkg+rpm"
        return packages

    def userspace_library(self):
        """(version, path) of the installed libnvidia-ml.so.1."""
        candidates = []
        rc, out = self.run(["ldconfig", "-p"], "driver.userspace_version")
        for line in out.splitlines() if rc == 0 else []:
            if line.strip().startswith("libnvidia-ml.so.1 ") and "=>" in line:
                candidates.append(line.split("=>", 1)[1].strip())
        candidates += [os.path.join(d, "libnvidia-ml.so.1") for d in LIB_DIRS]
        for path in candidates:
            if os.path.exists(path):
                real = os.path.realpath(path)
                m = _LIB_VERSION.search(real)
                if m:
                    return m.group(1), real
        return None, None

    def nvml(self):
        """(system, gpus, error code) through pynvml, or None when pynvml is not importable."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            # No library, no loaded driver, or a library/module mismatch are facts the driver state reports;
            # any other failure is an error of this fact.
            if e.value not in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH):
                self.errors["nvml"] = "NVML: %s" % e
            return {}, [], e.value
        try:
            reader = NvmlReader(pynvml, self.errors)
            system, gpus = reader.system(), reader.gpus()
            self.interconnect = self.guarded(NvmlInterconnect(pynvml, self.errors).read)  # same NVML session
            if self.interconnect is not None:
                self.sources["interconnect"] = "nvml"
            return system, gpus, None
        finally:
            pynvml.nvmlShutdown()

    def guarded(self, read, fact="interconnect"):
        """One part's reader failing in a way nobody foresaw costs that part (an errors entry), not the host's facts."""
        try:
            return read()
        except Exception as e:  # the other facts must still be returned
            self.errors[fact] = "reading the %s failed: %s: %s" % (fact, type(e).__name__, e)
            return None

    def smi_interconnect(self, gpus):
        """facts.interconnect from nvidia-smi (no pynvml): nvlink -s, nvlink -e, topo -m (2+ GPUs), and the <fabric>
        elements of the -q -x output already read."""
        outputs = {}
        for name, argv in (("status", ["nvidia-smi", "nvlink", "-s"]), ("counters", ["nvidia-smi", "nvlink", "-e"]),
                           ("topo", ["nvidia-smi", "topo", "-m"])):
            if not gpus or (name == "topo" and len(gpus) < 2):
                outputs[name] = None if name == "topo" else ("", None)
                continue
            path = self.module.get_bin_path(argv[0], opt_dirs=BIN_DIRS)
            if path is None:
                outputs[name] = ("", "nvidia-smi is not installed")
                continue
            rc, out, err = self.module.run_command([path] + argv[1:], environ_update={"LC_ALL": "C"})
            outputs[name] = (out, None) if rc == 0 else \
                ("", "%s exited %d: %s" % (" ".join(argv), rc, " ".join((err or out or "").split())[:300]))
        interconnect = self.guarded(lambda: from_smi(gpus, self.smi_xml, outputs["status"], outputs["counters"],
                                                     outputs["topo"], self.errors))
        if interconnect is not None:
            self.sources["interconnect"] = "nvidia-smi"
        return interconnect

    def nvidia_smi(self):
        rc, out = self.run(["nvidia-smi", "-q", "-x"], "gpus")
        if rc is None:
            return None
        if rc != 0:
            said = self.errors.get("gpus", "").lower()
            # nvidia-smi exits with the NVML return code; a mismatch or an unloaded driver is the driver state
            # this module reports, not a failure to read facts.
            if rc == NVML_ERROR_LIB_RM_VERSION_MISMATCH or "version mismatch" in said:
                del self.errors["gpus"]
                return {}, [], NVML_ERROR_LIB_RM_VERSION_MISMATCH
            if rc == NVML_ERROR_DRIVER_NOT_LOADED or "couldn't communicate with the nvidia driver" in said:
                del self.errors["gpus"]
                return {}, [], NVML_ERROR_DRIVER_NOT_LOADED
            return {}, [], None
        try:
            system, gpus = parse_smi_xml(out)
        except SmiParseError as e:
            self.errors["gpus"] = str(e)
            return {}, [], None
        self.smi_xml = out
        return system, gpus, None

    def driver_and_gpus(self, packages):
        module_version = (self.read("/sys/module/nvidia/version", "driver.module_version") or "").strip() or None
        proc_text = self.read("/proc/driver/nvidia/version", "driver.module_flavor") or ""
        proc_version, flavor = parse_proc_driver_version(proc_text)
        if module_version:
            self.sources["driver.module_version"] = "/sys/module/nvidia/version"
        elif proc_version:
            module_version = proc_version
            self.sources["driver.module_version"] = "/proc/driver/nvidia/version"
        if flavor:
            self.sources["driver.module_flavor"] = "/proc/driver/nvidia/version"
        if module_version and not re.match("^" + _VERSION + "$", module_version):
            self.errors["driver.module_version"] = "unexpected module version %r" % module_version[:80]
            module_version = None
            flavor = None
        userspace, lib_path = self.userspace_library()
        if userspace:
            self.sources["driver.userspace_version"] = lib_path

        gpu_source = "nvml"
        result = self.nvml()
        if result is None:
            gpu_source = "nvidia-smi -q -x"
            result = self.nvidia_smi()
            if result is not None and self.smi_xml is not None:
                self.interconnect = self.smi_interconnect(result[1])
        if result is None:
            gpu_source, result = None, ({}, [], None)
        system, gpus, error_code = result
        if gpu_source and (gpus or system):
            self.sources["gpus"] = gpu_source
        if not userspace and system.get("nvml_version"):  # "13.580.159.04" -> "580.159.04"
            userspace = system["nvml_version"].split(".", 1)[1] if system["nvml_version"].count(".") >= 2 else None
            self.sources["driver.userspace_version"] = "nvml"

        cuda = system.get("cuda_driver_version")
        if cuda and not re.match(r"^\d{1,2}\.\d{1,2}$", cuda):
            self.errors["driver.cuda_driver_version"] = "unexpected CUDA version %r" % cuda[:80]
            system["cuda_driver_version"] = None
        driver_packages = [p for p in packages if p["role"] == "driver"]
        installed = bool(driver_packages or userspace)
        state = driver_state(module_version, userspace, installed, error_code == NVML_ERROR_LIB_RM_VERSION_MISMATCH)
        if error_code == NVML_ERROR_DRIVER_NOT_LOADED and state == "loaded":
            state = "not_loaded"
        version = module_version or userspace
        driver = {
            "state": state,
            "module_version": module_version,
            "module_flavor": flavor,
            "userspace_version": userspace,
            "nvml_version": system.get("nvml_version"),
            "cuda_driver_version": system.get("cuda_driver_version"),
            "branch": version.split(".", 1)[0] if version else None,
            "packages": packages,
            "held": all(p["held"] for p in moves_with_driver(driver_packages, {module_version, userspace})
                        or driver_packages) if driver_packages else None,
        }
        return driver, gpus

    def nouveau(self, check_initramfs):
        files = []
        for d in MODPROBE_DIRS:
            for path in sorted(glob.glob(os.path.join(d, "*.conf"))):
                text = self.read(path, "nouveau.blacklisted")
                if text is not None:
                    files.append((path, text))
        blacklist_files = modprobe_blacklists(files, self.read("/proc/cmdline", "nouveau.blacklisted") or "")
        facts = {"loaded": os.path.isdir("/sys/module/nouveau"), "blacklisted": bool(blacklist_files),
                 "blacklist_files": blacklist_files, "initramfs": None, "in_initramfs": None}
        if not check_initramfs:
            return facts
        release = platform.release()
        for image, lister in (("/boot/initrd.img-" + release, "lsinitramfs"), ("/boot/initramfs-%s.img" % release, "lsinitrd")):
            if os.path.exists(image):
                facts["initramfs"] = image
                rc, out = self.run([lister, image], "nouveau.in_initramfs")
                if rc == 0:
                    facts["in_initramfs"] = bool(re.search(r"/nouveau\.ko", out))
                elif rc is None:
                    self.errors["nouveau.in_initramfs"] = "%s is not installed; cannot list %s" % (lister, image)
                break
        return facts

    def boot(self):
        """The kernel the host boots next and the nvidia module of the running and the next kernel
        (module_utils/fleetctl_boot.py says where each comes from)."""
        rc, dkms = self.run(["dkms", "status"], "boot.dkms")
        return boot_facts(platform.release(), dkms if rc == 0 else None, self.modinfo_version)

    def modinfo_version(self, path):
        rc, out = self.run(["modinfo", "-F", "version", path], "boot.modules")
        if rc is None:
            self.errors["boot.modules"] = "modinfo is not installed: cannot read the version of %s" % path
        return out.strip().splitlines()[0] if rc == 0 and out.strip() else None

    def persistence(self):
        return {"daemon_running": self.running("nvidia-persistenced"), "daemon_enabled": self.unit_enabled("nvidia-persistenced.service")}

    def container_runtime(self, packages):
        engines = []
        docker_installed = self.module.get_bin_path("dockerd", opt_dirs=BIN_DIRS) is not None
        docker = {"name": "docker", "installed": docker_installed, "running": self.running("dockerd"),
                  "nvidia_runtime": False, "nvidia_default": False, "config_files": []}
        text = self.read("/etc/docker/daemon.json", "container_runtime.docker")
        if text is not None:
            docker["config_files"].append("/etc/docker/daemon.json")
            try:
                conf = json.loads(text) if text.strip() else {}
                docker["nvidia_runtime"] = "nvidia" in (conf.get("runtimes") or {})
                docker["nvidia_default"] = conf.get("default-runtime") == "nvidia"
            except (ValueError, AttributeError) as e:
                self.errors["container_runtime.docker"] = "/etc/docker/daemon.json is not valid JSON: %s" % e
        engines.append(docker)
        for name, binary, paths in (
                ("containerd", "containerd", ["/etc/containerd/config.toml"] + sorted(glob.glob("/etc/containerd/conf.d/*.toml"))),
                ("crio", "crio", ["/etc/crio/crio.conf"] + sorted(glob.glob("/etc/crio/crio.conf.d/*")))):
            engine = {"name": name, "installed": self.module.get_bin_path(binary, opt_dirs=BIN_DIRS) is not None,
                      "running": self.running(binary), "nvidia_runtime": False, "nvidia_default": False, "config_files": []}
            for path in paths:
                text = self.read(path, "container_runtime." + name)
                if text is None:
                    continue
                engine["config_files"].append(path)
                has_runtime, is_default = toml_has_nvidia_runtime(text, name)
                engine["nvidia_runtime"] = engine["nvidia_runtime"] or has_runtime
                engine["nvidia_default"] = engine["nvidia_default"] or is_default
            engines.append(engine)

        toolkit = [p for p in packages if p["name"] in ("nvidia-container-toolkit", "nvidia-container-toolkit-base")]
        toolkit_version = toolkit[0]["version"] if toolkit else None
        if toolkit_version is None:
            rc, out = self.run(["nvidia-ctk", "--version"], "container_runtime.toolkit_version")
            m = re.search(r"version\s+" + r"(\d+\.\d+\.\d+)", out or "")
            toolkit_version = m.group(1) if rc == 0 and m else None
        specs = []
        for path in sorted(glob.glob("/etc/cdi/*.yaml") + glob.glob("/etc/cdi/*.json")
                           + glob.glob("/var/run/cdi/*.yaml") + glob.glob("/var/run/cdi/*.json")):
            text = self.read(path, "container_runtime.cdi") or ""
            if "nvidia.com/" in text:
                specs.append({"path": path, "driver_version": cdi_driver_version(text)})
        return {"engines": engines, "toolkit_version": toolkit_version, "cdi_specs": specs}

    def fabric_manager(self, packages):
        nvswitch = bool(glob.glob("/dev/nvidia-nvswitch[0-9]*")) or bool(glob.glob("/proc/driver/nvidia-nvswitch/devices/*"))
        fm = [p for p in packages if p["role"] == "fabricmanager" and "nscq" not in p["name"]]
        return {"nvswitch_present": nvswitch, "package_version": fm[0]["version"] if fm else None,
                "running": self.running("nv-fabricmanager"), "enabled": self.unit_enabled("nvidia-fabricmanager.service")}

    def xid(self, catalog, overrides, since_seq):
        try:
            records, source = read_kernel_log()
        except KernelLogUnreadable as e:
            self.errors["xid"] = "kernel log unreadable: %s" % e
            return {"events": [], "last_seq": None}
        self.sources["xid"] = source
        events = xid_events(records, catalog_index(catalog, overrides), since_seq if since_seq >= 0 else None)
        seqs = [r["seq"] for r in records if r["seq"] is not None]
        return {"events": events, "last_seq": max(seqs) if seqs else None}

    def collect(self, params):
        started = time.time()
        packages = self.packages()
        driver, gpus = self.driver_and_gpus(packages)
        facts = {
            "schema_version": FACTS_SCHEMA_VERSION,
            "collector": {"name": "gpu_facts", "version": COLLECTOR_VERSION},
            "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": self.host(),
            "driver": driver,
            "nouveau": self.nouveau(params["check_initramfs"]),
            "boot": self.guarded(self.boot, "boot"),
            "persistence": self.persistence(),
            "container_runtime": self.container_runtime(packages),
            "fabric_manager": self.fabric_manager(packages),
            "gpus": gpus,
            "interconnect": self.interconnect,
            "xid": self.xid(params["xid_catalog"], params["xid_overrides"], params["kmsg_since_seq"]),
        }
        facts["sources"] = self.sources
        facts["errors"] = self.errors
        facts["collect_seconds"] = round(time.time() - started, 3)
        return facts


def main():
    module = AnsibleModule(
        argument_spec=dict(
            xid_catalog=dict(type="list", elements="dict", default=[]),
            xid_overrides=dict(type="dict", default={}),
            kmsg_since_seq=dict(type="int", default=-1),
            check_initramfs=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    facts = Collector(module).collect(module.params)
    module.exit_json(changed=False, facts=facts)


if __name__ == "__main__":
    main()
