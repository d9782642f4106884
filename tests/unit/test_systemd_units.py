"""fleetctl systemd install|uninstall: every generated unit passes `systemd-analyze verify` without a warning, its
command lines are read back by systemd itself (the verify dump) and then by fleetctl's own click parser, and the
settings an operator relies on (the window's bounds, the resume before the upgrade, the calendar) are what systemd
reads. No systemd needs to run: systemd-analyze works offline."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import cli, config, settings, systemd
from orchestrator.cli import systemd as systemd_cli

REPO = Path(__file__).resolve().parents[2]
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")  # the venv's real entry point: verify needs it to exist
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
ANALYZE_ENV = {**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C"}
DRAIN = 'echo "drain it" 100% $HOME $$ \\ ; {host}'  # spaces, quotes, %, $, $$, a backslash, a lone ;


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A history, an inventory and a baseline under paths with spaces, and a unit directory."""
    home = tmp_path / "fleet home"
    monkeypatch.setenv("FLEETCTL_HOME", str(home))
    monkeypatch.delenv("FLEETCTL_WORKER", raising=False)
    etc = tmp_path / "etc fleetctl"
    etc.mkdir()
    (etc / "config.yml").write_text("# webhooks and --notify commands go here, not into units\n")
    monkeypatch.setenv("FLEETCTL_CONFIG", str(etc / "config.yml"))
    shutil.copy(REPO / "inventory" / "hosts.example.ini", etc / "inventory.ini")
    shutil.copy(REPO / "inventory" / "baseline.example.yml", etc / "baseline.yml")
    units = tmp_path / "units"
    units.mkdir()
    metrics = tmp_path / "textfile"
    metrics.mkdir()
    return {"home": home, "inventory": str(etc / "inventory.ini"), "baseline": str(etc / "baseline.yml"),
            "units": units, "metrics": str(metrics / "fleetctl audit.prom"), "config": str(etc / "config.yml")}


def fleetctl(monkeypatch, capsys, *args):
    """fleetctl's main() in this process (exit code, stdout, stderr), as the entry point runs it."""
    monkeypatch.setattr(sys, "argv", [FLEETCTL, *args])
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def full_install(env, *extra):
    return ["systemd", "install", "--audit-schedule", "daily", "--audit-output", env["metrics"],
            "--window-schedule", "Sat 02:00", "--duration", "3h", "--to", "570.86.15",
            "-i", env["inventory"], "-b", env["baseline"], "--waves", "1,50%,100%", "--soak", "10m",
            "--drain-preset", "slurm", "--drain", DRAIN, "--samples", "7", "--no-preflight",
            "--unit-dir", str(env["units"]), *extra]


def verify(paths: list[Path]) -> str:
    """systemd-analyze verify at its normal level: all it says (nothing, for units without a problem)."""
    done = subprocess.run([ANALYZE, "verify", "--man=no", "--recursive-errors=no", *map(str, paths)],
                          capture_output=True, text=True, env={**ANALYZE_ENV, "SYSTEMD_LOG_LEVEL": "info"},
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return (done.stdout + done.stderr).strip()


def dump(path: Path) -> dict[str, list[str]]:
    """The unit as systemd loaded it (verify's debug dump): setting -> values, ExecStart= and friends as their
    command lines."""
    done = subprocess.run([ANALYZE, "verify", "--man=no", "--recursive-errors=no", str(path)], capture_output=True,
                          text=True, env={**ANALYZE_ENV, "SYSTEMD_LOG_LEVEL": "debug"}, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    section, exec_kind, out = None, None, {}
    for line in done.stdout.splitlines():
        if line.startswith("\t-> Unit "):
            section = line.split("-> Unit ", 1)[1].rstrip(":")
            continue
        if section != path.name:
            continue
        m = re.match(r"\t\t-> (Exec\w+):$", line)
        if m:
            exec_kind = m.group(1)
            continue
        key, sep, value = line.strip().partition(": ")
        if key == "Command Line" and exec_kind:
            out.setdefault(exec_kind, []).append(value)
        elif sep and line.startswith("\t\t") and not line.startswith("\t\t\t"):
            out.setdefault(key, []).append(value)
    return out


C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def argv_of(command_line: str) -> list[str]:
    """systemd's dumped command line -> the argv the process gets. The dump quotes each word as systemd's
    quote_command_line() does (double quotes; C escapes, octal for other control characters; `\\$`, `\\"`, `\\\\`),
    showing the words before $-expansion: `$$` is a literal `$`, and no word may hold a `$` systemd would expand."""
    words, i, n = [], 0, len(command_line)
    while i < n:
        while i < n and command_line[i] == " ":
            i += 1
        if i >= n:
            break
        word, quoted = [], False
        while i < n and (quoted or command_line[i] != " "):
            ch = command_line[i]
            if ch == '"':
                quoted = not quoted
                i += 1
            elif ch == "\\":
                nxt = command_line[i + 1]
                if nxt in C_ESCAPES:
                    word.append(C_ESCAPES[nxt])
                    i += 2
                elif nxt.isdigit():
                    word.append(chr(int(command_line[i + 1:i + 4], 8)))
                    i += 4
                elif nxt == "x":
                    word.append(chr(int(command_line[i + 2:i + 4], 16)))
                    i += 4
                else:
                    word.append(nxt)
                    i += 2
            else:
                word.append(ch)
                i += 1
        assert not quoted, command_line
        text = "".join(word)
        parts = text.split("$$")
        assert not any("$" in p for p in parts), f"systemd would expand a variable in {text!r}"
        words.append("$".join(parts))
    return words


def unit_names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


# ---- the units as systemd reads them --------------------------------------------------------------------

@needs_analyze
def test_every_unit_verifies_clean_and_holds_what_was_asked(env, monkeypatch, capsys):
    code, out, err = fleetctl(monkeypatch, capsys, *full_install(env))
    assert (code, err) == (0, ""), err
    assert unit_names(env["units"]) == set(systemd.FILE_NAMES)
    paths = [env["units"] / n for n in systemd.UNIT_NAMES]
    assert verify(paths) == ""  # not one warning
    for p in paths:
        assert p.read_text().startswith(systemd.MARKER)
        assert p.stat().st_mode & 0o777 == 0o644
    assert "systemd is not running here" in out and "systemctl enable --now fleetctl-audit.timer " \
        "fleetctl-window.timer" in out

    window = dump(env["units"] / "fleetctl-window.service")
    assert window["Type"] == ["exec"]
    assert window["KillMode"] == ["control-group"]
    assert window["RuntimeMaxSec"] == ["3h"] and window["TimeoutStartSec"] == ["3h"]
    assert window["Restart"] == ["no"]
    # The history and the config file (defaults, notifications) the installing shell uses, whatever systemd's
    # $HOME: a space in a value is fine, systemd reads one word per setting.
    settings_file = env["units"] / systemd.SETTINGS_FILE
    assert sorted(window["Environment"]) == [f"FLEETCTL_CONFIG={env['config']}", f"FLEETCTL_HOME={env['home']}",
                                             f"FLEETCTL_UNIT_SETTINGS={settings_file}"]
    # The resume runs before the upgrade: it is the only ExecStartPre=, the upgrade the only ExecStart=.
    (pre,), (main,) = window["ExecStartPre"], window["ExecStart"]
    resume, upgrade = argv_of(pre), argv_of(main)
    assert resume == [FLEETCTL, "campaign", "resume", "--interrupted", "--window", "3h"]
    assert upgrade[:7] == [FLEETCTL, "upgrade", "--to", "570.86.15", "--yes", "--window", "3h"]
    assert "--drain" not in upgrade and upgrade[upgrade.index("-i") + 1] == env["inventory"]

    # ... and fleetctl's own parser takes both as the operator meant them.
    params = systemd_cli.parse(cli.cli, upgrade).params
    assert (params["target"], params["yes"], params["dry_run"], params["window"]) == ("570.86.15", True, False, 10800)
    assert (params["waves"], params["soak"], params["drain_preset"]) == ("1,50%,100%", (600,), "slurm")
    # The drain template is in the settings file, byte for byte, as the units' fleetctl reads it over the config file.
    monkeypatch.setenv("FLEETCTL_UNIT_SETTINGS", str(settings_file))
    assert config.load().values["drain"] == DRAIN
    assert upgrade[upgrade.index("--soak") + 1] == "10m"
    assert (params["samples"], params["no_preflight"], params["baseline"]) == (7, True, env["baseline"])
    assert params["idle_timeout"] is None  # not given: left to fleetctl's default (the window), not in the unit
    assert "--idle-timeout" not in upgrade
    resumed = systemd_cli.parse(cli.cli, resume).params
    assert resumed["interrupted"] is True and resumed["window"] == 10800
    # The resume is safe to run for real: with no campaign in the history it does nothing and succeeds.
    assert fleetctl(monkeypatch, capsys, *resume[1:])[:2] == (0, "no interrupted campaign\n")

    timer = dump(env["units"] / "fleetctl-window.timer")
    assert timer["OnCalendar"] == [normalized("Sat 02:00")] == ["Sat *-*-* 02:00:00"]
    assert timer["Persistent"] == ["no"]

    audit = dump(env["units"] / "fleetctl-audit.service")
    assert audit["Type"] == ["oneshot"] and audit["KillMode"] == ["control-group"]
    (audit_cmd,) = audit["ExecStart"]
    argv = argv_of(audit_cmd)
    assert argv == [FLEETCTL, "audit", "-i", env["inventory"], "-b", env["baseline"],
                    "--format", "prometheus", "-o", env["metrics"], "--no-preflight"]  # shared with the upgrade
    assert systemd_cli.parse(cli.cli, argv).params["output"] == env["metrics"]
    assert "SuccessExitStatus=1 3\n" in (env["units"] / "fleetctl-audit.service").read_text()
    audit_timer = dump(env["units"] / "fleetctl-audit.timer")
    assert audit_timer["OnCalendar"] == [normalized("daily")] == ["*-*-* 00:00:00"]
    assert audit_timer["Persistent"] == ["yes"]
    assert "RandomizedDelaySec=5min\n" in (env["units"] / "fleetctl-audit.timer").read_text()  # not in 252's dump


def normalized(expression: str) -> str:
    done = subprocess.run([ANALYZE, "calendar", expression], capture_output=True, text=True, env=ANALYZE_ENV)
    return re.search(r"Normalized form: (.*)", done.stdout).group(1).strip()


@needs_analyze
def test_duration_margin_and_a_calendar_with_ranges(env, monkeypatch, capsys):
    code, _, err = fleetctl(monkeypatch, capsys, "systemd", "install", "--window-schedule", "Mon..Fri 22:30",
                            "--duration", "90m", "--margin", "30m", "--to", "570.86.15",
                            "--unit-dir", str(env["units"]))
    assert (code, err) == (0, "")
    assert unit_names(env["units"]) == {"fleetctl-window.service", "fleetctl-window.timer",
                                        systemd.SETTINGS_FILE}  # no audit asked for
    assert verify([env["units"] / "fleetctl-window.service", env["units"] / "fleetctl-window.timer"]) == ""
    service = dump(env["units"] / "fleetctl-window.service")
    assert service["RuntimeMaxSec"] == ["1h 30min"] == service["TimeoutStartSec"]  # the hard bound: all of it
    # No wave starts in the last 30 minutes: fleetctl's own window is an hour.
    assert argv_of(service["ExecStartPre"][0])[-2:] == ["--window", "1h"]
    upgrade = argv_of(service["ExecStart"][0])
    assert upgrade[upgrade.index("--window") + 1] == "1h" and "-i" not in upgrade  # no -i: localhost, as the CLI
    assert dump(env["units"] / "fleetctl-window.timer")["OnCalendar"] == ["Mon..Fri *-*-* 22:30:00"]


@needs_analyze
def test_audit_without_metrics_fails_the_unit_on_findings(env, monkeypatch, capsys):
    code, _, err = fleetctl(monkeypatch, capsys, "systemd", "install", "--audit-schedule", "Mon..Fri 06:00",
                            "-i", env["inventory"], "--unit-dir", str(env["units"]))
    assert (code, err) == (0, "")
    service = env["units"] / "fleetctl-audit.service"
    assert verify([service, env["units"] / "fleetctl-audit.timer"]) == ""
    assert "SuccessExitStatus" not in service.read_text()
    assert argv_of(dump(service)["ExecStart"][0]) == [FLEETCTL, "audit", "-i", env["inventory"]]


@needs_analyze
@pytest.mark.parametrize("word", ["plain", "with space", 'dq"uote', "sq'uote", "back\\slash", ";", "a;b", "100%",
                                  "%n", "$HOME", "${HOME}", "$$", "tab\there", "new\nline", "", "-", "ünï",
                                  "\\x41", 'mix "a b" \\ ; $X %i'])
def test_quoting_round_trips_through_systemd(tmp_path, word):
    unit = tmp_path / "q.service"
    unit.write_text(f"[Service]\nType=oneshot\nExecStart={systemd.exec_line(['/bin/true', word, 'end'])}\n"
                    f"Environment={systemd.quote_word('X=' + word, expand_env=False)}\n")
    assert verify([unit]) == ""
    loaded = dump(unit)
    assert argv_of(loaded["ExecStart"][0]) == ["/bin/true", word, "end"]
    if word.isprintable():  # the dump prints an environment value raw
        assert loaded["Environment"] == [f"X={word}"]


# ---- install, uninstall ---------------------------------------------------------------------------------

def test_uninstall_removes_what_install_wrote_and_nothing_else(env, monkeypatch, capsys):
    units = env["units"]
    (units / "fleetctl-other.service").write_text("[Service]\nExecStart=/bin/true\n")
    (units / "site.timer").write_text("[Timer]\nOnCalendar=daily\n")
    (units / "fleetctl-window.service.d").mkdir()  # an operator's drop-in (OnFailure=...)
    (units / "fleetctl-window.service.d" / "alert.conf").write_text("[Unit]\nOnFailure=page.service\n")
    before = unit_names(units)
    assert fleetctl(monkeypatch, capsys, *full_install(env))[0] == 0
    assert unit_names(units) == before | set(systemd.FILE_NAMES)
    code, out, err = fleetctl(monkeypatch, capsys, "systemd", "uninstall", "--unit-dir", str(units))
    assert (code, err) == (0, "")
    assert unit_names(units) == before
    assert out.count("removed ") == 5
    assert fleetctl(monkeypatch, capsys, "systemd", "uninstall", "--unit-dir", str(units))[1].startswith(
        "nothing to uninstall")


def test_a_foreign_unit_of_the_same_name_is_never_overwritten_nor_removed(env, monkeypatch, capsys):
    units = env["units"]
    foreign = units / "fleetctl-window.timer"
    foreign.write_text("# the site's own\n[Timer]\nOnCalendar=Sun 03:00\n")
    code, out, err = fleetctl(monkeypatch, capsys, *full_install(env))
    assert code == 2 and out == "" and err.count("\n") == 1 and "not written by fleetctl" in err
    assert unit_names(units) == {"fleetctl-window.timer"}  # nothing written, not even the other units
    code, out, err = fleetctl(monkeypatch, capsys, *full_install(env)[:6], "--unit-dir", str(units))
    assert code == 0 and unit_names(units) == {"fleetctl-window.timer", "fleetctl-audit.service",
                                               "fleetctl-audit.timer", systemd.SETTINGS_FILE}
    code, out, _ = fleetctl(monkeypatch, capsys, "systemd", "uninstall", "--unit-dir", str(units))
    assert code == 0 and f"left alone (not written by fleetctl): {foreign}" in out
    assert unit_names(units) == {"fleetctl-window.timer"}
    assert foreign.read_text().startswith("# the site's own")


def test_reinstall_overwrites_its_own_units(env, monkeypatch, capsys):
    assert fleetctl(monkeypatch, capsys, *full_install(env))[0] == 0
    args = full_install(env)
    args[args.index("--duration") + 1] = "2h"
    assert fleetctl(monkeypatch, capsys, *args)[0] == 0
    assert "RuntimeMaxSec=2h\n" in (env["units"] / "fleetctl-window.service").read_text()


def test_print_writes_nothing(env, monkeypatch, capsys):
    code, out, err = fleetctl(monkeypatch, capsys, *full_install(env, "--print"))
    assert (code, err) == (0, "")
    assert unit_names(env["units"]) == set()
    for name in systemd.FILE_NAMES:
        assert f"# {env['units'] / name}\n{systemd.MARKER}" in out
    assert "drain: echo [arguments not shown]" in out and DRAIN not in out  # as `config show` shows it
    assert "systemctl" not in out.split("[Install]")[-1]  # no instructions, no systemctl run


def test_where_systemd_runs_it_reloads_and_enables_the_timers(env, monkeypatch, capsys,
                                                              tmp_path):
    booted = tmp_path / "run-systemd-system"
    booted.mkdir()
    monkeypatch.setattr(systemd, "SYSTEMD_BOOTED", booted)
    monkeypatch.setattr(systemd, "SYSTEM_UNIT_DIRS", (str(env["units"]),))
    calls = []
    monkeypatch.setattr(systemd, "systemctl", lambda *a, check=True: calls.append(a) or "inactive")
    code, out, err = fleetctl(monkeypatch, capsys, *full_install(env))
    assert (code, err) == (0, "")
    assert calls == [("daemon-reload",), ("enable", "--now", "fleetctl-audit.timer", "fleetctl-window.timer")]
    calls.clear()
    assert fleetctl(monkeypatch, capsys, "systemd", "uninstall", "--unit-dir", str(env["units"]))[0] == 0
    assert calls == [("disable", "--now", "fleetctl-audit.timer", "fleetctl-window.timer"), ("daemon-reload",),
                     ("is-active", "fleetctl-window.service")]
    # A directory systemd does not read: the commands are printed, not run.
    calls.clear()
    other = tmp_path / "elsewhere"
    other.mkdir()
    code, out, _ = fleetctl(monkeypatch, capsys, *full_install(env)[:-1], str(other))
    assert code == 0 and calls == [] and f"systemd does not read units from {other}" in out


# ---- bad input: one line, exit 2, nothing written -------------------------------------------------------

BAD = [
    (["--duration", "3x"], "Invalid value for '--duration': '3x' is not a duration (90, 90s, 5m or 2h)"),
    (["--duration", "0"], "Invalid value for '--duration': '0' is not above 0"),
    (["--duration", "nan"], "Invalid value for '--duration': 'nan'"),
    (["--margin", "-5m"], "Invalid value for '--margin'"),
    (["--soak-grace", "forever"], "Invalid value for '--soak-grace'"),
    (["--idle-timeout", "2w"], "Invalid value for '--idle-timeout'"),
    (["--window-schedule", "Blursday 25:00"], "--window-schedule 'Blursday 25:00': not a systemd calendar expression"),
    (["--window-schedule", "2001-01-01"], "never elapses"),
    (["--window-schedule", ""], "--window-schedule '': not a systemd calendar expression"),
    (["--audit-schedule", "every tuesday"], "--audit-schedule 'every tuesday'"),
    (["--to", "57"], "57"),
    (["--margin", "3h"], "--margin 3h: not shorter than --duration 3h"),
    (["--waves", "50%,10%"], "50%,10%"),
    (["--soak", "soon"], "Invalid value for '--soak': 'soon' is not a duration"),
    (["--drain", "scontrol {nodes}"], "unknown placeholder"),
    (["--samples", "2"], "--samples"),
    (["--rollback-scope", "fleet"], "--rollback-scope"),
    (["-i", "/nonexistent/inventory.ini"], "/nonexistent/inventory.ini: no such file"),
    (["--audit-output", "/nonexistent/dir/a.prom"], "no such directory"),
]


@pytest.mark.parametrize("change, message", BAD, ids=[" ".join(c) for c, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(env, monkeypatch, capsys, change, message):
    args = full_install(env)
    for flag, value in zip(change[::2], change[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    code, out, err = fleetctl(monkeypatch, capsys, *args)
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and err.startswith("fleetctl: error: ") and message in err, err
    assert "Traceback" not in err
    assert unit_names(env["units"]) == set()


@pytest.mark.parametrize("args, message", [
    ([], "nothing to install"),
    (["--duration", "3h"], "--duration needs --window-schedule"),
    (["--audit-schedule", "daily", "--waves", "1,100%"], "--waves needs --window-schedule"),
    (["--window-schedule", "Sat 02:00", "--to", "570.86.15"], "--window-schedule needs --duration and --to"),
    (["--window-schedule", "Sat 02:00", "--duration", "3h"], "--window-schedule needs --duration and --to"),
    (["--audit-output", "/tmp/x.prom"], "--audit-output needs --audit-schedule"),
    (["--audit-schedule", "daily", "--unit-dir", "/nonexistent/units"], "--unit-dir /nonexistent/units"),
])
def test_usage_errors(env, monkeypatch, capsys, args, message):
    if "--unit-dir" not in args:
        args = [*args, "--unit-dir", str(env["units"])]
    code, out, err = fleetctl(monkeypatch, capsys, "systemd", "install", *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert unit_names(env["units"]) == set()


def test_the_window_start_is_a_calendar_flag_of_its_own(env, monkeypatch, capsys):
    """`--window` is a duration wherever fleetctl takes it (upgrade, campaign resume): the window's start, a calendar
    time, is --window-schedule, and the old spelling is refused in one line naming the new one."""
    code, out, err = fleetctl(monkeypatch, capsys, "systemd", "install", "--window", "Sat 02:00", "--duration", "3h",
                              "--to", "570.86.15", "--unit-dir", str(env["units"]))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "No such option '--window'" in err and "--window-schedule" in err, err
    assert unit_names(env["units"]) == set()


def test_uninstall_of_a_missing_directory(monkeypatch, capsys):
    code, out, err = fleetctl(monkeypatch, capsys, "systemd", "uninstall", "--unit-dir", "/nonexistent/units")
    assert code == 2 and err.count("\n") == 1 and "not a directory" in err


def test_without_systemd_analyze_only_obvious_nonsense_is_refused(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(systemd.shutil, "which", lambda name: None if name == "systemd-analyze" else real_which(name))
    assert systemd.calendar("Sat 02:00", "--window-schedule") == "Sat 02:00"
    assert systemd.calendar("Mon..Fri 06:00 Europe/Berlin", "--window-schedule") == "Mon..Fri 06:00 Europe/Berlin"
    for bad in ("", "daily; rm -rf /", "Sat\n02:00", "100%", '"daily"'):
        with pytest.raises(systemd.InputError, match="not a systemd calendar expression"):
            systemd.calendar(bad, "--window-schedule")


def test_timespans_and_durations():
    assert [systemd.timespan(s) for s in (10800, 5400, 90, 45.5, 86400 * 2)] == \
        ["3h", "1h 30min", "1min 30s", "45s 500ms", "48h"]
    assert [settings.duration_text(s) for s in (10800, 5400, 90, 0.5, 0)] == ["3h", "90m", "90s", "0.5s", "0"]
    for s in (10800, 5400, 90, 0.5, 3601):
        assert settings.WINDOW.parse(settings.duration_text(s)) == s


@needs_analyze
def test_the_documented_install_commands(env, monkeypatch, capsys):
    """The install command docs/windows.md gives an operator, as written (the inventory path aside), verifies clean."""
    page = (REPO / "docs/windows.md").read_text()
    block = page.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    install, timers = block.strip().splitlines()
    assert timers == "systemctl list-timers 'fleetctl-*'"
    words = shlex.split(install)
    assert words[:4] == ["sudo", "fleetctl", "systemd", "install"]
    words[words.index("/etc/fleetctl/inventory.ini")] = env["inventory"]
    code, _, err = fleetctl(monkeypatch, capsys, *words[2:], "--unit-dir", str(env["units"]))
    assert (code, err) == (0, "")
    assert verify([env["units"] / n for n in systemd.UNIT_NAMES]) == ""
    service = dump(env["units"] / "fleetctl-window.service")
    assert service["RuntimeMaxSec"] == ["3h"] and service["KillMode"] == ["control-group"]


@needs_analyze
def test_shared_options_go_to_every_command_that_takes_them(env, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    Path("ca.pem").write_text("not checked here\n")
    code, _, err = fleetctl(monkeypatch, capsys, *full_install(env, "--forks", "8", "--webhook-format", "slack",
                                                               "--webhook-ca", "ca.pem", "--soak", "0"))
    assert (code, err) == (0, ""), err
    ca = str(tmp_path / "ca.pem")
    audit = argv_of(dump(env["units"] / "fleetctl-audit.service")["ExecStart"][0])
    window = dump(env["units"] / "fleetctl-window.service")
    resume, upgrade = argv_of(window["ExecStartPre"][0]), argv_of(window["ExecStart"][0])
    for argv in (audit, upgrade):
        assert argv[argv.index("--forks") + 1] == "8"
    assert "--forks" not in resume and "--waves" not in resume and "--waves" not in audit
    for argv in (audit, resume, upgrade):  # the notification options: every command has them
        assert argv[argv.index("--webhook-format") + 1] == "slack"
        assert argv[argv.index("--webhook-ca") + 1] == ca  # absolute: a unit runs in /
    assert upgrade[upgrade.index("--soak") + 1] == "0"
    for argv in (audit, resume, upgrade):
        systemd_cli.parse(cli.cli, argv)


SECRETS = [("--drain", "curl -u admin:hunter2pass https://bmc/{host}"), ("--undrain", "sshpass -p hunter2 ssh {host} x"),
           ("--canary", "mysql -phunter2 -e 'select 1'"), ("--notify", "page --token s3cret {event}"),
           ("--webhook", "https://hooks.example.com/services/T0/B0/secret")]


@needs_analyze
def test_text_settings_go_into_a_root_only_file_never_into_a_unit(env, monkeypatch, capsys):
    """A unit file is world-readable and `systemctl show` (and `ps`) show command lines to any user: the commands
    and URLs given to `systemd install` are in a file of mode 0600 the units name, read over the config file."""
    env_config = env["config"]
    with open(env_config, "w") as fh:
        fh.write("notify: [notify-send]\ndrain_preset: slurm\n")
    given = [w for flag, value in SECRETS for w in (flag, value)]
    code, out, err = fleetctl(monkeypatch, capsys, *full_install(env)[:-2], *given, "--unit-dir", str(env["units"]))
    assert (code, err) == (0, ""), err
    units = [env["units"] / n for n in systemd.UNIT_NAMES]
    assert verify(units) == ""
    for path in units:
        assert not any(value in path.read_text() for _, value in SECRETS)
        assert "hunter2" not in path.read_text() and "s3cret" not in path.read_text()
    window = dump(env["units"] / "fleetctl-window.service")
    for command in (*window["ExecStartPre"], *window["ExecStart"]):
        assert not {"--drain", "--undrain", "--canary", "--notify", "--webhook"} & set(argv_of(command))
    settings_file = env["units"] / systemd.SETTINGS_FILE
    assert settings_file.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("FLEETCTL_UNIT_SETTINGS", str(settings_file))  # as the units' fleetctl reads them
    values = config.load().values
    assert {k: values[k] for k in ("drain", "undrain", "canary")} == {k[2:]: v for k, v in SECRETS[:3]}
    assert (values["notify"], values["webhook"], values["drain_preset"]) == ([SECRETS[3][1]], [SECRETS[4][1]], "slurm")
    shown = fleetctl(monkeypatch, capsys, "config", "show")[1]
    assert f"drain                curl [arguments not shown]  ({settings_file})" in shown and "hunter2" not in shown
    # A later install with none of them leaves no stale secret behind.
    assert fleetctl(monkeypatch, capsys, *full_install(env))[0] == 0
    assert "hunter2" not in settings_file.read_text() and settings_file.stat().st_mode & 0o777 == 0o600


def test_audit_only_takes_the_options_the_audit_has(env, monkeypatch, capsys):
    code, _, err = fleetctl(monkeypatch, capsys, "systemd", "install", "--audit-schedule", "hourly", "--forks", "4",
                            "--unit-dir", str(env["units"]))
    assert (code, err) == (0, "")
    assert "audit --forks 4\n" in (env["units"] / "fleetctl-audit.service").read_text()
