"""fleetctl systemd install|uninstall: a scheduled audit and a maintenance-window upgrade as systemd timers.

Four units at most, each headed by MARKER so that uninstall (and a later install) touches only what fleetctl wrote:

- fleetctl-audit.service (Type=oneshot: `fleetctl audit ...`) + fleetctl-audit.timer (OnCalendar from
  --audit-schedule, Persistent=true: an audit missed while the control node was down runs at the next boot).
- fleetctl-window.service + fleetctl-window.timer (OnCalendar from --window-schedule, Persistent=false: a window missed
  while the control node was down is NOT run late, at hours nobody agreed to). The service is Type=exec so that its
  runtime can be bounded (RuntimeMaxSec= does nothing for Type=oneshot): ExecStartPre= first resumes campaigns
  whose fleetctl died (a crash or reboot of this node, the end of the previous window), bounded by
  TimeoutStartSec=; ExecStart= then runs `fleetctl upgrade --to VERSION --yes --window ...`, bounded by
  RuntimeMaxSec=. KillMode=control-group: a crash or the end of the window takes the whole process tree (no
  orphaned ansible-playbook races the next resume). No Restart=.

Every command line is checked by fleetctl's own click parser (and the upgrade's values by the functions the
upgrade uses) before a unit is written, so a unit never holds a command fleetctl would reject: cli/systemd.py,
with the command group. The units pin FLEETCTL_HOME (and FLEETCTL_CONFIG, when a config file is in use) to what the
installing shell uses.

A unit file is world-readable and `systemctl show` shows any user its command lines (so does `ps`, for as long as
fleetctl runs), while a --drain template, a --notify command or a webhook URL may carry a password or a token: no
such text is written into a unit or a command line. The settings given to `systemd install` whose values the history
keeps only part of (redact.ARGV_RULES: commands, URLs) go into SETTINGS_FILE beside the units, mode 0600 (root's
alone), in the config file's format; the units name it with $FLEETCTL_UNIT_SETTINGS, and fleetctl reads its keys
over the config file's (config.load).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from . import __version__
from .history import store as store_mod
from .errors import InputError, OperationError
from .exitcodes import BY_COMMAND, COMMON, Exit
from .files import write_atomically

DEFAULT_UNIT_DIR = "/etc/systemd/system"
# Where a system manager reads units from: only there do daemon-reload and enable make sense.
SYSTEM_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                    "/usr/lib/systemd/system", "/lib/systemd/system")
SYSTEMD_BOOTED = Path("/run/systemd/system")  # sd_booted(3): systemd is PID 1
AUDIT, WINDOW = "fleetctl-audit", "fleetctl-window"
UNIT_NAMES = (f"{AUDIT}.service", f"{AUDIT}.timer", f"{WINDOW}.service", f"{WINDOW}.timer")
SETTINGS_FILE = "fleetctl-units.yml"
FILE_NAMES = (*UNIT_NAMES, SETTINGS_FILE)  # what install writes (SETTINGS_FILE first) and uninstall removes (it last)
MARKER = "# Written by `fleetctl systemd install`"
AUDIT_RANDOM_DELAY = "5min"
# `upgrade` options that `systemd install` sets itself (or that make no sense in a unit); every other option of
# `fleetctl upgrade` is offered by `systemd install` too and written into ExecStart= when given.
OWN_UPGRADE_PARAMS = {"target", "yes", "dry_run", "window", "inventory_path", "limit", "baseline"}
# Passed on from the installing shell when set (FLEETCTL_HOME is always pinned: see environment()).
PASSED_ENV = ("FLEETCTL_WORKER",)
CALENDAR_CHARS = re.compile(r"[A-Za-z0-9*:.,/~ _+-]+")  # a rough check where systemd-analyze is not installed
SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./$-]+")


# ---- systemd.syntax -------------------------------------------------------------------------------------

def quote_word(arg: str, expand_env: bool = True) -> str:
    """ARG as one word of a unit file setting: '%' doubled (specifiers), '$' doubled where systemd expands
    environment variables (ExecStart= and friends), quoted with C escapes when it holds anything but plain
    characters (spaces, quotes, backslashes, a lone ';' that would separate commands, control characters)."""
    text = arg.replace("%", "%%")
    if expand_env:
        text = text.replace("$", "$$")
    if SAFE_WORD.fullmatch(arg):
        return text
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def exec_line(argv: list[str]) -> str:
    if not os.path.isabs(argv[0]):
        raise ValueError(f"{argv[0]}: not an absolute path")
    return " ".join(quote_word(a) for a in argv)


def timespan(seconds: float) -> str:
    """A systemd time span ('3h', '1h 30min', '90s' -> '1min 30s'), to the millisecond."""
    ms = round(seconds * 1000)
    parts = []
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return " ".join(parts) or "0"


def calendar(expression: str, flag: str) -> str:
    """A systemd calendar expression ('daily', 'Sat 02:00', 'Mon..Fri 06:00'), normalized by `systemd-analyze
    calendar` where that tool exists; without it only obviously bad input is refused."""
    text = expression.strip()
    if not text or "\n" in text:
        raise InputError(f"{flag} {expression!r}: not a systemd calendar expression (e.g. daily, 'Sat 02:00')")
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if not CALENDAR_CHARS.fullmatch(text) or len(text) > 200:
            raise InputError(f"{flag} {expression!r}: not a systemd calendar expression (e.g. daily, 'Sat 02:00')")
        return text
    try:
        done = subprocess.run([tool, "calendar", text], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "LC_ALL": "C", "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""})
    except (OSError, subprocess.SubprocessError) as e:
        raise OperationError(f"systemd-analyze calendar: {e}") from None
    lines = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in done.stdout.splitlines()) if v}
    if done.returncode != 0 or "Normalized form" not in lines:
        why = (done.stderr.strip().splitlines() or ["invalid"])[-1]
        raise InputError(f"{flag} {expression!r}: not a systemd calendar expression ({why})")
    if lines.get("Next elapse") == "never":
        raise InputError(f"{flag} {expression!r}: never elapses")
    return lines["Normalized form"]


# ---- what the units hold --------------------------------------------------------------------------------

@dataclass(frozen=True)
class AuditUnit:
    calendar: str
    argv: list[str]
    metrics_file: str | None


@dataclass(frozen=True)
class WindowUnit:
    calendar: str
    duration_s: float
    target: str
    resume_argv: list[str]
    upgrade_argv: list[str]


@dataclass(frozen=True)
class Units:
    audit: AuditUnit | None
    window: WindowUnit | None
    settings: dict[str, Any] = field(default_factory=dict)  # SETTINGS_FILE's keys
    environment: dict[str, str] = field(default_factory=dict)


def fleetctl_executable() -> str:
    """The absolute path of the fleetctl being run: argv[0] when it is a fleetctl script, else the one next to
    this interpreter (the same installation), else the one on PATH. Symlinks are kept (an installation replaced
    behind /usr/local/bin/fleetctl keeps working)."""
    candidates = []
    if Path(sys.argv[0]).name == "fleetctl":
        candidates.append(sys.argv[0])
    candidates.append(str(Path(sys.executable).parent / "fleetctl"))
    candidates.append(shutil.which("fleetctl") or "")
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise OperationError("cannot find the fleetctl executable (not next to this Python, not on PATH)")


def environment() -> dict[str, str]:
    """FLEETCTL_HOME pinned to the history this shell uses, and FLEETCTL_CONFIG to the config file it reads, if
    any (under systemd $HOME, $XDG_* and sudo's environment differ: the units must use the history the operator
    looks at and the defaults, notifications included, the operator set), plus PASSED_ENV."""
    env = {"FLEETCTL_HOME": os.path.abspath(store_mod.home())}
    config = config_file()
    if config:
        env["FLEETCTL_CONFIG"] = config
    env.update({k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)})
    return env


def config_file() -> str | None:
    """The config file fleetctl reads here (checked: a broken one is refused now), absolute; None without one."""
    try:
        from . import config as config_mod
    except ImportError:  # a fleetctl without a config file
        return None
    path = config_mod.load().path
    return os.path.abspath(path) if path else None


def path_params() -> set[str]:
    """Parameters naming a file (made absolute for a unit, which runs in /)."""
    try:
        from . import config as config_mod
    except ImportError:
        return set()
    return {k.param for k in config_mod.KEYS if k.path}


def header(name: str) -> str:
    return (f"{MARKER} (fleetctl {__version__}); `fleetctl systemd uninstall` removes it.\n"
            f"# A later install overwrites it: put local settings in a drop-in (systemctl edit {name}).\n")


def env_lines(env: dict[str, str]) -> str:
    return "".join(f"Environment={quote_word(f'{k}={v}', expand_env=False)}\n" for k, v in sorted(env.items()))


def settings_text(units: Units, masked: bool = False) -> str:
    """SETTINGS_FILE (MASKED: as `fleetctl config show` shows it, for --print)."""
    from . import config as config_mod

    keys = {k.name: k for k in config_mod.KEYS}
    values = {name: config_mod.shown(keys[name], v) if masked else v for name, v in units.settings.items()}
    return (f"{MARKER} (fleetctl {__version__}); `fleetctl systemd uninstall` removes it.\n"
            "# The commands and URLs given to it (they may carry a secret), root's alone (mode 0600): the units read "
            "them\n# ($FLEETCTL_UNIT_SETTINGS) over the config file.\n"
            + ("# --print: shown as `fleetctl config show` shows them; the file holds them whole.\n" if masked else "")
            + (yaml.safe_dump(values, sort_keys=True, allow_unicode=True, width=1 << 16) if values else ""))


def render(units: Units) -> dict[str, str]:
    """Unit file name -> text."""
    out: dict[str, str] = {}
    env = env_lines(units.environment)
    if units.audit:
        a = units.audit
        carried = " ".join(str(int(c)) for c in (Exit.FINDINGS, Exit.UNREACHABLE))
        if a.metrics_file:
            codes = (f"# The findings and unreachable hosts (exit {carried}) are in the metrics file (and its alert "
                     f"rules):\n# they do not fail the unit; every other code but 0 does (fleetctl audit --help)."
                     f"\nSuccessExitStatus={carried}\n")
        else:
            codes = ("# Every exit code but 0 fails the unit (fleetctl audit --help), for `systemctl --failed` and "
                     "OnFailure=\n# (no metrics file carries the findings).\n")
        out[f"{AUDIT}.service"] = (
            header(f"{AUDIT}.service")
            + "[Unit]\nDescription=fleetctl: audit the GPU fleet against the baseline\n"
            "Wants=network-online.target\nAfter=network-online.target\n\n"
            "[Service]\nType=oneshot\n" + env
            + f"ExecStart={exec_line(a.argv)}\n" + codes + "KillMode=control-group\n")
        out[f"{AUDIT}.timer"] = (
            header(f"{AUDIT}.timer")
            + "[Unit]\nDescription=fleetctl: scheduled audit\n\n"
            f"[Timer]\nOnCalendar={a.calendar}\n"
            "# An audit missed while this node was down runs when it is back.\nPersistent=true\n"
            f"RandomizedDelaySec={AUDIT_RANDOM_DELAY}\n\n"
            "[Install]\nWantedBy=timers.target\n")
    if units.window:
        w = units.window
        span = timespan(w.duration_s)
        failing = ", ".join(str(int(c)) for c in sorted({*BY_COMMAND["upgrade"], *COMMON} - {Exit.OK}))
        out[f"{WINDOW}.service"] = (
            header(f"{WINDOW}.service")
            + f"[Unit]\nDescription=fleetctl: upgrade window ({span}) to driver {w.target}\n"
            "Wants=network-online.target\nAfter=network-online.target\n\n"
            "[Service]\n"
            "# Type=exec, not oneshot: RuntimeMaxSec= bounds only a service that became active.\nType=exec\n" + env
            + "# First the campaigns whose fleetctl died (a crash or reboot of this node, the end of the last window)"
            "\n# are resumed from the history; a failure there (e.g. a campaign halted or rolled back) stops the "
            "unit\n# before a new campaign starts.\n"
            f"ExecStartPre={exec_line(w.resume_argv)}\n"
            f"ExecStart={exec_line(w.upgrade_argv)}\n"
            "# The window: the resume gets at most TimeoutStartSec=, the upgrade at most RuntimeMaxSec=; then the "
            "whole\n# process tree is stopped (KillMode=control-group) and the next window resumes what was "
            "cut off.\n"
            f"TimeoutStartSec={span}\nRuntimeMaxSec={span}\nKillMode=control-group\n"
            f"# Exit codes: only {Exit.OK:d} (done) succeeds; {failing} (fleetctl upgrade --help) fail the unit,\n"
            "# for `systemctl --failed` and OnFailure=. No Restart=: a failed window waits for a person.\n")
        out[f"{WINDOW}.timer"] = (
            header(f"{WINDOW}.timer")
            + f"[Unit]\nDescription=fleetctl: upgrade window to driver {w.target}\n\n"
            f"[Timer]\nOnCalendar={w.calendar}\n"
            "# A window missed while this node was down is not run late, at hours nobody agreed to.\n"
            "Persistent=false\nAccuracySec=1s\n\n"
            "[Install]\nWantedBy=timers.target\n")
    return out


# ---- install / uninstall --------------------------------------------------------------------------------

def is_ours(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().startswith(MARKER)
    except OSError:
        return False


def systemd_manages(unit_dir: Path) -> bool:
    """systemd is PID 1 here and reads units from UNIT_DIR: daemon-reload and enable apply."""
    return SYSTEMD_BOOTED.is_dir() and str(unit_dir.resolve()) in {os.path.realpath(d) for d in SYSTEM_UNIT_DIRS}


def systemctl(*args: str, check: bool = True) -> str:
    """systemctl's output; a failure (with CHECK) is one line, an OperationError (the unit files are written by
    then)."""
    try:
        done = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise OperationError(f"systemctl {' '.join(args)}: {e}") from None
    if check and done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise OperationError(f"systemctl {' '.join(args)}: {why}")
    return done.stdout.strip()


def unit_directory(unit_dir: str) -> Path:
    """UNIT_DIR, checked before anything is written or removed there (not half an install)."""
    path = Path(os.path.abspath(unit_dir))
    if not path.is_dir():
        raise InputError(f"--unit-dir {unit_dir}: not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"--unit-dir {unit_dir}: not writable (run it as root: sudo fleetctl systemd ...)")
    return path


def absolute(path: str | None, flag: str, must_exist: bool = True) -> str | None:
    """PATH made absolute (a unit runs in /): it must exist now, a typo is refused here, not at the next run."""
    if path is None:
        return None
    if not path.strip():
        raise InputError(f"{flag} {path!r}: empty (a variable that is not set?)")
    full = os.path.abspath(os.path.expanduser(path))
    if must_exist and not os.path.exists(full):
        raise InputError(f"{flag} {path}: no such file or directory")
    return full


def install(units: Units, unit_dir: str, print_only: bool) -> Iterator[str]:
    """Write the units (and enable the timers where systemd runs), the lines for the operator as it goes (the
    command line checks the units' command lines first)."""
    texts = {SETTINGS_FILE: settings_text(units, masked=print_only), **render(units)}
    directory = Path(os.path.abspath(unit_dir))
    if print_only:
        for name, text in texts.items():
            yield f"# {directory / name}\n{text}"
        return
    directory = unit_directory(unit_dir)
    foreign = [str(directory / n) for n in texts if (directory / n).exists() and not is_ours(directory / n)]
    if foreign:
        raise InputError(f"{foreign[0]}: not written by fleetctl; move it away first (nothing was written)")
    for name, text in texts.items():
        try:
            if name == SETTINGS_FILE:
                write_private(directory / name, text)
            else:
                write_atomically(directory / name, text)
                os.chmod(directory / name, 0o644)  # whatever the umask: systemd warns about world-writable units
        except OSError as e:
            raise InputError(f"{directory / name}: cannot write: {e.strerror}") from None
        yield f"wrote {directory / name}"
    timers = [n for n in texts if n.endswith(".timer")]
    if systemd_manages(directory):
        systemctl("daemon-reload")
        systemctl("enable", "--now", *timers)
        yield f"enabled: {' '.join(timers)} (systemctl list-timers 'fleetctl-*')"
    else:
        why = ("systemd is not running here" if not SYSTEMD_BOOTED.is_dir()
               else f"systemd does not read units from {directory}")
        yield (f"{why}; where it runs these units, run:\n  systemctl daemon-reload\n"
               f"  systemctl enable --now {' '.join(timers)}")


def write_private(path: Path, text: str) -> None:
    """PATH (SETTINGS_FILE) written atomically, mode 0600 from its first byte: an old file is made 0600 before (its
    mode is kept), a new one is made under umask 077."""
    if path.is_file() and not path.is_symlink():
        os.chmod(path, 0o600)
    umask = os.umask(0o077)
    try:
        write_atomically(path, text)
    finally:
        os.umask(umask)


def uninstall(unit_dir: str) -> Iterator[str]:
    """Disable and remove the units fleetctl wrote, the lines for the operator as it goes."""
    directory = unit_directory(unit_dir)
    present = [n for n in FILE_NAMES if (directory / n).exists() or (directory / n).is_symlink()]
    ours = [n for n in present if is_ours(directory / n)]
    for n in present:
        if n not in ours:
            yield f"left alone (not written by fleetctl): {directory / n}"
    if not ours:
        yield f"nothing to uninstall in {directory}"
        return
    managed = systemd_manages(directory)
    timers = [n for n in ours if n.endswith(".timer")]
    if managed and timers:
        systemctl("disable", "--now", *timers)
    for n in ours:
        try:
            (directory / n).unlink()
        except OSError as e:
            raise OperationError(f"{directory / n}: cannot remove: {e.strerror}") from None
        yield f"removed {directory / n}"
    if managed:
        systemctl("daemon-reload")
        if systemctl("is-active", f"{WINDOW}.service", check=False) in ("active", "activating", "deactivating"):
            yield f"{WINDOW}.service is still running (a campaign): it was left to finish"
    elif timers:
        yield (f"where systemd runs these units, run:\n  systemctl disable --now {' '.join(timers)}\n"
               "  systemctl daemon-reload")
