"""Writing files the operator names (-o FILE, unit files): atomically, never through a link planted in a directory
others can write. No command-line code: the commands and the services both use it."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from .errors import InputError

STREAM_PATHS = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/", "/dev/tty")


def writable(output: str | None) -> None:
    """Refuse an -o FILE that cannot be written, or that is a symbolic link in a directory others can write (one
    planted in /tmp), before anything runs or is recorded. A final symlink is never followed (write_atomically)."""
    if not output or str(Path(output).absolute()).startswith(STREAM_PATHS):
        return
    path = Path(output).absolute()
    parent = path.parent.resolve()  # the directories on the way may be links; only the final name is not followed
    if path.is_symlink() and others_can_write(parent):
        raise InputError(planted_link(output))
    if not parent.is_dir() or not os.access(parent, os.W_OK) or path.is_dir():
        raise InputError(f"{output}: cannot write the report there")


def others_can_write(directory: Path) -> bool:
    """Someone besides its owner (this user or root) may create names in DIRECTORY: its group or others may
    write it (/tmp, even sticky), or it is another user's."""
    try:
        st = directory.stat()
    except OSError:
        return False
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) or st.st_uid not in (0, os.geteuid())


def planted_link(output: object) -> str:
    return (f"{output}: a symbolic link in a directory others can write: not written through it (remove the link "
            "or write elsewhere)")


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: Path, text: str) -> None:
    """PATH holds the old text or the new, never part of one (node_exporter's textfile collector, a web server or
    a cron job may read it at any moment): a temporary file in the same directory, synced, renamed over PATH, with
    the old file's mode (a new one's: 0666 less the umask, as open() gives). Standard streams and file descriptors
    by name (-o /dev/stdout), devices and FIFOs are written in place. A symbolic link at PATH is never followed:
    the rename replaces the link itself, not its target; in a directory others can write it is refused."""
    if (not path.is_symlink() and path.exists() and not path.is_file()) \
            or str(path.absolute()).startswith(STREAM_PATHS):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    target = path.absolute()  # the name itself: a link there is replaced, its target never written
    if target.is_symlink() and others_can_write(target.parent):
        raise InputError(planted_link(path))
    try:
        st = os.lstat(target)
        mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        mode = None
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)  # not *.prom
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
