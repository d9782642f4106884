"""The config file's execution nodes (settings.EXECUTION_NODES): each runs the playbooks of the hosts it serves through
its ansible-runner worker command, all of them at once (runner.Runner.run_playbook). The CLI reads them once per
command, with the rest of the config file (cli/config.py), and hands them to the command as its RunnerConfig, with how
long a worker may be silent (settings.WORKER_SILENCE)."""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import settings
from ..errors import InputError

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


@dataclass(frozen=True)
class RunnerConfig:
    """How a command's playbooks run (runner.Runner): through the execution NODES (none: in-process, or
    $FLEETCTL_WORKER), each worker sending something at least every SILENCE seconds (settings.WORKER_SILENCE)."""
    nodes: tuple[ExecutionNode, ...] = ()
    silence: float = settings.WORKER_SILENCE.value

    def split(self, hosts: Iterable[Host]) -> dict[ExecutionNode | None, list[str]]:
        """HOSTS' names by the node that serves them: the first in the config file's order that does; None: no node."""
        parts: dict[ExecutionNode | None, list[str]] = {}
        for host in hosts:
            parts.setdefault(next((n for n in self.nodes if n.serves(host)), None), []).append(host.name)
        return parts


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
