"""nouveau: not loaded, blacklisted, absent from the initramfs."""

from __future__ import annotations

from .base import failed, not_applicable, passed
from .registry import control


@control("nouveau.not_loaded", "nouveau not loaded", "critical", ("nouveau",),
         "blacklist nouveau, rebuild the initramfs (update-initramfs -u / dracut -f) and reboot",
         roles=("boot_risk", "restored_on_rollback"))
def nouveau_not_loaded(facts, policy):
    """Fails when `/sys/module/nouveau` exists."""
    if facts["nouveau"]["loaded"]:
        return failed("the nouveau module is loaded: the NVIDIA driver cannot bind the GPUs")
    return passed("nouveau is not loaded")


@control("nouveau.blacklisted", "nouveau blacklisted", "high", ("nouveau.blacklisted",),
         "echo 'blacklist nouveau' > /etc/modprobe.d/blacklist-nouveau.conf, then rebuild the initramfs",
         roles=("boot_risk", "restored_on_rollback"))
def nouveau_blacklisted(facts, policy):
    """Fails when no `blacklist nouveau` in modprobe.d (/etc, /run, /usr/lib, /lib) nor on the kernel command line."""
    if not policy.get("nouveau", {}).get("blacklisted"):
        return None
    n = facts["nouveau"]
    if not n["blacklisted"]:
        return failed("nouveau is not blacklisted in modprobe.d or on the kernel command line: it can come back")
    return passed(f"nouveau blacklisted in {', '.join(n['blacklist_files'])}", files=n["blacklist_files"])


@control("nouveau.initramfs", "nouveau absent from the initramfs", "medium", ("nouveau.in_initramfs",),
         "rebuild the initramfs after blacklisting: update-initramfs -u (Debian/Ubuntu) or dracut -f (EL)",
         roles=("restored_on_rollback",))
def nouveau_initramfs(facts, policy):
    """Fails when `nouveau.ko` is inside the running kernel's initramfs."""
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
