"""One lab host's "hardware": `python -m fleetctl_lab.supervisor HOSTDIR` (see docs/lab.md).

Started by hosts.up as `ip netns exec fl-<name> unshare --mount --uts --pid --fork --kill-child --propagation private
python -m fleetctl_lab.supervisor HOSTDIR`, so it is PID 1 of the host's PID namespace (the host's `ps` and
/proc show only the host's processes; killing the supervisor kills the whole host) and owns a private mount
namespace (every mount below disappears with it). It mounts the host's root (overlay over /), the emulated kernel
files, then boots: kernel state, nvidia-persistenced, sshd. A reboot request from the host's shutdown/reboot shims
kills every process of the host and boots again; the hardware (hw/) and the root's changes (dpkg state) survive.

Standard library only: it runs before and beside everything else.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from . import debian
from .conf import read_conf
from .faults import apply_link_faults, xid_line
from .kernel import STACK, Modules, append_kmsg, load_messages

HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_ENV = {"PATH": HOST_PATH, "LANG": "C.UTF-8", "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive"}
POLL_S = 0.1
REBOOT_GRACE_S = 1.0        # the shim's command returns to its caller before the host goes down
SSHD_START_TIMEOUT_S = 20.0
MODULE_FILE = "usr/lib/nvidia-lab/modules/nvidia.version"
PERSISTENCED = "usr/bin/nvidia-persistenced"
PERSISTENCED_UNIT = "nvidia-persistenced.service"
FABRICMANAGER = "usr/bin/nv-fabricmanager"
FABRICMANAGER_UNIT = "nvidia-fabricmanager.service"
UNITS = {PERSISTENCED_UNIT: PERSISTENCED, FABRICMANAGER_UNIT: FABRICMANAGER}  # what the systemctl shim can manage
REQUEST_TIMEOUT_S = 60
LAB_SYSTEM = "fleetctl-lab-system"  # an rpm host's first package (lab/fleetctl_lab/packages.py)
GPU_EMULATION = "fleetctl-lab-gpu"  # the emulated GPUs beside a +debian host's real driver packages (packages.py)
EL_RELEASEVER = "9"
APT_TOOLS = ("usr/bin/apt-get", "usr/bin/apt", "usr/bin/apt-cache", "usr/bin/apt-mark")  # gone from an rpm host
PCI_DEVICE_IDS = {"h100-sxm": "0x2330", "h200-sxm": "0x2335", "a100-sxm": "0x20b2", "a100-pcie": "0x20b5",
                  "l40s": "0x26b9"}
PCIE_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}

SHUTDOWN_SHIM = """#!/bin/sh
# fleetctl lab shim: a lab host cannot power itself off; `shutdown -r ...` asks the lab supervisor for a reboot.
reboot=0; cancel=0
for arg in "$@"; do
  case "$arg" in
    -r|--reboot) reboot=1 ;;
    -c) cancel=1 ;;
  esac
done
[ "$cancel" = 1 ] && exit 0
if [ "$reboot" != 1 ]; then
  echo "shutdown: the fleetctl lab emulates reboots only (use shutdown -r)" >&2
  exit 1
fi
printf '%s\\n' "shutdown $*" > /run/nvidia-lab/control/reboot.tmp && mv /run/nvidia-lab/control/reboot.tmp /run/nvidia-lab/control/reboot
echo "Reboot scheduled (fleetctl lab)."
exit 0
"""

REBOOT_SHIM = """#!/bin/sh
# fleetctl lab shim: the lab supervisor (the host's "hardware") performs the reboot.
printf '%s\\n' "reboot $*" > /run/nvidia-lab/control/reboot.tmp && mv /run/nvidia-lab/control/reboot.tmp /run/nvidia-lab/control/reboot
exit 0
"""


# modprobe, rmmod and systemctl of a lab host: the supervisor (the host's kernel and init) answers them.
REQUEST_SHIM = """#!/usr/bin/python3
# fleetctl lab shim: the lab supervisor answers this command (it is the host's kernel and init).
import json, os, sys, time
control = "/run/nvidia-lab/control"
argv = [os.path.basename(sys.argv[0])] + sys.argv[1:]
if not os.path.exists(control + "/serving"):
    sys.stderr.write("System has not been booted with systemd as init system (PID 1). Can't operate.\\n"
                     if argv[0] == "systemctl" else "%s: the lab host is not up\\n" % argv[0])
    sys.exit(1)
base = "%s/request.%d.%d" % (control, os.getpid(), time.monotonic_ns())
with open(base + ".tmp", "w") as f:
    json.dump(argv, f)
os.rename(base + ".tmp", base + ".req")
deadline = time.monotonic() + @TIMEOUT@
while not os.path.exists(base + ".done"):
    if time.monotonic() > deadline:
        sys.stderr.write("%s: no answer from the lab host's supervisor\\n" % argv[0])
        sys.exit(1)
    time.sleep(0.02)
with open(base + ".done") as f:
    rc, out, err = json.load(f)
os.unlink(base + ".done")
sys.stdout.write(out)
sys.stderr.write(err)
sys.exit(rc)
""".replace("@TIMEOUT@", str(REQUEST_TIMEOUT_S))


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S ") + message, flush=True)


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip() or proc.returncode}")
    return proc


def mount(*args: str) -> None:
    run("mount", *args)


def write_in_place(path: Path, text: str) -> None:
    """Rewrite a file keeping its inode (it may be bind-mounted somewhere)."""
    with open(path, "w") as f:
        f.write(text)


def clear_dir(path: Path) -> None:
    """Empty PATH but keep the directory itself (it is bind-mounted)."""
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write PATH in the host root as a new regular file (never through a symlink into the machine's files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


class Host:
    def __init__(self, hostdir: Path):
        self.dir = hostdir.resolve()
        self.config = json.loads((self.dir / "host.json").read_text())
        self.name: str = self.config["name"]
        self.address: str = self.config["address"]
        self.root = self.dir / "root"
        self.kernel = self.dir / "kernel"
        self.hw = self.dir / "hw"
        self.control = self.dir / "control"
        self.kernel_modules = Modules(self.kernel, bool(self.config.get("nvswitch")))  # the emulated kernel's modules
        self.stopping = False
        self.boots = 0
        self.sshd_pid: int | None = None
        self.boot_id = ""
        self.release = os.uname().release  # the kernel this boot started (a planted kernel update: its release)

    # -- state for the controller ---------------------------------------------------------------------------
    def set_state(self, phase: str, **extra) -> None:
        data = {"phase": phase, "boots": self.boots, "boot_id": self.boot_id, "time": time.time(), **extra}
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(data) + "\n")
        tmp.replace(self.dir / "state.json")

    # -- the root filesystem (once per supervisor) ------------------------------------------------------------
    def mount_root(self) -> None:
        self.root.mkdir(exist_ok=True)
        upper, work = self.dir / "upper", self.dir / "work"
        upper.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        try:
            mount("-t", "overlay", "overlay", "-o", f"lowerdir=/,upperdir={upper},workdir={work}", str(self.root))
            log(f"root: overlay over /, upper on disk {upper}")
        except RuntimeError as e:
            # Upper on the controller's disk refused: a tmpfs mounted for the supervisor's life (so the host's
            # changes survive its reboots, not `lab down`).
            log(f"root: upper on disk refused ({e}); using a tmpfs")
            layers = self.dir / "layers"
            layers.mkdir(exist_ok=True)
            mount("-t", "tmpfs", "-o", "mode=0755", "fl-layers", str(layers))
            (layers / "upper").mkdir()
            (layers / "work").mkdir()
            mount("-t", "overlay", "overlay", "-o",
                  f"lowerdir=/,upperdir={layers / 'upper'},workdir={layers / 'work'}", str(self.root))

    def hide_lab(self) -> None:
        """The host's own /tmp (not the machine's), and $LAB inside the host: an empty tmpfs, with only the apt
        repository (read-only) at its place. Both live as long as the supervisor (a disk /tmp, as on Debian)."""
        mount("-t", "tmpfs", "-o", "mode=1777", "fl-tmp", str(self.root / "tmp"))
        lab = Path(self.config["lab_dir"])
        inside = self.root / lab.relative_to("/")
        inside.mkdir(parents=True, exist_ok=True)
        mount("-t", "tmpfs", "-o", "mode=0755,size=1m", "fl-lab", str(inside))
        (inside / "repo").mkdir()
        mount("--bind", "-o", "ro", str(lab / "repo"), str(inside / "repo"))

    def mount_kernel(self) -> None:
        """proc, sys, dev and the emulated kernel files over them (docs/lab.md)."""
        r = self.root
        mount("-t", "proc", "proc", str(r / "proc"))
        mount("--rbind", "/sys", str(r / "sys"))
        mount("--rbind", "/dev", str(r / "dev"))
        for sub in ("sys-module", "proc-driver", "pci-devices"):
            (self.kernel / sub).mkdir(parents=True, exist_ok=True)
        for name in ("kmsg", "boot_id"):
            (self.kernel / name).touch()
        mount("--bind", str(self.kernel / "sys-module"), str(r / "sys/module"))
        mount("--bind", str(self.kernel / "pci-devices"), str(r / "sys/bus/pci/devices"))
        mount("--bind", str(self.kernel / "proc-driver"), str(r / "proc/driver"))
        mount("--bind", str(self.kernel / "kmsg"), str(r / "dev/kmsg"))
        mount("--bind", str(self.kernel / "boot_id"), str(r / "proc/sys/kernel/random/boot_id"))
        hw_inside = r / "var/lib/nvidia-lab/hw"
        hw_inside.mkdir(parents=True, exist_ok=True)
        mount("--bind", str(self.hw), str(hw_inside))

    def mount_run(self) -> None:
        """A fresh /run each boot; the control directory at /run/nvidia-lab/control."""
        target = self.root / "run"
        if os.path.ismount(target):
            run("umount", "-R", str(target))
        mount("-t", "tmpfs", "-o", "mode=0755", "fl-run", str(target))
        (self.root / "run/sshd").mkdir(mode=0o755)
        (self.root / "run/lock").mkdir(mode=0o1777)
        control_inside = self.root / "run/nvidia-lab/control"
        control_inside.mkdir(parents=True)
        self.control.mkdir(exist_ok=True)
        mount("--bind", str(self.control), str(control_inside))

    # -- the host's own files (in its root) -----------------------------------------------------------------
    def configure(self) -> None:
        r = self.root
        socket.sethostname(self.name)
        replace_file(r / "etc/hostname", self.name + "\n")
        replace_file(r / "etc/hosts", f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                                      f"{self.address}\t{self.name}\n")
        machine_id = self.dir / "machine-id"
        if not machine_id.exists():
            machine_id.write_text(uuid.uuid4().hex + "\n")
        replace_file(r / "etc/machine-id", machine_id.read_text(), 0o444)
        self.configure_apt()
        self.configure_sshd()
        self.install_shims()
        # Package scripts never start daemons behind the supervisor's back (it starts them at boot).
        replace_file(r / "usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755)
        if not self.config.get("nouveau", True):
            replace_file(r / "etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n")

    def install_shims(self) -> None:
        """The host's power button and kernel: shutdown/reboot, modprobe/rmmod/modinfo and systemctl ask the
        supervisor (again after provisioning: Debian's kmod, a dependency of dkms, unpacks its own modprobe)."""
        replace_file(self.root / "usr/sbin/shutdown", SHUTDOWN_SHIM, 0o755)
        replace_file(self.root / "usr/sbin/reboot", REBOOT_SHIM, 0o755)
        for shim in ("usr/sbin/modprobe", "usr/sbin/rmmod", "usr/sbin/modinfo", "usr/bin/systemctl"):
            replace_file(self.root / shim, REQUEST_SHIM, 0o755)

    def configure_apt(self) -> None:
        """The lab repository is the host's only apt source: apt never reaches for the network."""
        apt = self.root / "etc/apt"
        if (apt / "sources.list").exists() or (apt / "sources.list").is_symlink():
            (apt / "sources.list").unlink()
        for entry in (apt / "sources.list.d").glob("*"):
            entry.unlink()
        replace_file(apt / "sources.list.d/fleetctl-lab.list",
                     f"deb [trusted=yes] file:{self.config['lab_dir']}/repo ./\n")
        if self.config.get("debian_mirror"):  # +debian: Debian's own driver packages, mirrored (debian.py)
            replace_file(apt / "sources.list.d/debian-nvidia.list", debian.source_line(self.config["debian_mirror"]))
        replace_file(apt / "apt.conf.d/99fleetctl-lab", 'APT::Sandbox::User "root";\nAcquire::Languages "none";\n'
                                                        'APT::Install-Recommends "false";\n')

    def configure_sshd(self) -> None:
        ssh = self.root / "etc/ssh"
        for old in ssh.glob("ssh_host_*"):
            old.unlink()
        replace_file(ssh / "ssh_host_ed25519_key", (self.dir / "ssh_host_ed25519_key").read_text(), 0o600)
        replace_file(ssh / "ssh_host_ed25519_key.pub", (self.dir / "ssh_host_ed25519_key.pub").read_text())
        replace_file(ssh / "lab_authorized_keys", Path(self.config["client_pub"]).read_text(), 0o600)
        replace_file(ssh / "sshd_config", "\n".join([
            "# fleetctl lab host",
            f"ListenAddress {self.address}",
            "Port 22",
            "HostKey /etc/ssh/ssh_host_ed25519_key",
            "PidFile /run/sshd.pid",
            "AuthorizedKeysFile /etc/ssh/lab_authorized_keys",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "UseDNS no",
            "PrintMotd no",
            "MaxStartups 200:30:400",
            "MaxSessions 100",
            "AcceptEnv LANG LC_*",
            "Subsystem sftp /usr/lib/openssh/sftp-server",
            "",
        ]))

    # -- provisioning: the driver is installed before the first boot ------------------------------------------
    def provision(self) -> None:
        """Install the starting driver (and the real pynvml for the host's python3) before the first boot. An rpm
        host (packaging "rpm") first gets its rpm database and dnf, installs with dnf, and loses apt."""
        driver = self.config.get("driver")
        rpm = self.config.get("packaging") == "rpm"
        if not driver and not rpm:
            return
        self.set_state("provisioning")
        logfile = self.dir / "provision.log"
        with open(logfile, "w") as out:
            def host_run(*args: str) -> str:
                proc = subprocess.run(["chroot", str(self.root), *args], env=HOST_ENV, capture_output=True,
                                      text=True, timeout=600)
                out.write(f"$ {' '.join(args)}\n{proc.stdout}{proc.stderr}\n")
                if proc.returncode != 0:
                    tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
                    raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {tail}")
                return proc.stdout
            if rpm:
                self.configure_dnf()
                host_run("rpm", "--initdb")
                host_run("dnf", "-y", "install", LAB_SYSTEM)
            if driver:
                install = {"rpm": self.install_rpm, "debian": self.install_debian}.get(self.config.get("packaging"),
                                                                                        self.install_deb)
                held = install(host_run, driver)
                if (self.root / "usr/bin/nvidia-ctk").exists() and (self.root / "usr/bin/containerd").exists():
                    # containerd with the nvidia runtime as default (the CDI spec needs the loaded driver: it is
                    # generated after the first boot, see first_boot_setup).
                    host_run("nvidia-ctk", "runtime", "configure", "--runtime=containerd", "--set-as-default")
                # A well-kept host: versions pinned, daemons enabled (unless this host's drift says otherwise).
                host_run(*(("dnf", "versionlock", "add") if rpm else ("apt-mark", "hold")), *held)
                wants = self.root / "etc/systemd/system/multi-user.target.wants"
                wants.mkdir(parents=True, exist_ok=True)
                if self.config.get("nvswitch") and not os.path.lexists(wants / FABRICMANAGER_UNIT):
                    os.symlink("/lib/systemd/system/" + FABRICMANAGER_UNIT, wants / FABRICMANAGER_UNIT)
                if self.config.get("persistence_off") and os.path.lexists(wants / PERSISTENCED_UNIT):
                    os.unlink(wants / PERSISTENCED_UNIT)
            if rpm:
                self.hide_apt()
        self.install_shims()

    def install_deb(self, host_run, driver: str) -> list[str]:
        """apt-get install the driver set of DRIVER; returns the packages to hold."""
        branch = driver.split(".", 1)[0]
        host_run("apt-get", "update")
        in_repo = set(host_run("apt-cache", "pkgnames").split())
        persistenced = self.repo_version(host_run("apt-cache", "madison", "nvidia-persistenced"), driver)
        packages = [f"nvidia-driver-{branch}-open={driver}-0lab1"]
        # The rest of a GPU container host, as far as the repository has it.
        packages += [p for p in ("python3-nvidia-ml-py", "containerd", "nvidia-container-toolkit") if p in in_repo]
        if persistenced:
            packages.append(f"nvidia-persistenced={persistenced}")
        if self.config.get("nvswitch") and f"nvidia-fabricmanager-{branch}" in in_repo:
            packages.append(f"nvidia-fabricmanager-{branch}={driver}-0lab1")  # HGX: exactly the driver's version
        host_run("apt-get", "install", "-y", "-o", "Dpkg::Options::=--force-confold", *packages)
        return [p.split("=", 1)[0] for p in packages if "=" in p]

    def install_debian(self, host_run, driver: str) -> list[str]:
        """apt-get install Debian's own packages of DRIVER (debian.DRIVERS, from the mirror) with the lab's emulated
        GPUs beside them; returns every package at DRIVER's version, to hold."""
        host_run("apt-get", "update")
        real = [f"{n}={v}" for n, v in debian.DRIVERS[driver].items()]
        host_run("apt-get", "install", "-y", "-o", "Dpkg::Options::=--force-confold", *real, GPU_EMULATION,
                 "python3-nvidia-ml-py", "containerd", "nvidia-container-toolkit")
        listed = host_run("dpkg-query", "-W", "-f=${Package}\t${Version}\n")
        return debian.held(driver, dict(line.split("\t", 1) for line in listed.splitlines() if "\t" in line))

    def install_rpm(self, host_run, driver: str) -> list[str]:
        """dnf install the driver set of DRIVER (EL names, NAME-VERSION); returns the packages to lock."""
        held = ["nvidia-driver", "nvidia-persistenced"]
        if self.config.get("nvswitch"):
            held.append("nvidia-fabric-manager")  # HGX: exactly the driver's version
        host_run("dnf", "-y", "install", *[f"{name}-{driver}" for name in held],
                 "python3-nvidia-ml-py", "containerd", "nvidia-container-toolkit")
        return held

    def configure_dnf(self) -> None:
        """An rpm host: rpm's database where EL keeps it (Debian's rpm keeps it in ~/.rpmdb), dnf with the lab's rpm
        repository as its only repository (never the network) and the versionlock plugin on; the plugins Debian
        enables that an EL host does not have are off."""
        r = self.root
        replace_file(r / "etc/rpm/macros", "%_dbpath /var/lib/rpm\n")
        replace_file(r / "etc/dnf/dnf.conf", "[main]\ngpgcheck=1\ninstallonly_limit=3\nclean_requirements_on_remove=True\n"
                     "best=True\nskip_if_unavailable=False\nreposdir=/etc/yum.repos.d\n")
        replace_file(r / "etc/dnf/vars/releasever", f"{EL_RELEASEVER}\n")
        repos = r / "etc/yum.repos.d"
        repos.mkdir(parents=True, exist_ok=True)
        for entry in repos.glob("*"):
            entry.unlink()
        replace_file(repos / "fleetctl-lab.repo", "[fleetctl-lab]\nname=fleetctl lab: emulated NVIDIA driver packages\n"
                     f"baseurl=file://{self.config['lab_dir']}/repo/rpm\nenabled=1\ngpgcheck=0\nrepo_gpgcheck=0\n"
                     "metadata_expire=0\n")
        plugins = r / "etc/dnf/plugins"
        replace_file(plugins / "versionlock.conf", "[main]\nenabled=1\nlocklist=/etc/dnf/plugins/versionlock.list\n")
        replace_file(plugins / "versionlock.list", "")
        for name in ("local", "show-leaves"):
            replace_file(plugins / f"{name}.conf", "[main]\nenabled=0\n")

    def hide_apt(self) -> None:
        """An rpm host has no apt (in its root only: whiteouts in the overlay). dpkg stays (no NVIDIA package)."""
        for tool in APT_TOOLS:
            (self.root / tool).unlink(missing_ok=True)

    @staticmethod
    def repo_version(madison: str, driver: str) -> str | None:
        """The version `apt-cache madison` lists that is DRIVER (or DRIVER-<revision>)."""
        for line in madison.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) >= 2 and (parts[1] == driver or parts[1].startswith(driver + "-")):
                return parts[1]
        return None

    # -- the emulated kernel (each boot) --------------------------------------------------------------------
    def boot_kernel(self) -> None:
        hw = read_conf(self.hw / "gpus.conf")
        self.release = read_conf(self.hw / "faults.conf").get("kernel_update") or os.uname().release
        module = self.module()
        nouveau = not self.nouveau_blacklisted()
        if module and nouveau and not self.nvidia_in_initramfs(module):
            # An un-blacklisted nouveau loads at boot and holds the GPUs; nvidia's probe finds none and its module
            # does not load, unless the initramfs loaded it first.
            module = None
        nouveau = nouveau and module is None
        self.booted_module = module
        self.boot_id = str(uuid.uuid4())
        write_in_place(self.kernel / "boot_id", self.boot_id + "\n")
        write_in_place(self.kernel / "booted_at", f"{time.time():.3f}\n")
        extra = self.boot_faults(hw, module)
        self.write_modules(module, nouveau)
        self.write_pci(hw)
        write_in_place(self.kernel / "kmsg", "".join(
            f"{prio},{seq},{usec},-;{msg}\n"
            for seq, (prio, usec, msg) in enumerate(boot_log(hw, module, nouveau, self.release) + extra)))

    def boot_faults(self, hw: dict[str, str], module: tuple[str, str] | None) -> list[tuple[int, int, str]]:
        """Faults planted for boots with the loaded driver version (lab inject xid/fall-off-bus --at-boot), and the
        NVLinks training as that driver loads: error counters restart, planted links train down, a planted
        fabric_stuck holds the fabric (faults.apply_link_faults)."""
        faults = read_conf(self.hw / "faults.conf")
        if module is None:
            return []
        lines = []
        xid = faults.get(f"boot_xid.{module[0]}")
        if xid:
            code, gpu = xid.split(":")
            lines.append((3, 3100000, xid_line(int(code), hw[f"gpu.{gpu}.pci"])))
        lost = faults.get(f"boot_lost.{module[0]}")
        if lost and hw.get(f"gpu.{lost}.lost") != "1":
            hw[f"gpu.{lost}.lost"] = "1"
            write_in_place(self.hw / "gpus.conf", "".join(f"{k}={v}\n" for k, v in hw.items()))
            lines.append((3, 3200000, xid_line(79, hw[f"gpu.{lost}.pci"])))
        if apply_link_faults(hw, faults, module[0]):
            write_in_place(self.hw / "gpus.conf", "".join(f"{k}={v}\n" for k, v in hw.items()))
        return lines

    def module(self) -> tuple[str, str] | None:
        """(version, flavor) of the driver's kernel module in the host root, or None: the lab packages' module file,
        else a DKMS module of the driver that the host's dkms has registered (Debian's nvidia-tesla-470-kernel-dkms
        and kin: /var/lib/dkms/nvidia-tesla-470/470.256.02/source). The lab's kernel stands for a host with the
        kernel headers: what DKMS registered is what boots, built (docs/lab.md). None after a boot into a planted
        kernel update (faults.conf kernel_update) with no nvidia.ko under /lib/modules/<release>."""
        if self.release != os.uname().release and not any((self.root / "lib/modules" / self.release).rglob("nvidia.ko*")):
            return None  # booted a kernel updated without a module built for it: the driver is gone
        try:
            words = (self.root / MODULE_FILE).read_text().split()
        except OSError:
            words = []
        if words:
            return words[0], words[1] if len(words) > 1 else "open"
        registered = [(tuple(int(p) for p in tree.name.split(".")), tree.name,
                       "open" if "open" in tree.parent.name else "proprietary")
                      for tree in (self.root / "var/lib/dkms").glob("nvidia*/*")  # source: a link into the host
                      if re.fullmatch(r"\d+\.\d+(\.\d+)?", tree.name) and (tree / "source").is_symlink()]
        return max(registered)[1:] if registered else None

    def nvidia_in_initramfs(self, module: tuple[str, str]) -> bool:
        """Whether the initramfs loads MODULE's version before nouveau can: the one made when the host was set up
        holds the driver it was set up with; the package manager rebuilds it on a driver change without nvidia in it
        (Debian's and Ubuntu's default), so from the first boot into another driver version on, nouveau wins."""
        record = self.kernel / "initramfs-nvidia"
        if self.boots <= 1 and not record.exists():
            write_in_place(record, module[0] + "\n")
        held = record.read_text().strip() if record.exists() else ""
        if held and held != module[0]:
            record.unlink()
            held = ""
        return held == module[0]

    def nouveau_blacklisted(self) -> bool:
        for directory in ("etc/modprobe.d", "run/modprobe.d", "usr/lib/modprobe.d", "lib/modprobe.d"):
            for conf in (self.root / directory).glob("*.conf"):
                try:
                    text = conf.read_text(errors="replace")
                except OSError:
                    continue
                if any(line.split()[:2] == ["blacklist", "nouveau"] for line in text.splitlines() if line.strip()):
                    return True
        return False

    def write_modules(self, module: tuple[str, str] | None, nouveau: bool) -> None:
        modules = self.kernel_modules
        clear_dir(modules.sys_module)
        clear_dir(modules.proc_driver)
        if module:
            for name in ("nvidia_drm", "nvidia_uvm"):
                modules.load(name, module)  # with what they depend on; boot_log writes the boot's lines
        elif nouveau:
            (modules.sys_module / "nouveau").mkdir()
            (modules.sys_module / "nouveau/initstate").write_text("live\n")

    def write_pci(self, hw: dict[str, str]) -> None:
        pci = self.kernel / "pci-devices"
        clear_dir(pci)
        device_id = PCI_DEVICE_IDS.get(hw.get("sku", ""), "0x2330")
        for i in range(int(hw.get("count", "0"))):
            bus_id = hw.get(f"gpu.{i}.pci", "")
            if not bus_id:
                continue
            dev = pci / sysfs_pci_name(bus_id)
            dev.mkdir()
            gen = int(hw.get(f"gpu.{i}.pcie_gen", "4"))
            gen_max = int(hw.get(f"gpu.{i}.pcie_gen_max", str(gen)))
            for name, value in (("vendor", "0x10de"), ("device", device_id), ("class", "0x030200"),
                                ("subsystem_vendor", "0x10de"), ("current_link_speed", PCIE_SPEED.get(gen, "")),
                                ("max_link_speed", PCIE_SPEED.get(gen_max, "")),
                                ("current_link_width", hw.get(f"gpu.{i}.pcie_width", "16")),
                                ("max_link_width", hw.get(f"gpu.{i}.pcie_width_max", "16"))):
                (dev / name).write_text(value + "\n")

    # -- processes ------------------------------------------------------------------------------------------
    def spawn(self, *argv: str, name: str) -> int:
        logfile = open(self.dir / f"{name}.log", "ab")
        proc = subprocess.Popen(["chroot", str(self.root), *argv], env=HOST_ENV, stdin=subprocess.DEVNULL,
                                stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
        logfile.close()
        return proc.pid

    def unit_state(self, unit: str) -> str | None:
        """enabled (a wants link: an absolute symlink into the host's root, so only its presence is checked),
        disabled, or None without a unit file."""
        if not any(os.path.lexists(self.root / d / unit)
                   for d in ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system")):
            return None
        wants = (self.root / "etc/systemd/system").glob("*.wants")
        return "enabled" if any(os.path.lexists(w / unit) for w in wants) else "disabled"

    def start_daemon(self, program: str, unit: str, *args: str) -> bool:
        """Start a daemon at boot when installed and enabled, or installed without a unit file."""
        if not (self.root / program).exists():
            return False
        if self.unit_state(unit) == "disabled":
            log(f"{program} installed but not enabled: not started")
            return False
        pid = self.spawn("/" + program, *args, name=os.path.basename(program))
        log(f"{program} started (pid {pid})")
        return True

    def start_daemons(self) -> None:
        persistent = self.booted_module is not None and self.start_daemon(PERSISTENCED, PERSISTENCED_UNIT, "--verbose")
        self.reset_driver_state(persistent)
        if self.booted_module is not None and self.config.get("nvswitch"):
            self.start_daemon(FABRICMANAGER, FABRICMANAGER_UNIT)

    def start_sshd(self) -> None:
        self.sshd_pid = self.spawn("/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config", name="sshd")

    def wait_sshd(self) -> None:
        deadline = time.monotonic() + SSHD_START_TIMEOUT_S
        while time.monotonic() < deadline:
            self.reap()
            if self.sshd_pid is None:
                raise RuntimeError(f"sshd exited at start (see {self.dir / 'sshd.log'})")
            try:
                with socket.create_connection((self.address, 22), timeout=1) as s:
                    s.settimeout(2)
                    if s.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not answer on {self.address}:22 within {SSHD_START_TIMEOUT_S:.0f} s")

    def reap(self) -> None:
        """Collect every exited child (the supervisor is PID 1: orphans of the host end up here)."""
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.sshd_pid:
                self.sshd_pid = None

    def host_pids(self) -> list[int]:
        """Every process of the host (this PID namespace) but the supervisor."""
        proc = self.root / "proc"
        if not (proc / "self").exists():  # not mounted yet
            return []
        return [int(p.name) for p in proc.iterdir() if p.name.isdigit() and p.name != "1"]

    def kill_all(self) -> None:
        for sig, wait in ((signal.SIGTERM, 0.5), (signal.SIGKILL, 5.0)):
            for pid in self.host_pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.reap()
                if not self.host_pids():
                    return
                time.sleep(0.02)

    # -- life -----------------------------------------------------------------------------------------------
    def boot(self) -> None:
        self.boots += 1
        self.set_state("booting")
        for stale in [self.control / "serving", *self.control.glob("request.*")]:
            stale.unlink(missing_ok=True)
        self.mount_run()
        self.boot_kernel()
        self.start_daemons()
        self.kernel_modules.write_refcnt(self.module_users)
        self.start_sshd()
        self.wait_sshd()
        self.set_state("up")
        (self.control / "serving").touch()
        log(f"boot {self.boots} up: boot_id {self.boot_id}, module {self.module()}")

    def reboot(self, request: str) -> None:
        log(f"reboot requested: {request.strip()}")
        self.set_state("rebooting")
        (self.control / "serving").unlink(missing_ok=True)
        self.sleep(REBOOT_GRACE_S)
        self.kill_all()
        faults = read_conf(self.hw / "faults.conf")
        self.sleep(float(self.config.get("reboot_delay_s", 2.0)) + float(faults.get("slow_reboot", "0") or 0))
        if not self.stopping:
            self.boot()

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            self.reap()
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def reset_driver_state(self, persistent: bool) -> None:
        """What a reboot resets on real GPUs: persistence mode is off until nvidia-persistenced runs, volatile ECC
        counters restart at 0, pending row remaps are applied, a recovery action is done. Aggregate counts and lost GPUs
        stay."""
        self.set_every_gpu(persistence=str(int(persistent)), ecc_unc_volatile="0", remap_pending="0",
                           recovery_action="0")

    def set_every_gpu(self, **reset: str) -> None:
        hw_path = self.hw / "gpus.conf"
        lines = []
        for line in hw_path.read_text().splitlines():
            m = re.match(r"^(gpu\.\d+\.)(\w+)=", line)
            lines.append(f"{m.group(1)}{m.group(2)}={reset[m.group(2)]}" if m and m.group(2) in reset else line)
        write_in_place(hw_path, "\n".join(lines) + "\n")

    def first_boot_setup(self) -> None:
        """What provisioning does once the driver is loaded: the CDI spec for containers."""
        if self.config.get("driver") and (self.root / "usr/bin/nvidia-ctk").exists():
            proc = subprocess.run(["chroot", str(self.root), "nvidia-ctk", "cdi", "generate",
                                   "--output=/etc/cdi/nvidia.yaml"], env=HOST_ENV, capture_output=True, text=True)
            log(f"cdi generate: exit {proc.returncode} {proc.stderr.strip()[-200:]}")

    # -- the host's modprobe, rmmod and systemctl (REQUEST_SHIM) ---------------------------------------------
    def answer(self, request: Path) -> None:
        try:
            argv = [str(a) for a in json.loads(request.read_text())]
            command = {"modprobe": self.modprobe, "rmmod": self.rmmod, "modinfo": self.modinfo,
                       "systemctl": self.systemctl}[argv[0]]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            argv, command = [request.name], lambda _args: (1, "", f"lab: cannot read the request: {e}\n")
        try:
            rc, out, err = command(argv[1:])
        except (OSError, subprocess.SubprocessError) as e:  # the host's command fails, never its supervisor
            rc, out, err = 1, "", f"{argv[0]}: {e}\n"
        self.kernel_modules.write_refcnt(self.module_users)
        log(f"{' '.join(argv)}: exit {rc} {err.strip()}")
        answer = request.with_suffix(".answer")
        answer.write_text(json.dumps([rc, out, err]))
        answer.replace(request.with_suffix(".done"))
        request.unlink(missing_ok=True)

    def modprobe(self, args: list[str]) -> tuple[int, str, str]:
        names = [a.replace("-", "_") for a in args if not a.startswith("-")]
        if not names:
            return 1, "", "modprobe: ERROR: missing module name.\n"
        if "-r" in args or "--remove" in args:
            return self.rmmod([n for n in names if self.kernel_modules.loaded(n)])
        messages: list[tuple[int, str]] = []
        for name in names:
            nvidia_before = self.kernel_modules.loaded("nvidia")
            try:
                messages += self.kernel_modules.load(name, self.module())
            except OSError as e:
                return 1, "", f"modprobe: {e}\n"
            if not nvidia_before and self.kernel_modules.loaded("nvidia"):
                # A driver load is what a boot with it does to the GPUs: volatile counters restart, faults planted
                # for this version happen (a GPU that fell off the bus stays lost).
                self.set_every_gpu(ecc_unc_volatile="0")
                hw = read_conf(self.hw / "gpus.conf")
                messages += [(prio, msg) for prio, _usec, msg in self.boot_faults(hw, self.module())]
        append_kmsg(self.kernel, messages)
        return 0, "", ""

    def modinfo(self, args: list[str]) -> tuple[int, str, str]:
        """modinfo [-F version] M: what modprobe would load (the version installed in the root)."""
        names = [a for a in args if not a.startswith("-") and a != "version"]
        module = self.module()
        if len(names) != 1 or module is None or names[0].replace("-", "_") not in STACK:
            return 1, "", f"modinfo: ERROR: Module {names[0] if names else '?'} not found.\n"
        return 0, (module[0] + "\n" if "-F" in args else f"version:        {module[0]}\n"), ""

    def rmmod(self, args: list[str]) -> tuple[int, str, str]:
        for name in (a.replace("-", "_") for a in args if not a.startswith("-")):
            rc, err = self.kernel_modules.unload(name, self.module_users)
            if rc:
                return rc, "", err + "\n"
            if name == "nvidia":
                self.set_every_gpu(persistence="0")
        return 0, "", ""

    def module_users(self, name: str) -> list[str]:
        """What holds a module open: the driver's daemons and GPU processes (/dev/nvidia*), a console on nvidia_drm."""
        users = []
        if name in ("nvidia", "nvidia_uvm"):
            hw = read_conf(self.hw / "gpus.conf")
            users += [f"pid {v}" for k, v in hw.items()
                      if k.endswith(".process") and v.isdigit() and v != "0" and (self.root / "proc" / v).exists()]
        if name == "nvidia":
            users += [os.path.basename(p) for p in UNITS.values() if self.daemon_pids(p)]
        if name == "nvidia_drm" and read_conf(self.hw / "faults.conf").get("drm_in_use") == "1":
            users.append("fbcon")
        return users

    def daemon_pids(self, program: str) -> list[int]:
        pids = []
        for pid in self.host_pids():
            try:
                argv0 = (self.root / "proc" / str(pid) / "cmdline").read_bytes().split(b"\0", 1)[0]
            except OSError:
                continue
            if argv0.decode(errors="replace") == "/" + program:
                pids.append(pid)
        return pids

    def systemctl(self, args: list[str]) -> tuple[int, str, str]:
        """is-active, start, stop and restart of the driver's daemons; anything else as without systemd."""
        words = [a for a in args if not a.startswith("-")]
        quiet = "--quiet" in args or "-q" in args
        unit = words[1] if len(words) == 2 and "." in words[1] else (words[1] + ".service" if len(words) == 2 else "")
        if not words or words[0] not in ("is-active", "is-enabled", "start", "stop", "restart") or unit not in UNITS:
            return 1, "", "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
        program, verb = UNITS[unit], words[0]
        if verb == "is-active":
            active = bool(self.daemon_pids(program))
            return (0 if active else 3), ("" if quiet else ("active\n" if active else "inactive\n")), ""
        if verb == "is-enabled":
            state = self.unit_state(unit)
            if state is None:
                return 1, "", f"Failed to get unit file state for {unit}: No such file or directory\n"
            return (0 if state == "enabled" else 1), ("" if quiet else state + "\n"), ""
        if verb in ("stop", "restart"):
            self.stop_daemon(program)
        if verb in ("start", "restart"):
            return self.start_unit(unit, program)
        return 0, "", ""

    def stop_daemon(self, program: str) -> None:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            for pid in self.daemon_pids(program):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.daemon_pids(program) and time.monotonic() < deadline:
                self.reap()
                time.sleep(0.02)
        if program == PERSISTENCED:
            self.set_every_gpu(persistence="0")

    def start_unit(self, unit: str, program: str) -> tuple[int, str, str]:
        if not (self.root / program).exists():
            return 5, "", f"Failed to start {unit}: Unit {unit} not found.\n"
        if not self.daemon_pids(program):
            args = ["--verbose"] if program == PERSISTENCED else []
            proc = subprocess.run(["chroot", str(self.root), "/" + program, *args], env=HOST_ENV,
                                  capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                log(f"{program}: exit {proc.returncode} {proc.stderr.strip()[-200:]}")
                return 1, "", (f"Job for {unit} failed because the control process exited with error code.\n"
                               f"See \"systemctl status {unit}\" and \"journalctl -xeu {unit}\" for details.\n")
        if program == PERSISTENCED:
            self.set_every_gpu(persistence="1")
        return 0, "", ""

    def serve(self) -> None:
        request = self.control / "reboot"
        seen = None
        while not self.stopping:
            self.reap()
            for asked in sorted(self.control.glob("request.*.req")):
                self.answer(asked)
            changed = [p.stat().st_mtime_ns for p in (self.hw / "gpus.conf", self.hw / "faults.conf") if p.exists()]
            if changed != seen:  # a GPU process or a console planted or gone: what uses the modules changed
                seen = changed
                self.kernel_modules.write_refcnt(self.module_users)
            if request.exists():
                text = request.read_text(errors="replace")
                request.unlink()
                self.reboot(text)
            time.sleep(POLL_S)  # an sshd that was stopped stays down until the next boot, like a stopped unit


def sysfs_pci_name(bus_id: str) -> str:
    """NVML's 00000000:18:00.0 -> sysfs 0000:18:00.0."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def boot_log(hw: dict[str, str], module: tuple[str, str] | None, nouveau: bool,
             release: str) -> list[tuple[int, int, str]]:
    """(priority, usec, message) of a boot's kernel log, as the real kernel and driver write it."""
    lines = [(5, 0, f"Linux version {release} (fleetctl-lab) #1 SMP PREEMPT_DYNAMIC"),
             (6, 0, f"Command line: BOOT_IMAGE=/boot/vmlinuz-{release} root=/dev/vda ro quiet"),
             (6, 1200, "DMI: fleetctl lab host, BIOS 1.0 01/01/2025")]
    usec = 210000
    device_id = PCI_DEVICE_IDS.get(hw.get("sku", ""), "0x2330")[2:]
    bus_ids = [hw[f"gpu.{i}.pci"] for i in range(int(hw.get("count", "0"))) if hw.get(f"gpu.{i}.pci")]
    for bus in bus_ids:
        usec += 137
        lines.append((6, usec, f"pci {sysfs_pci_name(bus)}: [10de:{device_id}] type 00 class 0x030200 PCIe Endpoint"))
    if module:
        version, flavor = module
        at = {"nvidia": (440013, 512498, 512506), "nvidia_modeset": (601233,), "nvidia_drm": (604871,),
              "nvidia_uvm": (612004,)}
        for name, times in at.items():
            lines += [(prio, usec, msg) for usec, (prio, msg) in zip(times, load_messages(name, version, flavor))]
        for i, bus in enumerate(bus_ids):  # a GPU that fell off the bus does not come back with a warm reboot
            if hw.get(f"gpu.{i}.lost") == "1":
                lines.append((3, 650000 + i, f"NVRM: GPU {sysfs_pci_name(bus)}: RmInitAdapter failed! (0x22:0x56:897)"))
    elif nouveau:
        for i, bus in enumerate(bus_ids):
            lines.append((3, 700000 + i * 1500, f"nouveau {sysfs_pci_name(bus)}: unknown chipset (180000a1)"))
    lines.append((6, 2100000, "systemd[1]: Reached target multi-user.target - Multi-User System."))
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m fleetctl_lab.supervisor HOSTDIR", file=sys.stderr)
        return 2
    host = Host(Path(argv[1]))
    (host.dir / "supervisor.pid").write_text(os.readlink("/proc/self") + "\n")  # the pid outside the namespace

    def stop(_signum, _frame):
        host.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        host.mount_root()
        host.hide_lab()
        host.mount_kernel()
        host.configure()
        host.mount_run()
        host.provision()
        host.kill_all()  # what package scripts started in the chroot; the boot starts the daemons
        host.boot()
        host.first_boot_setup()
        host.serve()
    except Exception as e:  # the controller reads the reason from state.json
        log(f"failed: {e}")
        host.set_state("failed", error=str(e))
        host.kill_all()
        return 1
    log("stopping: killing the host's processes")
    (host.control / "serving").unlink(missing_ok=True)
    host.kill_all()
    host.set_state("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
