#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Put a host's NVIDIA driver packages in one exact state: these packages at these versions, held; the driver
packages of any other branch removed.

Used for an upgrade (versions given as the upstream driver version, e.g. 570.86.15: the one distro version
apt knows for it is chosen) and for a rollback (versions given exactly as recorded before, e.g.
550.163.01-0ubuntu1). Idempotent: a host already in that state is left alone (changed=false). An install that
was interrupted (dpkg left half-configured, e.g. by a crashed controller) is finished first.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: nvidia_driver_packages
short_description: Exact NVIDIA driver package set, pinned and held (apt)
description:
  - Installs exactly the given packages at the given versions, holds them (apt-mark hold) and removes the
    branch-suffixed NVIDIA packages of other driver branches.
options:
  packages:
    description: Package name -> version (upstream driver version, or the exact distro version).
    type: dict
    required: true
  hold:
    description: Hold the packages after installing them.
    type: bool
    default: true
  update_cache:
    description: Run apt-get update when a requested version is not known to apt.
    type: bool
    default: true
  lock_timeout_s:
    description: How long to wait for the dpkg lock.
    type: int
    default: 300
author: fleetctl
"""

RETURN = r"""
before: {description: Installed NVIDIA packages before, name -> version, type: dict, returned: always}
after: {description: Installed NVIDIA packages after, name -> version, type: dict, returned: always}
installed: {description: Exact name=version strings given to apt, type: list, returned: when changed}
removed: {description: Packages of other branches removed, type: list, returned: always}
boot_id: {description: The boot id at the time of the change (a reboot after it loads the new module), type: str, returned: always}
"""

import fcntl
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule

# Packages whose name carries the driver branch (nvidia-driver-570-open, libnvidia-compute-570,
# nvidia-fabricmanager-570, nvidia-dkms-570-server ...): a branch change replaces them all.
BRANCHED = re.compile(r"^((lib)?nvidia-[a-z0-9-]*?|cuda-drivers(-fabricmanager)?)-(?P<branch>\d{3})"
                      r"(-open|-server|-server-open)?$")
NVIDIA = re.compile(r"^(lib)?nvidia-|^cuda-drivers")
ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "NEEDRESTART_MODE": "l"}


def installed(module):
    """name -> (version, held) of installed NVIDIA packages."""
    rc, out, err = module.run_command(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${Status}\n"],
                                      environ_update=ENV)
    if rc not in (0, 1):
        module.fail_json(msg="dpkg-query failed: %s" % err.strip())
    found = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and NVIDIA.match(parts[0]) and parts[2].endswith(" installed"):
            found[parts[0]] = (parts[1], parts[2].split(" ")[0] == "hold")
    return found


def matches(wanted, candidate):
    """'570.86.15' matches 570.86.15 and 570.86.15-0ubuntu1 (and an epoch); an exact distro version only itself."""
    bare = candidate.split(":", 1)[-1]
    return candidate == wanted or bare == wanted or bare.startswith(wanted + "-")


def candidates(module, name):
    rc, out, _ = module.run_command(["apt-cache", "madison", name], environ_update=ENV)
    return [p[1].strip() for p in (line.split("|") for line in out.splitlines()) if len(p) >= 2] if rc == 0 else []


def resolve(module, packages, update_cache):
    """name -> the one distro version apt will install for the requested version."""
    resolved, missing = {}, []
    for name, wanted in sorted(packages.items()):
        found = [c for c in candidates(module, name) if matches(wanted, c)]
        if found:
            resolved[name] = found[0]
        else:
            missing.append(name)
    if missing and update_cache:
        run(module, ["apt-get", "update"])
        return resolve(module, packages, False)
    if missing:
        module.fail_json(msg="no package version in the configured repositories for: %s"
                         % ", ".join("%s=%s" % (n, packages[n]) for n in missing))
    return resolved


def run(module, argv):
    rc, out, err = module.run_command(argv, environ_update=ENV)
    if rc != 0:
        lines = [line.strip() for line in (out + err).splitlines() if line.strip()]
        telling = [line for line in lines if re.search(r"error|fail|conflict|broken", line, re.I)]
        tail = " | ".join((telling or lines)[:4] if telling else lines[-4:])
        module.fail_json(msg="%s failed (exit %d): %s" % (" ".join(argv[:2]), rc, tail), rc=rc)
    return out


def wait_for_dpkg(module, timeout_s):
    """Wait until no dpkg frontend (apt, or an install a crashed controller left running) holds the lock."""
    deadline = time.time() + timeout_s
    path = "/var/lib/dpkg/lock-frontend"
    while os.path.exists(path):
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_UN)
            return
        except (IOError, OSError):
            if time.time() > deadline:
                module.fail_json(msg="dpkg is busy (%s held) for more than %ds" % (path, timeout_s))
            time.sleep(1)
        finally:
            os.close(fd)


def dpkg_interrupted(module):
    rc, out, _ = module.run_command(["dpkg", "--audit"], environ_update=ENV)
    return bool(out.strip())


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except (IOError, OSError):
        return None


def main():
    module = AnsibleModule(
        argument_spec=dict(packages=dict(type="dict", required=True), hold=dict(type="bool", default=True),
                           update_cache=dict(type="bool", default=True), lock_timeout_s=dict(type="int", default=300)),
        supports_check_mode=True)
    packages = dict((str(k), str(v)) for k, v in module.params["packages"].items())
    if not packages:
        module.fail_json(msg="packages: give at least one package")
    if not os.path.exists("/usr/bin/apt-get"):
        module.fail_json(msg="only apt-based hosts are supported (dnf versionlock: not yet)")
    for name in packages:
        if not re.match(r"^[a-z0-9][a-z0-9+.-]+$", name) or not re.match(r"^[A-Za-z0-9.+:~-]+$", packages[name]):
            module.fail_json(msg="not a package name and version: %r=%r" % (name, packages[name]))
    branches = set(m.group("branch") for m in (BRANCHED.match(n) for n in packages) if m)
    lock = "-o", "DPkg::Lock::Timeout=%d" % module.params["lock_timeout_s"]
    wait_for_dpkg(module, module.params["lock_timeout_s"])
    interrupted = dpkg_interrupted(module)
    if interrupted and not module.check_mode:
        run(module, ["dpkg", "--configure", "-a"])
    before = installed(module)
    resolved = resolve(module, packages, module.params["update_cache"])
    stale = sorted(n for n in before if BRANCHED.match(n) and BRANCHED.match(n).group("branch") not in branches
                   and n not in packages)
    to_install = sorted(n for n, v in resolved.items() if before.get(n, (None,))[0] != v)
    to_hold = sorted(n for n in resolved if module.params["hold"] and not before.get(n, (None, False))[1])
    result = dict(before=dict((n, v[0]) for n, v in before.items()), removed=stale, boot_id=boot_id(),
                  installed=["%s=%s" % (n, resolved[n]) for n in to_install], resolved=resolved)
    changed = bool(interrupted or to_install or stale or to_hold)
    if module.check_mode or not changed:
        module.exit_json(changed=changed, after=result["before"], **result)
    if to_install:
        # One transaction: the new branch in, the old branch out (they conflict; held packages may go).
        run(module, ["apt-get", "install", "-y", "--allow-downgrades", "--allow-change-held-packages", *lock,
                     "-o", "Dpkg::Options::=--force-confold"] + result["installed"] + [n + "-" for n in stale])
    still = sorted(n for n in stale if n in installed(module))
    if still:
        run(module, ["apt-get", "purge", "-y", "--allow-change-held-packages", *lock] + still)
    if module.params["hold"]:
        run(module, ["apt-mark", "hold"] + sorted(resolved))
    after = installed(module)
    wrong = ["%s (%s)" % (n, after.get(n, ("not installed",))[0]) for n, v in resolved.items()
             if after.get(n, (None,))[0] != v]
    if wrong:
        module.fail_json(msg="after the install these packages are not at the requested version: %s" % ", ".join(wrong))
    module.exit_json(changed=True, after=dict((n, v[0]) for n, v in after.items()), **result)


if __name__ == "__main__":
    main()
