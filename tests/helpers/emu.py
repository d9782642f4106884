"""The lab's emulated driver packages without namespaces: a fake root with packages unpacked by dpkg-deb, and the
environment its tools run in."""
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE_UTILS = REPO / "collections/ansible_collections/fleetctl/gpu/plugins/module_utils"
LIB = "usr/lib/x86_64-linux-gnu"
MISSING = [t for t in ("gcc", "dpkg-deb", "dpkg-scanpackages") if shutil.which(t) is None]


def deb(repo, name, version):
    return next(Path(p["path"]) for p in repo[1] if p["name"] == name and p["version"].startswith(version))


def dpkg_deb(*args):
    return subprocess.run(["dpkg-deb", *map(str, args)], check=True, capture_output=True, text=True).stdout


def set_loaded(root, version):
    path = root / "sys/module/nvidia/version"
    if version is None:
        path.unlink(missing_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(version + "\n")


def env_for(root):
    return dict(os.environ, NVIDIA_LAB_ROOT=str(root), LD_LIBRARY_PATH=str(root / LIB),
                PYTHONPATH=os.pathsep.join([str(root / "usr/lib/python3/dist-packages"), str(MODULE_UTILS)]),
                LC_ALL="C")
