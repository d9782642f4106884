"""Lab slots without root or namespaces: names per slot, the lowest free slot, stale claims reclaimed, one lab per
directory, the recorded names used by `down`; and the lab tests' leftover check scoped to its own lab.

The machine is faked: slots.RUN_DIR, network.NETNS_DIR and network.SYS_NET point into tmp_path, and what "lives"
and how remains are removed are passed in (hosts.py passes /proc scans and `ip`)."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest

from fleetctl_lab import hosts, network, slots, state
from fleetctl_lab.state import HostSpec


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A fake machine: /run/fleetctl-lab, /run/netns and /sys/class/net under tmp_path."""
    run, netns, net = tmp_path / "run", tmp_path / "netns", tmp_path / "net"
    netns.mkdir()
    net.mkdir()
    monkeypatch.setattr(slots, "RUN_DIR", run)
    monkeypatch.setattr(network, "NETNS_DIR", netns)
    monkeypatch.setattr(network, "SYS_NET", net)
    monkeypatch.delenv(slots.SLOT_ENV, raising=False)

    class Machine:
        living: set = set()        # lab directories whose supervisors live
        busy: set = set()          # namespaces something runs in
        reclaimed: list = []

        def alive(self, directory, names):
            return directory in self.living or any(n in self.busy for n in names.namespaces())

        def reclaim(self, names):
            self.reclaimed.append(names.slot)
            for ns in names.namespaces():
                (netns / ns).unlink()
            for link in [names.bridge, *names.veths()]:
                (net / link).unlink(missing_ok=True)

        def build(self, names, hosts_=("gpu-a",)):
            """What `up` makes of slot NAMES on the machine."""
            (net / names.bridge).touch()
            for i, h in enumerate(hosts_):
                (netns / names.netns(h)).touch()
                (net / names.veth(i)).touch()

        def claim(self, directory, pinned=None):
            return slots.claim(Path(directory), self.alive, self.reclaim, pinned)

    m = Machine()
    m.living, m.busy, m.reclaimed = set(), set(), []
    return m


# -- names ------------------------------------------------------------------------------------------------------

def test_slot_0_keeps_the_names_of_a_single_lab():
    n = network.names(0)
    assert (n.bridge, n.bridge_address, n.netns("gpu-a"), n.veth(3), n.host_address(0)) == \
        ("flbr0", "10.213.0.1/16", "fl-gpu-a", "flv3", "10.213.0.10")
    assert (network.BRIDGE, network.BRIDGE_ADDRESS, network.NETNS_PREFIX, network.VETH_PREFIX) == \
        ("flbr0", "10.213.0.1/16", "fl-", "flv")


@pytest.mark.parametrize("slot", range(network.SLOTS))
def test_every_slot_has_names_of_its_own_within_ifnamsiz(slot):
    n = network.names(slot)
    assert n.bridge == f"flbr{slot}" and n.bridge_address == f"10.{213 + slot}.0.1/16"
    assert n.host_address(0) == f"10.{213 + slot}.0.10"
    biggest = 65535 - 10 - 1  # the last host address of the /16 before its broadcast address
    assert n.host_address(biggest) == f"10.{213 + slot}.255.254"
    for name in (n.bridge, n.veth(0), n.veth(biggest)):
        assert len(name) <= network.IFNAMSIZ
    others = [network.names(s) for s in range(network.SLOTS) if s != slot]
    for o in others:
        assert not n.is_veth(o.veth(0)) and not n.is_veth(o.veth(12)) and not o.is_veth(n.veth(1))
        assert not n.is_netns(o.netns("gpu-a")) and not o.is_netns(n.netns("gpu-a"))
        assert n.subnet != o.subnet and n.bridge != o.bridge
    with pytest.raises(network.NetworkError):
        n.host_address(biggest + 1)


def test_slots_outside_the_range_are_refused():
    with pytest.raises(network.NetworkError):
        network.names(network.SLOTS)
    for text in ("16", "-1", "x"):
        with pytest.raises(slots.SlotError, match="FLEETCTL_LAB_SLOT"):
            slots.pinned_slot(text)
    assert slots.pinned_slot("") is None and slots.pinned_slot("7") == 7


def test_what_is_on_the_machine_is_read_per_slot(machine, tmp_path):
    machine.build(network.names(0), ("gpu-a", "gpu-b"))
    machine.build(network.names(1), ("gpu-a",))
    machine.build(network.names(10), ("gpu-a",))
    assert network.names(0).namespaces() == ["fl-gpu-a", "fl-gpu-b"]
    assert network.names(0).veths() == ["flv0", "flv1"]
    assert network.names(1).namespaces() == ["fl1-gpu-a"] and network.names(1).veths() == ["fl1v0"]
    assert network.names(10).veths() == ["fl10v0"]
    assert not network.names(2).in_use() and network.names(1).in_use()


# -- claiming ---------------------------------------------------------------------------------------------------

def test_up_claims_the_lowest_free_slot(machine, tmp_path):
    first = machine.claim(tmp_path / "a")
    second = machine.claim(tmp_path / "b")  # while the first is still being built (locked)
    assert (first.slot, second.slot) == (0, 1)
    first.close()
    machine.living.add(tmp_path / "a")      # built: its supervisors keep the slot
    machine.build(first.names)
    third = machine.claim(tmp_path / "c")
    assert third.slot == 2 and machine.reclaimed == []
    assert json.loads(slots.claim_path(2).read_text())["dir"] == str(tmp_path / "c")
    assert slots.slot_of(tmp_path / "c") == 2 and slots.owner_of(0) == tmp_path / "a"


def test_a_released_slot_is_taken_again(machine, tmp_path):
    a = machine.claim(tmp_path / "a")
    b = machine.claim(tmp_path / "b")
    a.release()
    a.close()
    assert slots.claim_path(0).read_text() == ""   # the file stays, empty
    assert machine.claim(tmp_path / "c").slot == 0
    b.close()


def test_a_stale_claim_is_reclaimed_and_only_its_slot_cleaned(machine, tmp_path):
    dead, live = tmp_path / "dead", tmp_path / "live"
    for directory in (live, dead):
        held = machine.claim(directory)
        machine.build(held.names, ("gpu-a", "gpu-b"))
        held.close()
        machine.living.add(directory)
    machine.living.discard(dead)             # slot 0 lives; slot 1's lab was killed with its session
    held = machine.claim(tmp_path / "next")
    assert held.slot == 1 and machine.reclaimed == [1]
    assert network.names(1).namespaces() == [] and not network.link_exists("flbr1")
    assert network.names(0).namespaces() == ["fl-gpu-a", "fl-gpu-b"] and network.link_exists("flbr0")
    assert slots.owner_of(1) == tmp_path / "next"


def test_a_slot_with_processes_in_its_namespaces_is_not_stale(machine, tmp_path):
    held = machine.claim(tmp_path / "a")
    machine.build(held.names)
    held.close()
    machine.busy.add("fl-gpu-a")               # no supervisor, but something still runs in a namespace
    assert machine.claim(tmp_path / "b").slot == 1 and machine.reclaimed == []


def test_names_on_the_machine_without_a_claim(machine, tmp_path):
    """A lab from before slots (flbr0, fl-*, no claim file): taken while something runs in it, remains once not."""
    machine.build(network.names(0))
    machine.busy.add("fl-gpu-a")
    held = machine.claim(tmp_path / "a")
    assert held.slot == 1
    machine.busy.clear()
    assert machine.claim(tmp_path / "b").slot == 0 and machine.reclaimed == [0]


def test_the_same_directory_is_refused(machine, tmp_path):
    a = tmp_path / "a"
    held = machine.claim(a)
    with pytest.raises(slots.SlotError, match="this lab directory is already up .being built"):
        machine.claim(a)
    held.close()
    machine.living.add(a)
    with pytest.raises(slots.SlotError, match="this lab directory is already up .slot 0."):
        machine.claim(a)
    assert machine.claim(tmp_path / "b").slot == 1     # another directory lives beside it


def test_a_stale_claim_of_the_same_directory_is_its_slot_again(machine, tmp_path):
    machine.claim(tmp_path / "x").close()
    machine.living.add(tmp_path / "x")
    machine.claim(tmp_path / "a").close()              # slot 1, then killed (not living)
    assert machine.claim(tmp_path / "a").slot == 1 and machine.reclaimed == [1]


def test_a_pinned_slot(machine, tmp_path, monkeypatch):
    held = machine.claim(tmp_path / "a", pinned=5)
    assert held.slot == 5
    with pytest.raises(slots.SlotError, match="lab slot 5 .FLEETCTL_LAB_SLOT=5. is in use, being built"):
        machine.claim(tmp_path / "b", pinned=5)
    monkeypatch.setenv(slots.SLOT_ENV, "7")
    assert slots.pinned_slot() == 7


def test_every_slot_taken(machine, tmp_path):
    held = [machine.claim(tmp_path / f"l{i}") for i in range(network.SLOTS)]
    assert [h.slot for h in held] == list(range(network.SLOTS))
    with pytest.raises(slots.SlotError, match="every lab slot"):
        machine.claim(tmp_path / "one-too-many")


def test_a_slot_locked_by_another_process_is_skipped(machine, tmp_path):
    """flock is per open file: a second open of the claim file stands for another process's `up` or `down`."""
    slots.RUN_DIR.mkdir(parents=True)
    with open(slots.claim_path(0), "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        assert machine.claim(tmp_path / "a").slot == 1
        with pytest.raises(slots.SlotError, match="stayed locked"):
            slots.lock(0, timeout=0.3)


# -- hosts: plan, down and up with the recorded names -----------------------------------------------------------

def test_plan_records_the_slot_and_every_name(tmp_path):
    lab = hosts.plan([HostSpec("gpu-a"), HostSpec("gpu-b")], tmp_path / "lab", network.names(3))
    assert (lab.slot, lab.bridge, lab.bridge_address) == (3, "flbr3", "10.216.0.1/16")
    assert [(h.netns, h.veth, h.address) for h in lab.hosts] == \
        [("fl3-gpu-a", "fl3v0", "10.216.0.10"), ("fl3-gpu-b", "fl3v1", "10.216.0.11")]
    state.save(lab)
    again = state.load(tmp_path / "lab")
    assert again.slot == 3 and again.hosts[1].netns == "fl3-gpu-b" and again.bridge == "flbr3"


def test_a_lab_json_from_before_slots_is_slot_0(tmp_path):
    lab = hosts.plan([HostSpec("gpu-a")], tmp_path, network.names(0))
    state.save(lab)
    data = json.loads(lab.json_path.read_text())
    del data["slot"]
    lab.json_path.write_text(json.dumps(data))
    assert state.load(tmp_path).slot == 0


@pytest.fixture
def no_root(monkeypatch):
    """hosts' root-only parts recorded instead of run."""
    done = []
    monkeypatch.setattr(hosts, "remove_netns", lambda ns: done.append(("netns", ns)))
    monkeypatch.setattr(network, "delete_link", lambda name: done.append(("link", name)))
    monkeypatch.setattr(hosts, "stop_supervisors", lambda directory, lab: done.append(("stop", directory.name)))
    monkeypatch.setattr(hosts, "unmount_under", lambda directory: None)
    return done


def test_down_removes_its_recorded_names_and_frees_its_slot(machine, tmp_path, no_root):
    other = machine.claim(tmp_path / "other")
    machine.build(other.names, ("gpu-a",))
    other.close()
    machine.living.add(tmp_path / "other")
    held = machine.claim(tmp_path / "lab")
    lab = hosts.plan([HostSpec("gpu-a")], tmp_path / "lab", held.names)
    state.save(lab)
    held.close()
    hosts.down(tmp_path / "lab")
    assert no_root == [("stop", "lab"), ("netns", "fl1-gpu-a"), ("link", "fl1v0"), ("link", "flbr1")]
    assert slots.owner_of(1) is None and slots.owner_of(0) == tmp_path / "other"
    assert not (tmp_path / "lab").exists()
    no_root.clear()
    hosts.down(tmp_path / "lab")        # idempotent: nothing recorded, no slot: nothing of another lab touched
    assert no_root == [("stop", "lab")]


def test_down_of_a_lab_whose_slot_was_reclaimed_leaves_the_new_lab_alone(machine, tmp_path, no_root):
    held = machine.claim(tmp_path / "dead")
    state.save(hosts.plan([HostSpec("gpu-a")], tmp_path / "dead", held.names))
    held.close()
    machine.claim(tmp_path / "new").close()     # slot 0 again: the dead lab's remains were reclaimed
    assert machine.reclaimed == [0] and slots.owner_of(0) == tmp_path / "new"
    hosts.down(tmp_path / "dead")
    assert no_root == [("stop", "dead")] and slots.owner_of(0) == tmp_path / "new"


def test_a_failed_up_tears_down_with_the_claim_it_holds(machine, tmp_path, no_root, monkeypatch):
    monkeypatch.setattr(hosts, "lab_alive", machine.alive)
    monkeypatch.setattr(hosts, "reclaim_remains", machine.reclaim)

    def fail(lab):
        raise hosts.LabError("prepare failed")
    monkeypatch.setattr(hosts, "prepare_files", fail)
    with pytest.raises(hosts.LabError, match="prepare failed"):
        hosts.up([HostSpec("gpu-a")], tmp_path / "lab")
    assert no_root == [("stop", "lab"), ("netns", "fl-gpu-a"), ("link", "flv0"), ("link", "flbr0")]
    assert slots.owner_of(0) is None and list((tmp_path / "lab").iterdir()) == []  # (its repository would stay)


def test_up_refuses_a_directory_that_is_up(machine, tmp_path, monkeypatch):
    state.save(hosts.plan([HostSpec("gpu-a")], tmp_path / "lab", network.names(0)))
    with pytest.raises(hosts.LabError, match="this lab directory is already up"):
        hosts.up([HostSpec("gpu-b")], tmp_path / "lab")


# -- the lab tests' leftover check, scoped to its own lab ----------------------------------------------------------

@pytest.fixture
def leftover_check():
    from tests.helpers import leftovers
    return leftovers


def test_leftover_processes_are_this_labs_only(leftover_check, tmp_path):
    lab = tmp_path / "lab"
    processes = [
        (1, b"python\0-m\0fleetctl_lab.supervisor\0" + str(lab).encode() + b"/hosts/gpu-a\0", "/"),
        (2, b"ssh\0-o\0UserKnownHostsFile=" + str(lab).encode() + b"/ssh/known_hosts\0root@10.213.0.10\0", "/"),
        (3, b"/usr/sbin/sshd\0-D\0", str(lab) + "/hosts/gpu-a/root"),
        (4, b"/usr/sbin/sshd\0-D\0", str(lab) + "/hosts/gpu-b/root (deleted)"),
        (5, b"/usr/sbin/sshd\0-D\0", str(tmp_path / "lab2") + "/hosts/gpu-a/root"),            # another lab's
        (6, b"python\0-m\0fleetctl_lab.supervisor\0" + str(tmp_path / "lab2").encode() + b"/hosts/x\0", "/"),
        (7, b"/usr/sbin/sshd\0-D\0", "/"),                                                       # the machine's
    ]
    assert [pid for pid, _ in leftover_check.processes_of(lab, processes)] == [1, 2, 3, 4]


def test_leftover_mounts_are_under_this_lab_only(leftover_check, tmp_path):
    lab = tmp_path / "lab"
    mounts = (f"overlay {lab}/hosts/a/root overlay rw 0 0\nfl-run {lab}/hosts/a/root/run tmpfs rw 0 0\n"
              f"overlay {tmp_path}/lab2/hosts/a/root overlay rw 0 0\nproc /proc proc rw 0 0\n")
    assert leftover_check.mount_points_under(lab, mounts) == [f"{lab}/hosts/a/root", f"{lab}/hosts/a/root/run"]


def test_leftover_network_is_this_slots_only(leftover_check, machine, tmp_path):
    mine, other = tmp_path / "lab", tmp_path / "other"
    held = machine.claim(other)
    machine.build(held.names, ("gpu-a",))       # slot 0: another lab, up
    held.close()
    machine.living.add(other)
    held = machine.claim(mine)
    machine.build(held.names, ("gpu-a", "gpu-b"))
    lab = hosts.plan([HostSpec("gpu-a"), HostSpec("gpu-b")], mine, held.names)
    held.release()
    held.close()                                 # "down", but its names were left behind
    assert leftover_check.slot_leftovers(mine, lab.slot) == \
        ["netns fl1-gpu-a", "netns fl1-gpu-b", "link flbr1", "link fl1v0", "link fl1v1"]
    assert leftover_check.lab_leftovers(mine, lab) == leftover_check.slot_leftovers(mine, 1)
    machine.reclaim(network.names(1))
    assert leftover_check.lab_leftovers(mine, lab) == []
    # the slot claimed since by another lab, or being built: that lab's names, not ours
    held = machine.claim(tmp_path / "third")
    assert held.slot == 1
    machine.build(held.names)
    assert leftover_check.slot_leftovers(mine, 1) == []
    held.close()
    assert leftover_check.slot_leftovers(mine, 1) == []
