"""Persistence: the per-GPU mode and nvidia-persistenced."""

from __future__ import annotations

from .base import failed, live_gpus, not_applicable, passed, warned
from .registry import control


@control("persistence.mode", "Persistence mode on", "medium", ("gpus",),
         "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced)",
         roles=("restored_on_rollback",))
def persistence_mode(facts, policy):
    """Fails when a GPU has persistence mode off."""
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
         "install and enable nvidia-persistenced (systemctl enable --now nvidia-persistenced)",
         roles=("restored_on_rollback",))
def persistence_daemon(facts, policy):
    """Fails when `nvidia-persistenced` is not running (warns: running but not enabled)."""
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
