"""The configuration file: the defaults people set once (inventory, baseline, notifications, drain hooks...).

Where: $FLEETCTL_CONFIG (it must exist; `/dev/null` for none), else $XDG_CONFIG_HOME/fleetctl/config.yml (default
~/.config), else /etc/fleetctl/config.yml: the first that exists, alone (files are not merged). YAML checked against
schemas/config.schema.json: a bad file is one line naming it and the JSON path, an InputError. Relative paths in it are
relative to its directory.

Its keys are the settings of orchestrator/settings.py that the file takes (KEYS), each declared there once. The
file becomes click's default_map on the root command's context (cli/config.py), so every command takes its keys
as the defaults of its flags with no code of its own, and a flag given on the command line wins. `fleetctl config show`
prints each key's effective value and where it came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from . import inputs, redact, schemas, settings
from .notify import send as notify
from .sanitize import clean_line
from .baseline import non_string_key
from .errors import InputError, yaml_error
from .settings import Setting

ENV = "FLEETCTL_CONFIG"
# `fleetctl systemd install`'s settings file (root's alone: the commands and URLs given to it, which may
# carry a secret): its keys win over the config file's.
UNIT_ENV = "FLEETCTL_UNIT_SETTINGS"
SYSTEM_PATH = Path("/etc/fleetctl/config.yml")

KEYS = tuple(s for s in settings.SETTINGS if s.file)
COMMANDS = {k.commands[i][0] for k in KEYS for i in range(len(k.commands))} | {"config"}  # those that read it


@dataclass(frozen=True)
class Config:
    path: Path | None  # the file in use, None without one
    searched: tuple[str, ...]
    values: dict[str, Any] = field(default_factory=dict)  # file key -> value, paths resolved
    unit_settings: Path | None = None  # $FLEETCTL_UNIT_SETTINGS: its keys are in VALUES, over the file's
    unit_keys: frozenset[str] = frozenset()


def candidates() -> tuple[list[Path], bool]:
    """(paths in order, whether the first was named by $FLEETCTL_CONFIG)."""
    if os.environ.get(ENV):
        return [Path(os.environ[ENV])], True
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path("~/.config").expanduser()  # the XDG spec: relative is ignored
    return [base / "fleetctl" / "config.yml", SYSTEM_PATH], False


def load() -> Config:
    paths, named = candidates()
    searched = tuple(str(p) for p in paths)
    if named and not present(paths[0]):
        raise InputError(f"{inputs.shown(paths[0])}: config file not found (${ENV})")
    path = next((p for p in paths if present(p)), None)
    values = read(path) if path else {}
    if not os.environ.get(UNIT_ENV):
        return Config(path, searched, values)
    unit = Path(os.environ[UNIT_ENV])
    overlay = read(unit)
    return Config(path, searched, {**values, **overlay}, unit, frozenset(overlay))


def present(path: Path) -> bool:
    """Whether PATH exists; one the system cannot even look up (a name too long) is read(), which says why."""
    try:
        return path.exists()
    except OSError:
        return True


def read(path: Path) -> dict[str, Any]:
    # A FIFO, /dev/zero, a directory, too large: one line (/dev/null is an empty file: no configuration)
    raw = inputs.read_regular(path, "the config file", inputs.MAX_DOCUMENT_BYTES, devnull_is_empty=True)
    try:
        doc = inputs.load_yaml(raw, path)  # YAML too deep or full of aliases: one line
    except yaml.YAMLError as e:
        raise yaml_error(inputs.shown(path), e) from None
    except RecursionError:
        raise InputError(f"{inputs.shown(path)}: nested too deeply to be a config file") from None
    if doc is None:  # empty (or /dev/null)
        return {}
    where, key = non_string_key(doc)
    if where:
        raise InputError(f"{inputs.shown(path)}: {where}: key {key} is not a string (quote it in the YAML)")
    if isinstance(doc, dict):  # first: a duration's one line rather than the schema's pattern
        check_durations(doc, lambda key: f"{inputs.shown(path)}: $.{key.name}")
    schemas.check("config", doc, inputs.shown(path))
    return normalise(doc, path.parent)


def check_durations(values: dict[str, Any], where: Callable[[Setting], str]) -> None:
    """The durations as the commands read them (settings.Setting.duration): the first bad one, as one line."""
    for key in KEYS:
        if key.name in values and key.timed:
            try:
                key.parse(values[key.name])
            except ValueError as e:
                raise InputError(f"{where(key)}: {e}") from None


def normalise(doc: dict[str, Any], directory: Path | None) -> dict[str, Any]:
    out = {}
    for key in KEYS:
        if key.name not in doc:
            continue
        value = doc[key.name]
        if key.many and isinstance(value, str):
            value = [value]
        if key.path and directory is not None:
            value = str(directory / Path(value).expanduser())  # an absolute path stays as it is
        out[key.name] = list(value) if key.many else value
    return out


def default_map(values: dict[str, Any]) -> dict[str, Any]:
    """click's default_map: {command: {subcommand: {param: value}}}."""
    out: dict[str, Any] = {}
    for key in KEYS:
        if key.name in values:
            for path in key.commands:
                node = out
                for part in path:
                    node = node.setdefault(part, {})
                node[key.param] = values[key.name]
    return out


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ---- fleetctl config show ---------------------------------------------------------------------------------

COMMAND_KEYS = ("notify", "drain", "undrain", "canary")  # command lines whose arguments may carry a token


def program_only(command: Any) -> Any:
    """A command line as `config show` prints it: its program, and " [arguments not shown]" when it has more."""
    return redact.program(command, redact.NOT_SHOWN) if isinstance(command, str) else command


def shown(key: Setting, value: Any) -> Any:
    """A webhook's path (Slack's secret), a Prometheus URL's user and path, and the arguments of the notify, drain,
    undrain and canary commands (tokens) are never printed."""
    if key.name == "webhook" and value:
        return [redact.url(u) for u in value]
    if key.name == "prometheus_url" and value:
        return redact.url(value)
    if key.name in COMMAND_KEYS and value:
        return [program_only(v) for v in value] if isinstance(value, list) else program_only(value)
    if key is settings.EXECUTION_NODES and value:  # one line a node
        return [f"{n['name']} ({n['worker']}): {n['hosts'] if isinstance(n['hosts'], str) else ','.join(n['hosts'])}"
                for n in value]
    return value


def check_flags(given: dict[str, Any]) -> None:
    """GIVEN (key -> a flag's value) as the file's values are checked: the first bad one, an InputError naming its
    flag."""
    check_durations(given, lambda key: key.flag)
    error = schemas.first_error("config", given)
    if error is not None:
        flag = next((k.flag for k in KEYS if error.absolute_path and k.name == error.absolute_path[0]), "a flag")
        raise InputError(f"{flag}: {error.message}")


def effective(cfg: Config, flags: dict[str, Any]) -> dict[str, Any]:
    """`config show`: each key's value from FLAGS (the command line), else CFG (the file), else its declared default,
    and where it came from."""
    given = {k.name: list(flags[k.name]) if k.many else flags[k.name] for k in KEYS
             if flags.get(k.name) not in (None, ())}
    check_flags(given)
    values = {}
    for key in KEYS:
        if key.name in given:
            value, source = list(given[key.name]) if key.many else given[key.name], "flag"
        elif key.name in cfg.values:
            value, source = cfg.values[key.name], str(cfg.unit_settings if key.name in cfg.unit_keys else cfg.path)
        else:
            value, source = [] if key.many else key.default, "default"
        values[key.name] = {"value": shown(key, value), "source": source, "flag": key.flag,
                            "commands": [" ".join(c) for c in key.commands]}
    env_headers = os.environ.get(notify.HEADERS_ENV)
    environment = {ENV: os.environ.get(ENV) or None,
                   notify.HEADERS_ENV: [name for name, _ in notify.parse_headers(env_headers, f"${notify.HEADERS_ENV}")]
                   if env_headers else None}
    return {"file": str(cfg.path) if cfg.path else None, "searched": list(cfg.searched), "values": values,
            "environment": environment}


def text(doc: dict[str, Any]) -> str:
    lines = [f"config file: {doc['file'] or 'none'} (searched: {', '.join(doc['searched'])})"]
    width = max(len(k) for k in doc["values"])
    for name, v in doc["values"].items():
        value = v["value"]
        if isinstance(value, list):
            value = ", ".join(value) if value else "-"
        elif value is None:
            value = "-"
        lines.append(f"{name:<{width}}  {clean_line(value)}  ({clean_line(v['source'])})")  # a file's text: no escapes
    names = doc["environment"][notify.HEADERS_ENV]
    if names:
        lines.append(f"${notify.HEADERS_ENV}: headers {', '.join(names)} (values not shown)")
    return "\n".join(lines) + "\n"
