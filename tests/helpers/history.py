"""The history's database edited behind fleetctl's back."""

from __future__ import annotations

import sqlite3


def tamper(home, *statements):
    with sqlite3.connect(home / "history.sqlite3") as db:
        for s in statements:
            db.execute(s)
