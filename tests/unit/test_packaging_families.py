"""Driver packaging families read from REAL package indices: Debian bookworm's non-free/contrib Packages (an excerpt
of the real index, tests/testdata/packaging/). What a campaign asks a Debian host for, what the host's
nvidia_driver_packages resolves it to in those repositories, and what it removes, on a branch change
(470.256.02 -> 535.216.03) and on a move between Debian's sources within a branch (535.216.03 -> 535.261.03)."""

from __future__ import annotations

import importlib.util
import re
from collections import defaultdict
from pathlib import Path

import pytest

from orchestrator.campaign import packages

ROOT = Path(__file__).resolve().parents[2]
TESTDATA = ROOT / "tests/testdata/packaging"
INDEX = TESTDATA / "debian-bookworm-nvidia.Packages"
TESLA_470, TESLA_535, CURRENT = "470.256.02-1~deb12u1", "535.216.03-3~deb12u1", "535.261.03-1"
# The headless subset an HGX host without a display installs: the kernel module (DKMS source), NVML, nvidia-smi,
# CUDA's driver library, the alternative and the kernel-support files the module's package needs.
HEADLESS = ("nvidia-tesla-{b}-kernel-dkms", "libnvidia-tesla-{b}-ml1", "nvidia-tesla-{b}-smi",
            "libnvidia-tesla-{b}-cuda1", "nvidia-tesla-{b}-alternative", "nvidia-tesla-{b}-kernel-support")


def load_module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


packaging = load_module("fleetctl_packaging_under_test", "collections/ansible_collections/fleetctl/gpu/plugins/module_utils/fleetctl_packaging.py")


def stanzas() -> list[dict[str, str]]:
    text = "\n".join(line for line in INDEX.read_text().splitlines() if not line.startswith("#"))
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", block, re.M))
        fields.setdefault("Source", fields["Package"])
        fields["Source"] = fields["Source"].split()[0]
        out.append(fields)
    return out


@pytest.fixture(scope="module")
def index() -> dict[str, list[str]]:
    """package name -> every version the repositories offer, newest last (as apt-cache madison lists them)."""
    versions = defaultdict(list)
    for s in stanzas():
        versions[s["Package"]].append(s["Version"])
    return versions


@pytest.fixture(scope="module")
def by_source() -> dict[str, set[str]]:
    out = defaultdict(set)
    for s in stanzas():
        out[s["Source"]].add(s["Package"])
    return out


def test_every_binary_of_debians_driver_sources_is_read_as_its_family_and_branch(by_source):
    expected = {"nvidia-graphics-drivers-tesla-470": ("debian-tesla-NNN", "470"),
                "nvidia-graphics-drivers-tesla-535": ("debian-tesla-NNN", "535"),
                "nvidia-graphics-drivers-tesla": ("debian-tesla", None),
                "nvidia-graphics-drivers": ("debian", None), "nvidia-open-gpu-kernel-modules": ("debian", None)}
    for source, (family, branch) in expected.items():
        assert len(by_source[source]) >= 3, source
        for name in by_source[source]:
            assert (packaging.read(name) or (None, None))[:2] == (family, branch), name
            assert packaging.role(name) == "driver", name
    assert packaging.role("nvidia-persistenced") == "persistenced"
    assert packaging.read("nvidia-persistenced") is None  # versioned apart from the driver's sources on Debian


def test_each_part_of_the_driver_is_spelled_as_each_source_really_names_it(by_source):
    """The key of a package (its part of the driver) spelled back in every Debian source gives that source's real
    binary, for every part the source ships (libcuda1 <-> libnvidia-tesla-535-cuda1, libegl-nvidia0 <->
    libegl-nvidia-tesla-535-0 <-> libegl-nvidia-tesla0)."""
    sources = {"nvidia-graphics-drivers-tesla-470": ("debian-tesla-NNN", "470"),
               "nvidia-graphics-drivers-tesla-535": ("debian-tesla-NNN", "535"),
               "nvidia-graphics-drivers-tesla": ("debian-tesla", None),
               "nvidia-graphics-drivers": ("debian", None)}
    keys = {source: {packaging.read(n)[2] for n in names} for source, names in by_source.items() if source in sources}
    for source, (family, branch) in sources.items():
        assert {packaging.spell(family, key, branch) for key in keys[source]} == by_source[source], source
    # the parts the branches share: every 470 part that 535 also ships is the 535 name on_branch
    for name in by_source["nvidia-graphics-drivers-tesla-470"]:
        if packaging.read(name)[2] in keys["nvidia-graphics-drivers-tesla-535"]:
            assert packaging.on_branch(name, "535") in by_source["nvidia-graphics-drivers-tesla-535"], name


class FakeAptModule:
    """What nvidia_driver_packages asks of AnsibleModule, answering apt-cache madison from the real index."""

    def __init__(self, index):
        self.index = index
        self.params = {}

    def run_command(self, argv, environ_update=None):
        if argv[:2] == ["apt-cache", "madison"]:
            found = self.index.get(argv[2], [])
            return 0, "".join(f" {argv[2]} | {v} | deb.debian.org bookworm/non-free\n"
                                                for v in reversed(found)), ""
        raise AssertionError(argv)

    def fail_json(self, msg):
        raise RuntimeError(msg)


def headless(branch: str, version: str) -> dict[str, str]:
    return {name.format(b=branch): version for name in HEADLESS}


def host_resolves(index, requests: dict[str, str]) -> dict[str, str]:
    module = load_module("nvidia_driver_packages_under_test", "collections/ansible_collections/fleetctl/gpu/plugins/modules/nvidia_driver_packages.py")
    return module.Apt(FakeAptModule(index)).resolve(requests, update_cache=False)


def test_a_debian_branch_change_installs_the_new_branch_and_removes_every_package_of_the_old(index):
    """470.256.02 -> 535.216.03: the campaign asks for nvidia-tesla-535-* (not nvidia-tesla-470-* at 535, the bug a
    branch-at-the-end pattern had); every request exists at exactly 535.216.03-3~deb12u1; nothing of 470 stays."""
    installed = headless("470", TESLA_470) | {"nvidia-persistenced": "470.103.01-1", "nvidia-modprobe": "470.103.01-1"}
    facts = [{"name": n, "version": v, "role": packaging.role(n)} for n, v in installed.items()]
    before = packages.driver_versioned(facts, "470.256.02")
    assert before == headless("470", TESLA_470)  # persistenced/modprobe are versioned apart on Debian
    wanted = packages.target_set(before, "470.256.02", "535.216.03")
    assert wanted == {n: "535.216.03" for n in headless("535", TESLA_535)}
    resolved = host_resolves(index, wanted)
    assert resolved == headless("535", TESLA_535)
    assert packaging.stale(installed, resolved) == sorted(headless("470", TESLA_470))


def test_a_version_debian_ships_under_its_unversioned_source_is_found_there(index):
    """535.216.03 (nvidia-tesla-535-*) -> 535.261.03, which bookworm ships only as the unversioned nvidia-driver
    source: the host resolves each tesla-535 request to the same part there (libnvidia-tesla-535-cuda1 ->
    libcuda1), and the tesla-535 packages go in the same change. And back: the rollback's exact tesla-535 set."""
    installed = headless("535", TESLA_535)
    wanted = packages.target_set(installed, "535.216.03", "535.261.03")
    assert wanted == {n: "535.261.03" for n in installed}  # same branch: the names stay, the host finds them
    resolved = host_resolves(index, wanted)
    assert resolved == {"nvidia-kernel-dkms": CURRENT, "libnvidia-ml1": CURRENT, "nvidia-smi": CURRENT,
                        "libcuda1": CURRENT, "nvidia-alternative": CURRENT, "nvidia-kernel-support": CURRENT}
    assert packaging.stale(installed, resolved) == sorted(installed)
    back = host_resolves(index, installed)  # a rollback asks for the recorded distro versions
    assert back == installed
    assert packaging.stale(resolved, back) == sorted(resolved)


def test_a_version_in_no_repository_is_named_with_its_package(index):
    with pytest.raises(RuntimeError, match=r"no package version in the configured repositories for: "
                                           r"libnvidia-tesla-535-ml1=535\.999\.01"):
        host_resolves(index, {"libnvidia-tesla-535-ml1": "535.999.01"})


@pytest.mark.parametrize("name, family, branch", [
    ("nvidia-driver-570-server-open", "branched", "570"), ("libnvidia-compute-570-server", "branched", "570"),
    ("nvidia-fabricmanager-570", "branched", "570"), ("cuda-drivers-570", "branched", "570"),
    ("nvidia-open-570", "branched", "570"), ("nvidia-dkms-570-open", "branched", "570"),
    ("linux-modules-nvidia-570-server-open-6.8.0-45-generic", "precompiled", "570"),
    ("kmod-nvidia-open-dkms", "el", None)])
def test_ubuntu_cuda_and_el_names(name, family, branch):
    assert packaging.read(name)[:2] == (family, branch)


def test_rpm_hosts_never_lose_their_unversioned_driver_packages():
    installed = {"nvidia-driver": "550.163.01-1.el9", "kmod-nvidia-open-dkms": "550.163.01-1.el9"}
    resolved = {"nvidia-driver": "570.86.15-1.el9"}
    assert packaging.stale(installed, resolved, debian_sources=False) == []


def closure(index_stanzas: list[dict[str, str]], roots: list[str]) -> dict[str, str]:
    """name -> version of ROOTS and everything they depend on or recommend in the index, as apt installs them
    (recommends included, its default): of a clause's alternatives (and the packages that Provide them) one of the
    roots' own source is taken first, else the first the index has; the newest version."""
    newest, provides = {}, defaultdict(list)
    for st in index_stanzas:
        newest[st["Package"]] = st  # later stanzas (bookworm-security) are newer
        for virtual in (v.split()[0] for v in st.get("Provides", "").split(",") if v.strip()):
            provides[virtual].append(st["Package"])
    home = {newest[r]["Source"] for r in roots}
    got, todo = {}, list(roots)
    while todo:
        name = todo.pop()
        if name in got or name not in newest:
            continue
        st = newest[name]
        got[name] = st["Version"]
        for field in ("Pre-Depends", "Depends", "Recommends"):
            for clause in filter(None, (c.strip() for c in st.get(field, "").split(","))):
                names = [alt.strip().split()[0] for alt in clause.split("|")]
                if any(":" in n for n in names):
                    continue  # another architecture (libcuda1:i386)
                options = [p for n in names for p in ([n] if n in newest else []) + provides.get(n, [])]
                chosen = next((p for p in options if p in got), None) or \
                    next((p for p in options if newest[p]["Source"] in home), None) or next(iter(options), None)
                if chosen:
                    todo.append(chosen)
    return got


def test_the_full_tesla_470_driver_moves_to_535_without_asking_for_parts_535_dropped_nor_removing_its_own_deps(index):
    """The whole nvidia-tesla-470-driver as apt installs it (its real dependency closure, with the unversioned
    source's *-common packages the ICDs need): the 470-only parts (libnvidia-tesla-470-cbl, -ifr1, -compiler) are
    not asked for at 535 and go with the old branch; nvidia-egl-common and its kin stay; every request exists at
    535.216.03."""
    all_stanzas = stanzas()
    installed = closure([s for s in all_stanzas if s["Source"] != "nvidia-graphics-drivers-tesla-535"],
                        ["nvidia-tesla-470-driver", "nvidia-tesla-470-opencl-icd", "libnvidia-tesla-470-ifr1"])
    assert {"libnvidia-tesla-470-cbl", "libnvidia-tesla-470-compiler", "nvidia-egl-common"} <= set(installed)
    facts = [{"name": n, "version": v, "role": packaging.role(n)} for n, v in installed.items() if packaging.role(n)]
    wanted = packages.target_set(packages.driver_versioned(facts, "470.256.02"), "470.256.02", "535.216.03")
    assert not any("470" in n or packaging.read(n)[2] in packaging.DEBIAN_LAST_BRANCH for n in wanted), wanted
    resolved = host_resolves(index, wanted)
    assert set(resolved.values()) == {TESLA_535}
    removed = packaging.stale(installed, resolved)
    assert removed == sorted(n for n in installed if "tesla-470" in n)
    kept = set(installed) - set(removed)
    assert {"nvidia-egl-common", "nvidia-vulkan-common"} & kept == {"nvidia-egl-common", "nvidia-vulkan-common"} \
        & set(installed)
    # nothing removed is something the new set needs (apt pulls in the new branch's other parts itself)
    needed = closure([s for s in all_stanzas if s["Source"] != "nvidia-graphics-drivers-tesla-470"], sorted(resolved))
    assert not set(removed) & set(needed), set(removed) & set(needed)


def test_a_full_tesla_535_host_moves_to_the_unversioned_535_261_and_back(index):
    all_stanzas = stanzas()
    installed = closure([s for s in all_stanzas if s["Source"] != "nvidia-graphics-drivers-tesla-470"],
                        ["nvidia-tesla-535-driver"])
    facts = [{"name": n, "version": v, "role": packaging.role(n)} for n, v in installed.items() if packaging.role(n)]
    recorded = packages.driver_versioned(facts, "535.216.03")
    resolved = host_resolves(index, packages.target_set(recorded, "535.216.03", "535.261.03"))
    assert set(resolved.values()) == {CURRENT} and "nvidia-driver" in resolved
    assert packaging.stale(installed, resolved) == sorted(recorded)  # each tesla-535 part has its unversioned twin
    now = {n: v for n, v in installed.items() if n not in recorded} | resolved
    back = host_resolves(index, recorded)  # the rollback: the recorded exact set
    assert back == recorded
    removed = packaging.stale(now, back)
    assert removed == sorted(resolved) and "nvidia-egl-common" not in removed


def test_the_gsp_firmware_apt_brings_with_535_moves_and_is_held_with_the_driver():
    """firmware-nvidia-tesla-535-gsp (non-free-firmware) comes as a dependency of nvidia-tesla-535-kernel-dkms: it is
    a part of the driver (moved to firmware-nvidia-gsp for 535.261.03) and held with what was asked for, while
    Debian's nvidia-modprobe, versioned apart, is neither."""
    assert packaging.read("firmware-nvidia-tesla-535-gsp") == ("debian-tesla-NNN", "535", "firmware-nvidia-gsp")
    assert packaging.equivalents("firmware-nvidia-tesla-535-gsp", "535")[0] == "firmware-nvidia-gsp"
    assert packaging.role("firmware-nvidia-gsp") == "driver"
    module = load_module("nvidia_driver_packages_under_test", "collections/ansible_collections/fleetctl/gpu/plugins/modules/nvidia_driver_packages.py")
    installed = {"nvidia-tesla-535-kernel-dkms": ("535.216.03-3~deb12u1", False),
                 "firmware-nvidia-tesla-535-gsp": ("535.216.03-3~deb12u1", False),
                 "nvidia-modprobe": ("535.309.01-0+deb12u1", False)}
    assert module.pulled_in(installed, {"nvidia-tesla-535-kernel-dkms": "535.216.03-3~deb12u1"}) == \
        ["firmware-nvidia-tesla-535-gsp"]
    facts = [{"name": n, "version": v, "role": packaging.role(n)} for n, (v, _) in installed.items()]
    assert [p["name"] for p in packaging.moves_with_driver(facts, {"535.216.03"})] == \
        ["nvidia-tesla-535-kernel-dkms", "firmware-nvidia-tesla-535-gsp"]


def ubuntu_names():
    """(binaries by source, dependencies by package) of the transcribed Ubuntu pages (the file names its sources)."""
    binaries, depends = defaultdict(set), {}
    for line in (TESTDATA / "ubuntu-noble-nvidia-graphics-drivers-580.txt").read_text().splitlines():
        words = line.split() if not line.startswith("#") else []
        if words[:1] == ["binary"]:
            binaries[words[1]].add(words[2])
        elif words[:1] == ["depends"]:
            depends[words[1]] = words[3:]
    return binaries, depends


def test_every_part_of_ubuntus_580_server_driver_is_a_branched_driver_package():
    binaries, depends = ubuntu_names()
    for name in binaries["nvidia-graphics-drivers-580-server"]:
        family, branch, key = packaging.read(name)
        assert (family, branch, packaging.role(name)) == ("branched", "580", "driver"), name
        assert key.endswith("-NNN-server") or key.endswith("-NNN-server-open"), key
        assert packaging.on_branch(name, "570") == name.replace("-580-", "-570-"), name
    for name in [d for deps in depends.values() for d in deps if d != "dkms"]:
        assert packaging.role(name) == "driver", name


def test_ubuntus_firmware_named_with_the_version_comes_with_the_new_driver_and_the_old_one_goes():
    """nvidia-dkms-580 depends on nvidia-firmware-580-<its version>: a same-branch upgrade never asks for the
    firmware by name (the new dkms brings its own), removes the old one, and a rollback asks for it exactly."""
    _, depends = ubuntu_names()
    old = "580.159.03-0ubuntu0.26.04.1"
    installed = {name: old for name in ["nvidia-dkms-580", *depends["nvidia-dkms-580"]] if name != "dkms"}
    assert "nvidia-firmware-580-580.159.03" in installed
    facts = [{"name": n, "version": v, "role": packaging.role(n)} for n, v in installed.items()]
    before = packages.driver_versioned(facts, "580.159.03")
    assert before == installed  # the rollback set names the firmware at its exact version
    wanted = packages.target_set(before, "580.159.03", "580.173.02")
    assert wanted == {"nvidia-dkms-580": "580.173.02", "nvidia-kernel-common-580": "580.173.02",
                      "nvidia-kernel-source-580": "580.173.02"}
    resolved = {n: "580.173.02-0ubuntu0.26.04.1" for n in wanted}
    assert packaging.stale(installed, resolved) == ["nvidia-firmware-580-580.159.03"]
    assert packaging.stale({**installed, "nvidia-firmware-580-580.173.02": resolved["nvidia-dkms-580"]},
                           before) == ["nvidia-firmware-580-580.173.02"]  # the rollback removes the new one


def test_ubuntus_xorg_driver_is_renamed_on_a_branch_change():
    assert packaging.on_branch("xserver-xorg-video-nvidia-570", "580") == "xserver-xorg-video-nvidia-580"
    assert packaging.stale({"xserver-xorg-video-nvidia-570": "570.133.07-0ubuntu1"},
                           {"nvidia-driver-580": "580.95.05-0ubuntu1"}) == ["xserver-xorg-video-nvidia-570"]


class FakeAptShow(FakeAptModule):
    """apt-cache madison and apt-cache show NAME=VERSION from the real index."""

    def __init__(self, index):
        super().__init__(index)
        self.stanzas = {(s["Package"], s["Version"]): s for s in stanzas()}

    def run_command(self, argv, environ_update=None):
        if argv[:2] == ["apt-cache", "show"]:
            name, version = argv[2].split("=", 1)
            s = self.stanzas.get((name, version))
            if s is None:
                return 100, "", f"E: Version '{version}' for '{name}' was not found\n"
            return 0, "".join(f"{k}: {v}\n" for k, v in s.items() if k != "Source") + "\n", ""
        return super().run_command(argv, environ_update)


def test_exact_version_dependencies_are_asked_for_at_that_version_not_at_the_newer_security_upload(index):
    """bookworm-security carries 535.309.01 of the unversioned source: asked for libcuda1=535.261.03 alone, apt would
    take nvidia-alternative at 535.309.01 and give up. The role adds every NVIDIA package libcuda1 depends on at
    exactly one version (and theirs), at that version; libc6 and the unversioned nvidia-support stay apt's choice."""
    module = load_module("nvidia_driver_packages_under_test", "collections/ansible_collections/fleetctl/gpu/plugins/modules/nvidia_driver_packages.py")
    assert "535.309.01-0+deb12u1" in index["nvidia-alternative"]
    apt = module.Apt(FakeAptShow(index))
    got = apt.with_exact_dependencies(apt.resolve({"libcuda1": "535.261.03"}, update_cache=False))
    assert got["libcuda1"] == got["nvidia-alternative"] == got["libnvidia-ptxjitcompiler1"] == "535.261.03-1"
    assert set(got.values()) == {"535.261.03-1"} and "libc6" not in got and "nvidia-support" not in got


def test_a_request_without_a_driver_removes_no_firmware_and_el_parts_are_never_held_unasked():
    """Asked for the container toolkit alone, nothing of the driver goes (removing the firmware would take
    nvidia-dkms-580 with it); on EL, nvidia-kmod-common (never asked for by name) is not locked at the driver's
    version, or the next driver's kmod could not require its own."""
    assert packaging.stale({"nvidia-firmware-580-580.159.03": "580.159.03-0ubuntu0.24.04.1"},
                           {"nvidia-container-toolkit": "1.17.8-1"}) == []
    module = load_module("nvidia_driver_packages_under_test", "collections/ansible_collections/fleetctl/gpu/plugins/modules/nvidia_driver_packages.py")
    installed = {"nvidia-driver": ("3:570.86.15-1.el9", False), "nvidia-kmod-common": ("3:570.86.15-1.el9", False),
                 "nvidia-driver-libs": ("3:570.86.15-1.el9", False)}
    assert module.pulled_in(installed, {"nvidia-driver": "3:570.86.15-1.el9"}) == ["nvidia-driver-libs"]


def test_a_branch_named_package_that_drifted_off_the_driver_version_is_still_judged_held():
    facts = [{"name": "libnvidia-compute-570", "version": "570.133.07-0ubuntu1", "role": "driver"},
             {"name": "nvidia-driver-570", "version": "570.86.15-0ubuntu1", "role": "driver"},
             {"name": "nvidia-modprobe", "version": "535.309.01-0+deb12u1", "role": "driver"}]
    assert [p["name"] for p in packaging.moves_with_driver(facts, {"570.86.15"})] == \
        ["libnvidia-compute-570", "nvidia-driver-570"]
