"""fleetctl's logging: one line per problem on stderr, for terminals, cron mail and the journal alike.

Libraries fleetctl drives log on their own: paramiko's transport thread logs a full traceback when a host accepts
the TCP connection and never sends an SSH banner, after fleetctl has already judged the host unreachable; Python
warnings (a deprecated cipher) print source lines. Those loggers are routed here: silent, since what they report
reaches the operator as fleetctl's own verdict (the host's reason), and in full with FLEETCTL_DEBUG=1.
"""

from __future__ import annotations

import logging
import os
import sys

LOGGER = "fleetctl"
THIRD_PARTY = ("paramiko", "ansible_runner", "ansible-runner", "py.warnings")


class OneLine(logging.Formatter):
    """`fleetctl: warning: MESSAGE`, the first line of the message only (no traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage().strip().splitlines()
        return f"fleetctl: {record.levelname.lower()}: {message[0] if message else ''}"


def configure(debug: bool | None = None) -> logging.Logger:
    """Set up fleetctl's logger and take over the third-party ones; safe to call again."""
    debug = bool(os.environ.get("FLEETCTL_DEBUG")) if debug is None else debug
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s") if debug else OneLine())
    own = logging.getLogger(LOGGER)
    own.handlers[:] = [handler]
    own.propagate = False
    own.setLevel(logging.DEBUG if debug else logging.WARNING)
    for name in THIRD_PARTY:
        other = logging.getLogger(name)
        other.handlers[:] = [handler] if debug else [logging.NullHandler()]
        other.propagate = False
        other.setLevel(logging.DEBUG if debug else logging.CRITICAL + 1)
    logging.captureWarnings(True)
    return own
