"""Writing files the operator names (-o FILE, unit files): atomically, never through a link planted in a directory
others can write, and no name for a file until it is whole (a SIGKILL mid-write leaves nothing behind). No
command-line code: the commands and the services both use it."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import tempfile
from pathlib import Path

from .errors import InputError
from .inputs import shown

STREAM_PATHS = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/", "/dev/tty")


def writable(output: str | None) -> None:
    """Refuse an -o FILE that cannot be written, or that is a symbolic link in a directory others can write (one
    planted in /tmp), before anything runs or is recorded. A final symlink is never followed (write_atomically)."""
    if not output or str(Path(output).absolute()).startswith(STREAM_PATHS):
        return
    path = Path(output).absolute()
    try:
        parent = path.parent.resolve()  # the directories on the way may be links; only the final name is not followed
        if path.is_symlink() and others_can_write(parent):
            raise InputError(planted_link(output))
        usable = parent.is_dir() and os.access(parent, os.W_OK) and not path.is_dir()
    except OSError as e:  # a name over NAME_MAX, a path over PATH_MAX, a loop of links
        raise InputError(f"{shown(output)}: cannot write the report there: {e.strerror}") from None
    if not usable:
        raise InputError(f"{shown(output)}: cannot write the report there")


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
    a cron job may read it at any moment): the text goes to a file without a name (O_TMPFILE) in the same
    directory, synced, given the old file's mode (a new one's: 0666 less the umask, as open() gives), then a name,
    renamed over PATH. Where the file system has no unnamed files, a hidden temporary name is used instead (which a
    SIGKILL mid-write would leave behind). Standard streams and file descriptors by name (-o /dev/stdout), devices
    and FIFOs are written in place. A symbolic link at PATH is never followed: the rename replaces the link itself,
    not its target; in a directory others can write it is refused."""
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
    fd, tmp = unnamed(target)
    try:
        with open(fd, "wb", closefd=False) as fh:
            fh.write(text.encode())
        os.fsync(fd)
        os.fchmod(fd, mode if mode is not None else 0o666 & ~current_umask())
        if tmp is None:  # whole: now it may have a name
            tmp = temporary_name(target)
            with directory_of(target) as directory:  # linkat(AT_SYMLINK_FOLLOW): the file, not /proc's link
                os.link(f"/proc/self/fd/{fd}", os.path.basename(tmp), dst_dir_fd=directory)
        os.replace(tmp, target)
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    with contextlib.suppress(OSError), directory_of(target) as directory:  # the rename itself survives a crash
        os.fsync(directory)


@contextlib.contextmanager
def directory_of(target: Path):
    """TARGET's directory, open (a descriptor)."""
    directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield directory
    finally:
        os.close(directory)


def unnamed(target: Path) -> tuple[int, str | None]:
    """(fd, None): a file without a name in TARGET's directory, open for writing; (fd, its name) where the file
    system (or a kernel before 3.11, or a system without /proc) has no such files: a hidden temporary one."""
    if os.path.isdir("/proc/self/fd"):  # where the unnamed file is given its name from
        try:
            return os.open(target.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600), None
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:200]}.", suffix=".tmp", dir=target.parent)  # not *.prom
    return fd, tmp


def temporary_name(target: Path) -> str:
    """A hidden name beside TARGET, not *.prom (a textfile collector reads those), short enough whatever TARGET's."""
    return str(target.parent / f".{target.name[:200]}.{secrets.token_hex(6)}.tmp")
