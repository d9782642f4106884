"""Ctrl-C and SIGTERM (systemd stopping a window's service): one line, Exit.INTERRUPTED / TERMINATED, the run
recorded as interrupted, a campaign stopped between two journal writes.

fleetctl's own handlers raise Interrupted in the main thread: a BaseException, like KeyboardInterrupt, but not one,
so click does not turn it into its own "Aborted!" with a blank line first. While a playbook runs, the first
signal is only noted: ansible-runner polls its cancel_callback (runner.PlaybookTree, so it installs no handlers of
its own, which it would leave behind), the playbook's whole process tree is stopped, and Interrupted is raised when
the run returns, before any of its results is used. A second signal is raised at once: a second Ctrl-C is never ignored.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from .exitcodes import Exit

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state: dict[str, int | None] = {"deferring": 0, "pending": None}


class Interrupted(BaseException):
    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> Exit:
        return Exit.for_signal(self.signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _handler(signum: int, frame: object) -> None:
    if _state["deferring"]:
        if _state["pending"] is None:
            _state["pending"] = signum
            return
        _state["pending"] = None  # the second: raised now, and the first is spent
    raise Interrupted(signum)


def install() -> None:
    """fleetctl's handlers for SIGINT and SIGTERM (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, _handler)


def requested() -> bool:
    """A signal arrived during deferred(): ansible-runner's cancel_callback."""
    return _state["pending"] is not None


@contextmanager
def deferred() -> Iterator[None]:
    """Around a child process that must be stopped cleanly (a playbook run): the first signal is noted, and raised
    when the block ends; the handlers are fleetctl's again afterwards, whatever the block installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    _state["deferring"] = (_state["deferring"] or 0) + 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
        for s, handler in saved.items():
            signal.signal(s, handler)
        pending = _state["pending"]
        if pending is not None and not _state["deferring"]:
            _state["pending"] = None
            raise Interrupted(pending)
