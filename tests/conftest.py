"""Shared test setup: the fleetctl.gpu collection's modules and module_utils, importable as Ansible ships them."""
import importlib.util
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


LAB_DIRS = ("tests/lab/", "tests/lab_emu/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist (`-n auto`, pyproject's addopts): one file per worker at a time, so a module's fixtures are built
    once, and every lab test in one scope, so one worker runs them all in order: two labs never run at once (one
    bridge, one set of namespaces) while the other workers take the rest. A scheduler, not `xdist_group` marks:
    pytest 9.2 ignores the node-id suffix those marks become (pytest-dev/pytest-xdist#1386)."""
    from xdist.scheduler import LoadScopeScheduling

    class LabsApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "the lab" if path.startswith(LAB_DIRS) else path

    return LabsApart(config, log)


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: root-only lab tests (need root; build lab hosts in network namespaces)")


@pytest.fixture(scope="session")
def gpu_facts_module():
    """collections/ansible_collections/fleetctl/gpu/plugins/modules/gpu_facts.py, imported as a Python module."""
    spec = importlib.util.spec_from_file_location("fleetctl_test_gpu_facts", MODULES / "gpu_facts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def testdata():
    """Path of tests/testdata."""
    return TESTDATA
