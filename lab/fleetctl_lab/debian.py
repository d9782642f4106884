"""Real NVIDIA driver packages for the lab's `+debian` hosts: Debian's own packages, from a local mirror.

DRIVERS names, per driver version, the headless part of the driver as Debian 12 (bookworm) packages it: the
DKMS kernel module source, the NVML library and nvidia-smi, at the exact versions of the archive. ensure_mirror()
fetches them and every dependency this machine lacks with apt, once per machine, into MIRROR (a flat repository
indexed with dpkg-scanpackages); a `+debian` host has it as an apt source beside the lab repository, which adds
python3-nvidia-ml-py, the container runtime and fleetctl-lab-gpu (the emulated GPUs answering for the real
library's version: packages.py). Real apt, dpkg, dkms, update-alternatives and maintainer scripts run in the host.

The fetch uses a private apt state (MIRROR/apt: its own sources with contrib, non-free and non-free-firmware,
lists and partial downloads); apt checks the archive's signatures with the machine's debian-archive-keyring. The
hosts trust the flat index the lab writes over those verified files ([trusted=yes]).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

CODENAME = "bookworm"
# Debian's driver versions and the packages each is installed as (Debian's three spellings: the source
# nvidia-graphics-drivers-tesla-470 names its packages nvidia-tesla-470-*, -tesla-535 nvidia-tesla-535-*, and the
# unversioned nvidia-graphics-drivers, bookworm's current 535, nvidia-*).
DRIVERS = {
    "470.256.02": {"nvidia-tesla-470-kernel-dkms": "470.256.02-1~deb12u1",
                   "libnvidia-tesla-470-ml1": "470.256.02-1~deb12u1",
                   "nvidia-tesla-470-smi": "470.256.02-1~deb12u1"},
    "535.216.03": {"nvidia-tesla-535-kernel-dkms": "535.216.03-3~deb12u1",
                   "libnvidia-tesla-535-ml1": "535.216.03-3~deb12u1",
                   "nvidia-tesla-535-smi": "535.216.03-3~deb12u1"},
    "535.261.03": {"nvidia-kernel-dkms": "535.261.03-1", "libnvidia-ml1": "535.261.03-1", "nvidia-smi": "535.261.03-1"},
}
# Dependencies pinned at the exact version of the driver (= DRIVER) that apt would otherwise take from a newer
# upload of the same source: bookworm-security carries 535.309.01 of the unversioned source.
PINNED_DEPENDENCIES = {
    "535.261.03": {"nvidia-alternative": "535.261.03-1", "nvidia-kernel-support": "535.261.03-1",
                   "firmware-nvidia-gsp": "535.261.03-1"},
}
ARCHIVE = os.environ.get("FLEETCTL_LAB_DEBIAN_ARCHIVE", "http://deb.debian.org/debian")
SECURITY = os.environ.get("FLEETCTL_LAB_DEBIAN_SECURITY", "http://deb.debian.org/debian-security")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
COMPONENTS = "main contrib non-free non-free-firmware"
MANIFEST = "fleetctl-mirror.json"


class MirrorError(RuntimeError):
    """The mirror cannot be made: one line for the operator."""


def mirror_dir() -> Path:
    """Kept outside the lab's directory so that `lab down` and a rebuilt lab keep the download."""
    return Path(os.environ.get("FLEETCTL_LAB_DEBIAN_MIRROR", "/var/cache/fleetctl-lab/debian"))


def source_line(mirror: Path | None = None) -> str:
    return f"deb [trusted=yes] file:{mirror or mirror_dir()} ./\n"


def wanted() -> dict[str, dict[str, str]]:
    return {v: {**names, **PINNED_DEPENDENCIES.get(v, {})} for v, names in DRIVERS.items()}


def held(driver: str, installed: dict[str, str]) -> list[str]:
    """The packages a well-kept host holds: every installed package at DRIVER's version (the driver's own and the
    parts apt pulled in with it: nvidia-tesla-470-alternative, -kernel-support, firmware-nvidia-gsp ...)."""
    return sorted(n for n, v in installed.items() if v.split(":", 1)[-1].startswith(driver + "-"))


def ensure_mirror() -> Path:
    """MIRROR holding every driver set of DRIVERS and what they need beyond this machine's packages; a no-op when
    the last fetch was for the same sets and its files are all there. Shared by every lab on the machine: one fetch
    at a time (MIRROR/.lock; a second lab waits, then finds it done), and the index and manifest are replaced
    atomically, so a lab's hosts reading the mirror while another lab fetches never see half a file (apt moves
    each .deb in whole from partial/; nothing is ever removed)."""
    mirror = mirror_dir()
    mirror.mkdir(parents=True, exist_ok=True)
    with open(mirror / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = mirror / MANIFEST
        try:
            previous = json.loads(manifest.read_text())
        except (OSError, ValueError):
            previous = {}
        if previous.get("wanted") == wanted() and (mirror / "Packages").exists() \
                and all((mirror / f).exists() for f in previous.get("files", [])):
            return mirror
        _check_machine()
        state = mirror / "apt"
        for sub in ("lists/partial", "archives/partial"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        (state / "sources.list").write_text(
            f"deb [signed-by={KEYRING}] {ARCHIVE} {CODENAME} {COMPONENTS}\n"
            f"deb [signed-by={KEYRING}] {ARCHIVE} {CODENAME}-updates {COMPONENTS}\n"
            f"deb [signed-by={KEYRING}] {SECURITY} {CODENAME}-security {COMPONENTS}\n")
        options = ["-o", f"Dir::Etc::SourceList={state / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/dev/null",
                   "-o", f"Dir::State::Lists={state / 'lists'}", "-o", f"Dir::Cache::Archives={mirror}",
                   "-o", f"Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
                   "-o", "APT::Sandbox::User=root", "-o", "APT::Install-Recommends=false", "-o", "Acquire::Languages=none"]
        _apt(["apt-get", *options, "update"], "apt-get update of Debian's contrib, non-free and non-free-firmware")
        for version, names in wanted().items():
            _apt(["apt-get", *options, "-y", "--download-only", "install", *[f"{n}={v}" for n, v in names.items()]],
                 f"fetching Debian's driver {version}")
        files = sorted(p.name for p in mirror.glob("*.deb"))
        scan = subprocess.run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=mirror,
                              capture_output=True, check=True)
        _replace(mirror / "Packages", scan.stdout)
        _replace(manifest, (json.dumps({"wanted": wanted(), "files": files}, indent=1) + "\n").encode())
        return mirror


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _check_machine() -> None:
    release = {}
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            key, _, value = line.partition("=")
            release[key] = value.strip('"')
    except OSError:
        pass
    if release.get("VERSION_CODENAME") != CODENAME:
        raise MirrorError(f"+debian hosts install Debian 12 ({CODENAME})'s NVIDIA packages over this machine's root; "
                          f"this machine is {release.get('PRETTY_NAME', 'not Debian')}")
    for tool in ("apt-get", "dpkg-scanpackages"):
        if shutil.which(tool) is None:
            raise MirrorError(f"+debian hosts need {tool} on this machine (apt-get install dpkg-dev)")
    if not Path(KEYRING).exists():
        raise MirrorError(f"+debian hosts need {KEYRING} (apt-get install debian-archive-keyring)")


def _apt(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C",
                                                                      "DEBIAN_FRONTEND": "noninteractive"})
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        telling = [ln for ln in lines if ln.startswith(("E:", "W:", " ")) or "Depends" in ln] or lines[-3:]
        raise MirrorError(f"{what} failed (exit {proc.returncode}): {' | '.join(telling[:4])}")
