"""Errors meant for people: one line, then exit 2 (usage or input error)."""


class InputError(Exception):
    """Bad input (file, flag, inventory, baseline): the message is the whole story, shown on one line."""

    exit_code = 2


class OperationError(Exception):
    """An operation could not be carried out (not the input's fault): one line, exit 1."""

    exit_code = 1
