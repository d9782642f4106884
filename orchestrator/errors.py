"""Errors meant for people: one line, then their exit_code (a usage or input error, or not carried out)."""

from __future__ import annotations

import errno

from .exitcodes import Exit

# What writing a full disk, a full device, a closed pipe or a closed standard output fails with: the output's
# failure, not a bug.
OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EPIPE, errno.EBADF)


def stdout_failed(e: BaseException) -> bool:
    """E is writing the standard output failing (OUTPUT_ERRNOS, no file named): the output's failure."""
    return isinstance(e, OSError) and e.errno in OUTPUT_ERRNOS and e.filename is None


class InputError(Exception):
    """Bad input (file, flag, inventory, baseline): the message is the whole story, shown on one line."""

    exit_code = Exit.USAGE


class OperationError(Exception):
    """An operation could not be carried out (not the input's fault): one line, Exit.UNAVAILABLE (never
    FINDINGS, which says a check failed)."""

    exit_code = Exit.UNAVAILABLE


class OutputError(OperationError):
    """The output (-o FILE, standard output) could not be written: a full disk, a closed pipe. One line,
    Exit.OUTPUT; a run's record says so (runs.close)."""

    exit_code = Exit.OUTPUT

    @classmethod
    def of_stdout(cls, e: OSError) -> OutputError:
        return cls(f"cannot write the standard output: {e.strerror or type(e).__name__}")


def yaml_error(path: object, e: Exception) -> InputError:
    """A YAML parse error of the file at PATH as one line: where (line, column) and what."""
    mark = getattr(e, "problem_mark", None)
    where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return InputError(f"{path}:{where}: not valid YAML: {problem}")


class SlurmError(OperationError):
    """Slurm could not be asked or would not do it (scontrol/sinfo missing, timed out, refused, or answered what
    fleetctl cannot read): one line, as every OperationError."""
