"""The driver: installed, loaded, matching its userspace, blessed, its flavor, held, its CUDA, the next boot."""

from __future__ import annotations

from .. import resources
from .base import Check, failed, not_applicable, passed, running_version, version_tuple, warned
from .registry import control

# Highest CUDA version each driver branch supports (NVIDIA CUDA toolkit / driver compatibility table).
CUDA_BY_BRANCH = {"535": "12.2", "545": "12.3", "550": "12.4", "555": "12.5", "560": "12.6", "565": "12.7",
                  "570": "12.8", "575": "12.9", "580": "13.0"}


@control("driver.installed", "NVIDIA driver installed", "critical", ("driver.module_version", "driver.userspace_version"),
         "install the blessed driver: fleetctl upgrade --to VERSION, or your distro's nvidia-driver package",
         roles=("restored_on_rollback", "judged_by_verify"))
def driver_installed(facts, policy):
    """Fails when there is no kernel module, no `libnvidia-ml` and no driver package."""
    d = facts["driver"]
    if d["state"] == "not_installed":
        return failed("no NVIDIA driver is installed (no kernel module, no libnvidia-ml, no driver package)",
                      pci_gpus=len(facts["host"].get("pci_gpus", [])))
    return passed(f"driver installed ({d['userspace_version'] or d['module_version']})",
                  userspace_version=d["userspace_version"], packages=[p["name"] for p in d["packages"] if p["role"] == "driver"])


@control("driver.loaded", "Kernel module loaded", "critical", ("driver.module_version",),
         "load it (modprobe nvidia) or reboot; check dmesg for why it did not load",
         roles=("health", "restored_on_rollback", "judged_by_verify"))
def driver_loaded(facts, policy):
    """Fails when the driver is installed but the `nvidia` module is not loaded."""
    state = facts["driver"]["state"]
    if state == "not_installed":
        return not_applicable("no driver installed")
    if state == "not_loaded":
        return failed("the driver is installed but the nvidia kernel module is not loaded",
                      userspace_version=facts["driver"]["userspace_version"])
    return passed(f"nvidia module {facts['driver']['module_version']} loaded")


@control("driver.version_match", "Loaded module matches userspace driver", "critical",
         ("driver.module_version", "driver.userspace_version"),
         "reboot (or unload and reload the nvidia modules) so the running module matches the installed userspace",
         roles=("health", "restored_on_rollback", "judged_by_verify"))
def driver_version_match(facts, policy):
    """Fails when the loaded module is not the installed userspace's version (NVML: "Driver/library version
    mismatch")."""
    d = facts["driver"]
    if d["state"] in ("not_installed", "not_loaded"):
        return not_applicable("no module loaded")
    if d["state"] == "version_mismatch":
        return failed(f"Driver/library version mismatch: module {d['module_version']} is loaded, userspace is "
                      f"{d['userspace_version'] or 'another version'} (NVML refuses to answer)",
                      module_version=d["module_version"], userspace_version=d["userspace_version"])
    return passed(f"module and userspace agree ({d['module_version']})")


@control("driver.version_allowed", "Driver version blessed", "high", ("driver.module_version",),
         "move the host to a blessed version: fleetctl upgrade --to VERSION",
         roles=("target", "restored_on_rollback"))
def driver_version_allowed(facts, policy):
    """Fails when the running version is not in the baseline's branches / exact versions."""
    rules = policy.get("driver", {})
    if not rules.get("branches") and not rules.get("versions"):
        return None
    version = running_version(facts) or facts["driver"]["userspace_version"]
    if version is None:
        return not_applicable("no driver to check")
    branch = version.split(".")[0]
    if rules.get("versions") and version not in rules["versions"]:
        return failed(f"driver {version} is not a blessed version ({', '.join(rules['versions'])})",
                      version=version, allowed_versions=rules["versions"])
    if rules.get("branches") and branch not in rules["branches"]:
        return failed(f"driver {version} is on branch {branch}, not a blessed branch ({', '.join(rules['branches'])})",
                      version=version, allowed_branches=rules["branches"])
    return passed(f"driver {version} is blessed", version=version)


@control("driver.flavor", "Kernel module flavor", "medium", ("driver.module_flavor",),
         "install the required flavor (e.g. nvidia-driver-XXX-open for the open kernel module)",
         roles=("target", "restored_on_rollback"))
def driver_flavor(facts, policy):
    """Fails when the kernel module's flavor (open or proprietary) differs from the baseline."""
    wanted = policy.get("driver", {}).get("flavor")
    if wanted in (None, "any"):
        return None
    flavor = facts["driver"]["module_flavor"]
    if flavor is None:
        return not_applicable("no module loaded")
    if flavor != wanted:
        return failed(f"the {flavor} kernel module is loaded; the baseline wants {wanted}", flavor=flavor, wanted=wanted)
    return passed(f"{flavor} kernel module", flavor=flavor)


@control("driver.held", "Driver packages held", "medium", ("driver.packages",),
         "pin the version: apt-mark hold <packages> (Debian/Ubuntu) or dnf versionlock add <packages> (EL)",
         roles=("restored_on_rollback", "judged_by_verify", "verify_always"))
def driver_held(facts, policy):
    """Fails when the driver packages are not held (`apt-mark hold` / `dnf versionlock`); warns for a runfile
    install."""
    if not policy.get("driver", {}).get("held"):
        return None
    pkgs = [p for p in facts["driver"]["packages"] if p["role"] == "driver"]
    if facts["driver"]["state"] == "not_installed":
        return not_applicable("no driver installed")
    # Only what moves with the driver (not Debian's nvidia-kernel-common or nvidia-modprobe: fleetctl_packaging).
    versions = {facts["driver"].get("userspace_version"), facts["driver"].get("module_version")} - {None}
    pkgs = resources.module_utils("fleetctl_packaging").moves_with_driver(pkgs, versions) or pkgs
    if not pkgs:
        return warned("the driver was not installed from packages (runfile or container image?): it cannot be held",
                      userspace_version=facts["driver"]["userspace_version"])
    loose = [p["name"] for p in pkgs if not p["held"]]
    if loose:
        return failed(f"{len(loose)} of {len(pkgs)} driver packages are not held: {', '.join(loose)}", not_held=loose)
    return passed(f"all {len(pkgs)} driver packages held", held=[p["name"] for p in pkgs])


@control("driver.cuda_support", "Driver supports the workloads' CUDA", "high",
         ("driver.module_version", "driver.cuda_driver_version"),
         "move to a driver branch whose CUDA version covers every workload image",
         roles=("target", "restored_on_rollback"))
def driver_cuda_support(facts, policy):
    """Fails when the driver's CUDA version is below a workload image's CUDA."""
    wanted = policy.get("workloads", {}).get("cuda")
    if not wanted:
        return None
    d = facts["driver"]
    version = running_version(facts)
    if version is None:
        return not_applicable("no driver loaded")
    supported = d["cuda_driver_version"] or CUDA_BY_BRANCH.get(d["branch"] or "")
    if supported is None:
        return Check("error", f"unknown CUDA version for driver branch {d['branch']}", {"branch": d["branch"]})
    too_new = [c for c in wanted if version_tuple(c) > version_tuple(supported)]
    if too_new:
        return failed(f"driver {version} supports CUDA up to {supported}; workloads need {', '.join(too_new)}",
                      driver_cuda=supported, workloads=wanted)
    return passed(f"driver {version} supports CUDA {supported} >= {max(wanted, key=version_tuple)}",
                  driver_cuda=supported, workloads=wanted)


@control("driver.next_boot", "The next boot kernel has the driver's module", "critical", ("boot.modules",),
         "build the module for that kernel (dkms autoinstall -k KERNEL, with its headers installed) or install the "
         "precompiled module package for it, or make the boot loader start a kernel that has one",
         roles=("boot_risk", "restored_on_rollback", "judged_by_verify", "verify_always"))
def driver_next_boot(facts, policy):
    """Fails when the kernel the host boots next (grub-reboot / saved default in grubenv, else grub.cfg's first entry,
    else Boot Loader Specification entries, else the newest `/boot/vmlinuz-*`) has no nvidia module under
    `/lib/modules/KERNEL`, or one of another version than the installed driver: the outage after an unattended kernel
    update whose DKMS build never happened, found before the reboot (`dkms status` for that kernel in the message); not
    applicable where no kernel image is under `/boot` (VMs and containers whose kernel comes from outside); the
    campaign's verify fails a host on it; baseline `driver.next_boot: false` turns it off. A kernel update whose nvidia
    module was never built (no headers, a failed DKMS build, an unsigned module) loses the driver at the next reboot:
    critical drift before the reboot happens."""
    if not policy.get("driver", {}).get("next_boot", True):
        return None
    d, boot = facts["driver"], facts.get("boot")
    if d["state"] == "not_installed":
        return not_applicable("no driver installed")
    if boot is None:
        return not_applicable("the facts hold no boot state (collected by an older gpu_facts)")
    kernel = boot["next_kernel"]
    if kernel is None:
        return not_applicable("no kernel image under /boot: the kernel comes from outside the host (VM, container "
                              "or network boot)", running_kernel=boot["running_kernel"])
    expected = d["userspace_version"] or d["module_version"]
    module = next((m for m in boot["modules"] if m["kernel"] == kernel), None)
    where = f"the host boots {kernel} next ({boot['next_kernel_source']})"
    evidence = {"next_kernel": kernel, "source": boot["next_kernel_source"], "expected": expected,
                "module": module}
    if module is None or not module["files"]:
        dkms = [f"{x['module']}/{x['version']}: {x['state']}" for x in (module or {}).get("dkms") or []]
        why = f" (dkms: {', '.join(dkms)})" if dkms else ""
        return failed(f"{where} and no nvidia module is installed for it{why}: the driver will not load after "
                      f"the next reboot", **evidence)
    if expected and module["version"] and module["version"] != expected:
        return failed(f"{where} with nvidia module {module['version']}, but the installed driver is {expected}: "
                      f"Driver/library version mismatch after the next reboot", **evidence)
    return passed(f"{where} with nvidia module {module['version'] or 'of unknown version'}", **evidence)
