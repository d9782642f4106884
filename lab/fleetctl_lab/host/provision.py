"""Provisioning a lab host: the starting driver (and the real pynvml for the host's python3) is installed before the
first boot, with apt from the lab's repository, Debian's own packages, or dnf on an rpm host (which loses apt); the
CDI spec once the driver is loaded."""

from __future__ import annotations

import os
import subprocess

from .. import debian
from .base import HOST_ENV, log, replace_file
from .daemons import FABRICMANAGER_UNIT, IMEX_UNIT, PERSISTENCED_UNIT

LAB_SYSTEM = "fleetctl-lab-system"  # an rpm host's first package (lab/fleetctl_lab/packages.py)
GPU_EMULATION = "fleetctl-lab-gpu"  # the emulated GPUs beside a +debian host's real driver packages (packages.py)
EL_RELEASEVER = "9"
APT_TOOLS = ("usr/bin/apt-get", "usr/bin/apt", "usr/bin/apt-cache", "usr/bin/apt-mark")  # gone from an rpm host


class Provisioning:
    """Uses set_state (HostBase) and install_shims (RootFilesystem)."""

    def provision(self) -> None:
        """Install the starting driver (and the real pynvml for the host's python3) before the first boot. An rpm
        host (packaging "rpm") first gets its rpm database and dnf, installs with dnf, and loses apt."""
        # man-db's dpkg trigger rebuilds the manual page index after each package change (3-4 s of CPU a time on
        # the 2-core CI machine); nothing on a lab host reads manual pages: off, as man-db/auto-update=false leaves it.
        (self.root / "var/lib/man-db/auto-update").unlink(missing_ok=True)
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
                if self.config.get("imex_nodes"):  # a tray of an NVLink domain: IMEX enabled, its node list
                    if not os.path.lexists(wants / IMEX_UNIT):
                        os.symlink("/lib/systemd/system/" + IMEX_UNIT, wants / IMEX_UNIT)
                    replace_file(self.root / "etc/nvidia-imex/nodes_config.cfg",
                                 "".join(f"{a}\n" for a in self.config["imex_nodes"]))
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
        if self.config.get("domain") and f"nvidia-imex-{branch}" in in_repo:
            packages.append(f"nvidia-imex-{branch}={driver}-0lab1")  # an NVLink domain's tray: IMEX at the driver's
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
        if self.config.get("domain"):
            held.append(f"nvidia-imex-{driver.split('.', 1)[0]}")  # an NVLink domain's tray: IMEX at the driver's
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

    def first_boot_setup(self) -> None:
        """What provisioning does once the driver is loaded: the CDI spec for containers."""
        if self.config.get("driver") and (self.root / "usr/bin/nvidia-ctk").exists():
            proc = subprocess.run(["chroot", str(self.root), "nvidia-ctk", "cdi", "generate",
                                   "--output=/etc/cdi/nvidia.yaml"], env=HOST_ENV, capture_output=True, text=True)
            log(f"cdi generate: exit {proc.returncode} {proc.stderr.strip()[-200:]}")
