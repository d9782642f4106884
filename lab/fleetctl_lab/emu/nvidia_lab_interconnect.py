"""NVLink, NVSwitch fabric, topology and P2P of a fleetctl lab host, by the rules the lab's libnvidia-ml.c answers
them (docs/lab.md), for the emulated nvidia-smi and nvidia-lab-bench. Installed as
/usr/lib/nvidia-lab/nvidia_lab_interconnect.py by the driver package; standard library only.

hw is gpus.conf as a dict, sku the SKU's entry of skus.json, ROOT the $NVIDIA_LAB_ROOT prefix.
"""
import os

FABRIC_DIR = "/var/run/nvidia-fabricmanager"
REAL_LIBRARY = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"


def driver_version(compiled, root):
    """The driver version the emulated tools answer for: COMPILED in (the lab's own driver packages), or, in the
    fleetctl-lab-gpu build that stands in for real distribution packages (`+debian` hosts), the version of the real
    libnvidia-ml.so.1 the package manager installed (Debian's alternatives end in libnvidia-ml.so.470.256.02);
    "" when none is installed."""
    if compiled:
        return compiled
    real = os.path.realpath(root + REAL_LIBRARY)
    version = os.path.basename(real)[len("libnvidia-ml.so."):]
    return version if os.path.exists(real) and version.count(".") >= 1 and version[-1:].isdigit() else ""
SOCKETS = 2
CPUS_PER_SOCKET = 32


def _number(text, default=0):
    try:
        return int(str(text).strip(), 0)
    except (TypeError, ValueError):
        return default


def links_down(hw, gpu):
    """The links of GPU that trained down (gpu.N.nvlink_down: "3,7")."""
    out = set()
    for part in hw.get("gpu.%d.nvlink_down" % gpu, "").split(","):
        if part.strip().isdigit():
            out.add(int(part))
    return out


def link_count(hw, gpu, counter, link):
    """LINK's count of an NVLink error counter (gpu.N.nvlink_<counter>: "LINK:COUNT,...")."""
    total = 0
    for part in hw.get("gpu.%d.nvlink_%s" % (gpu, counter), "").split(","):
        where, _, count = part.partition(":")
        if where.strip().isdigit() and int(where) == link:
            total += _number(count)
    return total


def links_up(sku, hw, gpu):
    return len([l for l in range(sku.get("nvlinks", 0)) if l not in links_down(hw, gpu)])


def fabric_manager_version(root):
    """The version of the nv-fabricmanager that runs (its pid file names a live nv-fabricmanager), or None."""
    try:
        with open(root + FABRIC_DIR + "/nv-fabricmanager.pid") as f:
            pid = int(f.read().split()[0])
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode("utf-8", "replace")
        if os.path.basename(argv0) != "nv-fabricmanager":
            return None
        with open(root + FABRIC_DIR + "/nv-fabricmanager.version") as f:
            return f.read().strip()
    except (IOError, OSError, ValueError, IndexError):
        return None


def fabric_domain(hw):
    """(cluster UUID, clique id) of a tray in a multi-node NVLink domain (gpus.conf fabric.cluster_uuid and
    fabric.clique_id, the lab spec's +domain=NAME), or None."""
    cluster = hw.get("fabric.cluster_uuid")
    return (cluster, _number(hw.get("fabric.clique_id"))) if cluster else None


def fabric_state(root, sku, hw, driver_version):
    """completed on a tray of a multi-node NVLink domain (the rack's switch trays run its fabric), not_supported
    (no NVSwitch), completed (the fabric manager runs at DRIVER_VERSION, no fabric_stuck fault), else in_progress."""
    if fabric_domain(hw):
        return "completed"
    if not sku.get("nvswitch"):
        return "not_supported"
    if _number(hw.get("fabric_stuck", "0")) or fabric_manager_version(root) != driver_version:
        return "in_progress"
    return "completed"


def socket_of(index, count):
    """Two CPU sockets; GPUs 0..n/2-1 hang off the first, all on it with 1 or 2 GPUs (lab/fleetctl_lab/skus.py)."""
    return 0 if count <= 2 else index * SOCKETS // count


def cpu_affinity(index, count):
    first = socket_of(index, count) * CPUS_PER_SOCKET
    return "%d-%d" % (first, first + CPUS_PER_SOCKET - 1)


def topology(sku, hw, count, a, b):
    """(`nvidia-smi topo -m` cell, bonded NVLinks) of GPUs A and B: NV<n> through the NVSwitches (n: the fewer links
    up of the two), else the PCIe relation (NODE within a socket, SYS across)."""
    if a == b:
        return "X", 0
    if sku.get("nvlinks"):
        n = min(links_up(sku, hw, a), links_up(sku, hw, b))
        if n:
            return "NV%d" % n, n
    return ("NODE" if socket_of(a, count) == socket_of(b, count) else "SYS"), 0


# nvmlGpuP2PStatus_t
P2P_OK, P2P_TOPOLOGY_NOT_SUPPORTED, P2P_NOT_SUPPORTED = 0, 3, 5
P2P_INDEX = {"r": 0, "w": 1, "n": 2, "a": 3, "p": 4}


def p2p_status(root, sku, hw, count, a, b, index, driver_version):
    """nvmlDeviceGetP2PStatus as the lab's NVML answers it (libnvidia-ml.c)."""
    if sku.get("nvswitch") and fabric_state(root, sku, hw, driver_version) != "completed":
        return P2P_NOT_SUPPORTED
    if sku.get("nvlinks") and links_up(sku, hw, a) and links_up(sku, hw, b):
        return P2P_OK
    if index in (2, 3):
        return P2P_NOT_SUPPORTED
    return P2P_OK if socket_of(a, count) == socket_of(b, count) else P2P_TOPOLOGY_NOT_SUPPORTED
