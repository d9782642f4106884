# -*- coding: utf-8 -*-
"""The boot a host is in (its boot id, the nvidia module loaded in it), the kernel it boots next, and whether that
kernel has an nvidia module (the driver.next_boot control).

The classic outage after an unattended kernel update: the new kernel is installed, DKMS could not build the nvidia
module for it (no headers, a compiler error, an unsigned module under Secure Boot), and nothing says so until the
next reboot comes back without a driver. So the facts name the kernel the boot loader will start next and the
nvidia module installed for it.

Where the next kernel comes from, in this order (the first that names an installed kernel wins):
  grubenv       /boot/grub/grubenv or /boot/grub2/grubenv: next_entry (grub-reboot), else saved_entry when
                /etc/default/grub says GRUB_DEFAULT=saved (EL's default; Debian/Ubuntu use 0)
  grub.cfg      the first kernel of /boot/grub/grub.cfg or /boot/grub2/grub.cfg (GRUB_DEFAULT=0, Debian/Ubuntu)
  loader        Boot Loader Specification entries (/boot/loader/entries/*.conf: kernel-install, systemd-boot, EL
                grubby), the default from /boot/loader/loader.conf, else the newest
  newest        the newest /boot/vmlinuz-* (what update-grub puts first)
A host with no kernel image under /boot (a VM or container whose kernel comes from outside) has no next kernel.
No Ansible import: the unit tests use it directly.
"""

from __future__ import absolute_import, division, print_function

import glob
import os
import re

__metaclass__ = type

BOOT_ID = "/proc/sys/kernel/random/boot_id"
SYS_MODULE = "/sys/module"
MODULE_NAMES = ("nvidia.ko", "nvidia.ko.xz", "nvidia.ko.zst", "nvidia.ko.gz")
_DKMS = re.compile(r"^(?P<module>[\w-]+)[/,]\s*(?P<version>[\w.~+-]+),\s*(?P<kernel>[^,]+),\s*(?P<arch>[^:]+):\s*"
                   r"(?P<state>[\w-]+)(?P<note>.*)$")


def read_value(path):
    """A small kernel or state file's content (a boot id, a module version, a refcnt) without surrounding blanks;
    None when it cannot be read or is empty."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except (IOError, OSError, UnicodeDecodeError):
        return None


def boot_id():
    """The boot id of the boot the host is in: a reboot changes it."""
    return read_value(BOOT_ID)


def loaded_nvidia_version(sys_module=SYS_MODULE):
    """The loaded nvidia kernel module's version; None when none is loaded."""
    return read_value(os.path.join(sys_module, "nvidia", "version"))


def version_key(kernel):
    """Sort key for kernel release strings: 6.8.0-47-generic after 6.8.0-45-generic, 6.10 after 6.9."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.+~_-]", kernel)]


def installed_kernels(boot="/boot"):
    """Kernel releases with an image in /boot (vmlinuz-RELEASE, as Debian, Ubuntu and EL name them)."""
    found = []
    for path in glob.glob(os.path.join(boot, "vmlinuz-*")):
        release = os.path.basename(path)[len("vmlinuz-"):]
        if release and "rescue" not in release:
            found.append(release)
    return sorted(found, key=version_key)


def kernel_named(text, kernels):
    """The installed kernel a boot entry's text names (the longest match: 6.8.0-45-generic, not 6.8.0-4)."""
    named = [k for k in kernels if k in text]
    return max(named, key=len) if named else None


def grubenv_entry(grubenv_text, default_grub_text):
    """The entry grubenv makes the next boot: next_entry (a one-time grub-reboot), else saved_entry if
    GRUB_DEFAULT=saved. None when the boot follows grub.cfg's order."""
    env = dict(line.split("=", 1) for line in (grubenv_text or "").splitlines() if "=" in line and not line.startswith("#"))
    if env.get("next_entry", "").strip():
        return env["next_entry"].strip()
    default = re.search(r'^\s*GRUB_DEFAULT\s*=\s*"?([^"\n]*)"?', default_grub_text or "", re.M)
    if default and default.group(1).strip() == "saved" and env.get("saved_entry", "").strip():
        return env["saved_entry"].strip()
    return None


def grub_cfg_first_kernel(text):
    """The kernel release of the first linux line of a generated grub.cfg (the default entry with GRUB_DEFAULT=0)."""
    m = re.search(r"^\s*linux(efi|16)?\s+\S*/vmlinuz-(\S+)", text or "", re.M)
    return m.group(2) if m else None


def loader_entries(entries_dir):
    """(entry id, kernel release) of each Boot Loader Specification entry, by file name."""
    out = []
    for path in sorted(glob.glob(os.path.join(entries_dir, "*.conf"))):
        try:
            with open(path) as f:
                text = f.read(65536)
        except (IOError, OSError):
            continue
        version = re.search(r"^\s*version\s+(\S+)", text, re.M)
        linux = re.search(r"^\s*linux\s+\S*/vmlinuz-(\S+)", text, re.M)
        release = version.group(1) if version else linux.group(1) if linux else None
        if release:
            out.append((os.path.basename(path)[:-len(".conf")], release))
    return out


def parse_dkms_status(text):
    """dkms status lines ('nvidia/570.86.15, 6.8.0-47-generic, x86_64: installed' and the older
    'nvidia, 570.86.15, 6.8.0-47-generic, x86_64: installed') -> [{module, version, kernel, state, note}]."""
    out = []
    for line in (text or "").splitlines():
        m = _DKMS.match(line.strip())
        if m:
            out.append({"module": m.group("module"), "version": m.group("version"), "kernel": m.group("kernel").strip(),
                        "state": m.group("state"), "note": m.group("note").strip(" ()") or None})
    return out


def module_files(kernel, modules_root="/lib/modules"):
    """Paths of nvidia kernel modules installed for KERNEL (updates/dkms, kernel/drivers/video, extra, precompiled
    kernel/nvidia-NNN ...)."""
    base = os.path.join(modules_root, kernel)
    found = []
    for root, dummy, files in os.walk(base):
        found.extend(os.path.join(root, f) for f in files if f in MODULE_NAMES)
    return sorted(found)


def next_kernel(boot="/boot", default_grub="/etc/default/grub", read=None):
    """(release, source) of the kernel the host boots next; (None, None) when it cannot be told."""
    read = read or _read
    kernels = installed_kernels(boot)
    for env in ("grub/grubenv", "grub2/grubenv"):
        entry = grubenv_entry(read(os.path.join(boot, env)), read(default_grub))
        if entry:
            loader_ids = dict(loader_entries(os.path.join(boot, "loader/entries")))
            kernel = loader_ids.get(entry) or kernel_named(entry, kernels)
            if kernel:
                return kernel, "grubenv"
    for cfg in ("grub/grub.cfg", "grub2/grub.cfg"):
        kernel = grub_cfg_first_kernel(read(os.path.join(boot, cfg)))
        if kernel and (kernel in kernels or not kernels):
            return kernel, "grub.cfg"
    entries = loader_entries(os.path.join(boot, "loader/entries"))
    if entries:
        default = re.search(r"^\s*default\s+(\S+)", read(os.path.join(boot, "loader/loader.conf")) or "", re.M)
        chosen = [r for i, r in entries if default and re.match(default.group(1).replace("*", ".*") + "$", i)]
        return (chosen[0] if chosen else max((r for dummy, r in entries), key=version_key)), "loader"
    if kernels:
        return kernels[-1], "newest"
    return None, None


def boot_facts(running, dkms_text, modinfo_version, boot="/boot", modules_root="/lib/modules",
               default_grub="/etc/default/grub"):
    """facts.boot: the RUNNING and the next kernel, each with its nvidia module files, the version
    MODINFO_VERSION(path) reads from the first, and its dkms status lines (DKMS_TEXT: dkms status, None without
    dkms)."""
    kernel, source = next_kernel(boot, default_grub)
    dkms = parse_dkms_status(dkms_text) if dkms_text is not None else None
    modules = []
    for release in [running] + ([kernel] if kernel and kernel != running else []):
        files = module_files(release, modules_root)
        modules.append({"kernel": release, "files": files, "version": modinfo_version(files[0]) if files else None,
                        "dkms": None if dkms is None else [d for d in dkms if d["kernel"] == release
                                                           and d["module"].startswith("nvidia")]})
    return {"running_kernel": running, "kernels": installed_kernels(boot), "next_kernel": kernel,
            "next_kernel_source": source, "modules": modules}


def _read(path):
    try:
        with open(path) as f:
            return f.read(1 << 20)
    except (IOError, OSError):
        return None
