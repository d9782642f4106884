"""The lab's RPM repository (lab/fleetctl_lab/packages.py, repo/rpm), read with rpm -qp: no root, no namespaces.

The same Package objects as the .debs, named as NVIDIA's RHEL repository names them; a lab host's rpm database
holds only the lab's packages, so nothing may be required that fleetctl-lab-system does not provide.
"""
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetctl_lab import packages

MISSING = [t for t in ("gcc", "dpkg-deb", "dpkg-scanpackages", "rpm", "rpmbuild", "createrepo_c")
           if shutil.which(t) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason="building the lab's rpm repository needs %s" % ", ".join(MISSING))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("repo")
    return path, packages.build_repo(path)


def rpms(repo):
    return {Path(p["path"]).name: Path(p["path"]) for p in packages.built_rpms(repo[0])}


def query(path, *args):
    return subprocess.run(["rpm", "-qp", *args, str(path)], check=True, capture_output=True, text=True).stdout


def test_names_epochs_and_versions_are_nvidias_el_ones(repo):
    path, _ = repo
    assert (path / "rpm/repodata/repomd.xml").exists()
    fmt = "%{NAME}|%{EPOCHNUM}|%{VERSION}|%{RELEASE}|%{ARCH}"
    found = {query(p, "--qf", fmt) for p in rpms(repo).values()}
    expected = set()
    for v in packages.DRIVER_VERSIONS:
        for name in ("nvidia-driver", "nvidia-persistenced", "nvidia-fabric-manager"):
            expected.add(f"{name}|3|{v}|0lab1|x86_64")
        expected.add(f"nvidia-imex-{v.split('.')[0]}|0|{v}|0lab1|x86_64")  # named as on Ubuntu: the branch in it
    expected |= {f"nvidia-container-toolkit|0|{tv}|1|x86_64" for tv in packages.TOOLKIT_VERSIONS}
    expected.add(f"containerd|0|{packages.CONTAINERD_VERSION}|0lab1|x86_64")
    expected.add(f"python3-nvidia-ml-py|0|{packages.pynvml_source()[1]}|1|noarch")
    expected.add("fleetctl-lab-system|0|1|1|noarch")
    assert found == expected
    assert sorted(rpms(repo)) == sorted(Path(p).name for p in (path / "rpm").glob("*.rpm"))
    imex = rpms(repo)["nvidia-imex-570-570.86.15-0lab1.x86_64.rpm"]
    assert query(imex, "--configfiles").split() == ["/etc/nvidia-imex/config.cfg"]


def test_driver_rpm_holds_the_debs_files(repo):
    path, _ = repo
    rpm = rpms(repo)["nvidia-driver-570.86.15-0lab1.x86_64.rpm"]
    dump = {line.split()[0]: line.split() for line in query(rpm, "--dump").splitlines()}
    lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.15"
    assert set(dump) == {lib, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/bin/nvidia-smi",
                         "/usr/bin/nvidia-lab-bench", "/usr/lib/nvidia-lab/modules/nvidia.version",
                         "/usr/lib/nvidia-lab/skus.json", "/usr/lib/nvidia-lab/nvidia_lab_interconnect.py"}
    deb = path / "nvidia-driver-570-open_570.86.15-0lab1_amd64.deb"
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True).stdout
    extracted = subprocess.run(["tar", "-xO", "." + lib], input=tar, check=True, capture_output=True).stdout
    assert dump[lib][3] == hashlib.sha256(extracted).hexdigest()  # the same compiled bytes, not stripped
    assert dump["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"][-1] == "libnvidia-ml.so.570.86.15"
    scripts = query(rpm, "--scripts")
    assert "install_fail=570.86.15" in scripts and "preinstall scriptlet" in scripts
    assert "/sbin/ldconfig" in scripts


def test_persistenced_scriptlets_translate_the_debian_arguments(repo):
    scripts = query(rpms(repo)["nvidia-persistenced-580.95.05-0lab1.x86_64.rpm"], "--scripts")
    # configure runs when the transaction is done (after the old package's %preun stopped its daemon)
    assert "posttrans scriptlet" in scripts and "set -- configure" in scripts
    assert 'if [ "$1" -eq 0 ]; then set -- remove; else set -- upgrade; fi' in scripts
    assert "multi-user.target.wants/nvidia-persistenced.service" in scripts


def test_nothing_is_required_but_what_fleetctl_lab_system_provides(repo):
    found = rpms(repo)
    provided = set(query(found["fleetctl-lab-system-1-1.noarch.rpm"], "--provides").split("\n")) - {""}
    assert set(packages.SYSTEM_PROVIDES) <= provided
    for name, path in found.items():
        for req in filter(None, query(path, "-R").splitlines()):
            if req.startswith("rpmlib("):
                continue  # rpm's own features, not packages
            assert req.split()[0] in provided, f"{name} requires {req!r}"


def test_rebuild_keeps_the_rpm_repository(repo):
    path, built = repo
    before = {p: p.stat().st_mtime_ns for p in [*rpms(repo).values(), path / "rpm/repodata/repomd.xml"]}
    assert packages.build_repo(path) == built
    assert {p: p.stat().st_mtime_ns for p in before} == before
    (path / "rpm/repodata/repomd.xml").unlink()  # an incomplete rpm repository is built again
    assert packages.build_repo(path) == built
    assert (path / "rpm/repodata/repomd.xml").exists() and len(rpms(repo)) == len(before) - 1
