"""Notifications of a campaign driven by the real engine: the payloads checked against their schema."""

from __future__ import annotations

from orchestrator import schemas, upgrade


def valid(payload: dict) -> dict:
    error = schemas.first_error("notification", payload)
    assert error is None, (schemas.json_path(error), error.message, payload)
    return payload


def drive(journal, cid, engine, notifier) -> str:
    return upgrade.drive(journal, cid, engine.ctx.fleet, engine.ctx.base, None, notifier, engine.parts)
