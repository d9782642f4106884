"""What must be gone after a lab's `down`, and nothing of another lab: its slot's namespaces and links, its mounts,
processes and directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fleetctl_lab import hosts, network, slots, state
from fleetctl_lab.state import Lab


def lab_leftovers(directory: Path, lab: Lab | int | None = None) -> list[str]:
    """Everything of the lab in DIRECTORY that is still on the machine, and nothing of another lab (several labs run
    at once, one per xdist worker and slot): its slot's namespaces, veths, bridge and Slurm runtime directory, mounts
    at or under DIRECTORY, processes mentioning DIRECTORY or whose root is under it (a Slurm lab's slurmctld and
    munged name $LAB/slurm), DIRECTORY itself. LAB: the lab as `up` returned it
    (or its slot), taken before `down` (which removes lab.json and frees the slot); without it, lab.json's or the
    slot claim's, when still there."""
    directory = Path(directory)
    found = slot_leftovers(directory, lab_slot(directory, lab))
    found += [f"mount {point}" for point in mount_points_under(directory, Path("/proc/mounts").read_text())]
    found += [f"process {pid}: {command}" for pid, command in processes_of(directory, machine_processes())]
    if directory.exists():
        found.append(f"directory {directory}")
    return found


def lab_slot(directory: Path, lab: Lab | int | None) -> int:
    if isinstance(lab, int):
        return lab
    if lab is None:
        lab = state.load(directory)
    slot = lab.slot if lab is not None else slots.slot_of(directory)
    if slot is None:
        raise AssertionError(f"lab_leftovers: which slot had the lab in {directory}? Pass the lab `up` returned")
    return slot


def slot_leftovers(directory: Path, slot: int) -> list[str]:
    """The namespaces, veths and bridge of SLOT, checked with the slot locked so that no other lab claims it
    meanwhile. A slot another lab holds (claimed since, or being built: its lock is taken) has that lab's names:
    not ours to report (its `up` removed any remains of ours when it claimed the slot)."""
    names = network.names(slot)
    handle = slots._open(slot)
    try:
        if not slots._try_lock(handle):
            return []
        if slots.read_owner(handle) not in (None, directory):
            return []
        found = [f"netns {n}" for n in names.namespaces()]
        found += [f"link {name}" for name in [names.bridge, *names.veths()] if network.link_exists(name)]
        if hosts.slurm_run_dir(slot).exists():  # the Slurm controller's socket and pid files
            found.append(f"directory {hosts.slurm_run_dir(slot)}")
        return found
    finally:
        handle.close()


def under(path: str, directory: Path) -> bool:
    return path == str(directory) or path.startswith(str(directory).rstrip("/") + "/")


def mount_points_under(directory: Path, mounts: str) -> list[str]:
    """Mount points (of /proc/mounts' text MOUNTS) at or under DIRECTORY: the lab's own tmpfs (fl-layers, fl-run,
    fl-tmp, fl-lab) and overlays are mounted under its host directories, so a leaked one shows there."""
    points = [line.split()[1].encode().decode("unicode_escape") for line in mounts.splitlines() if line.strip()]
    return [p for p in points if under(p, directory)]


def machine_processes():
    """(pid, command line (NUL-separated), root) of every process on the machine that can be read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            root = os.readlink(entry / "root")
        except OSError:
            continue
        yield int(entry.name), cmdline, root


def processes_of(directory: Path, processes) -> list[tuple[int, str]]:
    """(pid, command) of PROCESSES ((pid, cmdline, root)) of the lab in DIRECTORY: a command line naming DIRECTORY
    anywhere (supervisors, unshare, ip netns exec, ssh -o UserKnownHostsFile=..., overlay options...), or a root at
    or under it (whatever runs inside a host: sshd, daemons, sessions). Another lab's processes name their own
    directory: /x/lab is not named by /x/lab2/... (the name must end there)."""
    naming = re.compile(re.escape(str(directory).rstrip("/").encode()) + rb"(?=[/\0,:;=\s'\"]|$)")
    return [(pid, cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]) for pid, cmdline, root in processes
            if under(root, directory) or naming.search(cmdline)]
