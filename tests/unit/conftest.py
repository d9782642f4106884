"""Fixtures the unit test modules share (their plain helpers are in tests/helpers)."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_kernel_log as klog
from orchestrator.notify import send as notify, webhook as webhook_mod
from orchestrator.schedulers import slurmctl as slurm
from orchestrator.campaign import journal as journal_mod
from orchestrator.history.store import Store
from tests.helpers.campaign import Clock, Script, start
from tests.helpers.cli import REPO, fleetctl
from tests.helpers.slurm import FakeSlurm
from tests.helpers.webhooks import Receiver


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "history.sqlite3") as s:
        yield s


@pytest.fixture
def clock(monkeypatch):
    """The journal's clock, starting a month ago (each campaign is over before now)."""
    c = Clock(datetime.now(timezone.utc) - timedelta(days=30))
    monkeypatch.setattr(journal_mod, "now", c)
    return c


@pytest.fixture(scope="module")
def device_facts(testdata):
    report = json.loads((testdata / "h100-580.159.04-audit" / "audit-nvml.json").read_text())
    return report["hosts"][0]["facts"]


@pytest.fixture(scope="module")
def h100():
    """The facts of a real H100 host (tests/testdata/h100-580.159.04-audit)."""
    report = json.loads((REPO / "tests/testdata/h100-580.159.04-audit/audit-nvml.json").read_text())
    return report["hosts"][0]["facts"]


@pytest.fixture(scope="module")
def catalog():
    return klog.catalog_index(yaml.safe_load((REPO / "collections/ansible_collections/fleetctl/gpu/roles/gpu_facts/"
                                              "defaults/main.yml").read_text())["gpu_facts_xid_catalog"])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Two audits, a failed run, and a campaign with a rollback: every kind of record."""
    home = tmp_path_factory.mktemp("history")
    for _ in range(2):
        assert fleetctl("audit", "--fail-on", "never", home=home).returncode == 0
    assert fleetctl("audit", "-b", "/nonexistent", home=home).returncode == 2  # input error: nothing recorded
    with pytest.MonkeyPatch.context() as monkeypatch, Store(home / "history.sqlite3") as store:
        run_id, _ = store.begin_run("probe", [], "test", None, None)
        store.fail_run(run_id, "RuntimeError: boom", 1)
        _, _, engine = start(store, Script({("b", "verify"): "fail"}), ["a"], ["b"], fail_at=[1, 1])
        assert engine.run() == "rolled_back"
    return home / "history.sqlite3"


@pytest.fixture
def history(pristine, tmp_path):
    shutil.copy(pristine, tmp_path / "history.sqlite3")
    return tmp_path


@pytest.fixture
def fake(monkeypatch, testdata):
    def install(**states):
        f = FakeSlurm(testdata, **states)
        for attr in ("nodes", "drain", "resume", "cancel_reboot", "reservations", "hostnames", "create_reservation",
                     "update_reservation", "delete_reservation"):
            monkeypatch.setattr(slurm, attr, getattr(f, attr))
        return f
    return install


@pytest.fixture
def receivers():
    made = []

    def make(*script, fallback=200, tls=None):
        r = Receiver(list(script), fallback, tls)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.fixture
def quick_webhooks(tmp_path, monkeypatch):
    """Notifications from a test: a FLEETCTL_HOME of its own, no headers from the environment, retries 0.05 s apart."""
    monkeypatch.setenv("FLEETCTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(notify.HEADERS_ENV, raising=False)
    monkeypatch.setattr(webhook_mod, "BACKOFF_S", 0.05)
