"""fleetctl's exit codes, every one declared here once: what each means, and which command exits with which (the
README and the docs are made from BY_COMMAND). Scripts, cron and systemd rely on them: a code keeps its number.

One code, one meaning: 1 is always "the thing checked is not as it should be" (findings, an unhealthy host, a node
to drain, hosts off the target, a broken history chain), never "fleetctl could not do it" (69)."""

from __future__ import annotations

import enum
import inspect


class Exit(enum.IntEnum):
    OK = 0
    FINDINGS = 1
    USAGE = 2
    UNREACHABLE = 3
    ROLLED_BACK = 4
    HALTED = 5
    NEEDS_PERSON = 6
    UNAVAILABLE = 69  # EX_UNAVAILABLE
    INTERNAL = 70  # EX_SOFTWARE
    OUTPUT = 73  # EX_CANTCREAT
    HISTORY = 74  # EX_IOERR
    INTERRUPTED = 130  # 128 + SIGINT
    TERMINATED = 143  # 128 + SIGTERM

    @property
    def meaning(self) -> str:
        return MEANINGS[self]

    @classmethod
    def for_signal(cls, signum: int) -> Exit:
        """The code of a run stopped by signal SIGNUM (the shell's 128 + N)."""
        return cls(128 + signum)


MEANINGS = {
    Exit.OK: "success",
    Exit.FINDINGS: "a check failed: findings at or above --fail-on, an unhealthy host, a node to drain, hosts off "
                   "the target, a broken history",
    Exit.USAGE: "usage or input error",
    Exit.UNREACHABLE: "hosts unreachable",
    Exit.ROLLED_BACK: "the campaign rolled back",
    Exit.HALTED: "the campaign halted for a person (inconclusive gate, window closed, circuit breaker) or was "
                  "aborted",
    Exit.NEEDS_PERSON: "a host's rollback failed: it needs a person",
    Exit.UNAVAILABLE: "not carried out: Slurm, systemd or ansible-playbook failed, or another fleetctl holds the "
                      "campaign or a host",
    Exit.INTERNAL: "a fleetctl bug (FLEETCTL_DEBUG=1 shows the traceback)",
    Exit.OUTPUT: "the output (-o FILE or standard output) could not be written: a full disk, a closed pipe or standard "
                 "output",
    Exit.HISTORY: "the history cannot be read or written, is damaged or its chain is broken",
    Exit.INTERRUPTED: "interrupted (SIGINT)",
    Exit.TERMINATED: "stopped (SIGTERM)",
}

# Every command may exit with these.
COMMON = (Exit.USAGE, Exit.INTERNAL, Exit.OUTPUT, Exit.HISTORY, Exit.INTERRUPTED, Exit.TERMINATED)
_CAMPAIGN = (Exit.OK, Exit.FINDINGS, Exit.ROLLED_BACK, Exit.HALTED, Exit.NEEDS_PERSON, Exit.UNAVAILABLE)
# command -> the codes it exits with besides COMMON
BY_COMMAND: dict[str, tuple[Exit, ...]] = {
    "audit": (Exit.OK, Exit.FINDINGS, Exit.UNREACHABLE, Exit.UNAVAILABLE),
    "check": (Exit.OK, Exit.FINDINGS),
    "probe": (Exit.OK, Exit.FINDINGS, Exit.UNREACHABLE, Exit.UNAVAILABLE),
    "plan": (Exit.OK, Exit.UNREACHABLE, Exit.UNAVAILABLE),
    "upgrade": tuple(sorted((*_CAMPAIGN, Exit.UNREACHABLE))),
    "campaign list": (Exit.OK,),
    "campaign show": (Exit.OK,),
    "campaign resume": _CAMPAIGN,
    "campaign judge": _CAMPAIGN,
    "campaign abort": (Exit.OK, Exit.UNAVAILABLE),
    "rollback": (Exit.OK, Exit.NEEDS_PERSON, Exit.UNAVAILABLE),
    "report": (Exit.OK,),
    "report verify": (Exit.OK, Exit.FINDINGS),
    "report drivers": (Exit.OK,),
    "metrics": (Exit.OK,),
    "hosts": (Exit.OK,),
    "hosts show": (Exit.OK,),
    "config show": (Exit.OK,),
    "completion": (Exit.OK,),
    "systemd install": (Exit.OK, Exit.UNAVAILABLE),
    "systemd uninstall": (Exit.OK, Exit.UNAVAILABLE),
}


def documented(command: str | None = None):
    """A decorator for a command's function (under its click decorator): its help ends with the codes COMMAND
    exits with (None: those every command shares), from BY_COMMAND, so no help text keeps a list of its own."""
    codes = BY_COMMAND[command] if command else COMMON
    line = "; ".join(f"{int(code)} {code.meaning}" for code in codes)
    shared = ", ".join(str(int(code)) for code in COMMON)

    def decorate(f):
        head = "Exit codes" if command else "Exit codes of every command"
        tail = f"; {shared} as every command (fleetctl --help)." if command else "."
        f.__doc__ = inspect.cleandoc(f.__doc__ or "") + f"\n\n{head}: {line}{tail}"
        return f
    return decorate
