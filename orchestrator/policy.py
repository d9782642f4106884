"""Kept for imports from before orchestrator/controls/: the controls, their registry and evaluate() live there (one
module per family). New code imports orchestrator.controls."""

from __future__ import annotations

from .controls import *  # noqa: F401,F403
from .controls import __all__  # noqa: F401
from .controls.base import unread as _unread, unread_message as _unread_message  # noqa: F401
