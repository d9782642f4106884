"""The container runtime: engines configured for nvidia, its default, the toolkit, the CDI spec."""

from __future__ import annotations

from .base import failed, not_applicable, passed, running_version, version_tuple
from .registry import control


def _engines_in_scope(facts, policy):
    required = policy.get("container_runtime", {}).get("engines", [])
    engines = {e["name"]: e for e in facts["container_runtime"]["engines"]}
    return required, [e for e in engines.values() if e["installed"] or e["name"] in required]


@control("runtime.nvidia", "nvidia container runtime configured", "high", ("container_runtime",),
         "nvidia-ctk runtime configure --runtime=<docker|containerd|crio>, then restart the engine",
         roles=("restored_on_rollback",))
def runtime_nvidia(facts, policy):
    """Fails when docker / containerd / cri-o is installed (or required) without the nvidia runtime."""
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
         "nvidia-ctk runtime configure --runtime=<engine> --set-as-default, then restart the engine",
         roles=("restored_on_rollback",))
def runtime_default(facts, policy):
    """Fails when nvidia is not the engines' default runtime."""
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
         "upgrade nvidia-container-toolkit to the baseline's minimum",
         roles=("restored_on_rollback",))
def runtime_toolkit(facts, policy):
    """Fails when `nvidia-container-toolkit` is missing or older than the minimum (default 1.17.8, CVE-2025-23266)."""
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


@control("runtime.cdi", "CDI spec matches the running driver", "medium", ("container_runtime.cdi_specs",),
         "regenerate it: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (after every driver change)",
         roles=("restored_on_rollback",))
def runtime_cdi(facts, policy):
    """Fails when there is no CDI spec in /etc/cdi or /var/run/cdi, or one generated for another driver version."""
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
