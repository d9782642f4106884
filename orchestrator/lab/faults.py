"""`fleetctl lab inject HOST FAULT ...`: faults planted at the interfaces a real GPU host shows them.

Hardware faults (ECC, row remaps, a GPU off the bus, throughput, persistence) go into the host's emulated hardware
(hw/gpus.conf, hw/faults.conf) and survive reboots as real ones would; kernel-log lines go into the host's
/dev/kmsg (kernel/kmsg) and are gone after a reboot, like a real ring buffer.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from ..errors import InputError
from . import state
from .conf import read_conf, write_conf
from .kernel import append_kmsg

# Real driver wording for the Xids the lab plants (kernel logs in bug reports and NVIDIA's catalog).
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2b_c0000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark row for remapping.",
    74: "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801348 0x204).",
    120: "GSP task exception: GSP FATAL ERROR (0x0).",
    154: "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
}
XID_FORMS = ("pci", "legacy", "mig", "bare")


def update_conf(path: Path, **changes: object) -> None:
    values = read_conf(path)
    values.update({k.replace("__", "."): str(v) for k, v in changes.items()})
    write_conf(path, values)


class Host:
    """One lab host as seen from the controller, for planting faults."""

    def __init__(self, lab: state.Lab, name: str):
        try:
            self.record = lab.host(name)
        except KeyError as e:
            raise InputError(str(e.args[0])) from None
        self.lab = lab
        self.dir = lab.host_dir(name)
        self.gpus_conf = self.dir / "hw" / "gpus.conf"
        self.faults_conf = self.dir / "hw" / "faults.conf"
        self.kmsg = self.dir / "kernel" / "kmsg"

    def gpu_key(self, gpu: int, key: str) -> str:
        count = int(read_conf(self.gpus_conf).get("count", "0"))
        if not 0 <= gpu < count:
            raise InputError(f"{self.record.name} has GPUs 0..{count - 1}, not {gpu}")
        return f"gpu.{gpu}.{key}"

    def set_gpu(self, gpu: int, **values: object) -> None:
        conf = read_conf(self.gpus_conf)
        for key, value in values.items():
            conf[self.gpu_key(gpu, key)] = str(value)
        write_conf(self.gpus_conf, conf)

    def pci(self, gpu: int) -> str:
        return read_conf(self.gpus_conf)[self.gpu_key(gpu, "pci")]

    def kernel_log(self, message: str, priority: int = 3) -> None:
        """Append one record to the host's /dev/kmsg, numbered after the last one."""
        append_kmsg(self.dir / "kernel", [(priority, message)])


def xid_line(code: int, pci: str, form: str = "pci", pid: int = 40213, process: str = "python3") -> str:
    """One NVRM Xid line in the given log form; PCI is NVML's bus id (00000000:18:00.0)."""
    domain, bus, rest = pci.split(":")
    short = f"{domain[-4:]}:{bus}:{rest.split('.')[0]}"
    text = XID_TEXT.get(code, "Unknown Error")
    if form == "bare":
        return f"NVRM: GPU {domain[-4:]}:{bus}:{rest}: GPU has fallen off the bus."
    if form == "legacy":
        return f"NVRM: Xid ({short}): {code}, {text}"
    where = f"PCI:{short}" + (" GPU-I:05" if form == "mig" else "")
    if code == 154:
        return f"NVRM: Xid ({where}): {code}, {text}"
    return f"NVRM: Xid ({where}): {code}, pid={pid}, name={process}, {text}"


# ---- the faults ------------------------------------------------------------------------------

def xid(host: Host, code: int, gpu: int = 0, form: str = "pci") -> str:
    line = xid_line(code, host.pci(gpu), form)
    host.kernel_log(line)
    if code == 154:
        host.set_gpu(gpu, recovery_action=4)
    return line


def check_version(version: str) -> str:
    if not re.match(r"^\d{3}\.\d{1,3}(\.\d{1,3})?$", version):
        raise InputError(f"{version!r} is not a driver version (like 570.86.15)")
    return version


def kmsg(host: Host, line: str) -> str:
    if any(ord(ch) < 32 for ch in line):
        raise InputError("a kernel log line is one line of printable text")
    host.kernel_log(line)
    return line


def ecc(host: Host, gpu: int, volatile: int, aggregate: int | None = None) -> str:
    host.set_gpu(gpu, ecc_unc_volatile=volatile, ecc_unc_aggregate=aggregate if aggregate is not None else volatile)
    return f"GPU {gpu}: {volatile} uncorrectable ECC errors"


def remap(host: Host, gpu: int, uncorrectable: int = 1, pending: bool = True, failure: bool = False) -> str:
    host.set_gpu(gpu, remap_unc=uncorrectable, remap_pending=int(pending), remap_failure=int(failure))
    if pending:
        host.kernel_log(xid_line(63, host.pci(gpu)))
    if failure:
        host.kernel_log(xid_line(64, host.pci(gpu)))
    return f"GPU {gpu}: {uncorrectable} uncorrectable remapped rows, pending={pending}, failure={failure}"


def fall_off_bus(host: Host, gpu: int) -> str:
    """The GPU stops answering (NVML: GPU is lost) and the driver logs Xid 79 and the bare line."""
    host.set_gpu(gpu, lost=1)
    host.kernel_log(xid_line(79, host.pci(gpu)))
    host.kernel_log(xid_line(79, host.pci(gpu), form="bare"))
    return f"GPU {gpu} ({host.pci(gpu)}) fell off the bus"


def throughput(host: Host, factor: float, driver: str | None = None) -> str:
    if not 0 < factor <= 2:
        raise InputError(f"throughput factor must be in (0, 2], not {factor}")
    update_conf(host.faults_conf, **{f"throughput__{check_version(driver) if driver else 'any'}": factor})
    return f"throughput x{factor} on driver {driver or 'any'}"


def at_boot(host: Host, driver: str, kind: str, code: int, gpu: int) -> str:
    """Hardware that breaks when DRIVER loads: at every boot with it, the GPU logs Xid CODE (kind xid) or falls
    off the bus (kind lost: it stays lost, as a GPU that fell off does until a cold reset)."""
    host.gpu_key(gpu, "pci")
    version = check_version(driver)
    if kind == "xid":
        update_conf(host.faults_conf, **{f"boot_xid__{version}": f"{code}:{gpu}"})
        return f"Xid {code} on GPU {gpu} at every boot with driver {version}"
    update_conf(host.faults_conf, **{f"boot_lost__{version}": gpu})
    return f"GPU {gpu} falls off the bus at the next boot with driver {version}"


def gpu_in_use(host: Host, gpu: int) -> str:
    """A job keeps running on GPU: a process in the host that NVML lists as the GPU's compute process (until it
    exits or the host reboots)."""
    host.gpu_key(gpu, "process")
    proc = run_in_host(host, ["sh", "-c", "sleep 86400 </dev/null >/dev/null 2>&1 & echo $!"])
    pid = int(proc.stdout.split()[-1])
    host.set_gpu(gpu, process=pid)
    return f"GPU {gpu} in use by pid {pid} (sleep)"


def drm_in_use(host: Host, restore: bool = False) -> str:
    """A console holds nvidia_drm (fbcon on an nvidia-drm framebuffer): the modules cannot be unloaded, only a
    reboot loads another driver."""
    update_conf(host.faults_conf, drm_in_use=0 if restore else 1)
    return "nvidia_drm " + ("free again" if restore else "held by the console (fbcon)")


def slow_reboot(host: Host, seconds: float) -> str:
    update_conf(host.faults_conf, slow_reboot=seconds)
    return f"reboots take {seconds}s longer"


def install_failure(host: Host, driver: str) -> str:
    update_conf(host.faults_conf, install_fail=check_version(driver))
    return f"installing driver {driver} fails"


def nouveau(host: Host) -> str:
    """nouveau is loaded now (it comes back after a reboot only if it is not blacklisted)."""
    (host.dir / "kernel" / "sys-module" / "nouveau").mkdir(parents=True, exist_ok=True)
    host.kernel_log("nouveau 0000:18:00.0: NVIDIA GH100 (180000a1)", priority=6)
    return "nouveau loaded"


def persistence_off(host: Host, gpu: int | None = None) -> str:
    count = int(read_conf(host.gpus_conf).get("count", "0"))
    for index in [gpu] if gpu is not None else range(count):
        host.set_gpu(index, persistence=0)
    kill_in_host(host, "nvidia-persistenced")
    return "persistence mode off" + (f" on GPU {gpu}" if gpu is not None else "") + ", nvidia-persistenced stopped"


def runtime_misconfigured(host: Host) -> str:
    """Somebody replaced containerd's config: no nvidia runtime any more."""
    run_in_host(host, ["sh", "-c", "mkdir -p /etc/containerd && rm -f /etc/containerd/conf.d/99-nvidia.toml && "
                                   "printf 'version = 2\\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\\n"
                                   "  default_runtime_name = \"runc\"\\n' > /etc/containerd/config.toml"])
    return "containerd config without the nvidia runtime"


def unreachable(host: Host, mode: str = "link", restore: bool = False) -> str:
    if mode == "link":
        subprocess.run(["ip", "link", "set", host.record.veth, "up" if restore else "down"], check=True)
        return f"link {host.record.veth} {'up' if restore else 'down'}"
    if restore:
        raise InputError("sshd comes back with the host's next reboot (fleetctl lab reboot HOST)")
    kill_in_host(host, "sshd")
    return "sshd stopped"


# ---- reaching into a host --------------------------------------------------------------------

def host_pids(host: Host) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", host.record.netns], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def kill_in_host(host: Host, program: str) -> None:
    for pid in host_pids(host):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if os.path.basename(argv0.split(" ", 1)[0]) == program or argv0.startswith(f"{program}:"):
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass


def run_in_host(host: Host, argv: list[str]) -> subprocess.CompletedProcess:
    """Run a command inside the host (its mount, UTS and network namespaces, chrooted into its root)."""
    pid = host.record.supervisor_pid
    root = host.dir / "root"
    proc = subprocess.run(["nsenter", f"--target={pid}", "--mount", "--uts", "--net", "--pid", "--", "chroot", str(root), *argv],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {host.record.name}: {proc.stderr.strip()[-300:]}")
    return proc
