"""Text from hosts, files and commands, made fit for one line of a message or a history record."""

from __future__ import annotations


def one_line(text: object) -> str:
    """TEXT on one line: every run of white space (newlines, tabs) one space, none at either end."""
    return " ".join(str(text).split())
