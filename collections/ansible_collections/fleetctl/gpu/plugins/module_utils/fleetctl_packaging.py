# -*- coding: utf-8 -*-
"""NVIDIA driver packaging families, as data: how each distribution spells a driver branch in its package names.

One copy, used on the hosts (gpu_facts: which installed packages are the driver; nvidia_driver_packages: what to
install, what to remove on a branch change) and on the controller (the campaign's package sets). No Ansible import.

A family is a rule that reads a package name as (family, branch, key): the branch the name carries (None where the
name carries none and the version says it), and a key naming the same part of the driver across families and
branches, so that a package can be spelled for another branch or family:

  debian-tesla-NNN  Debian non-free, source nvidia-graphics-drivers-tesla-NNN: the branch in the middle of the name
                    (nvidia-tesla-535-driver, libnvidia-tesla-535-ml1, libegl-nvidia-tesla-535-0,
                    xserver-xorg-video-nvidia-tesla-535).
  debian-tesla      Debian non-free, source nvidia-graphics-drivers-tesla (the current Tesla branch, unversioned:
                    nvidia-tesla-driver, libegl-nvidia-tesla0).
  debian            Debian non-free, source nvidia-graphics-drivers (the current branch, unversioned: nvidia-driver,
                    libnvidia-ml1, nvidia-kernel-dkms, libcuda1, nvidia-smi).
  branched          Ubuntu's archive and NVIDIA's CUDA repositories for Ubuntu/Debian: the branch at the end, before
                    an -open/-server flavour (nvidia-driver-570-server-open, libnvidia-compute-570, nvidia-dkms-570,
                    nvidia-open-570, cuda-drivers-570, nvidia-fabricmanager-570, libnvidia-nscq-570,
                    nvidia-imex-570).
  versioned         Ubuntu: the driver's whole version in the name (nvidia-firmware-580-580.159.03), brought in by
                    the packages that depend on it, never asked for.
  el                Enterprise Linux (NVIDIA's CUDA repository, rpm): unversioned names, the branch chosen by the dnf
                    module stream (nvidia-driver:570-open): nvidia-driver, nvidia-driver-cuda, kmod-nvidia-open-dkms.

The Debian names come from the binary packages of those sources in bookworm's non-free Packages index (the real
index is tests/testdata/packaging/debian-bookworm-non-free-nvidia.Packages; the unit tests read it).
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

# Debian's driver packages whose name is not "<prefix>nvidia<suffix>" with the Tesla infix dropped: in the tesla
# sources these libraries take the libnvidia-tesla[-NNN]- prefix (libcuda1 <-> libnvidia-tesla-535-cuda1).
DEBIAN_RENAMED = {"libcuda1": "libnvidia-cuda1", "libcudadebugger1": "libnvidia-cudadebugger1",
                  "libnvcuvid1": "libnvidia-nvcuvid1", "libnvoptix1": "libnvidia-nvoptix1"}

# The binary packages of Debian's source nvidia-graphics-drivers (bookworm, 535.261.03-1 and 535.309.01-0+deb12u1),
# i.e. the keys of the Debian driver: in the tesla sources each one is spelled with the Tesla infix.
DEBIAN_DRIVER_KEYS = frozenset((
    "libcuda1", "libcudadebugger1", "libegl-nvidia0", "libgl1-nvidia-glvnd-glx", "libgles-nvidia1", "libgles-nvidia2",
    "libglx-nvidia0", "libnvcuvid1", "libnvidia-allocator1", "libnvidia-api1", "libnvidia-cfg1", "libnvidia-eglcore",
    "libnvidia-encode1", "libnvidia-fbc1", "libnvidia-glcore", "libnvidia-glvkspirv", "libnvidia-ml1",
    "libnvidia-ngx1", "libnvidia-nvvm4", "libnvidia-opticalflow1", "libnvidia-pkcs11-openssl3",
    "libnvidia-ptxjitcompiler1", "libnvidia-rtcore", "libnvoptix1", "nvidia-alternative", "nvidia-cuda-mps",
    "nvidia-detect", "nvidia-driver", "nvidia-driver-bin", "nvidia-driver-full", "nvidia-driver-libs",
    "nvidia-egl-common", "nvidia-egl-icd", "nvidia-kernel-dkms", "nvidia-open-kernel-dkms", "nvidia-kernel-source",
    "nvidia-open-kernel-source", "nvidia-open-kernel-support", "nvidia-kernel-support", "nvidia-legacy-check", "nvidia-libopencl1",
    "nvidia-opencl-common", "nvidia-opencl-icd", "nvidia-powerd", "nvidia-smi", "nvidia-suspend-common",
    "nvidia-vdpau-driver", "nvidia-vulkan-common", "nvidia-vulkan-icd", "xserver-xorg-video-nvidia",
    # in non-free-firmware: the GSP firmware the kernel module of 525 and later loads
    "firmware-nvidia-gsp",
    # only in the tesla sources (their keys, Tesla infix dropped)
    "libnvidia-cbl", "libnvidia-compiler", "libnvidia-ifr1",
))

# Parts of the Tesla sources that later branches dropped, with the last branch that ships each (tesla-470 has all
# three, tesla (525) only the compiler, tesla-535 and the unversioned source none).
DEBIAN_LAST_BRANCH = {"libnvidia-cbl": 470, "libnvidia-ifr1": 470, "libnvidia-compiler": 525}

# Packages of every family that are versioned with the driver but are not the driver itself.
PERSISTENCED = re.compile(r"^nvidia-persistenced$")
FABRICMANAGER = re.compile(r"^(nvidia-fabric-?manager(-\d+)?|cuda-drivers-fabricmanager(-\d+)?|libnvidia-nscq(-\d+)?)$")
# NVIDIA's IMEX service (rack-scale NVLink domains): nvidia-imex-570 (Ubuntu's archive and NVIDIA's repositories,
# deb and rpm; a branched name, spelled for another branch like the driver's) and the unversioned nvidia-imex.
IMEX = re.compile(r"^nvidia-imex(-\d{3})?$")
CONTAINER_TOOLKIT = re.compile(r"^(nvidia-container-toolkit(-base)?|libnvidia-container1|libnvidia-container-tools"
                               r"|nvidia-container-runtime)$")

_TESLA_BRANCH = re.compile(r"^(?P<pre>[a-z0-9.+-]*?nvidia)-tesla-(?P<branch>\d{3})(?P<post>-[a-z0-9.+-]+)?$")
_TESLA = re.compile(r"^(?P<pre>[a-z0-9.+-]*?nvidia)-tesla(?P<post>-[a-z0-9.+-]+|\d+)?$")
# Ubuntu / CUDA repository: the branch at the end (before the flavour). linux-modules-nvidia-570-server-open-<kernel>
# and its linux-objects/-signatures kin are precompiled for one kernel and versioned with the kernel, not the driver.
_BRANCHED = re.compile(r"^(?P<stem>((lib)?nvidia-[a-z0-9-]*?|xserver-xorg-video-nvidia|cuda-drivers(-fabricmanager)?)-)"
                       r"(?P<branch>\d{3})"
                       r"(?P<flavor>-open|-server|-server-open)?$")
_PRECOMPILED = re.compile(r"^linux-(modules|objects|signatures)-nvidia-(?P<branch>\d{3})(?P<flavor>-server)?(-open)?-.+$")
# What the driver is on the families that name it without Debian's sources (Ubuntu, CUDA repositories, EL).
_DRIVER = re.compile(r"^(nvidia-driver(-\d+)?(-open|-server|-server-open)?|nvidia-open(-\d+)?|cuda-drivers(-\d+)?"
                     r"|nvidia-kernel-(open|source|common)(-\d+)?(-open)?|nvidia-dkms(-\d+)?(-open)?|kmod-nvidia.*"
                     r"|libnvidia-compute(-\d+)?|nvidia-utils(-\d+)?|nvidia-compute-utils(-\d+)?"
                     r"|nvidia-headless(-no-dkms)?(-\d+)?(-open)?|libnvidia-ml1|nvidia-driver-(cuda|libs|NVML)|nvidia-modprobe"
                     r"|libnvidia-gl(-\d+)?|xserver-xorg-video-nvidia(-\d+)?)$")
# Ubuntu's firmware package carries the driver's whole version in its name (nvidia-firmware-580-580.159.03, a
# dependency of nvidia-dkms-580 / nvidia-kernel-common-580): a new driver version is a new package name.
_VERSIONED = re.compile(r"^nvidia-firmware-(?P<branch>\d{3})(?P<flavor>-server)?-(?P<version>\d+\.\d+(\.\d+)?)$")
_EL_DRIVER = re.compile(r"^(nvidia-driver-(cuda|libs|NVML|cuda-libs|devel)|kmod-nvidia.*|nvidia-kmod-common)$")


def _post(post):
    """Debian's suffix after the Tesla infix, as the unversioned name spells it ('-0' -> '0', '-ml1' -> '-ml1')."""
    if not post:
        return ""
    return post[1:] if re.match(r"^-\d+$", post) else post


def read(name):
    """(family, branch or None, key) of a driver-versioned package name; None for a name no family knows."""
    m = _TESLA_BRANCH.match(name)
    if m:
        return "debian-tesla-NNN", m.group("branch"), _debian_key(m.group("pre") + _post(m.group("post")))
    m = _TESLA.match(name)
    if m:
        return "debian-tesla", None, _debian_key(m.group("pre") + _post(m.group("post")))
    if name in DEBIAN_DRIVER_KEYS:
        return "debian", None, name
    m = _BRANCHED.match(name)
    if m:
        return "branched", m.group("branch"), m.group("stem") + "NNN" + (m.group("flavor") or "")
    m = _PRECOMPILED.match(name)
    if m:
        return "precompiled", m.group("branch"), name
    m = _VERSIONED.match(name)
    if m:
        return "versioned", m.group("branch"), "nvidia-firmware-NNN%s-V" % (m.group("flavor") or "")
    if _EL_DRIVER.match(name):
        return "el", None, name
    return None


def _debian_key(spelled):
    """The unversioned Debian name of a tesla package with its infix dropped (libnvidia-cuda1 -> libcuda1)."""
    for key, tesla in DEBIAN_RENAMED.items():
        if spelled == tesla:
            return key
    return spelled


def spell(family, key, branch=None):
    """KEY spelled in FAMILY (on BRANCH for the families whose names carry one); None where it cannot be."""
    if family in ("debian-tesla-NNN", "debian-tesla"):
        if key not in DEBIAN_DRIVER_KEYS:
            return None
        if key in DEBIAN_LAST_BRANCH and branch and int(branch) > DEBIAN_LAST_BRANCH[key]:
            return None
        name = DEBIAN_RENAMED.get(key, key)
        m = re.match(r"^(?P<pre>.*nvidia)(?P<post>.*)$", name)
        pre, post = m.group("pre"), m.group("post")
        infix = "-tesla-%s" % branch if family == "debian-tesla-NNN" else "-tesla"
        if family == "debian-tesla-NNN" and re.match(r"^\d+$", post):
            post = "-" + post  # libegl-nvidia0 -> libegl-nvidia-tesla-535-0
        return pre + infix + post
    if family == "debian":
        return key if key in DEBIAN_DRIVER_KEYS and key not in DEBIAN_LAST_BRANCH else None
    if family == "branched":
        return key.replace("NNN", branch) if branch else None
    return None


def on_branch(name, branch):
    """NAME spelled for driver BRANCH in its own family (the unversioned families keep their names); None for a
    part that BRANCH no longer ships (libnvidia-tesla-470-cbl has no 535)."""
    got = read(name)
    if got is None or got[1] is None or got[0] == "precompiled":
        return name
    return spell(got[0], got[2], branch)


def equivalents(name, branch):
    """The other spellings of NAME's part of the driver for BRANCH, in the order to try them when NAME is not in the
    repositories at the wanted version: Debian moves a branch between its tesla-NNN, tesla and unversioned sources
    (535.216.03 is nvidia-tesla-535-driver, 535.261.03 is nvidia-driver)."""
    got = read(name)
    if got is None or not got[0].startswith("debian"):
        return []
    out = []
    for family in ("debian-tesla-NNN", "debian", "debian-tesla"):
        other = spell(family, got[2], branch)
        if other and other != name and other not in out:
            out.append(other)
    return out


def role(name):
    """What an installed package is to fleetctl: driver, persistenced, fabricmanager, imex, container_toolkit, or
    None."""
    if PERSISTENCED.match(name):
        return "persistenced"
    if IMEX.match(name):
        return "imex"
    if CONTAINER_TOOLKIT.match(name):
        return "container_toolkit"
    if FABRICMANAGER.match(name):
        return "fabricmanager"
    if _DRIVER.match(name):
        return "driver"
    got = read(name)
    # Every part a family spells with the branch or version (libnvidia-compute-580-server, nvidia-firmware-580-V)
    # moves with the driver; a precompiled module package is versioned with its kernel.
    return "driver" if got is not None and got[0] != "precompiled" and got[0] != "el" else None


def stale(installed, resolved, debian_sources=True):
    """The installed driver packages that belong to another driver than RESOLVED (name -> version), to remove in
    the same change. INSTALLED: name -> version.
    - Ubuntu / CUDA repositories: a name carrying another branch than the requested ones (nvidia-driver-550-open
      beside 570's); nothing when no requested name carries a branch. A name carrying another driver version than
      the requested ones (Ubuntu's nvidia-firmware-580-580.159.03 when 580.173.02 is installed).
    - Debian (only with DEBIAN_SOURCES: rpm hosts share some of the unversioned names): another spelling of a part
      being installed (nvidia-tesla-535-smi beside the unversioned nvidia-smi of 535.261.03), and a part of another
      Tesla branch (nvidia-tesla-470-*, libnvidia-tesla-470-cbl included). Packages the new driver depends on but
      that are not its parts (nvidia-egl-common, nvidia-vulkan-common of the unversioned source) stay."""
    branches = set(b for b in (on_name_branch(n) for n in resolved) if b)
    versions = set(upstream_version(v) for v in resolved.values())
    debian = [read(n) for n in resolved if debian_sources and (read(n) or ("",))[0].startswith("debian")]
    keys = set(r[2] for r in debian)
    tesla_branches = set(r[1] for r in debian if r[0] == "debian-tesla-NNN")
    out = []
    for name in sorted(installed):
        got = read(name)
        if name in resolved or got is None:
            continue
        family, branch, key = got
        if family == "branched" and branches and branch not in branches:
            out.append(name)
        elif family == "versioned" and branches and (
                branch not in branches or _VERSIONED.match(name).group("version") not in versions):
            out.append(name)  # only when a driver of some branch is asked for: it brings its own firmware
        elif family.startswith("debian") and debian and (
                key in keys or (family == "debian-tesla-NNN" and branch not in tesla_branches)):
            out.append(name)
    return out


def upstream_version(version):
    """'1:570.86.15-0ubuntu1' -> '570.86.15' (epoch and distro revision dropped)."""
    return version.split(":", 1)[-1].split("-", 1)[0]


def moves_with_driver(packages, versions):
    """The driver packages (dicts with name, version, role) that move with the driver and a well-kept host holds:
    those at one of the driver VERSIONS, and every name that carries a branch or version (a libnvidia-compute-570
    that drifted to another version is still the driver's). Left out: unversioned names at other versions, which
    Debian versions apart (nvidia-kernel-common 20220217; nvidia-modprobe, nvidia-legacy-check 535.309.01 beside
    a 535.261.03 driver)."""
    return [p for p in packages if p["role"] == "driver"
            and (upstream_version(p["version"]) in versions or on_name_branch(p["name"]) is not None)]


def comes_with_dependents(name):
    """A package never asked for by name: it carries the driver version in its name (Ubuntu's
    nvidia-firmware-580-580.159.03), so the new version's packages bring their own, and stale() removes the old."""
    got = read(name)
    return got is not None and got[0] == "versioned"


def on_name_branch(name):
    """The branch NAME carries, or None."""
    got = read(name)
    return got[1] if got and got[0] != "precompiled" else None
