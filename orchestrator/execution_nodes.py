"""The config file's execution nodes (settings.EXECUTION_NODES): each runs the playbooks of the hosts it serves through
its ansible-runner worker command, all of them at once (runner.run_playbook). The CLI reads them once per command,
with the rest of the config file (cli/config.py), and hands them over here (use), with how long a worker may be silent
(settings.WORKER_SILENCE)."""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import settings
from .errors import InputError

if TYPE_CHECKING:
    from .inventory import Host


@dataclass(frozen=True)
class ExecutionNode:
    name: str
    worker: tuple[str, ...]  # the command, split as a shell would
    hosts: tuple[str, ...]  # inventory groups, or shell patterns of host names

    def serves(self, host: Host) -> bool:
        return any(p in host.groups or fnmatch.fnmatchcase(host.name, p) for p in self.hosts)

    def __str__(self) -> str:
        return f"execution node {self.name} ({shlex.join(self.worker)})"


_nodes: tuple[ExecutionNode, ...] = ()
_silence: float = settings.WORKER_SILENCE.value


def parse(entries: list[dict[str, Any]], where: str) -> tuple[ExecutionNode, ...]:
    """The config file's execution_nodes, checked by its schema already: an InputError (one line) for a name given
    twice or a worker command that does not split."""
    nodes: list[ExecutionNode] = []
    for i, entry in enumerate(entries):
        name, hosts = entry["name"], entry["hosts"]
        if any(n.name == name for n in nodes):
            raise InputError(f"{where}: $.execution_nodes[{i}]: execution node {name} is named twice")
        try:
            worker = shlex.split(entry["worker"])
        except ValueError as e:
            raise InputError(f"{where}: $.execution_nodes[{i}].worker: {e}") from None
        if not worker:
            raise InputError(f"{where}: $.execution_nodes[{i}].worker: no command")
        nodes.append(ExecutionNode(name, tuple(worker), (hosts,) if isinstance(hosts, str) else tuple(hosts)))
    return tuple(nodes)


def use(nodes: tuple[ExecutionNode, ...], silence: float = settings.WORKER_SILENCE.value) -> None:
    """The nodes every playbook of this process runs through (none: in-process, or $FLEETCTL_WORKER), and the
    seconds a worker may send nothing before it is stopped (settings.WORKER_SILENCE)."""
    global _nodes, _silence
    _nodes, _silence = nodes, silence


def silence() -> float:
    """The seconds a worker may send nothing, not even a keepalive (runner.WorkerStream)."""
    return _silence


def split(hosts: Iterable[Host]) -> dict[ExecutionNode | None, list[str]]:
    """HOSTS' names by the node that serves them: the first in the config file's order that does; None: no node."""
    parts: dict[ExecutionNode | None, list[str]] = {}
    for host in hosts:
        parts.setdefault(next((n for n in _nodes if n.serves(host)), None), []).append(host.name)
    return parts
