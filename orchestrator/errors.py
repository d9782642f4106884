"""Errors meant for people: one line, then exit 2 (usage or input error)."""


class InputError(Exception):
    """Bad input (file, flag, inventory, baseline): the message is the whole story, shown on one line."""

    exit_code = 2
