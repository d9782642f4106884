"""Errors meant for people: one line, then exit 2 (usage or input error)."""


class InputError(Exception):
    """Bad input (file, flag, inventory, baseline): the message is the whole story, shown on one line."""

    exit_code = 2


class OperationError(Exception):
    """An operation could not be carried out (not the input's fault): one line, exit 1."""

    exit_code = 1


def yaml_error(path: object, e: Exception) -> InputError:
    """A YAML parse error of the file at PATH as one line: where (line, column) and what."""
    mark = getattr(e, "problem_mark", None)
    where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return InputError(f"{path}:{where}: not valid YAML: {problem}")


class SlurmError(OperationError):
    """Slurm could not be asked or would not do it (scontrol/sinfo missing, timed out, refused, or answered what
    fleetctl cannot read): one line, exit 1."""
