"""`fleetctl lab up|status|inventory|env|inject|drift|prometheus|reboot|down`: an emulated GPU fleet on this machine
(root)."""

from __future__ import annotations

import json
import os
import re
import shlex
import time

import click
from rich.console import Console
from rich.table import Table

from orchestrator.errors import InputError
from . import faults, prometheus, slurm, state
from .skus import DEFAULT_SKU, SKUS

SPEC = re.compile(r"^(?P<count>\d+)x(?P<sku>[a-z0-9-]+)(?:/(?P<gpus>\d+))?(?:@(?P<driver>\d{3}\.\d+(?:\.\d+)?))?"
                  r"(?P<drift>(?:\+[a-z-]+(?:=[^+]*)?)*)$")
DRIFTS = ("nouveau", "persistence-off", "runtime")
PROMETHEUS_ENV = "FLEETCTL_LAB_PROMETHEUS"  # `fleetctl lab env`: the lab's Prometheus URL
# +rpm: an Enterprise-Linux-style host (rpm, dnf, dnf versionlock; no apt); +debian: the driver from Debian's own
# packages (real nvidia-tesla-470-*, nvidia-tesla-535-*, nvidia-*: lab/fleetctl_lab/debian.py)
PACKAGINGS = ("deb", "rpm", "debian")
FLAGS = set(DRIFTS) | {"rpm", "debian"}  # what may follow a spec's '+'
# +domain=NAME: the hosts (rack-scale trays) are in multi-node NVLink domain NAME (docs/lab.md); specs naming the
# same NAME build one domain.
SPEC_FORM = "COUNTxSKU[/GPUS][@DRIVER][+DRIFT...][+rpm|+debian][+domain=NAME]"


def parse_specs(specs: tuple[str, ...], hosts: int, sku: str, gpus: int | None, driver: str | None,
                drift: tuple[str, ...], packaging: str = "deb") -> tuple[list[state.HostSpec], dict[str, set[str]]]:
    """HostSpecs for `--spec 3xh100-sxm/8@570.86.15+nouveau+rpm ...`, `--spec 3xgb200-nvl/4@570.86.15+domain=rack-a`
    (or the uniform --hosts/--sku/... form)."""
    groups = []
    for text in specs or (f"{hosts}x{sku}" + (f"/{gpus}" if gpus else "") + (f"@{driver}" if driver else "")
                          + "".join(f"+{d}" for d in drift) + (f"+{packaging}" if packaging != "deb" else ""),):
        m = SPEC.match(text)
        if not m:
            raise InputError(f"--spec {text!r}: expected {SPEC_FORM}, e.g. 4xh100-sxm@570.86.15+nouveau")
        if m["sku"] not in SKUS:
            raise InputError(f"--spec {text!r}: unknown SKU {m['sku']!r} (known: {', '.join(SKUS)})")
        words = list(filter(None, m["drift"].split("+")))
        options = dict(w.split("=", 1) for w in words if "=" in w)
        drifts = {w for w in words if "=" not in w}
        if set(options) - {"domain"}:
            raise InputError(f"--spec {text!r}: unknown option {sorted(set(options) - {'domain'})[0]!r} "
                             "(known: +domain=NAME)")
        domain = options.get("domain")
        if domain is not None and not state.DOMAIN_NAME_RE.match(domain):
            raise InputError(f"--spec {text!r}: domain name {domain!r}: use lower-case letters, digits and '-'")
        if domain is not None and not SKUS[m["sku"]].rack_scale:
            raise InputError(f"--spec {text!r}: {m['sku']} is not a rack-scale SKU: no multi-node NVLink domain "
                             f"(rack-scale: {', '.join(k for k, s in SKUS.items() if s.rack_scale)})")
        if drifts - FLAGS:
            raise InputError(f"--spec {text!r}: unknown drift {sorted(drifts - FLAGS)[0]!r} "
                             f"(known: {', '.join(DRIFTS)}; +rpm for an rpm host, +debian for Debian's own packages)")
        if {"rpm", "debian"} <= drifts:
            raise InputError(f"--spec {text!r}: +rpm and +debian exclude each other")
        groups.append((int(m["count"]), m["sku"], int(m["gpus"]) if m["gpus"] else None, m["driver"], drifts, domain))
    out, extra_drift, serial = [], {}, {}
    for count, sku_key, n_gpus, drv, drifts, domain in groups:
        for _ in range(count):
            prefix = sku_key.split("-")[0]  # a100-sxm and a100-pcie hosts number on: a100-01, a100-02
            serial[prefix] = serial.get(prefix, 0) + 1
            name = f"{prefix}-{serial[prefix]:02d}"
            # A host with the NVIDIA driver installed has nouveau blacklisted by the package, unless drifted.
            out.append(state.HostSpec(name, sku_key, n_gpus, drv, nouveau="nouveau" in drifts,
                                      persistence_off="persistence-off" in drifts,
                                      packaging=next((p for p in PACKAGINGS if p in drifts), "deb"),
                                      domain=domain))
            extra_drift[name] = drifts & {"runtime"}
    if not out:
        raise InputError("the lab needs at least one host")
    return out, extra_drift


@click.group()
def lab() -> None:
    """An emulated GPU fleet on this machine: real sshd, dpkg and apt, emulated NVIDIA driver (needs root)."""
    if os.geteuid() != 0:
        raise InputError("the lab needs root (network and mount namespaces)")


@lab.command()
@click.option("--hosts", "count", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option("--sku", type=click.Choice(sorted(SKUS)), default=DEFAULT_SKU, show_default=True)
@click.option("--gpus", type=click.IntRange(1, 16), help="GPUs per host (default: the SKU's).")
@click.option("--driver", metavar="VERSION", help="Driver installed before the first boot (default: none).")
@click.option("--drift", type=click.Choice(DRIFTS), multiple=True, help="Plant this drift on every host.")
@click.option("--packaging", type=click.Choice(PACKAGINGS), default="deb", show_default=True,
              help="rpm: Enterprise-Linux-style hosts (rpm, dnf, dnf versionlock; no apt); debian: the driver from "
                   "Debian's own packages (470.256.02, 535.216.03, 535.261.03).")
@click.option("--spec", "specs", multiple=True, metavar="SPEC",
              help=f"{SPEC_FORM}, repeatable, for a mixed fleet (overrides the above).")
@click.option("--slurm", "with_slurm", is_flag=True,
              help="A Slurm cluster over the hosts: slurmctld and munged here, munged and slurmd in every host "
                   "(eval \"$(fleetctl lab env)\" for srun, sbatch, sinfo, scontrol).")
@click.option("--prometheus", "with_prometheus", is_flag=True,
              help="A DCGM exporter in every host and a Prometheus here scraping them (its URL: fleetctl lab env).")
def up(count, sku, gpus, driver, drift, packaging, specs, with_slurm, with_prometheus) -> None:
    """Build the lab's package repo and bring the hosts up (in the lowest free lab slot, or $FLEETCTL_LAB_SLOT's:
    several labs, each in its own FLEETCTL_LAB_DIR, live side by side)."""
    from . import debian, hosts, packages

    specs_, extra = parse_specs(specs, count, sku, gpus, driver, drift, packaging)
    for s in specs_:
        known = set(debian.DRIVERS if s.packaging == "debian" else packages.DRIVER_VERSIONS)
        if s.driver and s.driver not in known:
            where = "Debian's packages the lab mirrors" if s.packaging == "debian" else "the lab repo"
            raise InputError(f"driver {s.driver} is not in {where} (versions: {', '.join(sorted(known))})")
    if any(s.packaging == "rpm" for s in specs_) and packages.rpm_tools():
        raise InputError(f"rpm hosts need {', '.join(packages.rpm_tools())} to build the lab's rpm repository "
                         "(apt-get install rpm createrepo-c dnf dnf-plugins-core)")
    started = time.monotonic()
    directory = state.lab_dir()
    packages.lab_repo(directory / "repo")
    if any(s.packaging == "debian" for s in specs_):
        try:
            debian.ensure_mirror()
        except debian.MirrorError as e:
            raise InputError(str(e)) from None
    if with_slurm and (missing := [p for p in slurm.PROGRAMS if not os.path.exists(p)]):
        raise InputError(f"--slurm needs Slurm and munge ({', '.join(missing)} missing): apt-get install "
                         f"{' '.join(slurm.PACKAGES)}")
    if with_prometheus and not os.path.exists(prometheus.PROGRAM):
        raise InputError(f"--prometheus needs {prometheus.PROGRAM}: apt-get install {prometheus.PACKAGE}")
    the_lab = hosts.up(specs_, directory, with_slurm=with_slurm, with_prometheus=with_prometheus)
    for name, drifts in extra.items():
        if "runtime" in drifts:
            faults.runtime_misconfigured(faults.Host(the_lab, name))
    inventory = hosts.write_inventory(the_lab)
    click.echo(f"lab up: {len(specs_)} hosts in {time.monotonic() - started:.1f}s (slot {the_lab.slot}: bridge "
               f"{the_lab.bridge} {the_lab.bridge_address}); inventory: {inventory}")
    if the_lab.slurm:
        click.echo(f"slurm: partition {slurm.PARTITION} of {len(specs_)} nodes; eval \"$(fleetctl lab env)\" "
                   "for srun, sbatch, sinfo and scontrol")
    if the_lab.prometheus is not None:
        click.echo(f"prometheus: {prometheus.url(the_lab.prometheus)} scraping a DCGM exporter in every host "
                   f"every {prometheus.SCRAPE_INTERVAL}")


@lab.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status(fmt) -> None:
    """Each host's address, driver and health."""
    from . import hosts

    rows = hosts.status(state.lab_dir())
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        click.echo("no lab")
        return
    table = Table(title="fleetctl lab")
    for col in ("host", "address", "sku", "running", "driver loaded", "boot id"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["address"], r.get("sku", ""), "yes" if r.get("running") else "NO",
                      r.get("module_version") or "-", (r.get("boot_id") or "")[:8])
    Console().print(table)


@lab.command()
def inventory() -> None:
    """Print the path of the lab's Ansible inventory (fleetctl audit -i "$(fleetctl lab inventory)")."""
    the_lab = state.load()
    if the_lab is None or not the_lab.inventory.exists():
        raise InputError("no lab is up: run fleetctl lab up")
    click.echo(str(the_lab.inventory))


@lab.command()
def env() -> None:
    """Shell lines for the lab (eval "$(fleetctl lab env)"): FLEETCTL_LAB_DIR, in a Slurm lab SLURM_CONF, so srun,
    sbatch, sinfo and scontrol talk to the lab's cluster, and with --prometheus FLEETCTL_LAB_PROMETHEUS (its URL)."""
    from . import hosts

    the_lab = _lab()
    values = {state.LAB_ENV: str(the_lab.dir)}
    if the_lab.slurm:
        values.update(hosts.slurm_cluster(the_lab).env())
    if the_lab.prometheus is not None:
        values[PROMETHEUS_ENV] = prometheus.url(the_lab.prometheus)
    for key, value in values.items():
        click.echo(f"export {key}={shlex.quote(value)}")


@lab.command()
@click.argument("factor", type=float, required=False)
@click.option("--restore", is_flag=True, help="The drift is over: every host back at its own throughput.")
def drift(factor, restore) -> None:
    """A fleet-wide drift: every host's workload (DCGM exporter levels, benchmark) at FACTOR, e.g. 0.92."""
    click.echo(faults.drift(_lab(), factor, restore))


@lab.group("prometheus")
def prometheus_group() -> None:
    """The lab's Prometheus (lab up --prometheus): stop it and start it again (same port, same storage)."""


@prometheus_group.command("stop")
def prometheus_stop() -> None:
    """Stop the lab's Prometheus (as a monitoring outage would)."""
    the_lab = _lab()
    if the_lab.prometheus is None:
        raise InputError("this lab has no Prometheus: bring it up with `fleetctl lab up --prometheus`")
    click.echo("prometheus: " + ("stopped" if prometheus.stop(the_lab.dir) else "was not running"))


@prometheus_group.command("start")
def prometheus_start() -> None:
    """Start the lab's Prometheus again, on its recorded port."""
    click.echo(f"prometheus: {prometheus.start(_lab())}")


@lab.command()
def down() -> None:
    """Remove every namespace, mount, process, bridge and file the lab made (safe to repeat)."""
    from . import hosts

    started = time.monotonic()
    hosts.down(state.lab_dir())
    click.echo(f"lab down in {time.monotonic() - started:.1f}s")


@lab.command()
@click.argument("host")
def reboot(host) -> None:
    """Reboot one lab host, as its power button would."""
    h = faults.Host(_lab(), host)
    (h.dir / "control" / "reboot").write_text("fleetctl lab reboot\n")
    click.echo(f"{host}: reboot requested")


def _lab() -> state.Lab:
    the_lab = state.load()
    if the_lab is None:
        raise InputError("no lab is up: run fleetctl lab up")
    return the_lab


@lab.group()
@click.argument("host")
@click.pass_context
def inject(ctx, host) -> None:
    """Plant a fault on HOST (see docs/lab.md)."""
    ctx.obj = faults.Host(_lab(), host)


def _report(host: faults.Host, what: str) -> None:
    click.echo(f"{host.record.name}: {what}")


@inject.command("xid")
@click.argument("code", type=click.IntRange(1, 999))
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--form", type=click.Choice(faults.XID_FORMS), default="pci", show_default=True)
@click.option("--at-boot", "at_boot", metavar="VERSION", help="Instead: at every boot with driver VERSION.")
@click.pass_obj
def inject_xid(host, code, gpu, form, at_boot) -> None:
    """An Xid with CODE on GPU, in one of the kernel log forms."""
    _report(host, faults.at_boot(host, at_boot, "xid", code, gpu) if at_boot else faults.xid(host, code, gpu, form))


@inject.command("kmsg")
@click.argument("line")
@click.pass_obj
def inject_kmsg(host, line) -> None:
    """A raw kernel log line."""
    _report(host, faults.kmsg(host, line))


@inject.command("ecc")
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--volatile", type=click.IntRange(0), default=1, show_default=True)
@click.option("--aggregate", type=click.IntRange(0))
@click.pass_obj
def inject_ecc(host, gpu, volatile, aggregate) -> None:
    """Uncorrectable ECC error counts."""
    _report(host, faults.ecc(host, gpu, volatile, aggregate))


@inject.command("remap")
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--uncorrectable", type=click.IntRange(0), default=1, show_default=True)
@click.option("--pending/--no-pending", default=True, show_default=True)
@click.option("--failure", is_flag=True)
@click.pass_obj
def inject_remap(host, gpu, uncorrectable, pending, failure) -> None:
    """Remapped rows: pending (needs a reset) or failed."""
    _report(host, faults.remap(host, gpu, uncorrectable, pending, failure))


@inject.command("fall-off-bus")
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--at-boot", "at_boot", metavar="VERSION", help="Instead: at the next boot with driver VERSION.")
@click.pass_obj
def inject_fall_off_bus(host, gpu, at_boot) -> None:
    """A GPU falls off the bus (Xid 79): the driver sees one GPU fewer."""
    _report(host, faults.at_boot(host, at_boot, "lost", 79, gpu) if at_boot else faults.fall_off_bus(host, gpu))


@inject.command("pcie-errors")
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--replays", type=click.IntRange(0), default=0, show_default=True,
              help="NVML's PCIe replay counter (until the next driver load).")
@click.option("--fatal", type=click.IntRange(0), default=0, show_default=True, help="AER fatal errors (until reboot).")
@click.option("--nonfatal", type=click.IntRange(0), default=0, show_default=True, help="AER non-fatal errors.")
@click.option("--correctable", type=click.IntRange(0), default=0, show_default=True, help="AER correctable errors.")
@click.pass_obj
def inject_pcie_errors(host, gpu, replays, fatal, nonfatal, correctable) -> None:
    """A GPU's PCIe link replays and reports AER errors (NVML and /sys/bus/pci/devices/DEV/aer_dev_*)."""
    _report(host, faults.pcie_errors(host, gpu, replays, fatal, nonfatal, correctable))


@inject.command("leaked-memory")
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--mib", type=click.IntRange(0), default=2048, show_default=True)
@click.pass_obj
def inject_leaked_memory(host, gpu, mib) -> None:
    """A context leaked: GPU holds MIB with no process listed, until a reboot."""
    _report(host, faults.leaked_memory(host, gpu, mib))


@inject.command("vbios")
@click.argument("version")
@click.option("--gpu", type=int, help="Only this GPU (default: every GPU of the host).")
@click.option("--inforom", metavar="VERSION", help="The InfoROM image version too.")
@click.pass_obj
def inject_vbios(host, version, gpu, inforom) -> None:
    """The host's GPUs were flashed to VBIOS VERSION (the firmware NVML and nvidia-smi report)."""
    _report(host, faults.vbios(host, version, gpu, inforom))


@inject.command("gpu-in-use")
@click.option("--gpu", type=int, default=0, show_default=True)
@click.pass_obj
def inject_gpu_in_use(host, gpu) -> None:
    """A process keeps running on GPU (NVML lists it) until it exits or the host reboots."""
    _report(host, faults.gpu_in_use(host, gpu))


@inject.command("throughput")
@click.argument("factor", type=float)
@click.option("--driver", metavar="VERSION", help="Only on this driver version (default: any).")
@click.pass_obj
def inject_throughput(host, factor, driver) -> None:
    """Scale the benchmark's throughput by FACTOR (e.g. 0.92)."""
    _report(host, faults.throughput(host, factor, driver))


@inject.command("metric")
@click.argument("name")
@click.argument("factor", type=float, required=False)
@click.option("--driver", metavar="VERSION", help="Only while this driver version is loaded (default: any).")
@click.option("--restore", is_flag=True, help="Remove that fault (for --driver's version, or any).")
@click.pass_obj
def inject_metric(host, name, factor, driver, restore) -> None:
    """Scale the DCGM exporter's metric NAME (e.g. DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) by FACTOR (e.g. 0.94)."""
    _report(host, faults.metric(host, name, factor, driver, restore))


@inject.command("pcie-downgrade")
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--width", type=int, default=8, show_default=True, help="Lanes the link trains at.")
@click.option("--gen", type=int, help="PCIe generation it trains at (default: the GPU's own).")
@click.pass_obj
def inject_pcie_downgrade(host, gpu, width, gen) -> None:
    """GPU's PCIe link trains narrower or slower: NVML reports it, host<->device copies fall with it."""
    _report(host, faults.pcie_downgrade(host, gpu, width, gen))


@inject.command("unreachable")
@click.option("--mode", type=click.Choice(["link", "sshd"]), default="link", show_default=True)
@click.option("--restore", is_flag=True, help="Bring the link back up.")
@click.pass_obj
def inject_unreachable(host, mode, restore) -> None:
    """Cut the host's link, or stop its sshd."""
    _report(host, faults.unreachable(host, mode, restore))


@inject.command("drm-in-use")
@click.option("--restore", is_flag=True, help="Free nvidia_drm again.")
@click.pass_obj
def inject_drm_in_use(host, restore) -> None:
    """A console holds nvidia_drm: the nvidia modules cannot be unloaded (a reload must become a reboot)."""
    _report(host, faults.drm_in_use(host, restore))


@inject.command("kernel-update")
@click.option("--release", metavar="RELEASE", help="The new kernel's release (default: the running one's patch + 1).")
@click.option("--restore", is_flag=True, help="Remove the new kernel again.")
@click.pass_obj
def inject_kernel_update(host, release, restore) -> None:
    """A kernel update without an nvidia module built for it: the next boot loses the driver."""
    _report(host, faults.kernel_update(host, release, restore))


@inject.command("slow-reboot")
@click.argument("seconds", type=click.FloatRange(0, 600))
@click.pass_obj
def inject_slow_reboot(host, seconds) -> None:
    """Reboots take SECONDS longer."""
    _report(host, faults.slow_reboot(host, seconds))


@inject.command("install-failure")
@click.argument("driver", metavar="VERSION")
@click.pass_obj
def inject_install_failure(host, driver) -> None:
    """Installing driver VERSION fails (its package's preinst exits 1)."""
    _report(host, faults.install_failure(host, driver))


@inject.command("nouveau")
@click.pass_obj
def inject_nouveau(host) -> None:
    """nouveau is loaded."""
    _report(host, faults.nouveau(host))


@inject.command("persistence-off")
@click.option("--gpu", type=int)
@click.pass_obj
def inject_persistence_off(host, gpu) -> None:
    """Persistence mode off (all GPUs, or one) and nvidia-persistenced stopped."""
    _report(host, faults.persistence_off(host, gpu))


@inject.command("runtime-misconfigured")
@click.pass_obj
def inject_runtime(host) -> None:
    """containerd's config loses the nvidia runtime."""
    _report(host, faults.runtime_misconfigured(host))


@inject.command("nvlink-down")
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--link", type=int, required=True)
@click.option("--driver", metavar="VERSION", help="Instead: the link trains down at every load of driver VERSION.")
@click.pass_obj
def inject_nvlink_down(host, gpu, link, driver) -> None:
    """An NVLink of GPU trains down (and stays down across reboots under that driver)."""
    _report(host, faults.nvlink_down(host, gpu, link, driver))


@inject.command("nvlink-errors")
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--link", type=int, default=0, show_default=True)
@click.option("--count", type=int, required=True, help="Errors added to the link's CRC, replay, symbol and effective counters.")
@click.option("--driver", metavar="VERSION", help="Instead: right after every load of driver VERSION.")
@click.pass_obj
def inject_nvlink_errors(host, gpu, link, count, driver) -> None:
    """COUNT NVLink errors on a link of GPU (volatile counters: a driver load restarts them)."""
    _report(host, faults.nvlink_errors(host, gpu, count, link, driver))


@inject.command("fabric-stuck")
@click.option("--driver", metavar="VERSION", help="Instead: from the next load of driver VERSION.")
@click.pass_obj
def inject_fabric_stuck(host, driver) -> None:
    """The NVSwitch fabric stays in progress whatever the fabric manager does (CUDA: error 802)."""
    _report(host, faults.fabric_stuck(host, driver))


@inject.command("sxid")
@click.argument("code", type=click.IntRange(10000, 99999))
@click.option("--switch", type=int, default=0, show_default=True, help="The NVSwitch (nvidia-nvswitchN, 0..3).")
@click.option("--fatal/--non-fatal", default=None,
              help="The error's class (Severity 1 / 0); default the class the code was logged with on real hosts, "
                   "else fatal.")
@click.pass_obj
def inject_sxid(host, code, switch, fatal) -> None:
    """An NVSwitch SXid error with CODE in the kernel log, as the nvswitch driver writes it."""
    _report(host, faults.sxid(host, code, switch, fatal))


@inject.command("ib-port-down")
@click.option("--port", type=int, required=True, help="The InfiniBand port: N for mlx5_N port 1.")
@click.option("--rate", type=click.FloatRange(0, min_open=True), metavar="GBPS",
              help="Instead of staying down: the port comes back up trained at GBPS (e.g. 200).")
@click.pass_obj
def inject_ib_port_down(host, port, rate) -> None:
    """An InfiniBand port loses its link (DOWN, Disabled; link_downed counts it), or retrains below its rate."""
    _report(host, faults.ib_port_down(host, port, rate))


@inject.command("imex-down")
@click.option("--next-boot", "next_boot", is_flag=True,
              help="Instead: IMEX does not come up after the tray's next boot (that boot only).")
@click.option("--restore", is_flag=True, help="Clear the fault and start IMEX.")
@click.pass_obj
def inject_imex_down(host, next_boot, restore) -> None:
    """IMEX down on a tray of an NVLink domain: the daemon stops and will not start."""
    _report(host, faults.imex_down(host, next_boot, restore))


@inject.command("clique-change")
@click.option("--clique", type=int, help="The clique id it comes back in (default: the domain's - 1).")
@click.option("--restore", is_flag=True, help="Back in the domain's clique now.")
@click.pass_obj
def inject_clique_change(host, clique, restore) -> None:
    """The tray comes back from its next reboot outside its domain's NVLink clique."""
    _report(host, faults.clique_change(host, clique, restore))


@inject.command("imex-node-missing")
@click.argument("peer", required=False)
@click.option("--restore", is_flag=True, help="Write the domain's whole node list again.")
@click.pass_obj
def inject_imex_node_missing(host, peer, restore) -> None:
    """PEER (another tray of the domain) is missing from the tray's IMEX node list; IMEX restarts."""
    if not peer and not restore:
        raise InputError("name the PEER missing from the node list (or --restore)")
    _report(host, faults.imex_node_missing(host, peer or "", restore))
