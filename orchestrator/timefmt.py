"""The history's timestamps: UTC, ISO 8601 to the millisecond, with a Z (2025-01-31T12:00:00.000Z)."""

from __future__ import annotations

from datetime import datetime, timezone


def stamp(when: datetime) -> str:
    """WHEN (aware) as the history writes it."""
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse(text: str) -> datetime:
    """A timestamp the history wrote (or any ISO 8601 one; a Z is UTC), as an aware datetime where it says its zone."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def now() -> str:
    return stamp(datetime.now(timezone.utc))
