"""Shared test setup: the gpu_facts role's module_utils and module, importable as Ansible would ship them."""
import importlib.util
from pathlib import Path

import ansible.module_utils
import pytest

REPO = Path(__file__).resolve().parent.parent
ROLE = REPO / "roles" / "gpu_facts"
TESTDATA = Path(__file__).resolve().parent / "testdata"

# The module imports its helpers as ansible.module_utils.fleetctl_gpus / fleetctl_kernel_log (role module_utils).
_MODULE_UTILS = str(ROLE / "module_utils")
_PROBE_UTILS = str(REPO / "roles" / "gpu_probe" / "module_utils")  # fleetctl_throughput (the others are links)
if _PROBE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_PROBE_UTILS)
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: root-only lab tests (need root; build lab hosts in network namespaces)")


@pytest.fixture(scope="session")
def gpu_facts_module():
    """roles/gpu_facts/library/gpu_facts.py, imported as a Python module."""
    spec = importlib.util.spec_from_file_location("fleetctl_test_gpu_facts", ROLE / "library" / "gpu_facts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def testdata():
    """Path of tests/testdata."""
    return TESTDATA
