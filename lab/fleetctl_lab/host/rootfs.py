"""A lab host's root filesystem, once per supervisor: the overlay over /, its /tmp and the lab hidden, the emulated
kernel files bind-mounted over /proc, /sys and /dev, a fresh /run each boot, and the host's own files (hostname,
machine id, apt source, sshd config) and shims (shutdown, reboot, modprobe, rmmod, modinfo, systemctl)."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

from .. import debian
from ..conf import read_conf
from ..kernel import ib_ports
from .base import log, mount, replace_file, run

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

REQUEST_TIMEOUT_S = 60


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


class RootFilesystem:
    """Mounts and the host's own files (uses HostBase's directories and config)."""

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

    def own_home(self) -> None:
        """The host's own /root, kept on disk across its reboots, with the dotfiles a fresh Debian root has: not the
        machine's (a developer's shell start-up, pyenv and the like, would otherwise run in every ssh session)."""
        home = self.dir / "root-home"
        if not home.exists():
            home.mkdir(mode=0o700)
            for name in ("profile", "bashrc"):
                fresh = Path(f"/usr/share/base-files/dot.{name}")
                replace_file(home / f".{name}", fresh.read_text() if fresh.exists() else "", 0o644)
        mount("--bind", str(home), str(self.root / "root"))

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
        self.mount_infiniband()
        hw_inside = r / "var/lib/nvidia-lab/hw"
        hw_inside.mkdir(parents=True, exist_ok=True)
        mount("--bind", str(self.hw), str(hw_inside))

    def mount_infiniband(self) -> None:
        """kernel/class-infiniband over /sys/class/infiniband: the host sees its emulated HCAs, never the machine's.
        Where the machine has no /sys/class/infiniband (no RDMA driver loaded) and the host has HCAs, /sys/class is
        rebuilt on a tmpfs (sysfs takes no new directory): each of the machine's classes bound at its place, and
        the emulated infiniband beside them."""
        r, emulated = self.root, self.kernel / "class-infiniband"
        emulated.mkdir(parents=True, exist_ok=True)
        target = r / "sys/class/infiniband"
        if target.is_dir():
            mount("--bind", str(emulated), str(target))
            return
        if not ib_ports(read_conf(self.hw / "gpus.conf")):
            return  # no HCA: no /sys/class/infiniband, as on a real host without one
        classes = sorted(os.listdir("/sys/class"))
        mount("-t", "tmpfs", "-o", "mode=0755,size=1m", "fl-sys-class", str(r / "sys/class"))
        for name in classes:
            (r / "sys/class" / name).mkdir()
            mount("--rbind", f"/sys/class/{name}", str(r / "sys/class" / name))
        target.mkdir()
        mount("--bind", str(emulated), str(target))

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

    # -- the host's own files (in its root) ---------------------------------------------------------------------
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
