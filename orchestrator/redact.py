"""What fleetctl keeps of a command line or a URL that may carry a secret: the history's argv, `config show`,
a hook's record. One rule per flag, in one table."""

from __future__ import annotations

import urllib.parse
from typing import Callable

NOT_RECORDED = "[arguments not recorded]"  # the history, a hook's record
NOT_SHOWN = "[arguments not shown]"  # config show


def url(value: str) -> str:
    """scheme://host[:port] and '/…' for the rest: a webhook's path or query is often its secret (Slack's)."""
    try:
        p = urllib.parse.urlsplit(value)
        host = p.hostname or ""
        port = p.port
    except ValueError:
        return "(not a URL)"
    if ":" in host:
        host = f"[{host}]"
    rest = "/…" if p.path not in ("", "/") or p.query or p.fragment else ""
    return f"{p.scheme}://{host}{f':{port}' if port else ''}{rest}"


def program(command: str, note: str = NOT_RECORDED, always: bool = False) -> str:
    """COMMAND's program, then NOTE when it has arguments (or ALWAYS: a template's arguments come later)."""
    words = command.split()
    if not words or (len(words) == 1 and not always):
        return command
    return f"{words[0]} {note}"


def _template(value: str) -> str:
    return program(value, always=True)


# flag -> what the history keeps of its value: a probe's or canary's command and the drain/undrain templates may
# carry tokens (only the program stays, always marked); a --notify command likewise; a webhook or a Prometheus
# server its scheme://host.
ARGV_RULES: dict[str, Callable[[str], str]] = {
    "--command": _template, "--canary": _template, "--drain": _template, "--undrain": _template,
    "--notify": program, "--webhook": url, "--prometheus-url": url,
}


def argv(args: list[str]) -> list[str]:
    """ARGS as the history keeps them (`--flag value` and `--flag=value` alike)."""
    out = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if i and args[i - 1] in ARGV_RULES:
            arg = ARGV_RULES[args[i - 1]](arg)
        elif eq and flag in ARGV_RULES:
            arg = f"{flag}={ARGV_RULES[flag](value)}"
        out.append(arg)
    return out
