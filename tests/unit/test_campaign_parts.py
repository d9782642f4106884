"""Package sets for upgrade and rollback, drain hooks, and the upgrade CLI's input errors."""

from __future__ import annotations

import pytest

from orchestrator.campaign import hooks, packages
from orchestrator.errors import InputError
from tests.helpers.cli import fleetctl, runs

UBUNTU_550 = [  # what gpu_facts lists on an Ubuntu HGX host with the 550 server-open driver (dpkg names)
    {"name": "nvidia-driver-550-server-open", "version": "550.163.01-0ubuntu0.24.04.1", "role": "driver"},
    {"name": "libnvidia-compute-550-server", "version": "550.163.01-0ubuntu0.24.04.1", "role": "driver"},
    {"name": "nvidia-utils-550-server", "version": "550.163.01-0ubuntu0.24.04.1", "role": "driver"},
    {"name": "nvidia-fabricmanager-550", "version": "550.163.01-1", "role": "fabricmanager"},
    {"name": "libnvidia-nscq-550", "version": "550.163.01-1", "role": "fabricmanager"},
    {"name": "nvidia-persistenced", "version": "550.163.01-0ubuntu1", "role": "persistenced"},
    {"name": "nvidia-container-toolkit", "version": "1.17.8-1", "role": "container_toolkit"},
    {"name": "nvidia-modprobe", "version": "535.54.03-0ubuntu1", "role": "driver"},  # not versioned with it
]


def test_rollback_set_is_exactly_what_was_installed_with_the_driver():
    before = packages.driver_versioned(UBUNTU_550, "550.163.01")
    assert before == {
        "nvidia-driver-550-server-open": "550.163.01-0ubuntu0.24.04.1",
        "libnvidia-compute-550-server": "550.163.01-0ubuntu0.24.04.1",
        "nvidia-utils-550-server": "550.163.01-0ubuntu0.24.04.1",
        "nvidia-fabricmanager-550": "550.163.01-1", "libnvidia-nscq-550": "550.163.01-1",
        "nvidia-persistenced": "550.163.01-0ubuntu1"}


def test_upgrade_set_renames_the_branch_and_keeps_fabric_manager_with_the_driver():
    before = packages.driver_versioned(UBUNTU_550, "550.163.01")
    assert packages.target_set(before, "550.163.01", "570.86.15") == {
        "nvidia-driver-570-server-open": "570.86.15", "libnvidia-compute-570-server": "570.86.15",
        "nvidia-utils-570-server": "570.86.15", "nvidia-fabricmanager-570": "570.86.15",
        "libnvidia-nscq-570": "570.86.15", "nvidia-persistenced": "570.86.15"}
    same_branch = packages.target_set({"nvidia-driver-570-open": "570.86.15-0lab1"}, "570.86.15", "570.124.06")
    assert same_branch == {"nvidia-driver-570-open": "570.124.06"}


@pytest.mark.parametrize("version, up", [("1:570.86.15-0ubuntu1", "570.86.15"), ("550.163.01-1.el9", "550.163.01"),
                                         ("580.95.05", "580.95.05")])
def test_upstream_version(version, up):
    assert packages.upstream(version) == up


def test_presets_and_placeholders_fill_words_never_shell():
    # the Slurm preset alone is fleetctl's own drains (schedulers.py), no template ...
    assert hooks.resolve("slurm", None, None) == hooks.Hooks(slurm=True)
    # ... and with a template of the operator's, templates: the preset's scontrol commands fill the other side
    h = hooks.resolve("slurm", None, "my-undrain {node}")
    assert not h.slurm and h.undrain == "my-undrain {node}"
    assert hooks.argv(h.drain, {"host": "gpu-01", "node": "gpu01", "campaign": "7"}) == \
        ["scontrol", "update", "nodename=gpu01", "state=drain", "reason=fleetctl campaign 7"]
    k = hooks.resolve("kubernetes", None, "kubectl uncordon {host}")
    assert k.undrain == "kubectl uncordon {host}" and k.drain.startswith("kubectl drain {node}")
    # a hostile value stays one argument
    assert hooks.argv("echo {host}", {"host": "a; rm -rf /", "node": "", "campaign": ""}) == ["echo", "a; rm -rf /"]


@pytest.mark.parametrize("template, message", [("drain {nodes}", "unknown placeholder"), ("'unclosed", "quotation"),
                                               ("", "empty command")])
def test_bad_hook_templates_are_input_errors(template, message):
    with pytest.raises(InputError, match=message):
        hooks.resolve(None, template, None)


def test_hooks_report_each_host(tmp_path):
    results = hooks.run("sh -c 'test {host} = good'", {"good": "good", "bad": "bad"}, 1, 10)
    assert results["good"]["ok"] and not results["bad"]["ok"]
    assert "exited 1" in results["bad"]["reason"]
    missing = hooks.run("/nonexistent/drain {host}", {"h": "h"}, 1, 10)
    assert "command not found" in missing["h"]["reason"]
    assert hooks.run(None, {"h": "h"}, 1, 10)["h"]["ok"]


@pytest.mark.parametrize("args, message", [
    (["--to", "570.86.15"], "--yes is needed"),
    (["--to", "570.86.15", "--yes", "--window", "soon"], "not a duration"),
    (["--to", "570.86.15", "--yes", "--soak", "-5"], "Invalid value for '--soak': '-5' is not a duration"),
    (["--to", "570.86.15", "--yes", "--soak-interval", "0"], "'0' is not above 0"),
    (["--to", "570.86.15", "--yes", "--idle-timeout", "300x"], "Invalid value for '--idle-timeout'"),
    (["--to", "570.86.15", "--yes", "--drain", "scontrol drain {nodename}"], "unknown placeholder"),
    (["--to", "570", "--yes"], "not a driver version"),
    (["--to", "570.86.15", "--yes", "--waves", "1,50%"], "must be 100%"),
    (["--to", "570.86.15", "--yes", "--samples", "3"], "3"),
    (["--to", "570.86.15", "--yes", "--drain-preset", "kubernetes", "--drain-mode", "reservation"],
     "--drain-mode reservation: only fleetctl's own Slurm drains reserve nodes"),
    (["--to", "570.86.15", "--yes", "--max-in-flight", "0"], "--max-in-flight '0': at least 1 host"),
    (["--to", "570.86.15", "--yes", "--max-in-flight", "101%"], "--max-in-flight '101%': a share from 1% to 100%"),
    (["--to", "570.86.15", "--yes", "--max-in-flight", "0%"], "a share from 1% to 100%"),
    (["--to", "570.86.15", "--yes", "--max-in-flight", "x"], "a number of hosts or a share such as 25%"),
    (["--to", "570.86.15", "--yes", "--max-in-flight", "2", "--pace", "wave"], "it needs --pace host"),
])
def test_upgrade_input_errors_exit_2_in_one_line_before_anything_is_recorded(tmp_path, args, message):
    proc = fleetctl("upgrade", *args, home=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert runs(tmp_path) == []


def test_campaign_commands_on_unknown_ids(tmp_path):
    for args in (["campaign", "show", "9"], ["campaign", "resume", "9"], ["campaign", "abort", "9"], ["rollback", "9"]):
        proc = fleetctl(*args, home=tmp_path)
        assert proc.returncode == 2 and "no campaign 9" in proc.stderr, (args, proc.stderr)


def test_cuda_repo_driver_packages_follow_the_branch():
    before = {"cuda-drivers-550": "550.163.01-1", "cuda-drivers-fabricmanager-550": "550.163.01-1",
              "nvidia-driver-550-open": "550.163.01-1"}
    assert packages.target_set(before, "550.163.01", "570.86.15") == {
        "cuda-drivers-570": "570.86.15", "cuda-drivers-fabricmanager-570": "570.86.15",
        "nvidia-driver-570-open": "570.86.15"}


@pytest.mark.parametrize("value", ["inf", "nan", "1e308h", "400d", "9999999999", float("inf"), float("nan"), -1])
def test_absurd_durations_are_refused(value):
    from orchestrator import settings
    with pytest.raises(ValueError, match="is not a duration|is more than|is longer than a year|is not above"):
        settings.WINDOW.parse(value)


def test_the_driver_daemons_are_ignored_under_their_cut_process_names():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "collections/ansible_collections/fleetctl/gpu/plugins/modules/gpu_users.py"
    spec = importlib.util.spec_from_file_location("gpu_users", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ignore = {"nvidia-persistenced", "nv-fabricmanager"}
    assert module.ignored("nvidia-persiste", ignore) and module.ignored("nv-fabricmanage", ignore)
    assert module.ignored("nvidia-persistenced", ignore) and not module.ignored("python3", ignore)


def test_a_rollback_is_judged_on_the_whole_host_as_the_precheck_saw_it():
    """The rollback that put every package back but left nv-fabricmanager stopped (an HGX host that can run no
    multi-GPU job) fails its verify: a finding that passed at the precheck fails now, a daemon that ran is down."""
    from orchestrator.campaign import steps
    before_facts = {"persistence": {"daemon_running": True}, "fabric_manager": {"running": True}}
    assert steps.running_daemons(before_facts) == ["nvidia-persistenced.service", "nvidia-fabricmanager.service"]
    before = {"daemons": steps.running_daemons(before_facts),
              "driver_findings": {"fabricmanager.version": "pass", "persistence.daemon": "pass",
                                  "nouveau.blacklisted": "fail", "driver.held": "pass"}}
    after = {"facts": {"persistence": {"daemon_running": True}, "fabric_manager": {"running": False}},
             "findings": [
                 {"control": "fabricmanager.version", "status": "fail", "message": "nv-fabricmanager is not running"},
                 {"control": "persistence.daemon", "status": "pass", "message": ""},
                 {"control": "nouveau.blacklisted", "status": "fail", "message": "not blacklisted"},  # as before
                 {"control": "driver.held", "status": "fail", "message": "not held"}]}  # verify's own check
    assert steps.not_restored(after, before) == [
        "fabricmanager.version: nv-fabricmanager is not running (it was pass at the pre-check)",
        "nvidia-fabricmanager.service ran at the pre-check and is not running"]
    after["facts"]["fabric_manager"]["running"] = True
    after["findings"][0]["status"] = "pass"
    assert steps.not_restored(after, before) == []
    assert steps.not_restored(after, {}) == []  # a campaign recorded before this check: nothing to compare


def test_a_drain_preset_is_its_entry_alone(monkeypatch):
    """A preset added to hooks.PRESETS drains with its templates through the campaign's template scheduler; the
    --drain-preset flag offers every preset and its help says what each drains with, from the same entries."""
    from orchestrator import settings
    from orchestrator.campaign.options import CampaignOptions
    from orchestrator.schedulers import scheduler, templates
    monkeypatch.setitem(hooks.PRESETS, "pbs", hooks.Preset("pbsnodes -o {node}", "pbsnodes -r {node}", "pbs: PBS"))
    chosen = hooks.resolve("pbs", None, None)
    assert (chosen.drain, chosen.undrain, chosen.slurm) == ("pbsnodes -o {node}", "pbsnodes -r {node}", False)
    assert type(scheduler.of(CampaignOptions(hooks=chosen))) is templates.Templates
    monkeypatch.undo()
    assert set(settings.DRAIN_PRESET.choices) == set(hooks.PRESETS)
    assert all(p.says in settings.DRAIN_PRESET.help for p in hooks.PRESETS.values())
