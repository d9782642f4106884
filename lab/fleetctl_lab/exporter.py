"""The lab's DCGM exporter: `python -m fleetctl_lab.exporter HOSTDIR [--listen ADDRESS:PORT]` (docs/lab.md).

In a `lab up --prometheus` lab every host's boot starts it after the driver's daemons (daemons.py), in the host's
network and PID namespaces, listening on the host's address at dcgm-exporter's port 9400 (/metrics); a reboot kills
it with the host's other processes and the next boot starts it again, so its counters restart as dcgm-exporter's do.

What it exports, under dcgm-exporter's names and labels (gpu, UUID, device, pci_bus_id, modelName, Hostname and the
label field DCGM_FI_DRIVER_VERSION), per GPU that answers while a driver is loaded (none without a driver, none for
a GPU off the bus), comes from the emulated workload: a training job keeps every GPU busy at the LEVELS below x the
host's throughput factor (faults.conf throughput.<loaded version> x throughput.any, as nvidia-lab-bench's) x the
lab's drift (faults.conf drift) x the metric's own fault (metric.<NAME>.<loaded version|any>), with a fixed per-host
and per-GPU offset and a noise that wanders (an Ornstein-Uhlenbeck process: NOISE_SIGMA, correlation time
NOISE_TAU_S) shared by a GPU's metrics, as a job's phases move activity and power together. Xids come from the host's
kernel log (kernel/kmsg, read with the rules fleetctl's hosts read it with), PCIe replays from gpus.conf.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from orchestrator import resources
from .conf import read_conf
from .skus import SKUS

PORT = 9400  # dcgm-exporter's
# A busy GPU at throughput factor 1, in DCGM's units (ratios 0..1, percent): an LLM training job.
LEVELS = {
    "DCGM_FI_PROF_SM_ACTIVE": (0.80, "Ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0.45, "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_DEV_GPU_UTIL": (97.0, "GPU utilization (in %)."),
}
POWER = "DCGM_FI_DEV_POWER_USAGE"  # W: idle + POWER_SHARE of the span to the SKU's limit, the span x the factors
POWER_SHARE = 0.8
SCALED = (*LEVELS, POWER)  # the metrics `fleetctl lab inject HOST metric NAME FACTOR` scales
CEILING = {"DCGM_FI_PROF_SM_ACTIVE": 1.0, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1.0, "DCGM_FI_DEV_GPU_UTIL": 100.0}
XID_LAST = "DCGM_FI_DEV_XID_ERRORS"            # gauge: the last Xid code the GPU reported (0: none)
XID_TOTAL = "DCGM_EXP_XID_ERRORS_TOTAL"        # counter: Xids per code (label xid) since the exporter started
PCIE_REPLAYS = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"  # counter: the GPU's PCIe replays (NVML's, since the driver loaded)
HOST_SPREAD, GPU_SPREAD = 0.01, 0.005  # fixed offsets: +-1% per host, +-0.5% per GPU
NOISE_SIGMA, NOISE_TAU_S = 0.02, 3.0  # 2% of the level, correlated over ~3 s: the lab's clock runs fast (a job phase of
# minutes in a real fleet; a soak of 90 s then holds a few nearly independent blocks:
# orchestrator/judge/canary/statistics.py)


def offset(text: str, spread: float) -> float:
    """A fixed factor in [1 - spread, 1 + spread] from TEXT (nvidia-lab-bench's)."""
    unit = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / float(0xFFFFFFFF)
    return 1.0 + spread * (2.0 * unit - 1.0)


def number(text: str | None, default: float = 1.0) -> float:
    try:
        return float(text) if text not in (None, "") else default
    except ValueError:
        return default


def throughput(faults: dict[str, str], loaded: str) -> float:
    """The workload's factor on driver LOADED: throughput.<LOADED> x throughput.any x drift (nvidia-lab-bench's)."""
    return number(faults.get(f"throughput.{loaded}")) * number(faults.get("throughput.any")) * \
        number(faults.get("drift"))


def metric_factor(faults: dict[str, str], name: str, loaded: str) -> float:
    """`lab inject HOST metric NAME FACTOR [--driver V]`: metric.<NAME>.<LOADED> x metric.<NAME>.any."""
    return number(faults.get(f"metric.{name}.{loaded}")) * number(faults.get(f"metric.{name}.any"))


class Exporter:
    """A prometheus_client collector of one lab host's GPUs (its directory HOSTDIR on the controller's side)."""

    def __init__(self, hostdir: Path, rng: random.Random | None = None, clock=time.monotonic):
        self.dir = Path(hostdir)
        self.name = json.loads((self.dir / "host.json").read_text())["name"]
        self.rng = rng or random.Random()
        self.clock = clock
        self.noise: dict[str, tuple[float, float]] = {}   # GPU UUID -> (standard normal state, when)
        self.xids: dict[tuple[str, int], int] = {}        # (PCI bus id, code) -> count since start
        self.last_xid: dict[str, int] = {}                # PCI bus id -> the last code
        self.kmsg_seq: int | None = None                  # the last kernel log record counted

    def wander(self, key: str) -> float:
        """The GPU's noise now: a stationary Ornstein-Uhlenbeck step from its last value (N(0, 1) at the start)."""
        now = self.clock()
        last = self.noise.get(key)
        if last is None:
            z = self.rng.gauss(0.0, 1.0)
        else:
            keep = math.exp(-max(0.0, now - last[1]) / NOISE_TAU_S)
            z = last[0] * keep + math.sqrt(1.0 - keep * keep) * self.rng.gauss(0.0, 1.0)
        self.noise[key] = (z, now)
        return z

    def read_xids(self) -> None:
        """Count the Xids logged since the last look (the whole log at the start; from 0 again after a boot)."""
        log = resources.module_utils("fleetctl_kernel_log")
        try:
            records = log.parse_kmsg((self.dir / "kernel" / "kmsg").read_text(errors="replace"))
        except OSError:
            return
        if records and self.kmsg_seq is not None and records[-1]["seq"] < self.kmsg_seq:
            self.kmsg_seq = None  # a new boot's log
        for event in log.xid_events(records, {}, since_seq=self.kmsg_seq):
            self.xids[event["pci_bus_id"], event["code"]] = self.xids.get((event["pci_bus_id"], event["code"]), 0) + 1
            self.last_xid[event["pci_bus_id"]] = event["code"]
        if records:
            self.kmsg_seq = records[-1]["seq"]

    def collect(self):
        try:
            loaded = (self.dir / "kernel" / "sys-module" / "nvidia" / "version").read_text().strip()
        except OSError:
            loaded = ""
        hw = read_conf(self.dir / "hw" / "gpus.conf")
        faults = read_conf(self.dir / "hw" / "faults.conf")
        self.read_xids()
        labels = ["gpu", "UUID", "device", "pci_bus_id", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
        families = {name: GaugeMetricFamily(name, text, labels=labels) for name, (_, text) in LEVELS.items()}
        families[POWER] = GaugeMetricFamily(POWER, "Power draw (in W).", labels=labels)
        families[XID_LAST] = GaugeMetricFamily(XID_LAST, "Value of the last XID error encountered.", labels=labels)
        # Counters without the _total prometheus_client's text writer would append: untyped keeps DCGM's names.
        totals = {XID_TOTAL: Metric(XID_TOTAL, "Total XID errors observed since exporter start (a counter).",
                                    "unknown"),
                  PCIE_REPLAYS: Metric(PCIE_REPLAYS, "Total number of PCIe retries (a counter).", "unknown")}
        sku = SKUS.get(hw.get("sku", ""))
        count = int(number(hw.get("count"), 0)) if loaded and sku else 0
        uuids = [hw.get(f"gpu.{i}.uuid", f"gpu{i}") for i in range(count)]
        factor = throughput(faults, loaded)
        host = offset("host:" + ",".join(sorted(uuids)), HOST_SPREAD)
        for i, uuid in enumerate(uuids):
            gpu = f"gpu.{i}."
            if hw.get(gpu + "lost", "0") not in ("", "0"):
                continue
            pci = hw.get(gpu + "pci", "").lower()
            values = [str(i), uuid, f"nvidia{i}", pci, hw.get(gpu + "name", sku.name), self.name, loaded]
            load = host * offset("gpu:" + uuid, GPU_SPREAD) * (1.0 + NOISE_SIGMA * self.wander(uuid)) * factor
            for name, (level, _) in LEVELS.items():
                value = min(CEILING[name], level * load * metric_factor(faults, name, loaded))
                families[name].add_metric(values, round(value, 0 if name == "DCGM_FI_DEV_GPU_UTIL" else 4))
            idle, limit = sku.power_idle_mw / 1000.0, sku.power_limit_mw / 1000.0
            power = (idle + POWER_SHARE * (limit - idle) * load) * metric_factor(faults, POWER, loaded)
            families[POWER].add_metric(values, round(min(limit, power), 3))
            families[XID_LAST].add_metric(values, self.last_xid.get(pci, 0))
            for (where, code), n in sorted(self.xids.items()):
                if where == pci:
                    totals[XID_TOTAL].add_sample(XID_TOTAL, dict(zip(labels + ["xid"], values + [str(code)])), n)
            totals[PCIE_REPLAYS].add_sample(PCIE_REPLAYS, dict(zip(labels, values)),
                                            number(hw.get(gpu + "pcie_replays"), 0))
        yield from families.values()
        yield from totals.values()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetctl_lab.exporter",
                                     description="The fleetctl lab's DCGM exporter of one lab host.")
    parser.add_argument("hostdir", type=Path)
    parser.add_argument("--listen", metavar="ADDRESS:PORT", help=f"default: the host's address, port {PORT}")
    args = parser.parse_args(argv)
    collector = Exporter(args.hostdir)
    address, _, port = (args.listen or "").rpartition(":")
    if not args.listen:
        address, port = json.loads((args.hostdir / "host.json").read_text())["address"], str(PORT)
    registry = CollectorRegistry()
    registry.register(collector)
    _server, thread = start_http_server(int(port), addr=address, registry=registry)
    print(f"{time.strftime('%H:%M:%S')} serving {collector.name}'s GPUs on http://{address}:{port}/metrics",
          flush=True)
    thread.join()  # until SIGTERM (the host's reboot or `lab down`)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
