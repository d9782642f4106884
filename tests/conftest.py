"""Shared test setup: the fleetctl.gpu collection's modules and module_utils, importable as Ansible ships them."""
import importlib.util
import os
import socket
import sys
import threading
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


# The lab test files run in order on one worker, a lab at a time, or, from LAB_CORES cores, in two scopes, two labs at
# once (each lab in a slot of its own: lab/fleetctl_lab/slots.py). LAB_SCOPES is a static table, balanced by hand on
# the per-file times of a CI run (seconds, two labs on 2 cores): a scope runs as a whole on one worker, so the sums must
# be near each other, and a table reads and reviews as what it is. A lab test file missing here fails collection
# (below): add it to the lighter scope. Nothing in the lab tests asserts machine-wide state (lab_leftovers,
# test_lab_hosts and test_molecule look only at their own lab).
# History: two labs at once on the 2-core CI machine first lost tests whose faults must land in a short window, as
# every lab host ran the machine's /root/.bashrc (pyenv's start-up) in each ssh session; with hosts of their own /root
# a lab needs about a core, and the suite ran in 37 minutes with two labs, 53 with one (27 since the activation reads
# its state in two module calls, not nine). The race a kill -9 after a campaign's last record then lost (`campaign
# resume` of a finished campaign exited 2) is gone: it answers with the campaign's code. By issue 42 CI took 55 min
# (lab-b ~3000 s, lab-a ~2440 s); issue 43 cut lab campaigns that asserted nothing more (the crash suite's kills at
# every kind of step, upgrade test 5 folded in; noise-alone's 16 gates on test 1's lab; one campaign for the three
# interconnect canaries and for soak tests 1 and 4) and moved test_lab_report and test_lab_fleet to lab-a.
# Figures: "ci" = the sum of the file's tests among the 40 slowest of issue 42's last CI run (26 s or more each; exact
# where all of a file's tests are there); "~" = an estimate: the tests under 26 s, a module's lab, or a cut measured
# alone before and after on a loaded 2-core machine and scaled to CI's figure.
# Sums: lab-a ~2610, lab-b ~2160: lab-b leaves room for test_lab_slurm's issue-43 tests (~6-8 min: ~2580); the unit
# tests (~460 worker-seconds) fill the gap on whichever worker is free first.
LAB_SCOPES = {
    "test_lab_crash": "lab-a",          # ~367 (ci 440 + upgrade test 5's 189; the two, 588 s alone, now one: 343 s)
    "test_lab_domains": "lab-a",        # ~390 (ci 338 + ~50)
    "test_lab_soak": "lab-a",           # ~490 (ci 552 - ~78: tests 1 and 4, 225 s alone, now 156 s; + ~15 lab)
    "test_lab_debian": "lab-a",         # ~350 (ci 302 + ~45); its Debian mirror, shared: debian.ensure_mirror locks it
    "test_lab_security": "lab-a",       # 194 ci
    "test_lab_unattended": "lab-a",     # ~160 (ci 130 + ~30)
    "test_lab_matrix": "lab-a",         # 93 ci
    "test_lab_hosts": "lab-a",          # ~25
    "test_lab_health_checks": "lab-a",  # ~10
    "test_lab_fabric_health": "lab-a",  # ~9
    "test_lab_readme_tour": "lab-a",    # 83 ci
    "test_lab_execution_nodes": "lab-a",  # 118 ci
    "test_lab_report": "lab-a",         # 175 ci
    "test_lab_fleet": "lab-a",          # ~150 (ci 54 + ~95)
    "test_lab_upgrade": "lab-b",        # ~955 (ci 1327 - 189 test 5 - 280 noise + ~97: on test 1's lab, 369 -> 128 s)
    "test_lab_canary_metrics": "lab-b",  # ~655 (ci 619 + ~35)
    "test_lab_interconnect": "lab-b",   # ~205 (ci 312 - ~150: the canaries' one campaign, 496 -> 229 s; + ~45)
    "test_molecule": "lab-b",           # ~40 (ci 31 + ~10)
    "test_lab_probe": "lab-b",          # ~40
    "test_lab_rpm_hosts": "lab-b",      # ~25
    "test_lab_slurm": "lab-b",          # ~235 (ci 165 + ~70); issue 43 adds ~360-480
}
LAB_DIR = "tests/lab/"
LAB_CORES = 2  # two labs at once from this many cores up ($FLEETCTL_TEST_LABS=1 or 2 decides instead)
TWO_LABS = os.environ.get("FLEETCTL_TEST_LABS", "2" if (os.cpu_count() or 1) >= LAB_CORES else "1") == "2"
# tests/lab_emu (~60 s) builds packages and runs the emulated tools over a directory, no lab: a scope per file, like
# the unit tests, for whichever worker is free.


def lab_scope(nodeid: str) -> str | None:
    """The lab scope of a test id, None for a test outside tests/lab/."""
    path = nodeid.split("::", 1)[0]
    if not path.startswith(LAB_DIR):
        return None
    return LAB_SCOPES.get(Path(path).stem, "lab-a") if TWO_LABS else "the lab"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist (`-n auto`, pyproject's addopts): one file per worker at a time, so a module's fixtures are built
    once, and the lab files in one scope (two on a machine with LAB_CORES cores), each run in order by one worker,
    while the other workers take the rest. A scheduler, not `xdist_group` marks: pytest 9.2 ignores the node-id
    suffix those marks become (pytest-dev/pytest-xdist#1386)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # collection order (the lab scopes first, below), not scope sizes

    class Labs(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lab_scope(nodeid) or nodeid.split("::", 1)[0]

    return Labs(config, log)


def pytest_collection_modifyitems(config, items):
    """The lab files first, so the scheduler hands the lab scopes out before anything else (they take longest);
    a lab test file missing from LAB_SCOPES fails collection, so no file lands in a scope by accident."""
    for item in items:
        if lab_scope(item.nodeid) and item.path.stem not in LAB_SCOPES:
            raise pytest.UsageError(f"{item.path.name}: a lab test file without a scope: add it to LAB_SCOPES in "
                                    "tests/conftest.py")
    items.sort(key=lambda item: lab_scope(item.nodeid) is None)  # stable: each file's order is kept


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


@pytest.fixture(params=[b"", b"220 mail.example ESMTP\r\n"], ids=["silent", "not-ssh"])
def silent_listener(request):
    """A TCP port on loopback that accepts connections and never says a word, or never an SSH one (the pre-flight
    judges the first itself; paramiko reads what the second says, and logs its traceback)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
                held[-1].sendall(request.param)
            except OSError:
                continue
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()
