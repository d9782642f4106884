"""GPU models the lab can emulate, with the figures their emulated hardware reports."""

from __future__ import annotations

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


SKUS = {s.key: s for s in (
    Sku("h100-sxm", "NVIDIA H100 80GB HBM3", 8, "96.00.99.00.01", 5, 16, 71000, 700000, 680.0, 3000.0, True),
    Sku("h200-sxm", "NVIDIA H200", 8, "96.00.A5.00.01", 5, 16, 76000, 700000, 700.0, 4245.0, True),
    Sku("a100-sxm", "NVIDIA A100-SXM4-80GB", 8, "92.00.45.00.06", 4, 16, 60000, 400000, 280.0, 1700.0, True),
    Sku("l40s", "NVIDIA L40S", 4, "95.02.66.00.02", 4, 16, 36000, 350000, 330.0, 760.0, False),
)}
DEFAULT_SKU = "h100-sxm"
