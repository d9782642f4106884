"""The configuration file (issue 15): where it is looked for, how its keys become the commands' defaults (a flag
wins), `fleetctl config show`, and a bad file: one line naming the file and the JSON path, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import config
from orchestrator.notify import send as notify
from orchestrator.cli import cli
from orchestrator.errors import InputError
from tests.helpers.cli import REPO
from tests.helpers.webhooks import recorded, recorder


def run_cli(*args, home, config_path, env=None, timeout=120):
    environment = {k: v for k, v in os.environ.items() if k not in (config.ENV, notify.HEADERS_ENV)}
    environment.update(FLEETCTL_HOME=str(home), COLUMNS="200", **(env or {}))
    if config_path is not None:
        environment[config.ENV] = str(config_path)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=environment)


@pytest.fixture
def places(tmp_path, monkeypatch):
    """No $FLEETCTL_CONFIG, $XDG_CONFIG_HOME and /etc/fleetctl under tmp_path."""
    monkeypatch.delenv(config.ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(config, "SYSTEM_PATH", tmp_path / "etc" / "fleetctl" / "config.yml")
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_where_the_file_is_looked_for(places, monkeypatch):
    assert config.load().path is None
    system = write(config.SYSTEM_PATH, "forks: 8\n")
    assert config.load().path == system and config.load().values == {"forks": 8}
    user = write(places / "xdg" / "fleetctl" / "config.yml", "forks: 4\n")
    assert config.load().path == user and config.load().values == {"forks": 4}  # the user's, alone (no merging)
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # the XDG spec: a relative value is ignored
    home = write(places / "home" / ".config" / "fleetctl" / "config.yml", "forks: 2\n")
    assert config.load().path == home
    named = write(places / "elsewhere.yml", "forks: 16\n")
    monkeypatch.setenv(config.ENV, str(named))
    assert config.load().path == named and config.load().searched == (str(named),)
    monkeypatch.setenv(config.ENV, str(places / "missing.yml"))
    with pytest.raises(InputError, match=r"missing.yml: config file not found \(\$FLEETCTL_CONFIG\)"):
        config.load()
    monkeypatch.setenv(config.ENV, os.devnull)  # none at all
    assert config.load().values == {}


def test_paths_are_relative_to_the_file_and_lists_may_be_one_string(places):
    path = write(places / "etc" / "fleetctl" / "config.yml",
                 "inventory: hosts.ini\nbaseline: /srv/baseline.yml\nwebhook_ca: ~/ca.pem\n"
                 "webhook: https://hooks.example.com/x\nnotify: [\"pager {event}\"]\nsoak: 10m\n")
    values = config.load().values
    assert values["inventory"] == str(path.parent / "hosts.ini") and values["baseline"] == "/srv/baseline.yml"
    assert values["webhook_ca"] == str(places / "home" / "ca.pem")
    assert values["webhook"] == ["https://hooks.example.com/x"] and values["notify"] == ["pager {event}"]
    dm = config.default_map(values)
    assert dm["audit"]["inventory_path"] == values["inventory"] and "inventory_path" not in dm["campaign"]["resume"]
    assert dm["campaign"]["resume"]["webhook"] == ["https://hooks.example.com/x"]
    assert dm["rollback"]["notify"] == ["pager {event}"] and dm["upgrade"]["soak"] == "10m"
    assert "rollback" not in {k for k in dm if "inventory_path" in dm[k]}  # resume/rollback: the campaign's own


@pytest.mark.parametrize("text, expected", [
    ("fail_on: sometimes\n", "$.fail_on: 'sometimes' is not one of"),
    ("inventry: hosts.ini\n", "$: Additional properties are not allowed ('inventry' was unexpected)"),
    ("forks: 0\n", "$.forks: 0 is less than the minimum of 1"),
    ("webhook: [\"https://a/x\", \"ftp://b\"]\n", "$.webhook: "),
    ("- inventory\n", "$: expected object, found a list"),
    ("inventory: [unclosed\n", "line 2 column 1: not valid YAML"),
    ("forks: 4\nsoak: 2h\nforks: 8\n", "line 3 column 1: not valid YAML: key 'forks' given twice (first on line 1)"),
    ("1: x\n", "$: key 1 is not a string"),
    ("idle_timeout: 8785h\n", "$.idle_timeout: '8785h' is longer than a year"),  # the flag's bounds
    ("soak: 2h,5x\n", "$.soak: '5x' is not a duration (90, 90s, 5m or 2h)"),
    ("soak_interval: [1]\n", "$.soak_interval: [1] is not a duration"),
    ("notify_timeout: 0.05\n", "$.notify_timeout: 0.05 is not at least 0.1s"),
])
def test_a_bad_file_is_one_line_naming_it_and_the_json_path_exit_2(tmp_path, text, expected):
    bad = write(tmp_path / "config.yml", text)
    home = tmp_path / "home"
    proc = run_cli("audit", home=home, config_path=bad)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"fleetctl: error: {bad}:") and expected in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (home / "history.sqlite3").exists()  # nothing ran, nothing recorded


def test_durations_in_the_file_are_read_as_the_flags_read_them(places):
    write(config.SYSTEM_PATH, "idle_timeout: 5m\nsoak: 2h,30m,10m\nsoak_grace: 90\nnotify_timeout: 2.5\n")
    defaults = config.default_map(config.load().values)["upgrade"]
    params = cli.get_command(None, "upgrade").make_context("upgrade", ["--to", "570.86.15"],
                                                           default_map=defaults).params
    assert (params["idle_timeout"], params["soak"], params["soak_grace"], params["notify_timeout"]) == \
        (300, (7200, 1800, 600), 90, 2.5)


def test_a_bad_file_does_not_stand_in_the_way_of_commands_that_read_none(tmp_path):
    bad = write(tmp_path / "config.yml", "forks: many\n")
    proc = run_cli("completion", "bash", home=tmp_path / "home", config_path=bad)
    assert proc.returncode == 0 and "fleetctl" in proc.stdout


def test_the_file_gives_defaults_and_a_flag_wins(tmp_path):
    """localhost has no NVIDIA driver: the audit fails high/critical controls (exit 1) unless --fail-on never."""
    script, out = recorder(tmp_path / "cmd")
    path = write(tmp_path / "config.yml", f"fail_on: never\nnotify: \"{sys.executable} {script} {out} {{event}}\"\n")
    home = tmp_path / "home"
    quiet = run_cli("audit", "--format", "json", home=home, config_path=path)
    assert quiet.returncode == 0, quiet.stderr  # fail_on from the file
    assert json.loads(quiet.stdout)["summary"]["fail_on"] == "never" and recorded(out) == []
    loud = run_cli("audit", "--format", "json", "--fail-on", "high", home=home, config_path=path)
    assert loud.returncode == 1, loud.stderr  # the flag wins; the file's notify still applies
    (event,) = recorded(out)
    assert event["argv"] == ["findings"] and event["stdin"]["run"]["fail_on"] == "high"
    again = run_cli("audit", "--format", "json", "--fail-on", "high", "--notify", "true", home=home, config_path=path)
    assert again.returncode == 1 and len(recorded(out)) == 1  # --notify given: the file's list is replaced
    help_text = run_cli("audit", "--help", home=home, config_path=path).stdout
    assert "[default: never]" in help_text  # --help shows the file's defaults


def test_config_show_says_where_each_value_came_from(tmp_path):
    path = write(tmp_path / "config.yml", "inventory: inv/hosts.ini\nforks: 12\nwebhook:\n"
                 "  - https://hooks.slack.com/services/T00/B00/SECRETPATH\nwebhook_format: slack\n"
                 "prometheus_url: https://fleet:s3cret@prom.example:9090/api-SECRETPATH\n")
    home = tmp_path / "home"
    env = {notify.HEADERS_ENV: "Authorization: Bearer s3cr3t"}
    proc = run_cli("config", "show", "--format", "json", "--forks", "3", "--notify", "pager {event}", home=home,
                   config_path=path, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["file"] == str(path) and doc["searched"] == [str(path)]
    v = doc["values"]
    assert v["inventory"] == {"value": str(tmp_path / "inv" / "hosts.ini"), "source": str(path), "flag": "--inventory",
                              "commands": ["audit", "probe", "plan", "upgrade"]}
    assert (v["forks"]["value"], v["forks"]["source"]) == (3, "flag")
    assert (v["notify"]["value"], v["notify"]["source"]) == (["pager [arguments not shown]"], "flag")  # tokens
    assert (v["webhook"]["value"], v["webhook"]["source"]) == (["https://hooks.slack.com/…"], str(path))
    assert (v["webhook_format"]["value"], v["webhook_format"]["source"]) == ("slack", str(path))
    assert v["prometheus_url"]["value"] == "https://prom.example:9090/…"  # no user, password or path
    assert "s3cret" not in proc.stdout and "SECRETPATH" not in proc.stdout
    assert (v["fail_on"]["value"], v["fail_on"]["source"]) == ("high", "default")
    assert (v["notify_timeout"]["value"], v["notify_timeout"]["source"]) == ("10s", "default")
    assert (v["baseline"]["value"], v["baseline"]["source"]) == (None, "default")
    assert v["notify"]["commands"] == ["audit", "probe", "upgrade", "campaign resume", "rollback"]
    assert doc["environment"] == {config.ENV: str(path), notify.HEADERS_ENV: ["Authorization"]}
    table = run_cli("config", "show", home=home, config_path=path, env=env)
    assert table.returncode == 0 and f"config file: {path}" in table.stdout
    rows = {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines()[1:] if line.strip()}
    assert rows["forks"] == ["12", f"({path})"] and rows["fail_on"] == ["high", "(default)"]
    for out in (proc.stdout, table.stdout):
        assert "SECRETPATH" not in out and "s3cr3t" not in out
    none = run_cli("config", "show", "--format", "json", home=home, config_path=None,
                   env={"XDG_CONFIG_HOME": str(tmp_path / "nothing"), "HOME": str(tmp_path / "nothing")})
    doc = json.loads(none.stdout)
    if not config.SYSTEM_PATH.exists():
        assert doc["file"] is None and {v["source"] for v in doc["values"].values()} == {"default"}
    bad = run_cli("config", "show", "--forks", "0", home=home, config_path=path)
    assert bad.returncode == 2 and bad.stderr == "fleetctl: error: --forks: 0 is less than the minimum of 1\n"
    bad = run_cli("config", "show", "--idle-timeout", "2w", home=home, config_path=path)
    assert bad.returncode == 2 and bad.stderr == \
        "fleetctl: error: --idle-timeout: '2w' is not a duration (90, 90s, 5m or 2h)\n"
