#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Put a host's NVIDIA driver packages in one exact state: these packages at these versions, held; the driver
packages of any other branch removed. apt hosts (held with apt-mark) and dnf hosts (held with dnf versionlock).

Used for an upgrade (versions given as the upstream driver version, e.g. 570.86.15: the one distro version
the package manager knows for it is chosen) and for a rollback (versions given exactly as recorded before, e.g.
550.163.01-0ubuntu1 or 570.86.15-1.el9). Idempotent: a host already in that state is left alone (changed=false).
An apt install that was interrupted (dpkg left half-configured, e.g. by a crashed controller) is finished first.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvidia_driver_packages
short_description: Exact NVIDIA driver package set, pinned and held (apt or dnf)
version_added: "0.1.0"
description:
  - Installs exactly the given packages at the given versions, holds them (apt-mark hold, or dnf versionlock)
    with the NVIDIA packages the package manager brought in at the same driver version (Debian's
    firmware-nvidia-tesla-535-gsp), and removes (on apt, purges) the NVIDIA packages of other driver branches and of
    Debian's other spellings of the same parts.
  - Used for an upgrade (versions given as the upstream driver version, e.g. C(570.86.15) - the one distro version
    the package manager knows for it is chosen) and for a rollback (versions given exactly as recorded before, e.g.
    C(550.163.01-0ubuntu1) or C(570.86.15-1.el9)).
  - Idempotent - a host already in that state is left alone (C(changed=false)). An apt install that was interrupted
    (dpkg left half-configured, e.g. by a crashed controller) is finished first.
  - On apt hosts the NVIDIA packages the requested ones depend on at exactly one version are installed at that
    version too (apt would otherwise pick the newest and give up).
  - The new kernel module is not loaded; reboot, or use M(fleetctl.gpu.nvidia_module_reload).
options:
  packages:
    description:
      - Package name -> version (upstream driver version, or the exact distro version).
      - At least one package.
    type: dict
    required: true
  hold:
    description: Hold the packages after installing them.
    type: bool
    default: true
  update_cache:
    description: Refresh the package index when a requested version is not known (apt-get update, dnf makecache).
    type: bool
    default: true
  lock_timeout_s:
    description: How long to wait for the dpkg lock (apt).
    type: int
    default: 300
  manager:
    description: The package manager; C(auto) picks apt where C(/usr/bin/apt-get) exists, else dnf.
    type: str
    choices: [auto, apt, dnf]
    default: auto
attributes:
  check_mode:
    support: partial
    details: Nothing is installed, removed or held, but the package index may be refreshed (I(update_cache)) to
      resolve the versions. RV(after) is then the state before.
    description: Reports what would change.
  diff_mode:
    support: none
    description: No diff is returned; RV(before), RV(after), RV(installed) and RV(removed) say what changed.
  platform:
    platforms: posix
    description: Linux hosts with apt/dpkg (Debian, Ubuntu) or dnf 4 and rpm (EL).
extends_documentation_fragment:
  - action_common_attributes
requirements:
  - apt-get, apt-cache, apt-mark and dpkg-query on apt hosts.
  - dnf 4 with the versionlock plugin (python3-dnf-plugin-versionlock) and rpm on dnf hosts; dnf5 is not supported.
  - Root on the managed host (become).
notes:
  - Package names must match C(^[a-z0-9][a-z0-9+.-]+$) and versions C(^[A-Za-z0-9.+:~-]+$).
seealso:
  - module: fleetctl.gpu.gpu_users
  - module: fleetctl.gpu.nvidia_module_reload
author:
  - fleetctl maintainers (@fleetctl)
"""

EXAMPLES = r"""
- name: Upgrade to driver 570.86.15 (open kernel module) on Ubuntu and hold it
  fleetctl.gpu.nvidia_driver_packages:
    packages:
      nvidia-driver-570-open: 570.86.15
      nvidia-fabricmanager-570: 570.86.15
  become: true
  register: driver_packages

- name: Reboot when the packages changed
  ansible.builtin.reboot:
  become: true
  when: driver_packages is changed

- name: Record what was installed before, for a rollback
  ansible.builtin.set_fact:
    nvidia_packages_before: "{{ driver_packages.before }}"

- name: Roll back to exactly the recorded distro versions, without refreshing the index
  fleetctl.gpu.nvidia_driver_packages:
    packages:
      nvidia-driver-550-open: 550.163.01-0ubuntu1
    update_cache: false
  become: true
  register: rollback

- name: Install the EL driver without holding it
  fleetctl.gpu.nvidia_driver_packages:
    packages:
      nvidia-driver: 570.86.15
      kmod-nvidia-open-dkms: 570.86.15
    manager: dnf
    hold: false
  become: true

- name: Show what a change would do (check mode)
  fleetctl.gpu.nvidia_driver_packages:
    packages:
      nvidia-driver-570-open: 570.86.15
  check_mode: true
  become: true
  register: plan

- name: Print the plan
  ansible.builtin.debug:
    msg: "install {{ plan.installed }}, remove {{ plan.removed }}"
"""

RETURN = r"""
manager:
  description: The package manager used.
  returned: success
  type: str
  choices: [apt, dnf]
  sample: apt
before:
  description: Installed NVIDIA packages before the change, name -> version.
  returned: success
  type: dict
  sample: {"nvidia-driver-550-open": "550.163.01-0ubuntu1", "libnvidia-compute-550": "550.163.01-0ubuntu1"}
after:
  description:
    - Installed NVIDIA packages after the change, name -> version.
    - In check mode, or when nothing changed, the same as RV(before).
  returned: success
  type: dict
  sample: {"nvidia-driver-570-open": "570.86.15-0ubuntu1", "libnvidia-compute-570": "570.86.15-0ubuntu1"}
resolved:
  description:
    - Name -> the distro version asked of the package manager for each requested package (under the spelling the
      repositories have it), plus on apt the NVIDIA packages they depend on at exactly one version.
  returned: success
  type: dict
  sample: {"nvidia-driver-570-open": "570.86.15-0ubuntu1"}
installed:
  description:
    - Exact C(name=version) strings installed (in check mode, that would be installed); empty when every resolved
      package already was at its version.
  returned: success
  type: list
  elements: str
  sample: ["nvidia-driver-570-open=570.86.15-0ubuntu1"]
removed:
  description:
    - Installed packages of other driver branches (or other spellings of the same parts) removed in the change (in
      check mode, that would be removed); on apt they are purged.
  returned: success
  type: list
  elements: str
  sample: ["nvidia-driver-550-open", "libnvidia-compute-550"]
boot_id:
  description: The boot id at the time of the change (a reboot after it loads the new module); null when unreadable.
  returned: success
  type: str
  sample: 3f1c9d2e-6a0b-4c55-9d0e-1b2a3c4d5e6f
"""

import fcntl
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_packaging import (
    equivalents,
    read as read_package_name,
    role as package_role,
    stale as stale_packages,
    upstream_version,
)

# Driver packages of every packaging family (Debian's nvidia-tesla-535-*, libcuda1 ..., Ubuntu's/CUDA's
# nvidia-driver-570-open ..., EL's kmod-nvidia-*): module_utils/fleetctl_packaging.py.
NVIDIA = re.compile(r"^(lib)?nvidia-|^cuda-drivers|^kmod-nvidia")
ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "NEEDRESTART_MODE": "l"}
EXACT_DEPENDENCY = re.compile(r"^([a-z0-9][a-z0-9+.-]*)(?::[a-z0-9]+)?\s*\(=\s*([^)\s]+)\)$")


def is_nvidia(name):
    return bool(NVIDIA.match(name)) or read_package_name(name) is not None


def matches(wanted, candidate):
    """'570.86.15' matches 570.86.15 and 570.86.15-0ubuntu1 (and an epoch); an exact distro version only itself."""
    bare = candidate.split(":", 1)[-1]
    return candidate == wanted or bare == wanted or bare.startswith(wanted + "-")


class Manager(object):
    """What the module needs of a package manager. Versions are as the facts record them (dpkg's Version,
    rpm's VERSION-RELEASE)."""

    def __init__(self, module):
        self.module = module

    def attempt(self, argv):
        """None, or why ARGV failed: its telling lines."""
        rc, out, err = self.module.run_command(argv, environ_update=ENV)
        if rc == 0:
            return None
        lines = [line.strip() for line in (out + err).splitlines() if line.strip()]
        # apt names the package in its unmet-dependency lines ("nvidia-alternative : PreDepends: nvidia-legacy-check
        # (>= 495) but it is not installable") before its "E: Unable to correct problems".
        telling = [line for line in lines
                   if re.search(r"error|fail|conflict|broken|no match|depends: .* but ", line, re.I)]
        tail = " | ".join(telling[:4] if telling else lines[-4:])
        return "%s failed (exit %d): %s" % (" ".join(argv[:2]), rc, tail)

    def run(self, argv):
        problem = self.attempt(argv)
        if problem:
            self.module.fail_json(msg=problem)

    def resolve(self, packages, update_cache):
        """name -> the one distro version the package manager will install for the requested version. A name the
        repositories do not have at that version is looked for under its other spellings of the same branch
        (Debian: nvidia-tesla-535-driver holds 535.216.03, the unversioned nvidia-driver 535.261.03)."""
        resolved, missing = {}, []
        for name, wanted in sorted(packages.items()):
            branch = wanted.split(":", 1)[-1].split(".", 1)[0]
            for spelled in [name] + (equivalents(name, branch) if self.name == "apt" else []):
                found = [c for c in self.candidates(spelled) if matches(wanted, c)]
                if found:
                    resolved[spelled] = found[0]
                    break
            else:
                missing.append(name)
        if missing and update_cache:
            self.refresh()
            return self.resolve(packages, False)
        if missing:
            self.module.fail_json(msg="no package version in the configured repositories for: %s"
                                  % ", ".join("%s=%s" % (n, packages[n]) for n in missing))
        return resolved


class Apt(Manager):
    name = "apt"

    def prepare(self, lock_timeout_s):
        """Wait until no dpkg frontend holds the lock, then finish an install a crash interrupted."""
        self.lock = ("-o", "DPkg::Lock::Timeout=%d" % lock_timeout_s)
        deadline = time.time() + lock_timeout_s
        path = "/var/lib/dpkg/lock-frontend"
        while os.path.exists(path):
            fd = os.open(path, os.O_RDWR)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.lockf(fd, fcntl.LOCK_UN)
                break
            except (IOError, OSError):
                if time.time() > deadline:
                    self.module.fail_json(msg="dpkg is busy (%s held) for more than %ds" % (path, lock_timeout_s))
                time.sleep(1)
            finally:
                os.close(fd)
        rc, out, dummy = self.module.run_command(["dpkg", "--audit"], environ_update=ENV)
        interrupted = bool(out.strip())
        if interrupted and not self.module.check_mode:
            self.run(["dpkg", "--configure", "-a"])
        return interrupted

    def installed(self):
        """name -> (version, held) of installed NVIDIA packages."""
        rc, out, err = self.module.run_command(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${Status}\n"],
                                               environ_update=ENV)
        if rc not in (0, 1):
            self.module.fail_json(msg="dpkg-query failed: %s" % err.strip())
        found = {}
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and is_nvidia(parts[0]) and parts[2].endswith(" installed"):
                found[parts[0]] = (parts[1], parts[2].split(" ")[0] == "hold")
        return found

    def candidates(self, name):
        rc, out, dummy = self.module.run_command(["apt-cache", "madison", name], environ_update=ENV)
        return [p[1].strip() for p in (line.split("|") for line in out.splitlines()) if len(p) >= 2] if rc == 0 else []

    def refresh(self):
        self.run(["apt-get", "update"])

    def with_exact_dependencies(self, resolved):
        """RESOLVED plus the NVIDIA packages they depend on at exactly one version, at that version. apt takes a
        dependency it is not told about at its candidate, the newest, and gives up ("but 535.309.01 is to be
        installed") where a newer upload of the same source is in the repositories (bookworm-security's 535.309.01
        beside 535.261.03-1)."""
        out = dict(resolved)
        queue = sorted(resolved.items())
        while queue:
            name, version = queue.pop()
            for dep, exact in self.exact_dependencies(name, version):
                if dep in out or not is_nvidia(dep):
                    continue
                found = [c for c in self.candidates(dep) if matches(exact, c)]
                if found:
                    out[dep] = found[0]
                    queue.append((dep, found[0]))
        return out

    def exact_dependencies(self, name, version):
        """(package, version) of NAME=VERSION's Depends and Pre-Depends that ask for one version (the first
        alternative of each: firmware-nvidia-gsp (= 535.261.03) | firmware-nvidia-gsp-535.261.03)."""
        rc, out, dummy = self.module.run_command(["apt-cache", "show", "%s=%s" % (name, version)], environ_update=ENV)
        found = []
        for line in out.splitlines() if rc == 0 else []:
            if line.startswith(("Depends:", "Pre-Depends:")):
                for group in line.split(":", 1)[1].split(","):
                    m = EXACT_DEPENDENCY.match(group.split("|")[0].strip())
                    if m:
                        found.append((m.group(1), m.group(2)))
            elif not line.strip() and found:
                break  # the first stanza: apt-cache show lists NAME=VERSION once per repository
        return found

    def change(self, install, remove):
        # One transaction: the new branch in, the old branch out and purged, conffiles and all (they conflict; held
        # packages may go): nothing of another branch stays behind, not even "rc" (Debian's /etc/nvidia/<branch>).
        if install:
            self.run(["apt-get", "install", "-y", "--purge", "--allow-downgrades", "--allow-change-held-packages"]
                     + list(self.lock) + ["-o", "Dpkg::Options::=--force-confold"] + install
                     + [n + "-" for n in remove])
        still = sorted(n for n in remove if n in self.installed())
        if still:
            self.run(["apt-get", "purge", "-y", "--allow-change-held-packages"] + list(self.lock) + still)

    def hold(self, resolved):
        self.run(["apt-mark", "hold"] + sorted(resolved))


class Dnf(Manager):
    name = "dnf"
    ARCH_SUFFIX = re.compile(r"\.(\*|x86_64|aarch64|noarch|i686)$")

    def prepare(self, lock_timeout_s):
        """dnf 4 with its versionlock plugin, checked before anything changes. (rpm transactions do not stay
        half-done the way dpkg's do; dnf waits for its own lock.)"""
        rc, out, err = self.module.run_command(["dnf", "--version"], environ_update=ENV)
        if "dnf5" in out or out.strip().startswith("5."):
            self.module.fail_json(msg="dnf5 is not supported yet (its versionlock is built in and lists differently)")
        rc, out, err = self.module.run_command(["dnf", "-q", "versionlock", "list"], environ_update=ENV)
        if rc != 0:
            self.module.fail_json(msg="dnf versionlock does not work here (install python3-dnf-plugin-versionlock): %s"
                                  % " | ".join((err or out).strip().splitlines()[-2:]))
        return False

    def locks(self):
        """name -> locked version-release, from 'name-[epoch:]version-release.arch' entries ('!' ones exclude)."""
        rc, out, dummy = self.module.run_command(["dnf", "-q", "versionlock", "list"], environ_update=ENV)
        found = {}
        for line in (line.strip() for line in out.splitlines()):
            parts = self.ARCH_SUFFIX.sub("", line).rsplit("-", 2)
            if len(parts) == 3 and not line.startswith(("!", "#")):
                found[parts[0]] = "%s-%s" % (parts[1].split(":", 1)[-1], parts[2])
        return found

    def installed(self):
        """name -> (version-release, held): held means locked at exactly the installed version."""
        rc, out, err = self.module.run_command(["rpm", "-qa", "--qf", "%{NAME}\t%{VERSION}-%{RELEASE}\n"],
                                               environ_update=ENV)
        if rc != 0:
            self.module.fail_json(msg="rpm -qa failed: %s" % err.strip())
        locks = self.locks()
        return dict((p[0], (p[1], locks.get(p[0]) == p[1])) for p in (line.split("\t") for line in out.splitlines())
                    if len(p) == 2 and is_nvidia(p[0]))

    def candidates(self, name):
        # Locks hide the other versions from queries: look past them (the install lifts this package's lock).
        rc, out, dummy = self.module.run_command(["dnf", "-q", "--disableplugin=versionlock", "repoquery",
                                                  "--qf", "%{version}-%{release}", name], environ_update=ENV)
        return sorted(set(out.split()), reverse=True) if rc == 0 else []

    def refresh(self):
        self.run(["dnf", "-q", "makecache", "--refresh"])

    def change(self, install, remove):
        names = [spec.split("=", 1)[0] for spec in install]
        unlocked = sorted(set(self.locks()) & set(names + remove))
        if unlocked:
            self.run(["dnf", "-q", "versionlock", "delete"] + unlocked)
        if install:
            # dnf install of an exact version upgrades or downgrades to it; --allowerasing lets it replace conflicts.
            problem = self.attempt(["dnf", "-y", "-q", "install", "--allowerasing"]
                                   + ["%s-%s" % tuple(spec.split("=", 1)) for spec in install])
            if problem:
                # Whatever is installed now stays locked: dnf-automatic must not move a host that failed.
                still = sorted(n for n in unlocked if n in self.installed())
                if still:
                    self.attempt(["dnf", "-q", "versionlock", "add"] + still)
                self.module.fail_json(msg=problem)
        gone = sorted(n for n in remove if n in self.installed())
        if gone:
            self.run(["dnf", "-y", "-q", "remove", "--noautoremove"] + gone)

    def hold(self, resolved):
        relock = sorted(set(self.locks()) & set(resolved))
        if relock:
            self.run(["dnf", "-q", "versionlock", "delete"] + relock)
        self.run(["dnf", "-q", "versionlock", "add"] + ["%s-%s" % kv for kv in sorted(resolved.items())])


def manager_for(module):
    choice = module.params["manager"]
    if choice == "auto":
        choice = "apt" if os.path.exists("/usr/bin/apt-get") else "dnf" if os.path.exists("/usr/bin/dnf") else None
    if choice is None:
        module.fail_json(msg="neither apt-get nor dnf on this host: fleetctl changes apt and dnf hosts only")
    return {"apt": Apt, "dnf": Dnf}[choice](module)


def pulled_in(installed, resolved):
    """Installed parts of the driver at a requested driver version that were not requested: what the package
    manager brought with the driver (Debian's firmware-nvidia-tesla-535-gsp), held with it. Only what the next
    change asks for by name (the driver's, persistenced's and fabric manager's packages): a package held here and
    never asked for again would keep its old version locked against the next driver (EL's nvidia-kmod-common)."""
    versions = set(upstream_version(v) for v in resolved.values())
    return sorted(n for n, v in installed.items() if n not in resolved and upstream_version(v[0]) in versions
                  and package_role(n) in ("driver", "persistenced", "fabricmanager"))


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except (IOError, OSError):
        return None


def main():
    module = AnsibleModule(
        argument_spec=dict(packages=dict(type="dict", required=True), hold=dict(type="bool", default=True),
                           update_cache=dict(type="bool", default=True), lock_timeout_s=dict(type="int", default=300),
                           manager=dict(type="str", default="auto", choices=["auto", "apt", "dnf"])),
        supports_check_mode=True)
    packages = dict((str(k), str(v)) for k, v in module.params["packages"].items())
    if not packages:
        module.fail_json(msg="packages: give at least one package")
    for name in packages:
        if not re.match(r"^[a-z0-9][a-z0-9+.-]+$", name) or not re.match(r"^[A-Za-z0-9.+:~-]+$", packages[name]):
            module.fail_json(msg="not a package name and version: %r=%r" % (name, packages[name]))
    pm = manager_for(module)
    interrupted = pm.prepare(module.params["lock_timeout_s"])
    before = pm.installed()
    resolved = pm.resolve(packages, module.params["update_cache"])
    if pm.name == "apt":
        resolved = pm.with_exact_dependencies(resolved)
    stale = stale_packages(dict((n, v[0]) for n, v in before.items()), resolved, debian_sources=pm.name == "apt")
    to_install = sorted(n for n, v in resolved.items() if before.get(n, (None,))[0] != v)
    to_hold = sorted(n for n in list(resolved) + pulled_in(before, resolved)
                     if module.params["hold"] and not before.get(n, (None, False))[1])
    result = dict(manager=pm.name, before=dict((n, v[0]) for n, v in before.items()), removed=stale,
                  boot_id=boot_id(), installed=["%s=%s" % (n, resolved[n]) for n in to_install], resolved=resolved)
    changed = bool(interrupted or to_install or stale or to_hold)
    if module.check_mode or not changed:
        module.exit_json(changed=changed, after=result["before"], **result)
    pm.change(result["installed"], stale)
    if module.params["hold"]:
        now = pm.installed()
        pm.hold(dict(resolved, **dict((n, now[n][0]) for n in pulled_in(now, resolved))))
    after = pm.installed()
    wrong = ["%s (%s)" % (n, after.get(n, ("not installed",))[0]) for n, v in resolved.items()
             if after.get(n, (None,))[0] != v]
    if wrong:
        module.fail_json(msg="after the install these packages are not at the requested version: %s" % ", ".join(wrong))
    module.exit_json(changed=True, after=dict((n, v[0]) for n, v in after.items()), **result)


if __name__ == "__main__":
    main()
