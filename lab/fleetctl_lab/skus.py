"""GPU models the lab can emulate, with the figures their emulated hardware reports."""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Sku:
    key: str
    name: str  # what NVML / nvidia-smi call it
    gpus: int  # GPUs per host by default
    vbios: str
    pcie_gen: int
    pcie_width: int
    power_idle_mw: int
    power_limit_mw: int
    gemm_tflops: float  # bf16 dense GEMM, sustained (the lab benchmark's centre)
    bandwidth_gbs: float  # device-to-device copy
    nvswitch: bool  # HGX boards with NVSwitch need fabric manager
    # NVLink (docs/lab.md, docs/interconnect.md): links per GPU, all to NVSwitches on an NVSwitch board (every GPU
    # pair then shows NV<links>); 0 for a PCIe-only GPU (NVML answers NOT_SUPPORTED).
    nvlinks: int = 0
    nvlink_version: int = 0  # nvmlNvlinkVersion_t: 4 = 3.0 (A100), 6 = 4.0 (Hopper), 7 = 5.0 (Blackwell)
    nvlink_gbs: float = 0.0  # per link and direction, as `nvidia-smi nvlink -s` prints it
    nvswitch_links: tuple[int, ...] = ()  # how a GPU's links spread over the board's NVSwitches, in link order
    # The benchmark's interconnect centres (hosts with 2+ GPUs, every link up): NCCL all-reduce bus bandwidth
    # (NVLS off) with 2 GPUs and with 8 (interpolated linearly between), and one GPU -> GPU copy.
    allreduce_busbw_gbs: tuple[float, float] = (0.0, 0.0)
    p2p_gbs: float = 0.0
    inforom: str = ""  # InfoROM image (the real H100 and H200 of tests/testdata); none: NVML says NOT_SUPPORTED
    # InfiniBand (docs/lab.md, /sys/class/infiniband): one single-port HCA per GPU on an HGX board (ConnectX-7,
    # mlx5_0..mlx5_<n-1>); 0 for none. ib_speed: the lanes' speed name as the kernel's rate file prints it.
    ib_ports: int = 0
    ib_width: int = 4
    ib_speed: str = ""
    # A rack-scale tray (GB200 NVL72): its NVLinks leave the tray for the rack's NVLink switch trays, so its GPUs can
    # join a multi-node NVLink domain (a lab spec's +domain=NAME) run by IMEX; no NVSwitch on the tray itself.
    rack_scale: bool = False


# Host<->device copies (the benchmark's h2d_gbs / d2h_gbs) follow each GPU's CURRENT PCIe link (gpus.conf
# gpu.N.pcie_gen / pcie_width, which NVML and nvidia-smi report too): the link's bandwidth per direction, lanes x the
# per-lane figure of its generation (PCI-SIG: 2.5, 5, 8, 16, 32 GT/s; 8b/10b coding to Gen2, 128b/130b from Gen3),
# x what pinned 1 GiB copies reach of it on a real H100 at Gen5 x16 (63.0 GB/s): H2D 54.8 GB/s, D2H 55.1 GB/s
# (tests/testdata/h100-580.159.04-health/bench.json). A link trained at x8, or at Gen4, halves them.
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938}
PCIE_COPY_EFFICIENCY = {"h2d_gbs": 54.8 / (16 * PCIE_LANE_GBS[5]), "d2h_gbs": 55.1 / (16 * PCIE_LANE_GBS[5])}


def host_copy_gbs(metric: str, gen: int, width: int) -> float:
    """The benchmark's centre for METRIC (h2d_gbs or d2h_gbs) over a PCIe link of generation GEN and WIDTH lanes."""
    return PCIE_LANE_GBS[gen] * width * PCIE_COPY_EFFICIENCY[metric]


# PCIe-only GPU pairs (L40S, or NVLink pairs with every link down): a host with 3+ GPUs has two CPU sockets; GPUs
# 0..n/2-1 hang off socket 0, the rest off socket 1, each GPU under its own PCIe host bridge. Same socket: NODE;
# across: SYS. A host with 1 or 2 GPUs has them on socket 0 (as the real 2x H200 host: CPU affinity 0-31, NUMA 0).
SOCKETS = 2


def socket_of(index: int, count: int) -> int:
    """The CPU socket (NUMA node) GPU INDEX of COUNT hangs off."""
    return 0 if count <= 2 else index * SOCKETS // count


SKUS = {s.key: s for s in (
    Sku("h100-sxm", "NVIDIA H100 80GB HBM3", 8, "96.00.99.00.01", 5, 16, 71000, 700000, 680.0, 3000.0, True,
        nvlinks=18, nvlink_version=6, nvlink_gbs=26.562, nvswitch_links=(5, 4, 4, 5),
        allreduce_busbw_gbs=(322.5, 480.0), p2p_gbs=370.0, inforom="G520.0200.00.05",
        ib_ports=8, ib_speed="NDR"),
    Sku("h200-sxm", "NVIDIA H200", 8, "96.00.A5.00.01", 5, 16, 76000, 700000, 700.0, 4245.0, True,
        nvlinks=18, nvlink_version=6, nvlink_gbs=26.562, nvswitch_links=(5, 4, 4, 5),
        allreduce_busbw_gbs=(322.5, 480.0), p2p_gbs=370.0, inforom="G520.0282.02.02",
        ib_ports=8, ib_speed="NDR"),
    Sku("a100-sxm", "NVIDIA A100-SXM4-80GB", 8, "92.00.45.00.06", 4, 16, 60000, 400000, 280.0, 1700.0, True,
        nvlinks=12, nvlink_version=4, nvlink_gbs=25.0, nvswitch_links=(2, 2, 2, 2, 2, 2),
        allreduce_busbw_gbs=(155.0, 230.0), p2p_gbs=230.0),
    # A GB200 NVL72 compute tray (figures plausible for GB200, not measured): 4 Blackwell GPUs (2 per Grace CPU),
    # 18 NVLink 5.0 links each, one to each of the rack's 18 NVLink switch chips (9 switch trays of 2), 50 GB/s a link
    # and direction (nvidia-smi: 53.125); no NVSwitch and no fabric manager on the tray; one 400G NDR HCA per GPU.
    Sku("gb200-nvl", "NVIDIA GB200", 4, "97.00.5C.00.01", 5, 16, 150000, 1200000, 2000.0, 6500.0, False,
        nvlinks=18, nvlink_version=7, nvlink_gbs=53.125, nvswitch_links=(1,) * 18,
        allreduce_busbw_gbs=(650.0, 900.0), p2p_gbs=740.0, inforom="G548.0201.00.06",
        ib_ports=4, ib_speed="NDR", rack_scale=True),
    # A PCIe board without NVLink bridges, supported by every branch from 450 (Debian's 470 included: +debian hosts).
    Sku("a100-pcie", "NVIDIA A100 80GB PCIe", 4, "92.00.90.00.04", 4, 16, 45000, 300000, 250.0, 1500.0, False,
        allreduce_busbw_gbs=(20.0, 20.0), p2p_gbs=25.0),
    Sku("l40s", "NVIDIA L40S", 4, "95.02.66.00.02", 4, 16, 36000, 350000, 330.0, 760.0, False,
        allreduce_busbw_gbs=(20.0, 20.0), p2p_gbs=25.0),
)}
DEFAULT_SKU = "h100-sxm"

# A multi-node NVLink domain (a rack-scale tray's +domain=NAME): every GPU of its trays reports NVML fabric state
# completed / success, the domain's cluster UUID (derived from its name: the same on every tray and every `lab up`,
# never zero) and the default NVLink partition's clique id (NMX reserves 32766 for the default partition).
DOMAIN_CLIQUE = 32766
_DOMAIN_NAMESPACE = uuid.UUID("5b1f7a52-3c55-4f0e-9a63-4c4e5f2a1d70")


def domain_cluster_uuid(name: str) -> str:
    """The cluster UUID of the lab's NVLink domain NAME."""
    return str(uuid.uuid5(_DOMAIN_NAMESPACE, name))
