"""The history's timestamps: UTC, ISO 8601 to the millisecond, with a Z (2025-01-31T12:00:00.000Z)."""

from __future__ import annotations

import os
from datetime import datetime, timezone


def stamp(when: datetime) -> str:
    """WHEN (aware) as the history writes it."""
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse(text: str) -> datetime:
    """A timestamp the history wrote (or any ISO 8601 one; a Z is UTC), as an aware datetime where it says its zone."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# The test clock: where set, every record fleetctl writes (runs, campaign events, the chain) is stamped with this
# time instead of the system clock's, so that tests and benchmarks build histories spanning weeks through fleetctl's
# own write path, the hash chain holding (docs/hosts.md). Never set it in production.
TEST_CLOCK = "FLEETCTL_TEST_CLOCK"


def now() -> str:
    """Now as the history writes it: the system clock's, or $FLEETCTL_TEST_CLOCK's (TEST_CLOCK)."""
    fixed = os.environ.get(TEST_CLOCK)
    if not fixed:
        return stamp(datetime.now(timezone.utc))
    try:
        when = parse(fixed)
    except ValueError:
        from ..errors import InputError
        raise InputError(f"{TEST_CLOCK}={fixed[:40]!r} is not an ISO 8601 time (2026-01-31T12:00:00Z)") from None
    return stamp(when.astimezone(timezone.utc) if when.tzinfo else when.replace(tzinfo=timezone.utc))
