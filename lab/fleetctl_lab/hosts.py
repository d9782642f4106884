"""Lab hosts from the controller's side: up, status, inventory, down (docs/lab.md is the contract).

    lab = up([HostSpec("gpu-a"), HostSpec("gpu-b", driver="570.86.15")])   # $LAB from FLEETCTL_LAB_DIR
    write_inventory(lab)                                                     # done by up as well
    status()                                                                 # one dict per host
    down()                                                                   # idempotent; leaves nothing

Each host is a supervisor process (lab/fleetctl_lab/supervisor.py) in the host's network namespace fl-<name>, with
mount, UTS and PID namespaces of its own. The controller only claims a slot, writes the host's directory, builds the
network, starts the supervisors (all at once) and waits for every host's sshd to answer on the bridge.

Several labs (each its own $LAB) live side by side, each in a slot of its own (slots.py): slot 0 has the names a
single lab always had (flbr0, 10.213.0.0/16, fl-<name>, flv<i>), slot n flbr<n>, 10.<213+n>.0.0/16, fl<n>-<name>,
fl<n>v<i>. lab.json records the slot and every name; everything after `up` uses the recorded names.

Rebooting a host: `reboot`, `shutdown -r ...` inside it, or ansible.builtin.reboot with its defaults (no setting
needed: it runs `shutdown -r 0 "Reboot initiated by Ansible"` and waits for /proc/sys/kernel/random/boot_id to
change). While down (supervisor.py: 0.7 s + faults.conf slow_reboot) the address refuses connections.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fleetctl_lab
import orchestrator
from orchestrator.errors import OperationError
from . import debian, network, prometheus, slots, slurm, state
from .skus import DOMAIN_CLIQUE, SKUS, domain_cluster_uuid
from .state import HostRecord, HostSpec, Lab

__all__ = ["HostSpec", "Lab", "LabError", "up", "down", "status", "write_inventory"]

SUPERVISOR_MODULE = "fleetctl_lab.supervisor"
UP_TIMEOUT_S = 90.0
INSTALL_TIMEOUT_S = 600.0      # apt-get inside every host at once, on a small machine
STOP_TIMEOUT_S = 5.0
SLOT_LOCK_TIMEOUT_S = INSTALL_TIMEOUT_S + UP_TIMEOUT_S + 60.0  # a `down` waits for an `up` building in its slot
DGX_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")  # where an HGX board's 8 GPUs sit


class LabError(OperationError):
    """The lab could not be built or torn down."""


# -- up ------------------------------------------------------------------------------------------------------

def up(specs: list[HostSpec], lab_dir: str | os.PathLike | None = None, timeout: float | None = None,
       slot: int | None = None, with_slurm: bool = False, with_prometheus: bool = False) -> Lab:
    """Build and boot the hosts of SPECS in a slot of their own (SLOT, else $FLEETCTL_LAB_SLOT, else the lowest free
    one); return the lab once every host's sshd answers. WITH_SLURM: a Slurm cluster over the hosts (slurm.py),
    its controller started before the hosts boot. WITH_PROMETHEUS: a DCGM exporter in every host (exporter.py) and
    a Prometheus scraping them (prometheus.py), started once the hosts are up. On failure, nothing stays up (the apt
    repository is kept)."""
    directory = state.lab_dir(lab_dir)
    check_specs(specs)
    refuse_directory_up(directory)
    try:
        claim = slots.claim(directory, lab_alive, reclaim_remains,
                            pinned=slots.pinned_slot() if slot is None else slots.pinned_slot(slot))
    except slots.SlotError as e:
        raise LabError(str(e)) from None
    try:
        lab = plan(specs, directory, claim.names, with_slurm, with_prometheus)
        return build(lab, specs, timeout, claim)
    finally:
        claim.close()  # unlocked: from now on its supervisors keep the slot taken, until `down` releases it


def build(lab: Lab, specs: list[HostSpec], timeout: float | None, claim: slots.Claim) -> Lab:
    directory = lab.dir
    try:
        state.save(lab)  # first of all: the slot and names are recorded before anything of them exists
        prepare_files(lab)
        with slots.machine_wide():  # not the slot's lock: this process holds that one already
            network.create_bridge(lab.bridge, lab.bridge_address)
            network.create_hosts(lab.bridge, [(h.netns, h.veth, h.address) for h in lab.hosts])
        if lab.slurm:
            start_slurm(lab)
        start_supervisors(lab)
        state.save(lab)
        wait_up(lab, timeout or (INSTALL_TIMEOUT_S if any(s.driver for s in specs) else UP_TIMEOUT_S))
        state.save(lab)
        write_inventory(lab)
        if lab.prometheus is not None:
            prometheus.start(lab)
    except BaseException:
        down(directory, keep_repo=True, claim=claim)
        raise
    return lab


def check_specs(specs: list[HostSpec]) -> None:
    if not specs:
        raise LabError("no hosts to bring up")
    names = [s.name for s in specs]
    for spec in specs:
        if not state.HOST_NAME_RE.match(spec.name):
            raise LabError(f"host name {spec.name!r}: use lower-case letters, digits and '-' (32 characters at most)")
        if spec.sku not in SKUS:
            raise LabError(f"host {spec.name}: unknown SKU {spec.sku!r} (known: {', '.join(sorted(SKUS))})")
        if spec.gpus is not None and not 0 <= spec.gpus <= 64:
            raise LabError(f"host {spec.name}: gpus must be between 0 and 64")
        if spec.domain is not None and not (state.DOMAIN_NAME_RE.match(spec.domain) and SKUS[spec.sku].rack_scale
                                            and spec.packaging != "debian"):
            raise LabError(f"host {spec.name}: NVLink domain {spec.domain!r} needs a rack-scale SKU (not "
                           f"{spec.sku}), the lab's packages (deb or rpm) and a name of lower-case letters, digits "
                           "and '-'")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise LabError(f"duplicate host names: {', '.join(duplicates)}")


def refuse_directory_up(directory: Path) -> None:
    """One lab per lab directory (labs in other directories live beside it, each in its own slot). A second `up`
    of the same directory while its first is being built is refused by its slot's claim (slots.claim)."""
    if (directory / "lab.json").exists():
        raise LabError(f"this lab directory is already up: {directory} (its lab.json is there): run `fleetctl lab "
                       "down` first")


def lab_alive(directory: Path | None, names: network.Names) -> bool:
    """Anything of a lab still runs: a supervisor of the lab in DIRECTORY, or any process in a namespace of its
    slot (NAMES). A lab that is neither (its test run or its machine's session was killed) is remains."""
    hosts_dir = directory / "hosts" if directory is not None else None
    if hosts_dir is not None and any(is_supervisor(int(e.name), hosts_dir) for e in Path("/proc").iterdir()
                                     if e.name.isdigit()):
        return True
    return any(network.netns_pids(ns) for ns in names.namespaces())


def reclaim_remains(names: network.Names) -> None:
    """Namespaces, veths, the bridge and the Slurm controller of slot NAMES' dead lab (its files are wherever that
    lab was): only that slot's, never another lab's."""
    namespaces = names.namespaces()
    for ns in namespaces:
        remove_netns(ns)
    remove_slot_links(names)
    owner = slots.owner_of(names.slot)  # the dead lab's directory, when its claim names one
    slurm.stop_controller(owner / "slurm" if owner else None, slurm_run_dir(names.slot))
    if owner:
        prometheus.stop(owner)
    print(f"fleetctl lab: removed the remains of a dead lab ({', '.join(namespaces) or names.bridge})",
          file=sys.stderr)


def plan(specs: list[HostSpec], directory: Path, names: network.Names, with_slurm: bool = False,
         with_prometheus: bool = False) -> Lab:
    hosts = [HostRecord(spec, i, names.host_address(i), names.netns(spec.name), names.veth(i))
             for i, spec in enumerate(specs)]
    return Lab(directory, names.bridge, names.bridge_address, hosts, names.slot, with_slurm,
               prometheus.free_port() if with_prometheus else None)


# -- Slurm (slurm.py) ----------------------------------------------------------------------------------------

def slurm_run_dir(slot: int) -> Path:
    """Slot SLOT's Slurm runtime directory: the machine's on the controller, each host's own /run inside it."""
    return slots.run_dir() / f"slurm-{slot}"


def slurm_cluster(lab: Lab) -> slurm.Cluster:
    """LAB's Slurm cluster: a node per host with the host's GPUs."""
    return slurm.Cluster(lab.slurm_dir, slurm_run_dir(lab.slot), lab.slot, lab.bridge_address.split("/")[0],
                         tuple(slurm.Node(h.name, h.address, gpu_count(h)) for h in lab.hosts))


def start_slurm(lab: Lab) -> None:
    cluster = slurm_cluster(lab)
    cluster.write_files()
    try:
        cluster.start_controller()
    except slurm.SlurmError as e:
        raise LabError(str(e)) from None


def prepare_files(lab: Lab) -> None:
    """$LAB: the apt repository index, the client key, and per host its directory (hardware, host key, config)."""
    lab.dir.mkdir(parents=True, exist_ok=True)
    lab.dir.chmod(0o755)
    ensure_repo(lab.repo)
    lab.ssh_dir.mkdir(mode=0o700, exist_ok=True)
    if not lab.client_key.exists():
        keygen(lab.client_key, "fleetctl-lab-client")
    with ThreadPoolExecutor(max_workers=8) as pool:
        host_keys = list(pool.map(lambda h: prepare_host_dir(lab, h), lab.hosts))
    lab.known_hosts.write_text("".join(f"{h.address} {key}\n" for h, key in zip(lab.hosts, host_keys)))


def ensure_repo(repo: Path) -> None:
    """An apt repository that apt-get update accepts, empty unless packages.build_repo filled it."""
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / "Packages").exists():
        (repo / "Packages").write_text("")


def keygen(path: Path, comment: str) -> str:
    """A new ed25519 key at PATH; its public key as "type base64"."""
    for old in (path, path.with_name(path.name + ".pub")):
        old.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


def prepare_host_dir(lab: Lab, host: HostRecord) -> str:
    """hw/ (gpus.conf, faults.conf), kernel/, control/, the host key and host.json; returns the host's public key."""
    hostdir = lab.host_dir(host.name)
    for sub in ("hw", "kernel", "control", "root"):
        (hostdir / sub).mkdir(parents=True, exist_ok=True)
    (hostdir / "hw" / "gpus.conf").write_text(gpus_conf(host))
    faults = hostdir / "hw" / "faults.conf"
    if not faults.exists():
        faults.write_text("# injected faults (docs/lab.md): throughput.<version>=F, install_fail=V, slow_reboot=S\n")
    host_key = keygen(hostdir / "ssh_host_ed25519_key", f"root@{host.name}")
    (hostdir / "host.json").write_text(json.dumps({
        "name": host.name, "address": host.address, "lab_dir": str(lab.dir),
        "client_pub": str(lab.client_key) + ".pub", "driver": host.spec.driver, "nouveau": host.spec.nouveau,
        "persistence_off": host.spec.persistence_off, "nvswitch": SKUS[host.spec.sku].nvswitch,
        "packaging": host.spec.packaging, "domain": host.spec.domain,
        # IMEX's node list (/etc/nvidia-imex/nodes_config.cfg): the addresses of the trays of the host's domain
        "imex_nodes": [h.address for h in lab.hosts if h.spec.domain == host.spec.domain] if host.spec.domain else None,
        "slurm": {"conf_dir": str(lab.slurm_dir), "run_dir": str(slurm_run_dir(lab.slot))} if lab.slurm else None,
        "exporter": lab.prometheus is not None,  # a DCGM exporter at every boot (exporter.py)
        "debian_mirror": str(debian.mirror_dir()) if host.spec.packaging == "debian" else None}, indent=2) + "\n")
    return host_key


def gpus_conf(host: HostRecord) -> str:
    """The host's GPUs (docs/lab.md: gpus.conf): the SKU's figures, unique UUIDs and serials, healthy."""
    sku = SKUS[host.spec.sku]
    count = gpu_count(host)
    lines = [f"# {host.name}: emulated hardware, written by `fleetctl lab up`", f"sku={sku.key}", f"count={count}"]
    for i in range(count):
        bus = DGX_BUS_IDS[i] if i < len(DGX_BUS_IDS) else f"{0xe0 + i - len(DGX_BUS_IDS):02x}"
        values = {
            "name": sku.name, "uuid": f"GPU-{uuid.uuid4()}", "serial": f"1652822{host.index:03d}{i:03d}",
            "pci": f"00000000:{bus}:00.0", "vbios": sku.vbios, "inforom": sku.inforom,
            "persistence": 0 if host.spec.persistence_off else 1,
            "ecc": 1, "ecc_pending": 1, "ecc_unc_volatile": 0, "ecc_unc_aggregate": 0, "remap_corr": 0,
            "remap_unc": 0, "remap_pending": 0, "remap_failure": 0, "mig": 0, "pcie_gen": sku.pcie_gen,
            "pcie_gen_max": sku.pcie_gen, "pcie_width": sku.pcie_width, "pcie_width_max": sku.pcie_width,
            "temp": 32 + (host.index + i) % 5, "power_mw": sku.power_idle_mw, "clock_events": 1,
            "recovery_action": 0, "lost": 0, "pcie_replays": 0, "mem_used_mib": 0,
        }
        lines += [f"gpu.{i}.{key}={value}" for key, value in values.items()]
    if host.spec.domain:  # a tray of a multi-node NVLink domain (docs/lab.md: NVLink domains and IMEX)
        lines += [f"fabric.domain={host.spec.domain}", f"fabric.cluster_uuid={domain_cluster_uuid(host.spec.domain)}",
                  f"fabric.clique_id={DOMAIN_CLIQUE}"]
    if sku.ib_ports:  # the board's HCAs (docs/lab.md: /sys/class/infiniband)
        lines += [f"ib.count={sku.ib_ports}", f"ib.width={sku.ib_width}", f"ib.speed={sku.ib_speed}"]
    return "\n".join(lines) + "\n"


def gpu_count(host: HostRecord) -> int:
    return SKUS[host.spec.sku].gpus if host.spec.gpus is None else host.spec.gpus


def supervisor_command(host: HostRecord, hostdir: Path) -> list[str]:
    return ["setsid", "--fork", "ip", "netns", "exec", host.netns,
            "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--propagation", "private",
            sys.executable, "-m", SUPERVISOR_MODULE, str(hostdir)]


def supervisor_env() -> dict[str, str]:
    """The caller's environment, with this fleetctl_lab package and the orchestrator package it uses (a checkout's
    or the installed ones) importable."""
    roots = list(dict.fromkeys(str(Path(m.__file__).resolve().parents[1]) for m in (fleetctl_lab, orchestrator)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(roots + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def start_supervisors(lab: Lab) -> None:
    """Start every host's supervisor, detached (new session, reparented away from the caller)."""
    env = supervisor_env()
    for host in lab.hosts:
        hostdir = lab.host_dir(host.name)
        with open(hostdir / "supervisor.log", "ab") as logfile:
            subprocess.run(supervisor_command(host, hostdir), env=env, cwd="/", stdin=subprocess.DEVNULL,
                           stdout=logfile, stderr=subprocess.STDOUT, check=True, timeout=30)


def wait_up(lab: Lab, timeout: float) -> None:
    """Until every host reports `up` and answers SSH on the bridge; LabError naming the hosts that did not."""
    deadline = time.monotonic() + timeout
    waiting = {h.name: h for h in lab.hosts}
    while waiting and time.monotonic() < deadline:
        for name, host in list(waiting.items()):
            host_state = read_state(lab, name)
            if host_state.get("phase") == "failed":
                raise LabError(f"lab host {name} failed to come up: {host_state.get('error')} "
                               f"(log: {lab.host_dir(name) / 'supervisor.log'})")
            if host.supervisor_pid is None:
                host.supervisor_pid = read_pid(lab.host_dir(name) / "supervisor.pid")
            if host_state.get("phase") == "up":
                del waiting[name]
        time.sleep(0.05)
    if waiting:
        raise LabError(f"lab hosts not up within {timeout:.0f} s: {', '.join(sorted(waiting))}")
    with ThreadPoolExecutor(max_workers=min(32, len(lab.hosts))) as pool:
        unreachable = [h.name for h, ok in zip(lab.hosts, pool.map(lambda h: ssh_answers(h.address), lab.hosts))
                       if not ok]
    if unreachable:
        raise LabError(f"lab hosts up but not answering SSH from the controller: {', '.join(unreachable)}")


def ssh_answers(address: str, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def read_state(lab: Lab, name: str) -> dict:
    try:
        return json.loads((lab.host_dir(name) / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# -- inventory -----------------------------------------------------------------------------------------------

def write_inventory(lab: Lab) -> Path:
    """$LAB/inventory.ini: a real Ansible INI inventory, one group per SKU, host key checking on."""
    ssh_args = f"-o UserKnownHostsFile={lab.known_hosts} -o IdentitiesOnly=yes"
    lines = ["# fleetctl lab inventory (written by `fleetctl lab up`)"]
    for sku in sorted({h.spec.sku for h in lab.hosts}):
        lines.append(f"\n[{sku.replace('-', '_')}]")
        for h in (h for h in lab.hosts if h.spec.sku == sku):
            lines.append(" ".join([
                h.name, f"ansible_host={h.address}", "ansible_user=root",
                f"ansible_ssh_private_key_file={lab.client_key}",
                f"ansible_ssh_common_args={shlex.quote(ssh_args)}",
                "ansible_python_interpreter=/usr/bin/python3"]))
    # The lab's GPUs are emulated: their throughput comes from the lab's benchmark, run as a canary command.
    lines += ["", "[all:vars]", "gpu_probe_engine=command", "gpu_probe_command=nvidia-lab-bench"]
    lab.inventory.write_text("\n".join(lines) + "\n")
    return lab.inventory


# -- status --------------------------------------------------------------------------------------------------

def status(lab_dir: str | os.PathLike | None = None) -> list[dict]:
    """One dict per recorded host: name, sku, address, running, phase, ssh, driver (spec), module_version
    (loaded), nouveau_loaded, boot_id, booted_at, supervisor_pid. Empty when no lab is recorded."""
    lab = state.load(lab_dir)
    if lab is None:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(lab.hosts) or 1)) as pool:
        return list(pool.map(lambda h: host_status(lab, h), lab.hosts))


def host_status(lab: Lab, host: HostRecord) -> dict:
    hostdir = lab.host_dir(host.name)
    kernel = hostdir / "kernel"
    pid = read_pid(hostdir / "supervisor.pid") or host.supervisor_pid
    alive = pid is not None and is_supervisor(pid, hostdir)
    host_state = read_state(lab, host.name)
    ssh = alive and ssh_answers(host.address, timeout=1.0)
    return {
        "name": host.name, "sku": host.spec.sku, "address": host.address, "netns": host.netns,
        "running": alive and host_state.get("phase") == "up" and ssh, "phase": host_state.get("phase") if alive else "dead",
        "ssh": ssh, "driver": host.spec.driver, "module_version": read_text(kernel / "sys-module/nvidia/version"),
        "nouveau_loaded": (kernel / "sys-module/nouveau").is_dir(), "boot_id": read_text(kernel / "boot_id"),
        "booted_at": float(read_text(kernel / "booted_at") or 0) or None, "boots": host_state.get("boots"),
        "supervisor_pid": pid if alive else None,
    }


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


# -- down ----------------------------------------------------------------------------------------------------

def down(lab_dir: str | os.PathLike | None = None, keep_repo: bool = False, claim: slots.Claim | None = None) -> None:
    """Remove everything the lab made: processes, namespaces, veths, the bridge, mounts, its slot's claim, and $LAB
    (its apt repository too, unless KEEP_REPO). Idempotent; also cleans up after dead supervisors and half-built
    labs. Only the names recorded in lab.json (or, for a lab that got no further than its claim, its slot's) are
    touched, and only while its slot is this lab's: other labs on the machine are left alone. CLAIM: the slot,
    already locked by this process (an `up` that failed)."""
    directory = state.lab_dir(lab_dir)
    lab = state.load(directory)
    slot = lab.slot if lab else (claim.slot if claim else slots.slot_of(directory))
    if slot is not None and claim is None and slots.owner_of(slot) not in (directory, None):
        slot = None  # reclaimed by another lab once ours was dead: our remains went then; its names are its own
    held = claim or (lock_slot(slot) if slot is not None else None)  # waits while an `up` builds in the slot
    try:
        prometheus.stop(directory)
        stop_supervisors(directory, lab)
        ours = held is not None and held.owner in (directory, None)
        slurm.stop_controller(directory / "slurm", slurm_run_dir(held.slot) if ours else None)
        if ours:
            remove_network(directory, lab, network.names(held.slot))
            if held.owner == directory:
                held.release()
    finally:
        if held is not None and held is not claim:
            held.close()
    unmount_under(directory)
    remove_files(directory, keep_repo)


def lock_slot(slot: int) -> slots.Claim:
    try:
        return slots.lock(slot, SLOT_LOCK_TIMEOUT_S)
    except slots.SlotError as e:
        raise LabError(str(e)) from None


def remove_network(directory: Path, lab: Lab | None, names: network.Names) -> None:
    """The lab's namespaces and veths (as recorded; else the slot's names of the hosts it has directories for),
    then its slot's bridge once no namespace of the slot is left."""
    if lab:
        namespaces, veths = [h.netns for h in lab.hosts], [h.veth for h in lab.hosts]
    else:
        hosts_dir = directory / "hosts"
        namespaces = [names.netns(p.name) for p in hosts_dir.iterdir() if p.is_dir()] if hosts_dir.is_dir() else []
        veths = []
    for ns in sorted(namespaces):
        remove_netns(ns)
    for veth in veths:
        network.delete_link(veth)
    bridge = lab.bridge if lab else names.bridge
    if not names.namespaces():
        remove_slot_links(names, bridge)


def supervisor_pids(directory: Path, lab: Lab | None) -> list[int]:
    """Live supervisors (and their unshare parents) of the lab in DIRECTORY: recorded, or found by command line."""
    hosts_dir = directory / "hosts"
    candidates = {h.supervisor_pid for h in lab.hosts if h.supervisor_pid} if lab else set()
    if hosts_dir.is_dir():
        candidates |= {pid for p in hosts_dir.iterdir() if (pid := read_pid(p / "supervisor.pid"))}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            candidates.add(int(entry.name))
    return sorted(pid for pid in candidates if is_supervisor(pid, hosts_dir))


def is_supervisor(pid: int, under: Path | None = None) -> bool:
    """PID runs the lab supervisor (for a host directory at or below UNDER: guards against reused pids)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if SUPERVISOR_MODULE.encode() not in argv:
        return False
    if under is None:
        return True
    prefix = str(under).encode()
    return any(a == prefix or a.startswith(prefix + b"/") for a in argv)


def stop_supervisors(directory: Path, lab: Lab | None) -> None:
    """SIGTERM the supervisors (each kills its host's processes), then SIGKILL what is left: a PID namespace's
    init dying takes every process of the host with it."""
    pids = supervisor_pids(directory, lab)
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and (pids := [p for p in pids if is_supervisor(p, directory / "hosts")]):
        time.sleep(0.05)
    signal_all(pids, signal.SIGKILL)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(is_supervisor(p, directory / "hosts") for p in pids):
        time.sleep(0.05)


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def remove_slot_links(names: network.Names, bridge: str | None = None) -> None:
    """The slot's bridge (BRIDGE: as recorded) and any stray veth of the slot: gone with its last host namespace."""
    for veth in names.veths():
        network.delete_link(veth)
    network.delete_link(bridge or names.bridge)


def remove_netns(ns: str) -> None:
    """Kill whatever still runs in NS, then delete it (its veth pair goes with it)."""
    if ns not in network.netns_list():
        return
    for _ in range(50):
        pids = network.netns_pids(ns)
        if not pids:
            break
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.05)
    network.delete_netns(ns)


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below DIRECTORY in this mount namespace, deepest first."""
    prefix = str(directory)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # \040 etc.
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def unmount_under(directory: Path) -> None:
    for point in mounts_under(directory):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


def remove_files(directory: Path, keep_repo: bool) -> None:
    if not directory.exists():
        return
    if mounts_under(directory):  # never delete through a mount into the machine's own files
        raise LabError(f"cannot remove {directory}: still mounted there: {', '.join(mounts_under(directory))}")
    if not keep_repo:
        shutil.rmtree(directory)
        return
    for entry in directory.iterdir():
        if entry.name == "repo":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
