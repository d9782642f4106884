"""Shared test setup: the fleetctl.gpu collection's modules and module_utils, importable as Ansible ships them."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COLLECTIONS = REPO / "collections"  # what ANSIBLE_COLLECTIONS_PATH names: ansible_collections/fleetctl/gpu
COLLECTION = COLLECTIONS / "ansible_collections" / "fleetctl" / "gpu"
MODULES = COLLECTION / "plugins" / "modules"
MODULE_UTILS = COLLECTION / "plugins" / "module_utils"
TESTDATA = Path(__file__).resolve().parent / "testdata"

# The modules import their helpers as ansible_collections.fleetctl.gpu.plugins.module_utils.* (a namespace package).
if str(COLLECTIONS) not in sys.path:
    sys.path.append(str(COLLECTIONS))


# The lab test files in two scopes, two labs at once (each lab in a slot of its own: lab/fleetctl_lab/slots.py).
# A static table, balanced by hand on the per-file times of the last serial CI run on the 2-core machine (seconds): a
# scope runs as a whole on one worker, so the sums must be near each other, and a table reads and reviews as what it
# is, where an automatic split would move files between scopes with every timing. A lab test file missing here fails
# collection (below): add it to the lighter scope. Nothing in the lab tests asserts machine-wide state (lab_leftovers,
# test_lab_hosts and test_molecule look only at their own lab), so no file needs to run alone.
LAB_SCOPES = {
    "test_lab_crash": "lab-a",          # 611
    "test_lab_soak": "lab-a",           # 445
    "test_lab_debian": "lab-a",         # 420  (the Debian mirror is shared: debian.ensure_mirror locks it)
    "test_lab_security": "lab-a",       # 240
    "test_lab_unattended": "lab-a",     # 150
    "test_lab_matrix": "lab-a",         # 110
    "test_lab_hosts": "lab-a",          # 60
    "test_lab_upgrade": "lab-b",        # ~600
    "test_lab_interconnect": "lab-b",   # 470
    "test_lab_fleet": "lab-b",          # 340
    "test_molecule": "lab-b",           # ~300
    "test_lab_report": "lab-b",         # 160
    "test_lab_probe": "lab-b",          # 90
    "test_lab_rpm_hosts": "lab-b",      # 90
    "test_lab_slurm": "lab-b",          # 25
}
LAB_DIR = "tests/lab/"
# tests/lab_emu (~60 s) builds packages and runs the emulated tools over a directory, no lab: a scope per file, like
# the unit tests, for whichever worker is free.


def lab_scope(nodeid: str) -> str | None:
    """The lab scope of a test id, None for a test outside tests/lab/."""
    path = nodeid.split("::", 1)[0]
    return LAB_SCOPES.get(Path(path).stem, "lab-a") if path.startswith(LAB_DIR) else None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, and never fewer than 3, one per lab scope and one for the rest: a lab worker
    spends most of its time waiting on hosts that reboot, install packages and answer over SSH."""
    return max(3, os.cpu_count() or 1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist (`-n auto`, pyproject's addopts): one file per worker at a time, so a module's fixtures are built
    once, and the lab files in two scopes (LAB_SCOPES), each run in order by one worker, so two labs run side by side
    while the other workers take the rest. A scheduler, not `xdist_group` marks: pytest 9.2 ignores the node-id
    suffix those marks become (pytest-dev/pytest-xdist#1386)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # collection order (the lab scopes first, below), not scope sizes

    class TwoLabs(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lab_scope(nodeid) or nodeid.split("::", 1)[0]

    return TwoLabs(config, log)


def pytest_collection_modifyitems(config, items):
    """The lab files first, so the scheduler hands the two lab scopes out before anything else (they take longest);
    a lab test file missing from LAB_SCOPES fails collection, so no file lands in a scope by accident."""
    for item in items:
        if lab_scope(item.nodeid) and item.path.stem not in LAB_SCOPES:
            raise pytest.UsageError(f"{item.path.name}: a lab test file without a scope: add it to LAB_SCOPES in "
                                    "tests/conftest.py")
    items.sort(key=lambda item: lab_scope(item.nodeid) is None)  # stable: each file's order is kept
