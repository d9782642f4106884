"""One lab host's "hardware": `python -m fleetctl_lab.supervisor HOSTDIR` (see docs/lab.md).

Started by hosts.up as `ip netns exec fl-<name> unshare --mount --uts --pid --fork --kill-child --propagation private
python -m fleetctl_lab.supervisor HOSTDIR`, so it is PID 1 of the host's PID namespace (the host's `ps` and
/proc show only the host's processes; killing the supervisor kills the whole host) and owns a private mount
namespace (every mount below disappears with it). It mounts the host's root (overlay over /), the emulated kernel
files, then boots: kernel state, nvidia-persistenced, sshd. A reboot request from the host's shutdown/reboot shims
kills every process of the host and boots again; the hardware (hw/) and the root's changes (dpkg state) survive.

The host's parts (root filesystem, provisioning, kernel modules, init and daemons) are in fleetctl_lab.host; this
module is the loop that boots the host, answers its requests and reboots it.

Standard library only: it runs before and beside everything else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .conf import read_conf
from .host.base import POLL_S, HostBase, log
from .host.daemons import InitSystem
from .host.kernel_modules import KernelModules
from .host.provision import Provisioning
from .host.rootfs import RootFilesystem

REBOOT_GRACE_S = 0.2        # the shim's command returns to its caller before the host goes down
# Then down this long (+ faults.conf slow_reboot): ansible.builtin.reboot looks again ~1.5 s after its first look (a
# backoff of 1, 2, 4 ... s + up to 1 s), so the host is seen back at the second look; down 3 s, as it once was, it
# was seen at the third (~4 s), in every activation of every lab campaign.
REBOOT_DELAY_S = 0.5


class Host(RootFilesystem, Provisioning, KernelModules, InitSystem, HostBase):
    """One lab host: its parts (fleetctl_lab.host) and its life, the supervisor loop."""

    # -- life ---------------------------------------------------------------------------------------------------
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
        self.sleep(REBOOT_DELAY_S + float(faults.get("slow_reboot", "0") or 0))
        if not self.stopping:
            self.boot()

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            self.reap()
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def reset_driver_state(self, persistent: bool) -> None:
        """What a reboot resets on real GPUs: persistence mode is off until nvidia-persistenced runs, volatile ECC
        counters and the PCIe replay counter restart at 0, pending row remaps are applied, a recovery action is done, a
        leaked context is gone. Aggregate counts, lost GPUs and the firmware stay."""
        self.set_every_gpu(persistence=str(int(persistent)), ecc_unc_volatile="0", remap_pending="0",
                           recovery_action="0", pcie_replays="0", mem_used_mib="0")

    # -- the host's requests (REQUEST_SHIM) and reboots ---------------------------------------------------------
    def answer(self, request: Path) -> None:
        try:
            argv = [str(a) for a in json.loads(request.read_text())]
            command = {"modprobe": self.modprobe, "rmmod": self.rmmod, "modinfo": self.modinfo,
                       "systemctl": self.systemctl}[argv[0]]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            why = f"lab: cannot read the request: {e}\n"  # `e` is unbound once the except block ends
            argv, command = [request.name], lambda _args: (1, "", why)
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
        host.own_home()
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
