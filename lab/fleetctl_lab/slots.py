"""Lab slots: several labs on one machine, each with machine-wide names of its own (network.Names).

`lab up` claims the lowest free slot n of 0..15 (or the one $FLEETCTL_LAB_SLOT pins) and names everything from it:
bridge flbr<n>, subnet 10.<213+n>.0.0/16, namespaces fl-<host> (slot 0) or fl<n>-<host>, veths flv<i> or fl<n>v<i>.

RUN_DIR/slot-<n> is slot n's claim: a file naming the lab directory that holds the slot (empty: nobody's), and
the lock (flock) of whoever works on the slot's network right now: an `up` building its lab, a `down` removing it.
A claimed slot stays taken while its lab lives (a supervisor of that lab directory, or any process in the slot's
namespaces); once nothing lives there and nobody holds the lock, its claim is stale and the next `up` that takes the
slot removes its remains first (namespaces, veths and bridge of that slot only). Names of a slot that are on the
machine without a claim (a lab from before slots, or one whose claim was lost) count the same way. RUN_DIR/slots.lock
makes choosing a slot atomic; it is held while choosing (and while a lab's namespaces are made), never while a lab
builds or waits for its hosts.

Standard library only; what "lives" and how remains are removed come from the caller (hosts.py), so the choice is
tested without root.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from orchestrator.errors import OperationError

from . import network
from .network import Names

RUN_DIR = Path("/run/fleetctl-lab")
SLOT_ENV = "FLEETCTL_LAB_SLOT"
LOCK_POLL_S = 0.2

# alive(lab directory or None, names): whether anything of that lab still runs; reclaim(names): remove the remains
Alive = Callable[[Path | None, Names], bool]
Reclaim = Callable[[Names], None]


class SlotError(OperationError):
    """No slot can be claimed: one line for the operator."""


@dataclass
class Claim:
    """Slot SLOT, locked by this process through HANDLE; OWNER: the lab directory its file named when locked."""
    slot: int
    handle: IO[str]
    owner: Path | None

    @property
    def names(self) -> Names:
        return network.names(self.slot)

    def write(self, directory: Path) -> None:
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(json.dumps({"dir": str(directory), "pid": os.getpid(), "since": time.time()}) + "\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.owner = directory

    def release(self) -> None:
        """The slot is nobody's (the file stays, empty: a file unlinked while locked would split the lock)."""
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.flush()
        self.owner = None

    def close(self) -> None:
        """Unlock; the claim (what the file names) stays."""
        if not self.handle.closed:
            self.handle.close()


def run_dir() -> Path:
    return RUN_DIR


def claim_path(slot: int) -> Path:
    return run_dir() / f"slot-{slot}"


def pinned_slot(value: str | int | None = None) -> int | None:
    """The slot $FLEETCTL_LAB_SLOT (or VALUE) pins; None when none is pinned."""
    text = os.environ.get(SLOT_ENV, "") if value is None else str(value)
    if not text.strip():
        return None
    try:
        slot = int(text)
    except ValueError:
        slot = -1
    if not 0 <= slot < network.SLOTS:
        raise SlotError(f"{SLOT_ENV}={text!r}: a lab slot is a number from 0 to {network.SLOTS - 1}")
    return slot


def read_owner(handle: IO[str]) -> Path | None:
    handle.seek(0)
    text = handle.read()
    if not text.strip():
        return None
    try:
        return Path(json.loads(text)["dir"])
    except (ValueError, KeyError, TypeError):
        return None  # a torn or foreign file: nobody's


def owner_of(slot: int) -> Path | None:
    """The lab directory slot SLOT's claim names (read without its lock: for finding, never for deciding)."""
    try:
        with open(claim_path(slot)) as handle:
            return read_owner(handle)
    except OSError:
        return None


def slot_of(directory: Path) -> int | None:
    """The slot whose claim names DIRECTORY, if any."""
    return next((n for n in range(network.SLOTS) if owner_of(n) == directory), None)


def _open(slot: int) -> IO[str]:
    run_dir().mkdir(parents=True, exist_ok=True)
    return open(claim_path(slot), "a+")


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextmanager
def machine_wide():
    """RUN_DIR/slots.lock, for what is done on the machine as a whole, briefly: choosing a slot, and making a
    lab's namespaces (the first `ip netns add` after boot makes /run/netns a mount: two at once could stack two
    mounts, hiding the namespaces of the first). Never held while a lab builds or waits."""
    run_dir().mkdir(parents=True, exist_ok=True)
    with open(run_dir() / "slots.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def claim(directory: Path, alive: Alive, reclaim: Reclaim, pinned: int | None = None) -> Claim:
    """Claim a slot for the lab in DIRECTORY and return it locked (the caller builds, then close()s it): the slot a
    stale claim of DIRECTORY holds, else PINNED, else the lowest free one. A stale slot's remains are reclaimed
    first. SlotError when DIRECTORY is already up (or being built or torn down), when PINNED is taken, or when
    every slot is."""
    directory = Path(directory)
    with machine_wide():
        own = _own_stale_slot(directory, alive)
        candidates = [pinned] if pinned is not None else ([own] if own is not None else []) + \
            [n for n in range(network.SLOTS) if n != own]
        taken = []
        for n in candidates:
            handle = _open(n)
            if not _try_lock(handle):
                handle.close()
                taken.append((n, "being built or torn down"))
                continue
            owner, names = read_owner(handle), network.names(n)
            if (owner is not None or names.in_use()) and alive(owner, names):
                handle.close()
                taken.append((n, f"by {owner}" if owner else f"by a lab without a claim ({names.bridge})"))
                continue
            held = Claim(n, handle, owner)
            try:
                if owner is not None or names.in_use():
                    reclaim(names)
                held.write(directory)
            except BaseException:
                held.close()
                raise
            return held
    if pinned is not None:
        raise SlotError(f"lab slot {pinned} ({SLOT_ENV}={pinned}) is in use, {taken[0][1]}")
    raise SlotError(f"every lab slot (0..{network.SLOTS - 1}) is in use: run `fleetctl lab down` in a lab "
                    "directory that is no longer needed")


def _own_stale_slot(directory: Path, alive: Alive) -> int | None:
    """The slot whose claim names DIRECTORY; SlotError when that lab lives or someone works on it."""
    for n in range(network.SLOTS):
        if owner_of(n) != directory:
            continue
        with _open(n) as handle:
            if not _try_lock(handle):
                raise SlotError(f"this lab directory is already up (being built or torn down in slot {n}): "
                                f"{directory}")
            if read_owner(handle) == directory and alive(directory, network.names(n)):
                raise SlotError(f"this lab directory is already up (slot {n}): {directory}: run `fleetctl lab "
                                "down` first")
        return n
    return None


def lock(slot: int, timeout: float) -> Claim:
    """Slot SLOT locked (waiting up to TIMEOUT s for an `up` or `down` working on it), whoever owns it."""
    handle = _open(slot)
    deadline = time.monotonic() + timeout
    while not _try_lock(handle):
        if time.monotonic() > deadline:
            handle.close()
            raise SlotError(f"lab slot {slot} stayed locked for {timeout:.0f} s (an `up` or `down` working on it)")
        time.sleep(LOCK_POLL_S)
    return Claim(slot, handle, read_owner(handle))
