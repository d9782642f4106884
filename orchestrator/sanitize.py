"""Text from hosts and files as a terminal may show it (no rich, no click: the services use it too)."""

from __future__ import annotations

import re

# Text from hosts and files (host and group names, messages, reasons, versions, a baseline's name) is data: it goes
# into rich as Text, never as markup ("[/red]" would crash the table, after the run was recorded), and without the
# escape sequences and control characters a terminal would act on (a window title, colours, a cleared screen).
ESCAPE_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[PX^_][^\x1b]*(?:\x1b\\)?"
                             r"|[ -/]*[0-~])?")  # CSI, OSC, DCS/SOS/PM/APC, the short ones; a lone ESC
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # C0 but \n \t, DEL, C1, bidi


def clean(value: object) -> str:
    """VALUE (from a host or a file) as a terminal may show it: escape sequences and control characters (but a
    newline and a tab) removed. JSON keeps the data as it is (it escapes them)."""
    return CONTROL.sub("", ESCAPE_SEQUENCE.sub("", str(value)))


def clean_line(value: object) -> str:
    """clean(VALUE) on one line, every character kept in sight: a newline (which could forge a line of its own)
    shown as \\n, a carriage return as \\r, a tab as a space. An error message, a table's caption."""
    return clean(str(value).replace("\r", "\\r")).replace("\n", "\\n").replace("\t", " ")


def one_line(text: object, limit: int | None = None) -> str:
    """TEXT squeezed onto one line: every run of white space or unprintable characters one space, none at either
    end; at most LIMIT characters, then "...". What a host, a server or a command said, inside a message."""
    s = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return s[:limit] + "..." if limit is not None and len(s) > limit else s
