"""Slurm as the captures of tests/testdata/slurm answer it, recording what fleetctl asks of it."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

from orchestrator.schedulers import slurmctl as slurm
from orchestrator.errors import SlurmError


def captured(testdata, state: str, name: str) -> slurm.Node:
    """The captured node of STATE (tests/testdata/slurm/STATE.sinfo.json), as node NAME."""
    (node,) = slurm.parse_nodes((testdata / "slurm" / f"{state}.sinfo.json").read_text()).values()
    return dataclasses.replace(node, name=name)


class FakeSlurm:
    """Slurm's answers for a few nodes (captured states) and its reservations; drains, resumes and reservations
    recorded and applied (a reservation whose start has passed marks its nodes as the `maint` capture shows them)."""

    def __init__(self, testdata, **states: str):
        self.testdata = testdata
        self.state = {name: captured(testdata, s, name) for name, s in states.items()}
        self.held: dict[str, slurm.Reservation] = {}
        self.asked: list[tuple] = []
        self.refuse: str | None = None  # what `scontrol create reservation` answers, if it refuses

    def reservations(self):
        return dict(self.held)

    def hostnames(self, nodelist):
        return nodelist.split(",")

    def hold(self, name, start, nodes):
        active = start <= datetime.now(timezone.utc)
        self.held[name] = slurm.Reservation(name, "ACTIVE" if active else "INACTIVE", str(start), ",".join(nodes),
                                            frozenset({"MAINT", "IGNORE_JOBS", "SPEC_NODES"}))
        for n in nodes if active else ():
            self.state[n] = dataclasses.replace(self.state[n], flags=self.state[n].flags | {"MAINTENANCE", "RESERVED"})

    def create_reservation(self, name, start, nodes):
        if self.refuse:
            raise SlurmError(self.refuse)
        self.asked.append(("create", name, start, nodes))
        self.hold(name, start, nodes)

    def update_reservation(self, name, nodes):
        self.asked.append(("update", name, nodes))
        self.held[name] = dataclasses.replace(self.held[name], nodelist=",".join(nodes))

    def delete_reservation(self, name):
        self.asked.append(("delete", name))
        del self.held[name]

    def nodes(self, names=None, timeout=0):
        return {n: self.state[n] for n in (names or self.state) if n in self.state}

    def drain(self, name, reason, timeout=0):
        self.asked.append(("drain", name, reason))
        base = self.state[name]
        self.state[name] = dataclasses.replace(base, state=base.base + "+DRAIN", flags=base.flags | {"DRAIN"},
                                               reason=reason)

    def resume(self, name, timeout=0):
        self.asked.append(("resume", name))
        self.state[name] = captured(self.testdata, "idle", name)

    def cancel_reboot(self, name, timeout=0):
        self.asked.append(("cancel_reboot", name))
        base = self.state[name]
        self.state[name] = dataclasses.replace(base, state=base.state.replace("+REBOOT_REQUESTED", ""),
                                               flags=base.flags - {"REBOOT_REQUESTED"})
