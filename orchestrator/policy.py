"""Policy evaluation on the controller: one host's facts + its baseline policy -> findings.

Each control is one small function in CONTROLS, with a stable id, a default severity and a remediation hint.
A control returns a Check (status, message, evidence) or None when its baseline key is not set (not_applicable).
When a fact it needs could not be read on the host, the finding is `error` instead of a guess.

A control registered with reference=True also gets the host's reference facts: the facts of its latest recorded
audit in which that same control passed (audit.collect looks them up in the history, one query for the whole
fleet), or None when there is none. evaluate() stays pure: the caller hands the reference in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from . import resources

SEVERITIES = ("info", "low", "medium", "high", "critical")
STATUSES = ("pass", "fail", "warn", "not_applicable", "error")

# Highest CUDA version each driver branch supports (NVIDIA CUDA toolkit / driver compatibility table).
CUDA_BY_BRANCH = {"535": "12.2", "545": "12.3", "550": "12.4", "555": "12.5", "560": "12.6", "565": "12.7",
                  "570": "12.8", "575": "12.9", "580": "13.0"}


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


def version_tuple(version: str | None) -> tuple[int, ...]:
    parts = []
    for p in (version or "").split("-", 1)[0].split(":")[-1].split("."):
        # ASCII digits ('²' is a digit to isdigit(), not to int()), at most 18 (int() refuses thousands of them)
        digits = "".join(ch for ch in p if ch in "0123456789")[:18]
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@dataclass
class Check:
    status: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Control:
    id: str
    title: str
    severity: str
    needs: tuple[str, ...]  # fact paths whose read errors make this control `error` ("gpus[*].x": any GPU's x)
    remediation: str
    evaluate: Callable[..., Check | None]  # (facts, policy), or (facts, policy, reference) with uses_reference
    uses_reference: bool = False
    roles: tuple[str, ...] = ()  # see ROLES


CONTROLS: list[Control] = []
# What else a control is used for besides the audit, declared with the control:
#   target: its outcome follows from the driver version alone, so a campaign judges the TARGET with it before touching
#           a host (plan.target_problems: the host's facts as they would be on the target) and after the change
ROLES = ("target",)


def control(id: str, title: str, severity: str, needs: tuple[str, ...], remediation: str, reference: bool = False,
            roles: tuple[str, ...] = ()):
    assert set(roles) <= set(ROLES), roles

    def register(fn: Callable[..., Check | None]):
        CONTROLS.append(Control(id, title, severity, needs, remediation, fn, reference, roles))
        return fn
    return register


def with_role(role: str) -> tuple[str, ...]:
    """Ids of the controls that declare ROLE."""
    return tuple(c.id for c in CONTROLS if role in c.roles)


def reference_controls() -> list[str]:
    """Ids of the controls that compare a host with its own last passing audit."""
    return [c.id for c in CONTROLS if c.uses_reference]


def passed(message: str, **evidence: Any) -> Check:
    return Check("pass", message, evidence)


def failed(message: str, **evidence: Any) -> Check:
    return Check("fail", message, evidence)


def warned(message: str, **evidence: Any) -> Check:
    return Check("warn", message, evidence)


def not_applicable(message: str, **evidence: Any) -> Check:
    return Check("not_applicable", message, evidence)


def running_version(facts: dict[str, Any]) -> str | None:
    d = facts["driver"]
    return d["module_version"] if d["state"] in ("loaded", "version_mismatch") else None


def live_gpus(facts: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in facts["gpus"] if not g.get("lost")]


# ---- driver ------------------------------------------------------------------------------------

@control("driver.installed", "NVIDIA driver installed", "critical", ("driver.module_version", "driver.userspace_version"),
         "install the blessed driver: fleetctl upgrade --to VERSION, or your distro's nvidia-driver package")
def driver_installed(facts, policy):
    d = facts["driver"]
    if d["state"] == "not_installed":
        return failed("no NVIDIA driver is installed (no kernel module, no libnvidia-ml, no driver package)",
                      pci_gpus=len(facts["host"].get("pci_gpus", [])))
    return passed(f"driver installed ({d['userspace_version'] or d['module_version']})",
                  userspace_version=d["userspace_version"], packages=[p["name"] for p in d["packages"] if p["role"] == "driver"])


@control("driver.loaded", "Kernel module loaded", "critical", ("driver.module_version",),
         "load it (modprobe nvidia) or reboot; check dmesg for why it did not load")
def driver_loaded(facts, policy):
    state = facts["driver"]["state"]
    if state == "not_installed":
        return not_applicable("no driver installed")
    if state == "not_loaded":
        return failed("the driver is installed but the nvidia kernel module is not loaded",
                      userspace_version=facts["driver"]["userspace_version"])
    return passed(f"nvidia module {facts['driver']['module_version']} loaded")


@control("driver.version_match", "Loaded module matches userspace driver", "critical",
         ("driver.module_version", "driver.userspace_version"),
         "reboot (or unload and reload the nvidia modules) so the running module matches the installed userspace")
def driver_version_match(facts, policy):
    d = facts["driver"]
    if d["state"] in ("not_installed", "not_loaded"):
        return not_applicable("no module loaded")
    if d["state"] == "version_mismatch":
        return failed(f"Driver/library version mismatch: module {d['module_version']} is loaded, userspace is "
                      f"{d['userspace_version'] or 'another version'} (NVML refuses to answer)",
                      module_version=d["module_version"], userspace_version=d["userspace_version"])
    return passed(f"module and userspace agree ({d['module_version']})")


@control("driver.version_allowed", "Driver version blessed", "high", ("driver.module_version",),
         "move the host to a blessed version: fleetctl upgrade --to VERSION", roles=("target",))
def driver_version_allowed(facts, policy):
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
         "install the required flavor (e.g. nvidia-driver-XXX-open for the open kernel module)", roles=("target",))
def driver_flavor(facts, policy):
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
         "pin the version: apt-mark hold <packages> (Debian/Ubuntu) or dnf versionlock add <packages> (EL)")
def driver_held(facts, policy):
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
         "move to a driver branch whose CUDA version covers every workload image", roles=("target",))
def driver_cuda_support(facts, policy):
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
         "precompiled module package for it, or make the boot loader start a kernel that has one")
def driver_next_boot(facts, policy):
    """A kernel update whose nvidia module was never built (no headers, a failed DKMS build, an unsigned module)
    loses the driver at the next reboot: critical drift before the reboot happens."""
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


# ---- nouveau -----------------------------------------------------------------------------------

@control("nouveau.not_loaded", "nouveau not loaded", "critical", ("nouveau",),
         "blacklist nouveau, rebuild the initramfs (update-initramfs -u / dracut -f) and reboot")
def nouveau_not_loaded(facts, policy):
    if facts["nouveau"]["loaded"]:
        return failed("the nouveau module is loaded: the NVIDIA driver cannot bind the GPUs")
    return passed("nouveau is not loaded")


@control("nouveau.blacklisted", "nouveau blacklisted", "high", ("nouveau.blacklisted",),
         "echo 'blacklist nouveau' > /etc/modprobe.d/blacklist-nouveau.conf, then rebuild the initramfs")
def nouveau_blacklisted(facts, policy):
    if not policy.get("nouveau", {}).get("blacklisted"):
        return None
    n = facts["nouveau"]
    if not n["blacklisted"]:
        return failed("nouveau is not blacklisted in modprobe.d or on the kernel command line: it can come back")
    return passed(f"nouveau blacklisted in {', '.join(n['blacklist_files'])}", files=n["blacklist_files"])


@control("nouveau.initramfs", "nouveau absent from the initramfs", "medium", ("nouveau.in_initramfs",),
         "rebuild the initramfs after blacklisting: update-initramfs -u (Debian/Ubuntu) or dracut -f (EL)")
def nouveau_initramfs(facts, policy):
    if not policy.get("nouveau", {}).get("absent_from_initramfs"):
        return None
    n = facts["nouveau"]
    if n["initramfs"] is None:
        return not_applicable("no initramfs found for the running kernel")
    if n["in_initramfs"] is None:
        return not_applicable(f"{n['initramfs']} was not listed")
    if n["in_initramfs"]:
        return failed(f"{n['initramfs']} still holds nouveau.ko: early boot can load it", initramfs=n["initramfs"])
    return passed(f"{n['initramfs']} holds no nouveau", initramfs=n["initramfs"])


# ---- persistence -------------------------------------------------------------------------------

@control("persistence.mode", "Persistence mode on", "medium", ("gpus",),
         "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced)")
def persistence_mode(facts, policy):
    if not policy.get("persistence", {}).get("mode"):
        return None
    gpus = live_gpus(facts)
    if not gpus:
        return not_applicable("no GPU visible to the driver")
    off = [g["index"] for g in gpus if g.get("persistence_mode") is False]
    if off:
        return failed(f"persistence mode is off on GPU {', '.join(map(str, off))}", gpus_off=off)
    return passed(f"persistence mode on for all {len(gpus)} GPUs")


@control("persistence.daemon", "nvidia-persistenced running", "medium", ("persistence",),
         "install and enable nvidia-persistenced (systemctl enable --now nvidia-persistenced)")
def persistence_daemon(facts, policy):
    if not policy.get("persistence", {}).get("daemon"):
        return None
    if facts["driver"]["state"] == "not_installed":
        return not_applicable("no driver installed")
    p = facts["persistence"]
    if not p["daemon_running"]:
        return failed("nvidia-persistenced is not running", enabled=p["daemon_enabled"])
    if p["daemon_enabled"] is False:
        return warned("nvidia-persistenced runs but is not enabled: it will not start after a reboot")
    return passed("nvidia-persistenced is running", enabled=p["daemon_enabled"])


# ---- container runtime -------------------------------------------------------------------------

def _engines_in_scope(facts, policy):
    required = policy.get("container_runtime", {}).get("engines", [])
    engines = {e["name"]: e for e in facts["container_runtime"]["engines"]}
    return required, [e for e in engines.values() if e["installed"] or e["name"] in required]


@control("runtime.nvidia", "nvidia container runtime configured", "high", ("container_runtime",),
         "nvidia-ctk runtime configure --runtime=<docker|containerd|crio>, then restart the engine")
def runtime_nvidia(facts, policy):
    if "container_runtime" not in policy:
        return None
    required, engines = _engines_in_scope(facts, policy)
    if not engines:
        return not_applicable("no container engine installed")
    missing = [e["name"] for e in engines if e["name"] in required and not e["installed"]]
    bare = [e["name"] for e in engines if e["installed"] and not e["nvidia_runtime"]]
    if missing or bare:
        parts = ([f"not installed: {', '.join(missing)}"] if missing else []) + \
                ([f"no nvidia runtime in: {', '.join(bare)}"] if bare else [])
        return failed("; ".join(parts), missing=missing, unconfigured=bare)
    return passed(f"nvidia runtime configured for {', '.join(e['name'] for e in engines)}")


@control("runtime.default", "nvidia runtime is the default", "medium", ("container_runtime",),
         "nvidia-ctk runtime configure --runtime=<engine> --set-as-default, then restart the engine")
def runtime_default(facts, policy):
    if not policy.get("container_runtime", {}).get("nvidia_default"):
        return None
    _, engines = _engines_in_scope(facts, policy)
    engines = [e for e in engines if e["installed"]]
    if not engines:
        return not_applicable("no container engine installed")
    not_default = [e["name"] for e in engines if not e["nvidia_default"]]
    if not_default:
        return failed(f"nvidia is not the default runtime of {', '.join(not_default)}", engines=not_default)
    return passed("nvidia is the default runtime")


@control("runtime.toolkit", "nvidia-container-toolkit version", "high", ("container_runtime.toolkit_version",),
         "upgrade nvidia-container-toolkit to the baseline's minimum")
def runtime_toolkit(facts, policy):
    minimum = policy.get("container_runtime", {}).get("toolkit_min")
    if not minimum:
        return None
    version = facts["container_runtime"]["toolkit_version"]
    if version is None:
        _, engines = _engines_in_scope(facts, policy)
        if not any(e["installed"] for e in engines):
            return not_applicable("no container engine and no toolkit installed")
        return failed("nvidia-container-toolkit is not installed", minimum=minimum)
    if version_tuple(version) < version_tuple(minimum):
        return failed(f"nvidia-container-toolkit {version} is older than {minimum}", version=version, minimum=minimum)
    return passed(f"nvidia-container-toolkit {version} >= {minimum}", version=version)


@control("runtime.cdi", "CDI spec matches the running driver", "medium", ("container_runtime.cdi",),
         "regenerate it: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (after every driver change)")
def runtime_cdi(facts, policy):
    if not policy.get("container_runtime", {}).get("cdi"):
        return None
    specs = facts["container_runtime"]["cdi_specs"]
    version = running_version(facts)
    if not specs:
        return failed("no CDI spec for nvidia.com/gpu in /etc/cdi or /var/run/cdi")
    stale = [s for s in specs if version and s["driver_version"] and s["driver_version"] != version]
    if stale:
        return failed(f"CDI spec {stale[0]['path']} was generated for driver {stale[0]['driver_version']}, "
                      f"the running driver is {version}", specs=specs, running=version)
    return passed(f"CDI spec {specs[0]['path']} matches driver {specs[0]['driver_version']}", specs=specs)


# ---- fabric manager ----------------------------------------------------------------------------

@control("fabricmanager.version", "Fabric manager matches the driver", "critical", ("fabric_manager",),
         "install nvidia-fabricmanager of exactly the driver's version and enable it", roles=("target",))
def fabricmanager_version(facts, policy):
    mode = policy.get("fabric_manager", {}).get("required")
    fm = facts["fabric_manager"]
    if mode is None or mode == "never" or (mode == "auto" and not fm["nvswitch_present"]):
        return not_applicable("no NVSwitch on this host" if mode == "auto" else "not required by the baseline")
    version = running_version(facts)
    package = fm["package_version"]
    if package is None:
        return failed("NVSwitch system without nvidia-fabricmanager: GPUs will not initialize (CUDA error 802)")
    if version and package.split("-", 1)[0] != version:
        return failed(f"fabric manager {package} does not match driver {version}", package=package, driver=version)
    if not fm["running"]:
        return failed("nv-fabricmanager is not running", package=package)
    return passed(f"fabric manager {package} running", package=package)


# ---- GPUs --------------------------------------------------------------------------------------

@control("gpu.count", "Expected GPUs visible", "critical", ("gpus",),
         "check for a GPU that fell off the bus (Xid 79), reseat or RMA; a reboot may bring it back")
def gpu_count(facts, policy):
    if facts["driver"]["state"] != "loaded":
        return not_applicable("the driver is not answering")
    expected = policy.get("gpus", {}).get("count")
    on_bus = len(facts["host"].get("pci_gpus", []))
    seen = len(live_gpus(facts))
    lost = [g["index"] for g in facts["gpus"] if g.get("lost")]
    want = max(expected or 0, on_bus)  # a GPU on the PCI bus that the driver does not see is missing too
    if seen < want or lost:
        return failed(f"{seen} GPUs answer, {want} expected ({on_bus} on the PCI bus)"
                      + (f"; GPU {', '.join(map(str, lost))} lost" if lost else ""),
                      visible=seen, expected=want, on_pci_bus=on_bus, lost=lost)
    return passed(f"{seen} GPUs visible", visible=seen, expected=want, on_pci_bus=on_bus)


@control("gpu.ecc", "ECC mode", "high", ("gpus",),
         "nvidia-smi -e 1 (or 0), then reset the GPU or reboot for it to take effect")
def gpu_ecc(facts, policy):
    wanted = policy.get("gpus", {}).get("ecc")
    gpus = live_gpus(facts)
    if wanted is None or not gpus:
        return None if wanted is None else not_applicable("no GPU visible")
    wrong = [g["index"] for g in gpus if g["ecc"]["enabled"] is not None and g["ecc"]["enabled"] != wanted]
    pending = [g["index"] for g in gpus if g["ecc"]["pending"] is not None and g["ecc"]["pending"] != g["ecc"]["enabled"]]
    if wrong:
        return failed(f"ECC is {'off' if wanted else 'on'} on GPU {', '.join(map(str, wrong))}"
                      + (" (a change is pending a reset)" if pending else ""), gpus=wrong, pending=pending)
    return passed(f"ECC {'on' if wanted else 'off'} on all {len(gpus)} GPUs")


@control("gpu.ecc_errors", "No uncorrectable ECC errors", "critical", ("gpus",),
         "drain the host and reset the GPU; repeated uncorrectable errors mean RMA")
def gpu_ecc_errors(facts, policy):
    gpus = [g for g in live_gpus(facts) if g["ecc"]["enabled"]]
    if not gpus:
        return not_applicable("no GPU with ECC on")
    bad = {g["index"]: g["ecc"]["uncorrected_volatile"] for g in gpus if (g["ecc"]["uncorrected_volatile"] or 0) > 0}
    if bad:
        return failed(f"uncorrectable ECC errors since the last reset on GPU {', '.join(map(str, bad))}",
                      uncorrected_volatile=bad)
    aggregate = {g["index"]: g["ecc"]["uncorrected_aggregate"] for g in gpus if (g["ecc"]["uncorrected_aggregate"] or 0) > 0}
    if aggregate:
        return warned("no uncorrectable ECC errors since the last reset, but some in the GPU's lifetime",
                      uncorrected_aggregate=aggregate)
    return passed(f"no uncorrectable ECC errors on {len(gpus)} GPUs")


@control("gpu.remapped_rows", "Row remapping healthy", "high", ("gpus",),
         "a pending remap needs a GPU reset; a remap failure means the GPU should be RMA'd")
def gpu_remapped_rows(facts, policy):
    limit = policy.get("gpus", {}).get("max_uncorrectable_remapped_rows")
    gpus = [g for g in live_gpus(facts) if g.get("remapped_rows")]
    if not gpus:
        return not_applicable("row remapping not supported or no GPU visible")
    failure = [g["index"] for g in gpus if g["remapped_rows"]["failure"]]
    pending = [g["index"] for g in gpus if g["remapped_rows"]["pending"]]
    over = {g["index"]: g["remapped_rows"]["uncorrectable"] for g in gpus
            if limit is not None and (g["remapped_rows"]["uncorrectable"] or 0) > limit}
    if failure:
        return failed(f"row remapping FAILED on GPU {', '.join(map(str, failure))}", failure=failure)
    if pending:
        return failed(f"row remap pending (reset needed) on GPU {', '.join(map(str, pending))}", pending=pending)
    if over:
        return warned(f"uncorrectable remapped rows above {limit}: {over}", uncorrectable=over, limit=limit)
    return passed(f"no pending or failed row remaps on {len(gpus)} GPUs")


@control("gpu.retired_pages", "Retired pages within limit", "high", ("gpus",),
         "a pending retirement needs a reboot; many retired pages mean RMA")
def gpu_retired_pages(facts, policy):
    limit = policy.get("gpus", {}).get("max_retired_pages")
    gpus = [g for g in live_gpus(facts) if g.get("retired_pages")]
    if limit is None:
        return None
    if not gpus:
        return not_applicable("page retirement not used on these GPUs (row remapping replaces it)")
    over = {g["index"]: g["retired_pages"]["single_bit"] + g["retired_pages"]["double_bit"] for g in gpus
            if g["retired_pages"]["single_bit"] + g["retired_pages"]["double_bit"] > limit}
    pending = [g["index"] for g in gpus if g["retired_pages"]["pending"]]
    if over or pending:
        return failed(f"retired pages over {limit} on {sorted(over)} / pending on {pending}", over=over, pending=pending)
    return passed(f"retired pages within {limit}")


@control("gpu.mig", "MIG mode as expected", "medium", ("gpus",),
         "nvidia-smi -mig 1 (or 0) on each GPU, then reset it")
def gpu_mig(facts, policy):
    wanted = policy.get("gpus", {}).get("mig")
    if wanted is None:
        return None
    gpus = [g for g in live_gpus(facts) if g.get("mig")]
    if not gpus:
        return not_applicable("MIG not supported or no GPU visible")
    wrong = [g["index"] for g in gpus if g["mig"]["current"] != wanted]
    if wrong:
        return failed(f"MIG is {'off' if wanted else 'on'} on GPU {', '.join(map(str, wrong))}", gpus=wrong)
    return passed(f"MIG {'on' if wanted else 'off'} on {len(gpus)} GPUs")


@control("gpu.pcie", "PCIe link at full width", "medium", ("gpus",),
         "reseat the GPU or riser; a degraded link width costs host-device bandwidth")
def gpu_pcie(facts, policy):
    if not policy.get("gpus", {}).get("pcie_full_width"):
        return None
    gpus = [g for g in live_gpus(facts) if g.get("pcie") and g["pcie"].get("width") and g["pcie"].get("width_max")]
    if not gpus:
        return not_applicable("no PCIe link readable")
    narrow = {g["index"]: f"x{g['pcie']['width']}/x{g['pcie']['width_max']}" for g in gpus if g["pcie"]["width"] < g["pcie"]["width_max"]}
    if narrow:
        return failed(f"PCIe link below full width: {narrow}", links=narrow)
    # An idle GPU lowers its link generation to save power: that alone is not a fault.
    return passed(f"PCIe links at full width on {len(gpus)} GPUs")


@control("gpu.clocks", "No hardware slowdown", "low", ("gpus",),
         "check cooling and power delivery (HW slowdown / thermal / power brake)")
def gpu_clocks(facts, policy):
    gpus = [g for g in live_gpus(facts) if g.get("clock_event_reasons")]
    if not gpus:
        return not_applicable("no clock-event reasons readable")
    hw = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}
    slowed = {g["index"]: sorted(hw & set(g["clock_event_reasons"]["active"])) for g in gpus
              if hw & set(g["clock_event_reasons"]["active"])}
    if slowed:
        return warned(f"clocks held down by {slowed}", reasons=slowed)
    return passed("no hardware or thermal slowdown")


@control("gpu.xid", "No Xid errors since boot", "critical", ("xid",),
         "read the event's action; drain and reset for critical Xids, check the job for application Xids")
def gpu_xid(facts, policy):
    threshold = policy.get("xid", {}).get("fail_on", "high")
    events = facts["xid"]["events"]
    if not events:
        return passed("no Xid events in the kernel log since boot")
    bad = [e for e in events if severity_rank(e["severity"]) >= severity_rank(threshold)]
    summary = sorted({(e["code"], e["name"] or "", e["severity"]) for e in events})
    evidence = {"events": [{k: e.get(k) for k in ("code", "pci_bus_id", "gpu_instance", "class", "severity", "source", "raw")}
                           for e in events[-20:]], "count": len(events)}
    codes = ", ".join(f"{code} ({name})" for code, name, _ in summary)
    if bad:
        action = next((e["action"] for e in bad if e.get("action")), "")
        return failed(f"{len(bad)} Xid event(s) at or above {threshold}: {codes}" + (f" -> {action}" if action else ""), **evidence)
    return warned(f"{len(events)} Xid event(s) below {threshold}: {codes}", **evidence)


@control("gpu.recovery_action", "No GPU recovery action pending", "high", ("gpus",),
         "do what the driver asks: reset the GPU, reboot, or drain and reset")
def gpu_recovery_action(facts, policy):
    gpus = [g for g in live_gpus(facts) if g.get("recovery_action") is not None]
    if not gpus:
        return not_applicable("recovery action not reported by this driver")
    pending = {g["index"]: g["recovery_action"] for g in gpus if g["recovery_action"] != "None"}
    if pending:
        return failed(f"the driver asks for recovery: {pending}", actions=pending)
    return passed("no recovery action pending")


# ---- interconnect: NVLink, NVSwitch fabric, topology, GPUDirect RDMA (docs/interconnect.md) ------------------

# NVLink error counters are totals since the driver loaded: an audit sees a count with no time base, and replays
# happen on healthy links (NVIDIA's DCGM counts CRC errors as significant only at 100+ per second). Judged, as
# docs/interconnect.md fixes it: what nvidia-smi nvlink -e shows (replay, recovery, crc) and failed link recoveries.
# Only shown in the evidence: the legacy crc_flit / crc_data / ecc_data counters (crc_data and ecc_data count on every
# healthy link of a real 2x H200 after traffic - 143 to 308 per GPU after 100 s - while nvidia-smi says 0:
# tests/testdata/h200x2-580.159.04-audit) and the symbol / effective counts of newer drivers. A GPU warns (which
# blocks nothing) when its links' judged counters add up to more than 100: a few replays over weeks of uptime stay
# under it, a flapping link passes it in minutes. Counters fail only over the baseline's
# interconnect.nvlink.errors_fail, which has no default.
NVLINK_ERROR_COUNTERS = ("replay", "recovery", "crc", "recovery_failed")
NVLINK_ERRORS_WARN = 100


def link_counts(link: dict[str, Any]) -> dict[str, int | None]:
    """A link's error counters, with `crc` taken from its legacy source (crc_flit) in facts from before the
    nvidia-smi-style crc counter."""
    counts = dict(link.get("errors") or {})
    if "crc" not in counts:
        counts["crc"] = counts.pop("crc_flit", None)
    return counts


def nvlink_errors(gpu: dict[str, Any]) -> int:
    """The NVLink errors nvidia-smi shows (replay, recovery, CRC) and failed recoveries, over a GPU's links."""
    return sum(v for link in (gpu.get("nvlink") or {}).get("links", [])
               for k, v in link_counts(link).items() if k in NVLINK_ERROR_COUNTERS and v)
# nvmlGpuFabricInfo_v2 healthMask: 2-bit fields, value 1 (TRUE) when the condition holds (nvml.h).
FABRIC_HEALTH = {0: "degraded bandwidth", 2: "route recovery in progress", 4: "route unhealthy",
                 6: "access timeout recovery in progress"}
FABRIC_802 = ("CUDA programs fail with error 802 until the fabric manager completes it; check nv-fabricmanager "
              "(version must equal the driver's)")
_NV = re.compile(r"NV([0-9]+)")


def short_pci(bus_id: str | None) -> str:
    """00000000:9B:00.0 -> 0000:9b:00.0, the form of lspci, sysfs and the kernel log."""
    if not bus_id:
        return "?"
    domain, sep, rest = bus_id.partition(":")
    return (domain[-4:] + sep + rest).lower() if sep else bus_id.lower()


def gpu_label(ig: dict[str, Any]) -> str:
    return f"GPU {ig['index']} ({short_pci(ig.get('pci_bus_id'))})"


def gpu_labels(gpus: list[dict[str, Any]], of: int) -> str:
    return f"all {of} GPUs" if len(gpus) == of > 1 else ", ".join(map(gpu_label, gpus))


def nvlinks(link: str | None) -> int:
    """Bonded NVLinks of a topology relation: NV18 -> 18, a PCIe relation (PIX ... SYS) -> 0."""
    m = _NV.fullmatch(link or "")
    return int(m.group(1)) if m else 0


def _pairs(n: int) -> str:
    return f"{n} GPU pair{'s' if n != 1 else ''}"


def interconnect_of(facts: dict[str, Any]) -> tuple[dict[str, Any] | None, Check | None]:
    """facts.interconnect, or why a control has nothing to judge."""
    if "interconnect" not in facts:
        return None, not_applicable("no interconnect facts (collected by a fleetctl without them)")
    if facts["interconnect"] is None:
        return None, not_applicable("the driver is not answering: no interconnect facts")
    ic = facts["interconnect"]  # a GPU off the bus is gpu.count's finding, not an unread interconnect
    return dict(ic, gpus=[g for g in ic.get("gpus") or [] if not g.get("lost")]), None


def _uuid(facts: dict[str, Any], ig: dict[str, Any]) -> str | None:
    pci = (ig.get("pci_bus_id") or "").lower()
    for g in facts.get("gpus") or []:
        if not g.get("lost") and ((pci and (g.get("pci_bus_id") or "").lower() == pci)
                                  or (not pci and g.get("index") == ig.get("index"))):
            return g.get("uuid")
    return None


def same_gpu(facts: dict[str, Any], ig: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, Any] | None:
    """REF's interconnect entry for the GPU of IG: the same uuid (facts.gpus), else the same PCI slot, else index."""
    ref_gpus = ((ref or {}).get("interconnect") or {}).get("gpus") or []
    uuid = _uuid(facts, ig)
    if uuid:
        match = next((r for r in ref_gpus if _uuid(ref, r) == uuid), None)
        if match:
            return match
    for key in ("pci_bus_id", "index"):
        value = str(ig.get(key)).lower()
        match = next((r for r in ref_gpus if ig.get(key) is not None and str(r.get(key)).lower() == value), None)
        if match:
            return match
    return None


def _unread_message(facts: dict[str, Any], path: str) -> str:
    return next((f"{k}: {m}" for k, m in facts.get("errors", {}).items() if _unread(k, path)), "not reported")


@control("gpu.nvlink", "NVLink links up, error counters low", "high", ("interconnect.gpus[*].nvlink",),
         "drain the host; `nvidia-smi nvlink -s -i GPU` shows the links; a GPU reset or reboot retrains them, a link "
         "that stays down or keeps counting errors means reseating or replacing the GPU board (RMA). Where a board "
         "wires fewer links than the GPU reports, set interconnect.nvlink.links_up", reference=True)
def gpu_nvlink(facts, policy, reference):
    ic, skip = interconnect_of(facts)
    if skip:
        return skip
    rules = policy.get("interconnect", {}).get("nvlink", {})
    gpus = ic.get("gpus") or []
    unread = [g for g in gpus if g.get("nvlink") is None]
    if unread:
        return Check("error", "NVLink state unread: " + "; ".join(
            f"{gpu_label(g)}: {_unread_message(facts, f'interconnect.gpus[{i}].nvlink')}"
            for i, g in ((g["index"], g) for g in gpus) if g.get("nvlink") is None), {"gpus": [g["index"] for g in unread]})
    linked = [g for g in gpus if g["nvlink"]["supported"]]
    # A GPU that lists no link now (nvidia-smi: "all links are inActive") but had links up at the last passing audit
    # lost them all; without such a reference it is a GPU without NVLink wired.
    lost = [(g, ref_up) for g, ref_up in ((g, (((same_gpu(facts, g, reference) or {}).get("nvlink") or {}).get("up") or 0))
                                          for g in gpus if not g["nvlink"]["supported"]) if ref_up]
    if not linked and not lost:
        return not_applicable("no NVLink on this GPU" if len(gpus) == 1 else "no NVLink on this host's GPUs")
    warn_limit = rules.get("errors_warn", NVLINK_ERRORS_WARN)
    fail_limit = rules.get("errors_fail")
    problems = [f"{gpu_label(g)}: no NVLink link answers; {up} were up at the last passing audit" for g, up in lost]
    warnings, evidence, unwired = [], [], []
    for g in linked:
        nv = g["nvlink"]
        if rules.get("links_up") is not None:
            expected, source = rules["links_up"], "baseline"
        else:
            ref = same_gpu(facts, g, reference)
            ref_nv = (ref or {}).get("nvlink") or {}
            expected, source = (ref_nv["up"], "last passing audit") if ref_nv.get("supported") else (nv["total"], "all links")
        if nv["up"] == 0 and source == "all links":
            unwired.append(g["index"])  # a PCIe board without NVLink bridges lists its links, every one inactive
            continue
        down = [link["link"] for link in nv["links"] if link["state"] != "up"]
        counters: dict[str, int] = {}
        per_link: dict[int, int] = {}
        for link in nv["links"]:
            for name, value in link_counts(link).items():
                if value is not None:
                    counters[name] = counters.get(name, 0) + value
                    if name in NVLINK_ERROR_COUNTERS:
                        per_link[link["link"]] = per_link.get(link["link"], 0) + value
        errors = sum(per_link.values())
        evidence.append({"index": g["index"], "pci_bus_id": g.get("pci_bus_id"), "up": nv["up"], "total": nv["total"],
                         "expected": expected, "expected_from": source, "down": down, "errors": errors,
                         "error_counters": {k: v for k, v in counters.items() if v}})
        if nv["up"] < expected:
            why = "" if expected == nv["total"] else (
                f" ({expected} expected by the baseline)" if source == "baseline" else f" ({expected} up at the last passing audit)")
            problems.append(f"{gpu_label(g)}: {nv['up']} of {nv['total']} NVLink links up{why}; down: "
                            + (", ".join(map(str, down)) or "none listed"))
        if errors:
            worst = max(per_link, key=lambda link: per_link[link])
            detail = (f"{gpu_label(g)}: {errors} NVLink errors since the driver loaded ("
                      + ", ".join(f"{k} {v}" for k, v in sorted(counters.items(), key=lambda kv: -kv[1])
                                  if v and k in NVLINK_ERROR_COUNTERS)
                      + f"; most on link {worst}: {per_link[worst]})")
            if fail_limit is not None and errors > fail_limit:
                problems.append(f"{detail}, over the limit of {fail_limit}")
            elif warn_limit is not None and errors > warn_limit:
                warnings.append(f"{detail}, over {warn_limit}")
    no_nvlink = [g["index"] for g in gpus if not g["nvlink"]["supported"]]
    facts_of = {"gpus": evidence, "errors_warn": warn_limit, "errors_fail": fail_limit, "no_nvlink": no_nvlink,
                "no_link_up": unwired}
    if reference and any(e["expected_from"] == "last passing audit" for e in evidence):
        facts_of["reference_collected_at"] = reference.get("collected_at")
    if problems:
        return failed("; ".join(problems), **facts_of)
    if warnings:
        return warned("; ".join(warnings), **facts_of)
    if not evidence:
        return not_applicable("the GPUs list NVLink links but none is up, and neither the baseline "
                              "(interconnect.nvlink.links_up) nor a passing audit expects one: a PCIe board without "
                              "NVLink bridges", **facts_of)
    shapes = sorted({f"{e['up']} of {e['total']}" for e in evidence})
    sources = sorted({e["expected_from"] for e in evidence})
    return passed(f"NVLink: {' / '.join(shapes)} links up on {len(linked)} GPU{'s' if len(linked) > 1 else ''} "
                  f"(expected: {', '.join(sources)}), {sum(e['errors'] for e in evidence)} link errors", **facts_of)


@control("gpu.fabric", "NVSwitch fabric registration completed", "critical", (),
         "restart nv-fabricmanager at exactly the driver's version (see fabricmanager.version) and read "
         "/var/log/fabricmanager.log; a GPU that stays out of the fabric needs a GPU reset or a reboot")
def gpu_fabric(facts, policy):
    # No `needs`: whether an unread fabric state matters depends on the host being an NVSwitch host.
    ic, skip = interconnect_of(facts)
    fm = facts.get("fabric_manager") or {}
    if skip:
        unread = any(_unread(k, "interconnect.gpus[*].fabric") for k in facts.get("errors", {}))
        if unread and fm.get("nvswitch_present"):
            return Check("error", f"fabric state unread: {_unread_message(facts, 'interconnect.gpus[*].fabric')}")
        return skip
    gpus = ic.get("gpus") or []
    on_fabric = [g for g in gpus if g.get("fabric") and g["fabric"]["state"] != "not_supported"]
    switch_links = any(((link.get("remote") or {}).get("type") == "switch")
                       for g in gpus for link in ((g.get("nvlink") or {}).get("links") or []))
    if not (on_fabric or fm.get("nvswitch_present") or switch_links):
        return not_applicable("not an NVSwitch host: no GPU on an NVSwitch fabric")
    unread = [(g["index"], g) for g in gpus  # completed without a status: one NVML did not name
              if g.get("fabric") is None or (g["fabric"]["state"] == "completed" and g["fabric"].get("status") is None)]
    if unread:
        return Check("error", "fabric state unread on an NVSwitch host: " + "; ".join(
            f"{gpu_label(g)}: {_unread_message(facts, f'interconnect.gpus[{i}].fabric')}" for i, g in unread),
            {"gpus": [g["index"] for _, g in unread]})
    if not on_fabric:
        return not_applicable("NVSwitch host whose GPUs report no fabric state (before Hopper NVML has none); "
                              "fabricmanager.version checks the fabric manager")
    evidence = {"fabric": {g["index"]: g["fabric"] for g in gpus}}
    by_state: dict[str, list[dict[str, Any]]] = {}
    for g in gpus:
        by_state.setdefault(g["fabric"]["state"], []).append(g)
    problems = []
    for state, words in (("not_started", "not started"), ("in_progress", "in progress")):
        if by_state.get(state):
            problems.append(f"{gpu_labels(by_state[state], len(gpus))}: fabric registration {words}: {FABRIC_802}")
    for g in by_state.get("completed", []):
        if g["fabric"].get("status") != "success":
            problems.append(f"{gpu_label(g)}: fabric registration completed with status {g['fabric'].get('status')}")
    if by_state.get("not_supported"):
        problems.append(f"{gpu_labels(by_state['not_supported'], len(gpus))}: no fabric state while "
                        f"{', '.join(str(g['index']) for g in on_fabric)} report one")
    if problems:
        version = running_version(facts)
        if fm.get("nvswitch_present") and fm.get("package_version") is None:
            problems.append("nvidia-fabricmanager is not installed")
        elif fm.get("nvswitch_present") and not fm.get("running"):
            problems.append(f"nv-fabricmanager {fm['package_version']} is not running")
        elif fm.get("package_version") and version and fm["package_version"].split("-", 1)[0] != version:
            problems.append(f"fabric manager {fm['package_version']} != driver {version}")
        return failed("; ".join(problems), **evidence)
    unhealthy = {}
    for g in gpus:
        mask = g["fabric"].get("health_mask") or 0
        flags = [name for shift, name in FABRIC_HEALTH.items() if (mask >> shift) & 0x3 == 1]
        if flags:
            unhealthy[g["index"]] = flags
    if unhealthy:
        return warned("fabric registered, but its health mask reports: " + "; ".join(
            f"GPU {i}: {', '.join(f)}" for i, f in unhealthy.items()), health=unhealthy, **evidence)
    cliques = sorted({g["fabric"].get("clique_id") for g in gpus}, key=str)
    return passed(f"fabric registration completed (success) on all {len(gpus)} GPUs, clique "
                  f"{', '.join(map(str, cliques))}", **evidence)


@control("gpu.topology", "GPU pairs connected as expected", "high", ("interconnect.topology",),
         "a pair below its NVLinks talks over PCIe: see gpu.nvlink and gpu.fabric for the links and the fabric; "
         "`nvidia-smi topo -m` shows the matrix. Boards with different links per pair: leave interconnect.topology "
         "out and the host's last passing audit is the reference", reference=True)
def gpu_topology(facts, policy, reference):
    ic, skip = interconnect_of(facts)
    if skip:
        return skip
    gpus = ic.get("gpus") or []
    pairs = ic.get("topology")
    if len(gpus) < 2:
        return not_applicable("fewer than 2 GPUs")
    if pairs is None:
        return Check("error", f"GPU topology unread: {_unread_message(facts, 'interconnect.topology')}")
    counts: dict[str, int] = {}
    for p in pairs:
        counts[p["link"]] = counts.get(p["link"], 0) + 1
    shape = ", ".join(f"{link} x {n}" for link, n in sorted(counts.items(), key=lambda kv: (-nvlinks(kv[0]), kv[0])))
    evidence: dict[str, Any] = {"pairs": {f"{p['gpus'][0]}-{p['gpus'][1]}": p["link"] for p in pairs}}
    wanted = policy.get("interconnect", {}).get("topology")
    if wanted:
        wrong = [f"GPU {p['gpus'][0]}-{p['gpus'][1]} {p['link']}" for p in pairs if p["link"] != wanted]
        if wrong:
            shown = ", ".join(wrong[:8]) + (f" and {len(wrong) - 8} more" if len(wrong) > 8 else "")
            return failed(f"{len(wrong)} of {_pairs(len(pairs))} not {wanted} (the baseline's): {shown}",
                          expected=wanted, **evidence)
        return passed(f"all {_pairs(len(pairs))} {wanted}" if len(pairs) > 1 else f"the GPU pair is {wanted}",
                      expected=wanted, **evidence)
    ref_ic = (reference or {}).get("interconnect") or {}
    if not ref_ic.get("topology"):
        return passed(f"{_pairs(len(pairs))}: {shape} (no interconnect.topology in the baseline and no earlier "
                      f"passing audit to compare with: this one becomes the reference)", **evidence)
    now_index = {}
    for g in gpus:
        ref_gpu = same_gpu(facts, g, reference)
        if ref_gpu is not None:
            now_index[ref_gpu["index"]] = g["index"]
    now = {tuple(sorted(p["gpus"])): p["link"] for p in pairs}
    fell = []
    for p in ref_ic["topology"]:
        a, b = (now_index.get(i) for i in p["gpus"])
        if a is None or b is None or nvlinks(p["link"]) == 0:
            continue  # a GPU gone is gpu.count's finding; changes between PCIe relations are not this control's
        link = now.get(tuple(sorted((a, b))))
        if link is not None and nvlinks(link) < nvlinks(p["link"]):
            fell.append(f"GPU {a}-{b} {p['link']} -> {link}")
    evidence["reference_collected_at"] = reference.get("collected_at")
    if fell:
        shown = ", ".join(fell[:8]) + (f" and {len(fell) - 8} more" if len(fell) > 8 else "")
        return failed(f"{_pairs(len(fell))} lost NVLinks since the last passing audit "
                      f"({reference.get('collected_at')}): {shown}", lost=fell, **evidence)
    return passed(f"{_pairs(len(pairs))}: {shape}, none below the last passing audit", **evidence)


@control("gpudirect.peermem", "GPUDirect RDMA module loaded", "medium", ("interconnect.peermem_loaded",),
         "modprobe nvidia_peermem (it ships with the driver and needs the RDMA stack: MLNX_OFED/DOCA or rdma-core) "
         "and load it at boot: echo nvidia_peermem > /etc/modules-load.d/nvidia-peermem.conf")
def gpudirect_peermem(facts, policy):
    if not policy.get("interconnect", {}).get("peermem"):
        return None
    ic, skip = interconnect_of(facts)
    if skip:
        return skip
    if ic.get("peermem_loaded") is None:
        return Check("error", f"nvidia_peermem state unread: {_unread_message(facts, 'interconnect.peermem_loaded')}")
    if not ic["peermem_loaded"]:
        return failed("nvidia_peermem is not loaded: no GPUDirect RDMA, so NCCL and MPI stage GPU buffers through "
                      "host memory for the network (unless they use DMA-BUF)")
    return passed("nvidia_peermem is loaded (GPUDirect RDMA)")


# ---- evaluation --------------------------------------------------------------------------------

def _pattern(path: str) -> str:
    return re.escape(path).replace(r"\[\*\]", r"\[\d+\]")


def _unread(key: str, need: str) -> bool:
    """An error recorded at KEY leaves NEED unread: KEY is NEED, inside it, or one of its parents ("interconnect"
    leaves "interconnect.gpus[*].nvlink" unread). "[*]" in NEED stands for any index."""
    if re.fullmatch(_pattern(need) + r"(?:[.\[].*)?", key):
        return True
    parents = re.split(r"(?=[.\[])", need)[:-1]
    return any(re.fullmatch(_pattern("".join(parents[:i + 1])), key) for i in range(len(parents)))


def _fact_error(facts: dict[str, Any], needs: tuple[str, ...]) -> str | None:
    if "gpus" in needs:
        needs = needs + ("nvml",)  # NVML failing as a whole leaves every GPU fact unread
    for key, message in facts.get("errors", {}).items():
        if any(_unread(key, n) for n in needs):
            return f"{key}: {message}"
    return None


def evaluate(facts: dict[str, Any], policy: dict[str, Any],
             reference: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Findings for one host, one per control, in CONTROLS order.

    REFERENCE maps a control id to the host's facts at its latest recorded audit where that control passed (see
    Store.passing_facts); controls registered with reference=True get theirs, or None."""
    severities = policy.get("severity", {})
    findings = []
    for c in CONTROLS:
        error = _fact_error(facts, c.needs)
        if error:
            check = Check("error", f"could not read the facts this control needs: {error}")
        else:
            args = (facts, policy, (reference or {}).get(c.id)) if c.uses_reference else (facts, policy)
            check = c.evaluate(*args) or not_applicable("not required by the baseline")
        findings.append({"control": c.id, "title": c.title, "severity": severities.get(c.id, c.severity),
                         "status": check.status, "message": check.message, "evidence": check.evidence,
                         "remediation": c.remediation if check.status in ("fail", "warn", "error") else None})
    return findings


def error_finding(control_id: str, title: str, message: str) -> dict[str, Any]:
    """The one finding of a host whose facts could not be had (unreachable, or garbage returned)."""
    return {"control": control_id, "title": title, "severity": "critical", "status": "error", "message": message,
            "evidence": {}, "remediation": "check SSH access and the host's Python; rerun the audit"}
