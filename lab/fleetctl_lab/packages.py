"""The lab's emulated NVIDIA packages: real .deb files in a flat local apt repository (docs/lab.md).

build_repo(repo_dir) compiles the NVML emulation (emu/libnvidia-ml.c) once per driver version, packs every
package with dpkg-deb and indexes the repository with dpkg-scanpackages, so that a lab host can use

    deb [trusted=yes] file:/var/lib/fleetctl-lab/repo ./

Packages (per driver version V of branch B; revision 0lab1):
  nvidia-driver-B-open  V-0lab1  libnvidia-ml.so.V (+ .so.1), nvidia-smi, nvidia-lab-bench, the "kernel module"
                                 /usr/lib/nvidia-lab/modules/nvidia.version ("V open"), skus.json and
                                 nvidia_lab_interconnect.py (NVLink/fabric rules for the tools); its preinst
                                 fails when faults.conf says install_fail=V. Branches conflict with and replace
                                 each other.
  nvidia-persistenced   V-0lab1  the daemon, its systemd unit (enabled by postinst, which also starts it)
  nvidia-fabricmanager-B V-0lab1 nv-fabricmanager and its unit (not started: as with the real package)
  nvidia-imex-B         V-0lab1  the IMEX daemon nvidia-imex and nvidia-imex-ctl (emu/, rack-scale trays), its unit
                                 (not enabled: the lab enables it on the trays of a domain) and the conffile
                                 /etc/nvidia-imex/config.cfg. Branches conflict with and replace each other.
  nvidia-container-toolkit 1.17.4-1, 1.17.8-1: nvidia-ctk
  fleetctl-lab-gpu      1.0-0lab1: the NVML emulation, nvidia-smi and nvidia-lab-bench under /usr/local, answering for
                                 the version of the real libnvidia-ml.so.1 installed (`+debian` hosts: lab/fleetctl_lab/debian.py)
  python3-nvidia-ml-py  the real pynvml of this interpreter's nvidia-ml-py, in /usr/lib/python3/dist-packages

The same packages are also built as RPMs (rpmbuild) into an rpm-md repository in repo_dir/rpm (createrepo_c), for
the lab's Enterprise-Linux-style hosts (dnf, rpm, dnf versionlock), named as NVIDIA's CUDA repository for RHEL
names them: nvidia-driver, nvidia-persistenced and nvidia-fabric-manager (Epoch 3, Version V, Release 0lab1; no
branch in the name), nvidia-imex-B (the branch in the name, as on Ubuntu), nvidia-container-toolkit, containerd,
python3-nvidia-ml-py. Same files (the Debian library directory: the host underneath is Debian); the Debian maintainer scripts run as RPM scriptlets (RPM_SCRIPTLETS).
A host's rpm database holds only these packages, so the RPMs require nothing but what fleetctl-lab-system (no
files, installed first) provides: the shell and python3 the host root already has.
A content hash of the sources and the package list makes a rebuild of an unchanged repository a no-op, and
lab_repo(repo_dir) builds each content hash once per machine (in the user's cache directory) and copies it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import gzip
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .skus import DEFAULT_SKU, PCIE_COPY_EFFICIENCY, PCIE_LANE_GBS, SKUS

DRIVER_VERSIONS = ("550.163.01", "570.86.15", "570.124.06", "580.95.05")
CONTAINERD_VERSION = "1.7.24"
TOOLKIT_VERSIONS = ("1.17.4", "1.17.8")
REVISION = "0lab1"
FLAVOR = "open"
MAINTAINER = "fleetctl lab <lab@fleetctl.invalid>"
EMU = Path(__file__).resolve().parent / "emu"
LIBDIR = "usr/lib/x86_64-linux-gnu"
FAULTS = "/var/lib/nvidia-lab/hw/faults.conf"
IMEX_CONFIG = "etc/nvidia-imex/config.cfg"
IMEX_PIDFILE = "/var/run/nvidia-imex/nvidia-imex.pid"
# The keys of the real config.cfg the lab's daemon and nvidia-imex-ctl use (NVIDIA's IMEX guide), at its defaults.
IMEX_CONFIG_TEXT = (b"# IMEX configuration (fleetctl lab emulation of nvidia-imex)\n"
                    b"IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\n"
                    b"SERVER_PORT=50000\n"
                    b"IMEX_CMD_PORT=50005\n"
                    b"IMEX_CMD_ENABLED=1\n"
                    b"LOG_FILE_NAME=/var/log/nvidia-imex.log\n")
MANIFEST = "lab-packages.json"
RPM_DIR = "rpm"
RPM_EPOCH = 3  # what NVIDIA's RHEL packages of the driver carry
RPM_ARCH = {"amd64": "x86_64", "all": "noarch"}
LAB_SYSTEM = "fleetctl-lab-system"
GPU_EMULATION = "fleetctl-lab-gpu"  # the emulated GPUs beside a real driver's packages (+debian hosts)
SYSTEM_PROVIDES = ("/bin/sh", "/usr/bin/sh", "/usr/bin/python3", "/sbin/ldconfig")
# Debian maintainer script -> (RPM scriptlet, how its arguments are made from RPM's $1, a count of installed
# instances). rpm runs the new package's %post before the old one's %preun and %postun (dpkg runs the old prerm
# and postrm first), so the postinst ("configure") runs in %posttrans, after the old package is gone, as dpkg's.
RPM_SCRIPTLETS = {
    "preinst": ("pre", 'if [ "$1" -gt 1 ]; then set -- upgrade; else set -- install; fi'),
    "postinst": ("posttrans", "set -- configure"),
    "prerm": ("preun", 'if [ "$1" -eq 0 ]; then set -- remove; else set -- upgrade; fi'),
    "postrm": ("postun", 'if [ "$1" -eq 0 ]; then set -- remove; else set -- upgrade; fi'),
}
RPMBUILD_DEFINES = {
    "debug_package": "%{nil}",          # no -debuginfo packages
    "__os_install_post": "%{nil}",      # no stripping or byte-compiling: the files are the .debs' bytes
    "_build_id_links": "none",
    "_rpmfilename": "%%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
}

# What NVML and nvidia-smi report beyond skus.py: PCI ids (device << 16 | vendor), memory in bytes (what the
# real boards report), architecture (nvmlDeviceArchitecture_t) and MIG support.
SKU_HARDWARE = {
    "h100-sxm": dict(pci_device_id=0x233010DE, pci_subsystem_id=0x16C110DE, memory_total=85520809984, arch="Hopper", mig=True),
    "h200-sxm": dict(pci_device_id=0x233510DE, pci_subsystem_id=0x18BE10DE, memory_total=150754820096, arch="Hopper", mig=True),
    "a100-sxm": dict(pci_device_id=0x20B210DE, pci_subsystem_id=0x147F10DE, memory_total=85899345920, arch="Ampere", mig=True),
    "a100-pcie": dict(pci_device_id=0x20B510DE, pci_subsystem_id=0x153310DE, memory_total=85899345920, arch="Ampere", mig=True),
    "l40s": dict(pci_device_id=0x26B910DE, pci_subsystem_id=0x185110DE, memory_total=48305799168, arch="Ada Lovelace", mig=False),
    # plausible for GB200 (186 GB HBM3e a GPU), not read from a real board
    "gb200-nvl": dict(pci_device_id=0x294110DE, pci_subsystem_id=0x20CA10DE, memory_total=199715979264, arch="Blackwell", mig=True),
}
GENERIC_HARDWARE = dict(pci_device_id=0x000010DE, pci_subsystem_id=0x000010DE, memory_total=85899345920, arch="Hopper", mig=True)
ARCH_IDS = {"Ampere": 7, "Ada Lovelace": 8, "Hopper": 9, "Blackwell": 10}
LAB_MAX_NVSWITCHES = 18  # a GB200 NVL72 GPU's links reach the rack's 18 NVLink switch chips


def branch(version: str) -> str:
    return version.split(".", 1)[0]


def sku_table() -> dict:
    """skus.json: skus.py plus SKU_HARDWARE, the default SKU first, and the PCIe figures host copies follow."""
    keys = [DEFAULT_SKU] + sorted(k for k in SKUS if k != DEFAULT_SKU)
    return {"default": DEFAULT_SKU, "pcie": {"lane_gbs": {str(g): v for g, v in PCIE_LANE_GBS.items()},
                                             "copy_efficiency": dict(PCIE_COPY_EFFICIENCY)},
            "skus": {k: {**dataclasses.asdict(SKUS[k]), **SKU_HARDWARE.get(k, GENERIC_HARDWARE)} for k in keys}}


def sku_header() -> str:
    """lab_skus.h for the C library: the same table (LAB_SKUS[0] is the default, used for an unknown sku=)."""
    rows = []
    for key, s in sku_table()["skus"].items():
        switches = list(s["nvswitch_links"])[:LAB_MAX_NVSWITCHES]
        rows.append('    {%s, %s, %s, %d, %d, %d, %d, 0x%08X, 0x%08X, %d, %d, %dULL, %d, %d, %d, %d, {%s}},' % (
            json.dumps(key), json.dumps(s["name"]), json.dumps(s["vbios"]), s["pcie_gen"], s["pcie_width"],
            s["power_idle_mw"], s["power_limit_mw"], s["pci_device_id"], s["pci_subsystem_id"],
            ARCH_IDS.get(s["arch"], 0), int(s["mig"]), s["memory_total"], int(s["nvswitch"]), s["nvlinks"],
            s["nvlink_version"], len(switches), ", ".join(str(n) for n in switches) or "0"))
    return "\n".join([
        "/* Generated by lab/fleetctl_lab/packages.py from lab/fleetctl_lab/skus.py: do not edit. */",
        "struct lab_sku {",
        "    const char *key, *name, *vbios;",
        "    unsigned int pcie_gen, pcie_width, power_idle_mw, power_limit_mw, pci_device_id, pci_subsystem_id, arch, mig;",
        "    unsigned long long memory_total;",
        "    unsigned int nvswitch, nvlinks, nvlink_version, nvswitch_count;",
        "    unsigned int nvswitch_links[%d]; /* links to each NVSwitch, in link order */" % LAB_MAX_NVSWITCHES,
        "};",
        "static const struct lab_sku LAB_SKUS[] = {", *rows, "};",
        "#define LAB_SKU_COUNT (sizeof LAB_SKUS / sizeof LAB_SKUS[0])", ""])


def pynvml_source() -> tuple[bytes, str]:
    """The installed nvidia-ml-py's pynvml.py and its version (read at build time, never committed)."""
    dist = importlib.metadata.distribution("nvidia-ml-py")
    for f in dist.files or ():
        if str(f) == "pynvml.py":
            return Path(dist.locate_file(f)).read_bytes(), dist.version
    raise RuntimeError("nvidia-ml-py is installed without pynvml.py")


def _script(name: str, **subst: str) -> bytes:
    text = (EMU / name).read_text()
    for key, value in subst.items():
        text = text.replace("@%s@" % key, value)
    return text.encode()


def _unit(description: str, exec_start: str, pidfile: str) -> bytes:
    return ("[Unit]\nDescription=%s\n\n[Service]\nType=forking\nPIDFile=%s\nExecStart=%s\n\n"
            "[Install]\nWantedBy=multi-user.target\n" % (description, pidfile, exec_start)).encode()


def _sh(*lines: str) -> bytes:
    return ("#!/bin/sh\nset -e\n" + "\n".join(lines) + "\n").encode()


@dataclasses.dataclass
class Package:
    name: str
    version: str
    description: str
    files: dict = dataclasses.field(default_factory=dict)  # relative path -> (bytes, mode) or ("->", target)
    conffiles: tuple = ()  # relative paths of FILES that are configuration (dpkg conffiles, rpm %config(noreplace))
    scripts: dict = dataclasses.field(default_factory=dict)  # preinst/postinst/prerm/postrm/triggers -> bytes
    fields: dict = dataclasses.field(default_factory=dict)  # extra control fields (Depends, Conflicts, ...)
    architecture: str = "amd64"
    rpm_name: str = ""  # the name in the RPM repository (default: name)
    epoch: int = 0      # RPM only
    rpm_provides: tuple = ()  # RPM only (the Debian fields stay Debian's)

    @property
    def filename(self) -> str:
        return "%s_%s_%s.deb" % (self.name, self.version, self.architecture)

    @property
    def rpm_version(self) -> tuple[str, str]:
        """(Version, Release): the Debian revision is the Release (1 without one)."""
        version, _, release = self.version.rpartition("-")
        return (version, release) if version else (self.version, "1")

    @property
    def rpm_filename(self) -> str:
        return "%s-%s-%s.%s.rpm" % (self.rpm_name or self.name, *self.rpm_version, RPM_ARCH[self.architecture])


def _stop_daemon(pidfile: str) -> str:
    return ('if [ -r %s ]; then kill "$(cat %s)" 2>/dev/null || true; rm -f %s; fi' % (pidfile, pidfile, pidfile))


def package_list(pynvml: tuple[bytes, str], libs: dict[str, bytes]) -> list[Package]:
    skus = (json.dumps(sku_table(), indent=1) + "\n").encode()
    branches = sorted({branch(v) for v in DRIVER_VERSIONS})
    pkgs = []
    for v in DRIVER_VERSIONS:
        b = branch(v)
        others = ", ".join("nvidia-driver-%s-open" % o for o in branches if o != b)
        pkgs.append(Package(
            "nvidia-driver-%s-open" % b, "%s-%s" % (v, REVISION),
            "NVIDIA driver %s (open kernel module), fleetctl lab emulation\n"
            " NVML library, nvidia-smi, nvidia-lab-bench and the emulated kernel module of driver %s." % (b, v),
            files={
                "%s/libnvidia-ml.so.%s" % (LIBDIR, v): (libs[v], 0o644),
                "%s/libnvidia-ml.so.1" % LIBDIR: ("->", "libnvidia-ml.so.%s" % v),
                "usr/bin/nvidia-smi": (_script("nvidia-smi", LAB_DRIVER_VERSION=v), 0o755),
                "usr/bin/nvidia-lab-bench": (_script("nvidia-lab-bench", LAB_DRIVER_VERSION=v), 0o755),
                "usr/lib/nvidia-lab/modules/nvidia.version": (("%s %s\n" % (v, FLAVOR)).encode(), 0o644),
                "usr/lib/nvidia-lab/skus.json": (skus, 0o644),
                "usr/lib/nvidia-lab/nvidia_lab_interconnect.py": ((EMU / "nvidia_lab_interconnect.py").read_bytes(), 0o644),
            },
            scripts={
                # The lab's install fault: the package refuses to unpack, like a failed DKMS build would.
                "preinst": _sh(
                    "if [ -r %s ] && sed 's/#.*//' %s | tr -d ' \\t' | grep -qx 'install_fail=%s'; then" % (FAULTS, FAULTS, v),
                    "    echo \"nvidia-driver-%s-open: installation of %s failed (lab fault install_fail)\" >&2" % (b, v),
                    "    exit 1",
                    "fi"),
                "triggers": b"activate-noawait ldconfig\n",
            },
            fields={"Depends": "libc6", "Provides": "nvidia-driver, libnvidia-ml1", "Conflicts": others,
                    "Replaces": others, "Section": "non-free/libs"},
            rpm_name="nvidia-driver", epoch=RPM_EPOCH))
        pidfile = "/var/run/nvidia-persistenced/nvidia-persistenced.pid"
        wants = "/etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service"
        pkgs.append(Package(
            "nvidia-persistenced", "%s-%s" % (v, REVISION),
            "NVIDIA persistence daemon %s, fleetctl lab emulation" % v,
            files={"usr/bin/nvidia-persistenced": (_script("nvidia-persistenced", LAB_DRIVER_VERSION=v), 0o755),
                   "lib/systemd/system/nvidia-persistenced.service": (_unit(
                       "NVIDIA Persistence Daemon", "/usr/bin/nvidia-persistenced --verbose", pidfile), 0o644)},
            scripts={
                # Enabled like deb-systemd-helper would; started directly (never through the controller's systemd).
                "postinst": _sh('if [ "$1" = configure ]; then',
                                "    mkdir -p %s" % os.path.dirname(wants),
                                "    ln -sf /lib/systemd/system/nvidia-persistenced.service %s" % wants,
                                "    /usr/bin/nvidia-persistenced --verbose </dev/null >/dev/null 2>&1 || true",
                                "fi"),
                "prerm": _sh(_stop_daemon(pidfile)),
                "postrm": _sh('if [ "$1" = remove ] || [ "$1" = purge ]; then rm -f %s; fi' % wants),
            },
            fields={"Section": "non-free/utils"}, epoch=RPM_EPOCH))
        fm_pidfile = "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
        others_fm = ", ".join("nvidia-fabricmanager-%s" % o for o in branches if o != b)
        pkgs.append(Package(
            "nvidia-fabricmanager-%s" % b, "%s-%s" % (v, REVISION),
            "NVIDIA fabric manager %s for NVSwitch systems, fleetctl lab emulation" % v,
            files={"usr/bin/nv-fabricmanager": (_script("nvidia-persistenced", LAB_DRIVER_VERSION=v), 0o755),
                   "lib/systemd/system/nvidia-fabricmanager.service": (_unit(
                       "NVIDIA fabric manager service", "/usr/bin/nv-fabricmanager", fm_pidfile), 0o644)},
            scripts={"prerm": _sh(_stop_daemon(fm_pidfile))},
            fields={"Provides": "nvidia-fabricmanager", "Conflicts": others_fm, "Replaces": others_fm,
                    "Section": "non-free/utils"},
            rpm_name="nvidia-fabric-manager", epoch=RPM_EPOCH))
        others_imex = ", ".join("nvidia-imex-%s" % o for o in branches if o != b)
        pkgs.append(Package(
            "nvidia-imex-%s" % b, "%s-%s" % (v, REVISION),
            "IMEX Manager %s for NVIDIA multi-node NVLink systems, fleetctl lab emulation" % v,
            files={"usr/bin/nvidia-imex": (_script("nvidia-imex", LAB_DRIVER_VERSION=v), 0o755),
                   "usr/bin/nvidia-imex-ctl": (_script("nvidia-imex-ctl"), 0o755),
                   IMEX_CONFIG: (IMEX_CONFIG_TEXT, 0o644),
                   "lib/systemd/system/nvidia-imex.service": (_unit(
                       "NVIDIA IMEX service", "/usr/bin/nvidia-imex -c /%s" % IMEX_CONFIG, IMEX_PIDFILE), 0o644)},
            conffiles=(IMEX_CONFIG,),
            scripts={"prerm": _sh(_stop_daemon(IMEX_PIDFILE))},
            fields={"Conflicts": others_imex, "Replaces": others_imex, "Section": "non-free/utils"}))
    for tv in TOOLKIT_VERSIONS:
        pkgs.append(Package(
            "nvidia-container-toolkit", "%s-1" % tv,
            "NVIDIA Container Toolkit %s (nvidia-ctk), fleetctl lab emulation" % tv,
            files={"usr/bin/nvidia-ctk": (_script("nvidia-ctk", LAB_TOOLKIT_VERSION=tv), 0o755)},
            fields={"Section": "utils"}))
    pkgs.append(Package(
        "containerd", "%s-0lab1" % CONTAINERD_VERSION,
        "containerd %s (stub: the binary answers --version; configs are real files), fleetctl lab emulation"
        % CONTAINERD_VERSION,
        files={"usr/bin/containerd": (_sh(
                   'if [ "${1:-}" = --version ]; then',
                   '    echo "containerd github.com/containerd/containerd %s lab"' % CONTAINERD_VERSION,
                   "    exit 0",
                   "fi",
                   "exec sleep infinity"), 0o755),
               "etc/containerd/config.toml": (b'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
                                              b'  default_runtime_name = "runc"\n', 0o644)},
        fields={"Section": "admin"}))
    pkgs.append(Package(
        GPU_EMULATION, "1.0-%s" % REVISION,
        "The lab's emulated GPUs for hosts whose driver comes from real distribution packages (+debian)\n"
        " NVML in /usr/local/lib/x86_64-linux-gnu, found before the real library, and nvidia-smi and nvidia-lab-bench in\n"
        " /usr/local/bin, all answering for the version of the real libnvidia-ml.so.1 the host has installed.",
        files={"usr/local/lib/x86_64-linux-gnu/libnvidia-ml.so.1": (libs[""], 0o644),
               "usr/local/bin/nvidia-smi": (_script("nvidia-smi", LAB_DRIVER_VERSION=""), 0o755),
               "usr/local/bin/nvidia-lab-bench": (_script("nvidia-lab-bench", LAB_DRIVER_VERSION=""), 0o755),
               "usr/local/lib/nvidia-lab/skus.json": (skus, 0o644),
               "usr/local/lib/nvidia-lab/nvidia_lab_interconnect.py":
                   ((EMU / "nvidia_lab_interconnect.py").read_bytes(), 0o644)},
        scripts={"triggers": b"activate-noawait ldconfig\n"},
        fields={"Section": "non-free/libs"}))
    source, version = pynvml
    pkgs.append(Package(
        "python3-nvidia-ml-py", version,
        "Python bindings for NVML (pynvml %s, as published in the nvidia-ml-py wheel)" % version,
        files={"usr/lib/python3/dist-packages/pynvml.py": (source, 0o644)},
        fields={"Depends": "python3", "Section": "python"}, architecture="all"))
    return pkgs


def _content_hash(pynvml: tuple[bytes, str]) -> str:
    h = hashlib.sha256()
    for path in sorted(EMU.iterdir()) + [Path(__file__).resolve(), Path(__file__).resolve().parent / "skus.py"]:
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(json.dumps([DRIVER_VERSIONS, TOOLKIT_VERSIONS, REVISION, sku_table(), pynvml[1]]).encode())
    h.update(pynvml[0])
    return h.hexdigest()


def _compile(version: str, build: Path) -> bytes:
    gen = build / ("gen-" + (version or "real"))
    gen.mkdir()
    (gen / "lab_skus.h").write_text(sku_header())
    out = build / ("libnvidia-ml.so." + (version or "real"))
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-fvisibility=hidden",
                    "-Wl,-soname,libnvidia-ml.so.1", '-DLAB_DRIVER_VERSION="%s"' % version,
                    '-DLAB_FLAVOR="%s"' % FLAVOR, "-I", str(gen), "-o", str(out), str(EMU / "libnvidia-ml.c")],
                   check=True, capture_output=True, text=True)
    return out.read_bytes()


def _stage(pkg: Package, root: Path) -> int:
    """The package's files under ROOT; returns their size."""
    root.mkdir(parents=True)
    size = 0
    for rel, (content, arg) in sorted(pkg.files.items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "->":
            path.symlink_to(arg)
        else:
            path.write_bytes(content)
            path.chmod(arg)
            size += len(content)
    for d in [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
        d.chmod(0o755)
    return size


def _build_deb(pkg: Package, build: Path, repo_dir: Path) -> Path:
    root = build / pkg.filename
    size = _stage(pkg, root)
    debian = root / "DEBIAN"
    debian.mkdir()
    for name, content in pkg.scripts.items():
        (debian / name).write_bytes(content)
        (debian / name).chmod(0o644 if name == "triggers" else 0o755)
    debian.chmod(0o755)
    fields = {"Package": pkg.name, "Version": pkg.version, "Architecture": pkg.architecture,
              "Maintainer": MAINTAINER, "Installed-Size": str(max(1, (size + 1023) // 1024)), "Priority": "optional",
              **{k: v for k, v in pkg.fields.items() if v}, "Description": pkg.description}
    (debian / "control").write_text("".join("%s: %s\n" % kv for kv in fields.items()))
    if pkg.conffiles:
        (debian / "conffiles").write_text("".join("/%s\n" % rel for rel in pkg.conffiles))
    out = repo_dir / pkg.filename
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
                   check=True, capture_output=True, text=True)
    return out


def lab_system_package() -> Package:
    """fleetctl-lab-system: what a lab host's rpm database says the system provides (its root has them)."""
    return Package(LAB_SYSTEM, "1-1", "The system underneath a fleetctl lab host (no files)\n"
                   " Provides the shell and interpreters the host's root filesystem already has, for the scriptlets"
                   " and programs of the lab's RPMs.", architecture="all", rpm_provides=SYSTEM_PROVIDES)


def rpm_scriptlets(pkg: Package) -> dict[str, str]:
    """The Debian maintainer scripts as RPM scriptlet bodies (RPM_SCRIPTLETS); dpkg's ldconfig trigger runs when
    the transaction is done and after a removal."""
    out = {}
    for deb_name, (rpm_name, arguments) in RPM_SCRIPTLETS.items():
        if deb_name in pkg.scripts:
            body = pkg.scripts[deb_name].decode()
            if body.startswith("#!"):
                body = body.split("\n", 1)[1]
            out[rpm_name] = arguments + "\n" + body
    if b"ldconfig" in pkg.scripts.get("triggers", b""):
        for name in ("posttrans", "postun"):
            out[name] = out.get(name, "") + "/sbin/ldconfig\n"
    return out


def rpm_spec(pkg: Package, staged: Path) -> str:
    """A spec that packs STAGED (the package's files, _stage) as they are; no dependencies but the Provides of
    fleetctl-lab-system (AutoReqProv off)."""
    summary, _, rest = pkg.description.partition("\n")
    version, release = pkg.rpm_version
    lines = ["Name: " + (pkg.rpm_name or pkg.name)]
    if pkg.epoch:
        lines.append("Epoch: %d" % pkg.epoch)
    lines += ["Version: " + version, "Release: " + release, "Summary: " + summary, "License: NVIDIA (emulation)",
              "Packager: " + MAINTAINER, "BuildArch: " + RPM_ARCH[pkg.architecture], "AutoReqProv: no"]
    lines += ["Provides: " + p for p in pkg.rpm_provides]
    lines += ["", "%description", " ".join(rest.split()) or summary, "", "%install",
              "cp -a %s/. %%{buildroot}/" % staged, "", "%files"]
    lines += [('%%config(noreplace) "/%s"' if rel in pkg.conffiles else '"/%s"') % rel for rel in sorted(pkg.files)]
    for name, body in rpm_scriptlets(pkg).items():
        lines += ["", "%" + name, body.replace("%", "%%").rstrip("\n")]
    return "\n".join(lines) + "\n"


def _build_rpm(pkg: Package, build: Path, rpm_dir: Path) -> Path:
    work = build / ("rpm-" + pkg.rpm_filename)
    _stage(pkg, work / "root")
    spec = work / "package.spec"
    spec.write_text(rpm_spec(pkg, work / "root"))
    defines = dict(RPMBUILD_DEFINES, _topdir=str(work), _rpmdir=str(rpm_dir), _dbpath=str(work / "rpmdb"))
    subprocess.run(["rpmbuild", "--quiet", "-bb", "--nodeps", *[a for k, v in defines.items()
                                                                    for a in ("--define", "%s %s" % (k, v))],
                    str(spec)], check=True, capture_output=True, text=True)
    return rpm_dir / pkg.rpm_filename


def _index(repo_dir: Path) -> None:
    scan = subprocess.run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=repo_dir,
                          check=True, capture_output=True)
    packages = scan.stdout
    (repo_dir / "Packages").write_bytes(packages)
    packed = gzip.compress(packages, mtime=0)
    (repo_dir / "Packages.gz").write_bytes(packed)
    sums = {"MD5Sum": hashlib.md5, "SHA256": hashlib.sha256}
    lines = ["Origin: fleetctl-lab", "Label: fleetctl-lab", "Suite: lab", "Codename: lab",
             "Date: " + time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime()),
             "Architectures: amd64 all", "Description: fleetctl lab: emulated NVIDIA driver packages"]
    for field, fn in sums.items():
        lines.append(field + ":")
        for name, data in (("Packages", packages), ("Packages.gz", packed)):
            lines.append(" %s %d %s" % (fn(data).hexdigest(), len(data), name))
    (repo_dir / "Release").write_text("\n".join(lines) + "\n")


def rpm_tools() -> list[str]:
    """What building the RPM repository needs and this machine lacks."""
    return [t for t in ("rpmbuild", "createrepo_c") if shutil.which(t) is None]


def _index_rpm(rpm_dir: Path) -> None:
    subprocess.run(["createrepo_c", "--quiet", "--no-database", str(rpm_dir)], check=True, capture_output=True,
                   text=True)


def build_repo(repo_dir: Path) -> list[dict]:
    """Builds (or finds up to date) every lab package in repo_dir: the .debs, and the RPMs in repo_dir/rpm when
    rpmbuild and createrepo_c are there (rpm_tools()); returns the .debs, [{name, version, path}] (built_rpms:
    the RPMs)."""
    repo_dir = Path(repo_dir)
    repo_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("gcc", "dpkg-deb", "dpkg-scanpackages"):
        if shutil.which(tool) is None:
            raise RuntimeError("building the lab packages needs %s (apt-get install build-essential dpkg-dev)" % tool)
    with_rpm = not rpm_tools()
    rpm_dir = repo_dir / RPM_DIR
    pynvml = pynvml_source()
    digest = _content_hash(pynvml)
    with open(repo_dir / ".lab-packages.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = repo_dir / MANIFEST
        try:
            previous = json.loads(manifest.read_text())
        except (OSError, ValueError):
            previous = {}
        indexes = [repo_dir / "Packages.gz"] + ([rpm_dir / "repodata/repomd.xml"] if with_rpm else [])
        if previous.get("hash") == digest and all(i.exists() for i in indexes) \
                and all(Path(p["path"]).exists() for p in previous.get("packages", []) + previous.get("rpms", [])):
            return previous["packages"]
        built, built_rpm = [], []
        with tempfile.TemporaryDirectory(prefix="lab-packages-") as tmp:
            build = Path(tmp)
            with concurrent.futures.ThreadPoolExecutor() as pool:  # gcc and rpmbuild runs take most of the build
                builds = DRIVER_VERSIONS + ("",)  # "": the version read from the real library (fleetctl-lab-gpu)
                libs = dict(zip(builds, pool.map(lambda v: _compile(v, build), builds)))
                pkgs = package_list(pynvml, libs)
                for old in repo_dir.glob("*.deb"):
                    old.unlink()
                shutil.rmtree(rpm_dir, ignore_errors=True)
                for pkg in pkgs:
                    path = _build_deb(pkg, build, repo_dir)
                    built.append({"name": pkg.name, "version": pkg.version, "path": str(path)})
                if with_rpm:
                    rpm_dir.mkdir()
                    # fleetctl-lab-gpu stands beside Debian's real packages (+debian): no rpm host needs it
                    rpms = [p for p in pkgs if p.name != GPU_EMULATION] + [lab_system_package()]
                    for pkg, path in zip(rpms, pool.map(lambda p: _build_rpm(p, build, rpm_dir), rpms)):
                        version = "%s-%s" % pkg.rpm_version
                        built_rpm.append({"name": pkg.rpm_name or pkg.name, "epoch": pkg.epoch, "version": version,
                                          "path": str(path)})
        _index(repo_dir)
        if with_rpm:
            _index_rpm(rpm_dir)
        manifest.write_text(json.dumps({"hash": digest, "packages": built, "rpms": built_rpm}, indent=1) + "\n")
        return built


def cache_dir() -> Path:
    """Where lab_repo keeps the repositories it built: $XDG_CACHE_HOME/fleetctl-lab (default ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fleetctl-lab"


def lab_repo(repo_dir: Path) -> list[dict]:
    """build_repo's packages in REPO_DIR, built once per content hash on this machine (every lab up otherwise
    compiles and packs the same packages again): a build in cache_dir(), copied (a lab may change its copy) with
    the manifest's paths moved to REPO_DIR."""
    repo_dir = Path(repo_dir)
    built = cache_dir() / ("repo-" + _content_hash(pynvml_source())[:16])
    packages = build_repo(built)
    rpms = built_rpms(built)
    shutil.rmtree(repo_dir, ignore_errors=True)
    shutil.copytree(built, repo_dir, ignore=shutil.ignore_patterns(".lab-packages.lock"))

    def moved(entries: list[dict]) -> list[dict]:
        return [dict(e, path=str(repo_dir / Path(e["path"]).relative_to(built))) for e in entries]
    manifest = json.loads((built / MANIFEST).read_text())
    manifest.update(packages=moved(packages), rpms=moved(rpms))
    (repo_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest["packages"]


def built_rpms(repo_dir: Path) -> list[dict]:
    """The RPMs of the last build_repo(repo_dir): [{name, epoch, version (V-R), path}] ([] without rpm tools)."""
    try:
        return json.loads((Path(repo_dir) / MANIFEST).read_text()).get("rpms", [])
    except (OSError, ValueError):
        return []
