"""Text from hosts and files as every output format shows it (no rich, no click: the services use it too).

One rule, visible(), for the terminal's tables and lines, CSV, HTML and the Slack and Teams notifications: a
character a terminal, a spreadsheet or a browser could act on or hide is shown as its escape, never passed raw nor
dropped. JSON keeps the data as it is (it escapes them itself).
"""

from __future__ import annotations

import re
from typing import Any

MAX_SHOWN = 200  # a longer word inside a message (an argument, a path) is shown shortened
MAX_MESSAGE = 1000  # characters of an error message, at most


def visible(value: object, keep: str = "") -> str:
    """VALUE (from a host or a file) with every character that str.isprintable() refuses shown as Python writes
    its escape (\\x07, \\r, \\x1b, \\u202e, \\U000e0041), but those in KEEP: the C0 and C1 control characters and
    DEL (a terminal's escape sequences, BEL, BS, CR), format characters (right-to-left overrides and isolates,
    zero-width spaces and joiners, U+061C, U+FEFF), line and paragraph separators, spaces other than ' ',
    unassigned and private-use code points. Host and group names, messages, reasons, versions, a baseline's name."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii") for c in text)


def clean(value: object) -> str:
    """visible(VALUE), a newline and a tab kept: a table cell, a report printed whole."""
    return visible(value, keep="\n\t")


def clean_line(value: object) -> str:
    """visible(VALUE) on one line: a newline (which could forge a line of its own) shown as \\n too. An error
    message, a table's caption, a progress line."""
    return visible(value)


def shortened(text: str, limit: int = MAX_SHOWN) -> str:
    """TEXT longer than LIMIT as its start and its end around "...": what it was, and how it ends."""
    return text if len(text) <= limit else f"{text[:limit * 3 // 5]}...{text[-(limit * 3 // 10):]}"


LONG_WORD = re.compile(rf"\S{{{MAX_SHOWN + 1},}}")


def error_line(value: object) -> str:
    """An error message as fleetctl shows it: clean_line(VALUE), bounded whatever the input it names: each word
    longer than MAX_SHOWN (a 10 KB argument, a path) shortened(), the whole to MAX_MESSAGE."""
    text = LONG_WORD.sub(lambda m: shortened(m.group()), clean_line(value))
    return shortened(text, MAX_MESSAGE)


def one_line(text: object, limit: int | None = None) -> str:
    """TEXT squeezed onto one line: every run of white space one space, none at either end, the rest visible(); at
    most LIMIT characters, then "...". What a host, a server or a command said, inside a message."""
    s = visible(" ".join(str(text).split()))
    return s[:limit] + "..." if limit is not None and len(s) > limit else s


def clean_data(doc: Any) -> Any:
    """DOC (dicts, lists, strings, numbers) with clean() applied to every string value in it: a document rendered
    into a format that does not escape them itself (an HTML template)."""
    if isinstance(doc, str):
        return clean(doc)
    if isinstance(doc, dict):
        return {k: clean_data(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [clean_data(v) for v in doc]
    return doc
