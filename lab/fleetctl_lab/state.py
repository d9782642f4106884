"""The lab's record on the controller: where it lives ($LAB) and lab.json (slot, bridge, hosts, addresses, specs,
pids). `down`, `status`, `inject` and `reboot` use the names recorded here, never names computed again."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_LAB_DIR = Path("/var/lib/fleetctl-lab")
LAB_ENV = "FLEETCTL_LAB_DIR"
HOST_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
DOMAIN_NAME_RE = HOST_NAME_RE  # an NVLink domain's name (+domain=NAME)


def lab_dir(path: str | os.PathLike | None = None) -> Path:
    """$LAB: PATH if given, else $FLEETCTL_LAB_DIR, else /var/lib/fleetctl-lab (always absolute)."""
    return Path(path or os.environ.get(LAB_ENV) or DEFAULT_LAB_DIR).resolve()


@dataclass(frozen=True)
class HostSpec:
    """What one lab host should be. nouveau=True: nouveau is not blacklisted (the drift a fresh install has)."""
    name: str
    sku: str = "h100-sxm"
    gpus: int | None = None        # None: the SKU's default count
    driver: str | None = None      # e.g. "570.86.15": installed from the lab repo before the first boot
    nouveau: bool = True
    persistence_off: bool = False
    packaging: str = "deb"         # "rpm": an Enterprise-Linux-style host (rpm, dnf, dnf versionlock; no apt);
                                   # "debian": the driver from Debian's own packages (lab/fleetctl_lab/debian.py)
    domain: str | None = None      # a rack-scale tray's multi-node NVLink domain (docs/lab.md): its GPUs' fabric
                                   # cluster and clique, and IMEX over the domain's trays

    @property
    def branch(self) -> str | None:
        return self.driver.split(".", 1)[0] if self.driver else None


@dataclass
class HostRecord:
    spec: HostSpec
    index: int
    address: str
    netns: str
    veth: str                      # root-namespace end of the host's veth pair
    supervisor_pid: int | None = None

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class Lab:
    dir: Path
    bridge: str
    bridge_address: str
    hosts: list[HostRecord] = field(default_factory=list)
    slot: int = 0                  # the lab's slot (slots.py): its bridge, subnet, namespace and veth names
    slurm: bool = False            # a Slurm cluster over the hosts (slurm.py): slurmctld here, slurmd in each host
    prometheus: int | None = None  # the port (127.0.0.1) of the lab's Prometheus (prometheus.py), scraping a DCGM
                                   # exporter in each host (exporter.py); None: none (no --prometheus)

    # paths (docs/lab.md)
    @property
    def json_path(self) -> Path:
        return self.dir / "lab.json"

    @property
    def repo(self) -> Path:
        return self.dir / "repo"

    @property
    def ssh_dir(self) -> Path:
        return self.dir / "ssh"

    @property
    def client_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def slurm_dir(self) -> Path:
        return self.dir / "slurm"

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.ini"

    def host_dir(self, name: str) -> Path:
        return self.dir / "hosts" / name

    def host(self, name: str) -> HostRecord:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no lab host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")


def save(lab: Lab) -> None:
    """Write lab.json atomically."""
    data = {"slot": lab.slot, "slurm": lab.slurm, "prometheus": lab.prometheus, "bridge": lab.bridge, "bridge_address": lab.bridge_address,
            "hosts": [dict(asdict(h), spec=asdict(h.spec)) for h in lab.hosts]}
    lab.dir.mkdir(parents=True, exist_ok=True)
    tmp = lab.json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(lab.json_path)


def load(path: str | os.PathLike | None = None) -> Lab | None:
    """The lab recorded in $LAB/lab.json, or None when there is none (or it cannot be read)."""
    directory = lab_dir(path)
    try:
        data = json.loads((directory / "lab.json").read_text())
    except (OSError, ValueError):
        return None
    hosts = [HostRecord(**dict(h, spec=HostSpec(**h["spec"]))) for h in data.get("hosts", [])]
    slot = data.get("slot")
    if slot is None:  # a lab.json from before slots: its bridge says which (flbr0: slot 0)
        slot = int(data["bridge"][4:]) if re.fullmatch(r"flbr\d+", data["bridge"]) else 0
    return Lab(directory, data["bridge"], data["bridge_address"], hosts, int(slot), bool(data.get("slurm")),
               data.get("prometheus"))
