"""Every setting declared once (orchestrator/settings.py): the commands' options, the config file's keys and
schemas/config.schema.json follow from the one declaration and agree with it; every time flag and key takes the one
duration type (90, 90s, 5m, 2h); the options objects take keywords only."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import defaultdict
from contextlib import nullcontext

import click
import pytest
from jsonschema import Draft202012Validator

from orchestrator import check, config, probe, settings, upgrade
from orchestrator.campaign.hooks import Hooks
from orchestrator.campaign.options import CampaignOptions
from orchestrator.cli import cli, options
from orchestrator.cli.main import BUILTIN  # fleetctl's own commands (a plugin words its own flags)
from tests.helpers.cli import REPO

SCHEMA = json.loads((REPO / "schemas" / "config.schema.json").read_text())
TIME_FLAGS = {"--soak", "--soak-interval", "--soak-grace", "--window", "--idle-timeout", "--warmup", "--trial",
              "--notify-timeout", "--prometheus-timeout", "--duration", "--margin", "--lead"}


def command(path: tuple[str, ...]) -> click.Command:
    found = cli
    for name in path:
        found = found.get_command(None, name)
    return found


def commands(group: click.Group = cli, path: tuple[str, ...] = ()):
    for name in group.list_commands(None):
        sub = group.get_command(None, name)
        if isinstance(sub, click.Group):
            if sub.invoke_without_command:  # a command too, with options of its own (`report`, `hosts`)
                yield (*path, name), sub
            yield from commands(sub, (*path, name))
        else:
            yield (*path, name), sub


def test_the_schema_file_is_generated_from_the_settings():
    assert (REPO / "schemas" / "config.schema.json").read_text() == settings.schema_text(), \
        "regenerate it: python -m orchestrator.settings > schemas/config.schema.json"
    assert list(SCHEMA["properties"]) == [k.name for k in config.KEYS]


@pytest.mark.parametrize("key", config.KEYS, ids=lambda k: k.name)
def test_the_file_and_the_commands_take_the_same_values(key):
    """Each key as the schema checks the file and as its commands' option parses the command line: the same
    default, choices and bounds, whichever side is read first."""
    schema = Draft202012Validator(SCHEMA["properties"][key.name])
    for path in key.commands:
        param = next(p for p in command(path).params if p.name == key.param)
        assert key.flag in param.opts and param.default == key.default == SCHEMA["properties"][key.name].get("default")
        assert param.multiple == key.many
        if key.default is not None:
            assert schema.is_valid(key.default) and param.type_cast_value(None, key.default) == key.value
        if key.kind == "choice":
            assert list(param.type.choices) == list(key.choices) == SCHEMA["properties"][key.name]["enum"]
        if key.kind == "int":
            for value in (key.minimum - 1, key.minimum, key.maximum, key.maximum + 1):
                valid = key.minimum <= value <= key.maximum
                assert schema.is_valid(value) == valid
                with nullcontext() if valid else pytest.raises(click.BadParameter):
                    param.type_cast_value(None, value)
        if key.kind == "number":  # node-hours: above 0 (--capacity-budget), at most the maximum
            low = key.minimum
            for value, valid in ((low, not key.above), (low + 0.001, True), (key.maximum, True),
                                 (key.maximum + 1, False), (-1, False)):
                assert schema.is_valid(value) == valid, value
                with nullcontext() if valid else pytest.raises(click.BadParameter):
                    param.type_cast_value(None, value)
        if key.timed:
            high = settings.MAX_DURATION_S if key.maximum is None else key.maximum
            low = key.minimum or 0
            for value, valid in ((high, True), (high + 1, False), (low, not key.above), (low - 1, False),
                                 ("5x", False), ("2h,30m", key.kind == "durations" and high >= 7200)):
                assert schema.is_valid(value) == valid, value
                with nullcontext() if valid else pytest.raises(click.BadParameter):
                    param.type_cast_value(None, value)


def test_every_option_made_from_a_setting_is_the_settings_own():
    """Every command's flags are settings' (settings.py declares each once; a command may word the help, and take
    some of --format's choices): the flag's parameter, type and default are the setting's (`systemd install`'s
    hidden --notify and --webhook refuse to be written into a unit); and every command a setting names takes it."""
    by_flag = {s.flag: s for s in settings.SETTINGS}
    takers = defaultdict(set)
    for path, cmd in commands():
        for param in cmd.params:
            s = next((s for s in settings.SETTINGS if s.flag in param.opts and path in s.commands),  # --within: 2
                     next((by_flag[o] for o in param.opts if o in by_flag), None))
            if path == ("config", "show") or path[0] not in BUILTIN or isinstance(param, click.Argument) \
                    or param.hidden or param.name == "help":
                continue
            assert s is not None, (path, param.opts)  # every flag is a setting's: the CLI is made from them
            assert param.name == s.param, (path, s.flag)
            if s.kind == "switch":
                assert param.is_flag and (s.flag_value is None or param.flag_value == s.flag_value), (path, s.flag)
            else:
                assert param.default == s.default or s in (settings.FORMAT, settings.UNIT_DIR) \
                    or (param.required and s.default is None), (path, s.flag)
                assert type(param.type) is type(options.param_type(s) or click.STRING), (path, s.flag)
            takers[s.name].add(path)
    for s in settings.SETTINGS:
        assert set(s.commands) <= takers[s.name], s.name


def test_every_time_flag_takes_a_duration():
    """(`config show` takes the words the file would have, and checks them as it checks the file.)"""
    for path, cmd in commands():
        for param in cmd.params:
            if set(param.opts) & TIME_FLAGS and path != ("config", "show"):
                assert isinstance(param.type, options.Duration), (path, param.opts)
    for key in config.KEYS:
        assert key.timed == (key.flag in TIME_FLAGS) or key.flag is None, key.name  # a key of the file alone


def test_durations_on_the_command_line():
    upgrade_cmd = command(("upgrade",))
    params = upgrade_cmd.make_context("upgrade", ["--to", "570.86.15", "--idle-timeout", "5m", "--warmup", "90",
                                                  "--trial", "1.5s", "--soak", "2h, 30m,0", "--soak-interval", "90s",
                                                  "--soak-grace", "0", "--window", "1.5h",
                                                  "--notify-timeout", "2"]).params
    assert (params["idle_timeout"], params["warmup_s"], params["trial_s"], params["soak"]) == (300, 90, 1.5,
                                                                                                (7200, 1800, 0))
    assert (params["soak_interval"], params["soak_grace"], params["window"], params["notify_timeout"]) == \
        (90, 0, 5400, 2)
    defaults = upgrade_cmd.make_context("upgrade", ["--to", "570.86.15"]).params
    assert (defaults["idle_timeout"], defaults["soak"], defaults["warmup_s"]) == (None, (7200, 1800), 20)
    for flag, value, said in (("--idle-timeout", "300x", "'300x' is not a duration (90, 90s, 5m or 2h)"),
                              ("--idle-timeout", "8785h", "'8785h' is longer than a year"),
                              ("--warmup", "-1", "'-1' is not a duration"), ("--trial", "0", "'0' is not at least"),
                              ("--soak", "2h,,30m", "'' is not a duration"), ("--window", "0", "is not above 0"),
                              ("--soak", "30m,8785h", "'8785h' is longer than a year")):
        with pytest.raises(click.BadParameter, match=re.escape(said)):
            upgrade_cmd.make_context("upgrade", ["--to", "570.86.15", flag, value])
    soak = options.Duration(settings.SOAK)  # a value converted already (a config file's) is checked again
    assert soak.convert((7200.0, 1800.0), None, None) == (7200, 1800)
    for converted, said in (((7200.0, -1.0), "-1.0 is not at least 0"), ((1e9,), "1000000000.0 is longer than a year")):
        with pytest.raises(click.BadParameter, match=re.escape(said)):
            soak.convert(converted, None, None)


def test_the_options_objects_take_keywords_only_and_old_campaigns_still_load():
    for cls in (upgrade.UpgradeOptions, probe.ProbeOptions, CampaignOptions, Hooks, check.CheckOptions):
        assert all(f.kw_only for f in dataclasses.fields(cls)), cls
    with pytest.raises(TypeError):
        upgrade.UpgradeOptions("570.86.15", "1,100%")
    opts = upgrade.UpgradeOptions(target="570.86.15")
    assert (opts.campaign.soak_s, opts.campaign.probe.warmup_s) == (list(settings.SOAK.value), 20)
    # a busy fleet's jobs run for hours: the wait for them is the window's, else a day; a campaign recorded before: 5m
    assert upgrade.campaign_options({}).idle.timeout_s == 86400
    assert upgrade.campaign_options({"window": 3 * 3600}).idle.timeout_s == 3 * 3600
    assert CampaignOptions.from_dict({}).idle.timeout_s == 300 and CampaignOptions.from_dict({}).pace == "wave"
    recorded = {"rollback_scope": "wave", "soak_s": [600.0], "hooks": {"drain": "d {host}", "undrain": None,
                                                                       "timeout_s": 900.0, "slurm": False}}
    loaded = CampaignOptions.from_dict(recorded)
    assert loaded.hooks == Hooks(drain="d {host}") and loaded.as_dict()["hooks"] == recorded["hooks"]
    made = upgrade.campaign_options({"drain_preset": "slurm", "idle_timeout": 90.5})
    assert made.hooks == Hooks(slurm=True) and (made.idle.timeout_s, made.idle.poll_s) == (91, 10)


# What the previous version recorded for a campaign (campaigns.options), every key: a resume still reads it whole.
RECORDED_BY_THE_PREVIOUS_VERSION = {
    "rollback_scope": "wave", "forks": 8, "window_end": "2026-11-28T04:00:00+00:00", "soak_s": [7200.0, 1800.0],
    "soak_interval_s": 60.0, "soak_grace_s": 300.0, "canary": "/opt/canary --json", "canary_max_failures": 1,
    "pace": "host", "max_in_flight": 2, "drain_mode": "reservation", "lead_s": 1800.0,
    "capacity_budget_node_hours": 40.0,
    "hooks": {"drain": None, "undrain": None, "timeout_s": 900.0, "slurm": True},
    "idle": {"timeout_s": 10800, "poll_s": 10}, "probe": {"samples": 12, "warmup_s": 20.0, "trial_s": 1.0}}


def test_a_campaign_recorded_by_the_previous_version_resumes_with_its_options():
    loaded = CampaignOptions.from_dict(json.loads(json.dumps(RECORDED_BY_THE_PREVIOUS_VERSION)))
    assert loaded.as_dict() == RECORDED_BY_THE_PREVIOUS_VERSION
    assert (loaded.pace, loaded.max_in_flight, loaded.probe.samples, loaded.soak_length(3)) == ("host", 2, 12, 1800.0)


def test_every_campaign_flag_reaches_the_engine_from_its_declaration_alone():
    """`upgrade` takes every setting declared `recorded` (settings.CAMPAIGN), and what the command line gives reaches
    the options the engine reads (and the history records) under the setting's key, with nothing between them that
    names the setting: a new campaign flag is its declaration."""
    upgrade_cmd = command(("upgrade",))
    taken = {p.name: p for p in upgrade_cmd.params}
    assert {s.param for s in settings.CAMPAIGN} <= set(taken)
    given = {"--forks": "3", "--soak": "1h,20m", "--soak-interval": "2m", "--soak-grace": "7m", "--canary": "run it",
             "--canary-max-failures": "2", "--rollback-scope": "wave", "--pace": "host", "--max-in-flight": "25%",
             "--drain-mode": "reservation", "--drain-preset": "slurm", "--lead": "10m", "--capacity-budget": "12.5",
             "--samples": "11", "--warmup": "3s", "--trial": "2s", "--window": "2h", "--idle-timeout": "1h"}
    for s in (s for s in settings.CAMPAIGN if s.recorded):  # a new one: other than its default, as its kind has it
        given.setdefault(s.flag, next(c for c in s.choices if c != s.default) if s.choices else
                         "7m" if s.timed else str((s.value or 0) + 1) if s.kind in ("int", "number") else "given")
    ctx = upgrade_cmd.make_context("upgrade", ["--to", "570.86.15", *[w for kv in given.items() for w in kv]])
    made = upgrade.campaign_options(dict(ctx.params))
    for s in settings.CAMPAIGN:
        if not s.recorded:
            continue
        head, _, key = s.recorded.partition(".")
        value = getattr(getattr(made, head), key) if key else getattr(made, head)
        want = taken[s.param].type_cast_value(ctx, given[s.flag])
        assert value == (list(want) if isinstance(want, tuple) else want), s.name
    assert made.window_end and made.hooks == Hooks(slurm=True) and made.idle.timeout_s == 3600


def test_a_new_recorded_setting_is_a_field_of_the_campaigns_options(monkeypatch):
    """A throwaway setting declared `recorded` becomes a field of the campaign's options, with its default for a
    campaign recorded before it existed, and goes from the command line to them and into the history and back."""
    from orchestrator.campaign import options as campaign_options
    new = settings.Setting(name="frobnicate", flag="--frobnicate", kind="int", minimum=0, maximum=9, default=4,
                           commands=settings.UPGRADE, help="Frobnicate.", recorded="frobnicate")
    monkeypatch.setattr(settings, "CAMPAIGN", (*settings.CAMPAIGN, new))
    cls = campaign_options.options_class(settings.CAMPAIGN)
    monkeypatch.setattr(upgrade, "CampaignOptions", cls)
    monkeypatch.setattr(campaign_options, "CampaignOptions", cls)
    assert cls.from_dict({}).frobnicate == 4
    cmd = options.campaign()(click.command()(lambda **given: upgrade.campaign_options(given)))
    made = cmd.main(["--frobnicate", "7"], standalone_mode=False)
    assert made.frobnicate == 7 and cls.from_dict(json.loads(json.dumps(made.as_dict()))) == made
