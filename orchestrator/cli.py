"""fleetctl's command line (the contract in the README's "Command line": flags and exit codes are relied on by scripts and cron)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console

from . import __version__, audit as audit_mod, logs, plan as plan_mod, probe as probe_mod, render, upgrade as upgrade_mod
from . import config as config_mod, interrupts, notify as notify_mod
from .errors import InputError, OperationError
from .store import HistoryError, Store

EXIT_USAGE = 2


EXIT_INTERNAL = 70  # a fleetctl bug: never confused with "findings" (1) by a script
CAMPAIGN_ID = click.IntRange(1, 2**63 - 1)  # what SQLite can look up: a bigger number is a usage error, not a crash


def one_line(message: object) -> str:
    """An error is one line (scripts and cron mail read it): a newline from a path or a value is shown escaped."""
    return render.clean(str(message).replace("\r", "\\r").replace("\n", "\\n"))  # and no escape sequence


def writable(output: str | None) -> None:
    """Refuse an -o FILE that cannot be written, or that is a symbolic link in a directory others can write (one
    planted in /tmp), before anything runs or is recorded. A final symlink is never followed (write_atomically)."""
    if not output or str(Path(output).absolute()).startswith(STREAM_PATHS):
        return
    path = Path(output).absolute()
    parent = path.parent.resolve()  # the directories on the way may be links; only the final name is not followed
    if path.is_symlink() and others_can_write(parent):
        raise InputError(planted_link(output))
    if not parent.is_dir() or not os.access(parent, os.W_OK) or path.is_dir():
        raise InputError(f"{output}: cannot write the report there")


def others_can_write(directory: Path) -> bool:
    """Someone besides its owner (this user or root) may create names in DIRECTORY: its group or others may
    write it (/tmp, even sticky), or it is another user's."""
    try:
        st = directory.stat()
    except OSError:
        return False
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) or st.st_uid not in (0, os.geteuid())


def planted_link(output: object) -> str:
    return (f"{output}: a symbolic link in a directory others can write: not written through it (remove the link "
            "or write elsewhere)")


def write_report(report: dict, fmt: str, output: str | None, printer) -> None:
    """JSON, Prometheus metrics, or a table through PRINTER(report, console), to OUTPUT or stdout."""
    if fmt == "json":
        emit(json.dumps(report, indent=2) + "\n", output)
    elif fmt == "prometheus":
        from . import prometheus
        emit(prometheus.report_text(report), output)
    elif output:
        buffer = io.StringIO()
        printer(report, Console(file=buffer, width=160, force_terminal=False))
        emit(buffer.getvalue(), output)
    else:
        printer(report, terminal())


def stored_argv() -> list[str]:
    """The command line as the history keeps it: a canary or drain/undrain command may carry tokens, so only its
    program stays."""
    argv = sys.argv[1:]
    out = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] in ("--command", "--canary", "--drain", "--undrain"):
            arg = arg.split()[0] + " [arguments not recorded]" if arg.split() else arg
        elif arg.startswith(("--command=", "--canary=", "--drain=", "--undrain=")):
            flag, value = arg.split("=", 1)
            arg = flag + "=" + (value.split()[0] + " [arguments not recorded]" if value.split() else "")
        out.append(arg)
    return notify_mod.redact_argv(out)  # a --notify command's arguments and a --webhook's path neither


def emit(text: str, output: str | None) -> None:
    if output:
        try:
            write_atomically(Path(output), text)
        except OSError as e:
            raise InputError(f"{output}: cannot write: {e.strerror}") from None
    else:
        click.echo(text, nl=False)


STREAM_PATHS = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/", "/dev/tty")


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: Path, text: str) -> None:
    """PATH holds the old text or the new, never part of one (node_exporter's textfile collector, a web server or
    a cron job may read it at any moment): a temporary file in the same directory, synced, renamed over PATH, with
    the old file's mode (a new one's: 0666 less the umask, as open() gives). Standard streams and file descriptors
    by name (-o /dev/stdout), devices and FIFOs are written in place. A symbolic link at PATH is never followed:
    the rename replaces the link itself, not its target; in a directory others can write it is refused."""
    if (not path.is_symlink() and path.exists() and not path.is_file()) \
            or str(path.absolute()).startswith(STREAM_PATHS):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    target = path.absolute()  # the name itself: a link there is replaced, its target never written
    if target.is_symlink() and others_can_write(target.parent):
        raise InputError(planted_link(path))
    try:
        st = os.lstat(target)
        mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        mode = None
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)  # not *.prom
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def terminal() -> Console:
    """A console for stdout; logs and cron mail get 160 columns instead of rich's 80 when no width is known."""
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Console()
    return Console(width=160)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleetctl")
@click.pass_context
def cli(ctx) -> None:
    """Keep NVIDIA GPU fleets on a known-good driver baseline.

    Flags default to the config file's values ($FLEETCTL_CONFIG, ~/.config/fleetctl/config.yml or
    /etc/fleetctl/config.yml): `fleetctl config show`.
    """
    config_mod.apply(ctx)


@cli.command()
@click.option("-i", "--inventory", "inventory_path", metavar="INVENTORY",
              help="Ansible inventory (file or directory). Default: localhost over the local connection.")
@click.option("-l", "--limit", metavar="LIMIT", help="Ansible host pattern to restrict the run to.")
@click.option("-b", "--baseline", metavar="BASELINE", help="Baseline YAML (blessed matrix). Default: the embedded one.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]), default="table", show_default=True)
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE (atomically) instead of stdout.")
@click.option("--fail-on", type=click.Choice(audit_mod.FAIL_ON_CHOICES), default="high", show_default=True,
              help="Exit 1 when a control fails at or above this severity.")
@click.option("--forks", type=click.IntRange(1, 1000), help="Hosts worked on at once (default: all, up to 64).")
@click.option("--no-preflight", is_flag=True, help="Skip the SSH reachability and host-key pre-flight.")
@click.option("-a", "--all", "show_all", is_flag=True, help="Table: show passing controls too.")
@notify_mod.options
def audit(inventory_path, limit, baseline, fmt, output, fail_on, forks, no_preflight, show_all) -> None:
    """Audit driver, nouveau, persistence, container runtime and GPU health against the baseline.

    Exit codes: 0 compliant, 1 findings at or above --fail-on, 2 usage or input error, 3 hosts unreachable.
    """
    opts = audit_mod.AuditOptions(inventory_path, limit, baseline, fail_on, forks, not no_preflight)
    writable(output)
    with Store() as store:
        report = audit_mod.run(opts, store, stored_argv(), notify_mod.from_context())
    write_report(report, fmt, output, lambda r, console: render.print_audit(r, console, show_all))
    sys.exit(report["summary"]["exit_code"])


from .completion import completion  # noqa: E402
from .lab.cli import lab  # noqa: E402

cli.add_command(lab)
cli.add_command(completion)
cli.add_command(config_mod.config_group)


@cli.command()
@click.option("-i", "--inventory", "inventory_path", metavar="INVENTORY",
              help="Ansible inventory. Default: localhost over the local connection.")
@click.option("-l", "--limit", metavar="LIMIT", help="Ansible host pattern to restrict the run to.")
@click.option("-b", "--baseline", metavar="BASELINE", help="Baseline YAML (gate thresholds, Xid overrides).")
@click.option("--throughput", is_flag=True, help="Take throughput samples too (warm-up, then N sustained trials).")
@click.option("--engine", type=click.Choice(["builtin", "command"]),
              help="Throughput engine (default: the host's gpu_probe_engine inventory variable, else builtin).")
@click.option("--command", "canary", metavar="CMD", help="Canary workload for --engine command (prints JSON metrics).")
@click.option("--samples", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--warmup", "warmup_s", type=click.FloatRange(0, 600), default=20.0, show_default=True, help="Seconds.")
@click.option("--trial", "trial_s", type=click.FloatRange(0.01, 60), default=1.0, show_default=True, help="Seconds per sample.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]), default="table", show_default=True)
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE (atomically) instead of stdout.")
@click.option("--forks", type=click.IntRange(1, 1000), help="Hosts worked on at once (default: all, up to 64).")
@click.option("--no-preflight", is_flag=True, help="Skip the SSH reachability and host-key pre-flight.")
@notify_mod.options
def probe(inventory_path, limit, baseline, throughput, engine, canary, samples, warmup_s, trial_s, fmt, output, forks,
          no_preflight) -> None:
    """GPU health (NVML, Xid, ECC, remaps, PCIe, clocks) and, with --throughput, GEMM and bandwidth samples.

    Exit codes: 0 healthy, 1 a host unhealthy, 2 usage or input error, 3 hosts unreachable.
    """
    if engine == "command" and not canary:
        raise click.UsageError("--engine command needs --command CMD")
    if canary and ("{{" in canary or "{%" in canary):
        # Ansible would evaluate it as a template on this machine before the host ever ran it.
        raise click.UsageError("--command may not contain '{{' or '{%'")
    writable(output)
    opts = probe_mod.ProbeOptions(inventory_path, limit, baseline, throughput, engine, canary, samples, warmup_s,
                                  trial_s, forks, not no_preflight)
    with Store() as store:
        report = probe_mod.run(opts, store, stored_argv(), notify_mod.from_context())
    write_report(report, fmt, output, render.print_probe)
    sys.exit(report["summary"]["exit_code"])


@cli.command()
@click.option("--to", "target", required=True, metavar="VERSION", help="Target driver version, e.g. 570.86.15.")
@click.option("-i", "--inventory", "inventory_path", metavar="INVENTORY",
              help="Ansible inventory. Default: localhost over the local connection.")
@click.option("-l", "--limit", metavar="LIMIT", help="Ansible host pattern to restrict the plan to.")
@click.option("-b", "--baseline", metavar="BASELINE", help="Baseline YAML (blessed versions, failure budget).")
@click.option("--waves", default=plan_mod.DEFAULT_RAMP, show_default=True, metavar="RAMP",
              help="Cumulative wave targets: host counts or percentages of the eligible hosts, ending at 100%.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-o", "--output", metavar="FILE", help="Write the plan to FILE instead of stdout.")
@click.option("--forks", type=click.IntRange(1, 1000), help="Hosts worked on at once (default: all, up to 64).")
@click.option("--no-preflight", is_flag=True, help="Skip the SSH reachability and host-key pre-flight.")
def plan(target, inventory_path, limit, baseline, waves, fmt, output, forks, no_preflight) -> None:
    """Plan canary waves to move the fleet's driver to VERSION (nothing is changed on any host).

    Hosts already on VERSION are skipped; unreachable, unhealthy, driverless hosts and hosts whose baseline does
    not bless VERSION are excluded, each with its reason.

    Exit codes: 0 plan made, 2 usage or input error, 3 hosts unreachable (excluded; the plan is still made).
    """
    opts = plan_mod.PlanOptions(target, waves, inventory_path, limit, baseline, forks, not no_preflight)
    writable(output)
    with Store() as store:
        report = plan_mod.run(opts, store, stored_argv())
    if fmt == "json":
        emit(json.dumps(report, indent=2) + "\n", output)
    elif output:
        emit(plan_mod.render_text(report), output)
    else:
        plan_mod.print_plan(report, terminal())
    sys.exit(report["summary"]["exit_code"])


@cli.command()
@click.option("--to", "target", required=True, metavar="VERSION", help="Target driver version, e.g. 570.86.15.")
@click.option("-i", "--inventory", "inventory_path", metavar="INVENTORY",
              help="Ansible inventory. Default: localhost over the local connection.")
@click.option("-l", "--limit", metavar="LIMIT", help="Ansible host pattern to restrict the campaign to.")
@click.option("-b", "--baseline", metavar="BASELINE", help="Baseline YAML (blessed versions, budget, gate).")
@click.option("--waves", default=plan_mod.DEFAULT_RAMP, show_default=True, metavar="RAMP",
              help="Cumulative wave targets: host counts or percentages of the eligible hosts, ending at 100%.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@click.option("--dry-run", is_flag=True, help="Print what would be done, change nothing.")
@click.option("--soak", "soak", default=upgrade_mod.soak.DEFAULT_SOAK, show_default=True, metavar="DURATIONS",
              help="Watched soak between waves, one length per gap (the last repeated), e.g. 2h,30m; 0: none.")
@click.option("--soak-interval", "soak_interval", default="60", show_default=True, metavar="DURATION",
              help="A health check and a canary run of every changed host this often while soaking.")
@click.option("--soak-grace", "soak_grace", default="5m", show_default=True, metavar="DURATION",
              help="A changed host unreachable this long during a soak fails.")
@click.option("--canary", metavar="CMD", help="The canary workload run on changed hosts while soaking (the probe "
              "command engine's protocol; default: the host's probe engine).")
@click.option("--canary-max-failures", type=click.IntRange(0, 100000), default=0, show_default=True,
              help="Failed canary runs a host may have before it fails.")
@click.option("--window", metavar="DURATION", help="Maintenance window length: no wave starts after it (exit 5).")
@click.option("--rollback-scope", type=click.Choice(upgrade_mod.ROLLBACK_SCOPES), default="campaign",
              show_default=True, help="On a failed wave roll back every changed host, or the wave's only.")
@click.option("--drain-preset", type=click.Choice(sorted(upgrade_mod.hooks.PRESETS)),
              help="Drain/undrain with Slurm (scontrol) or Kubernetes (kubectl drain/uncordon).")
@click.option("--drain", metavar="CMD", help="Drain command template run on this machine: {host} {node} {campaign}.")
@click.option("--undrain", metavar="CMD", help="Undrain command template.")
@click.option("--idle-timeout", type=click.IntRange(0, 86400), default=300, show_default=True,
              help="Seconds to wait for GPUs to be free after the drain.")
@click.option("--samples", type=click.IntRange(5, 1000), default=10, show_default=True,
              help="Throughput samples per probe (>= 5: the gate's test needs them).")
@click.option("--warmup", "warmup_s", type=click.FloatRange(0, 600), default=20.0, show_default=True)
@click.option("--trial", "trial_s", type=click.FloatRange(0.01, 60), default=1.0, show_default=True)
@click.option("--forks", type=click.IntRange(1, 1000), help="Hosts of a wave worked on at once (default: all, up to 64).")
@click.option("--no-preflight", is_flag=True, help="Skip the SSH pre-flight of the planning audit.")
@notify_mod.options
def upgrade(target, inventory_path, limit, baseline, waves, yes, dry_run, soak, soak_interval, soak_grace, canary,
            canary_max_failures, window, rollback_scope, drain_preset, drain, undrain, idle_timeout, samples, warmup_s,
            trial_s, forks, no_preflight) -> None:
    """Move the fleet's driver to VERSION in canary waves, gated by GPU probes, watched while they soak, rolled
    back on failure.

    Exit codes: 0 done, 1 done but hosts are off the target (failed and rolled back within the budget, or left
    out at plan), 2 usage or input error, 4 rolled back, 5 halted for a person (inconclusive gate, window closed)
    or aborted, 6 a host's rollback failed: it needs a person.
    """
    if canary and ("{{" in canary or "{%" in canary):
        raise click.UsageError("--canary may not contain '{{' or '{%'")  # Ansible would template it here
    opts = upgrade_mod.UpgradeOptions(
        target, waves, inventory_path, limit, baseline, forks, not no_preflight,
        upgrade_mod.parse_soaks(soak), upgrade_mod.parse_duration(soak_interval, "--soak-interval"),
        upgrade_mod.parse_duration(soak_grace, "--soak-grace", allow_zero=True), canary, canary_max_failures,
        upgrade_mod.parse_duration(window, "--window") if window else None, rollback_scope, drain_preset, drain,
        undrain, idle_timeout_s=idle_timeout, samples=samples, warmup_s=warmup_s, trial_s=trial_s)
    if not dry_run and not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("--yes is needed to upgrade without a terminal (or use --dry-run)")
        click.confirm(f"Upgrade the fleet's driver to {target}?", abort=True)
    with Store() as store:
        cid, code, text = upgrade_mod.start(opts, store, stored_argv(), dry_run, terminal(),
                                           notify_mod.from_context())
    click.echo(render.clean(text), nl=False)  # reasons quote hosts
    sys.exit(code)


@cli.group()
def campaign() -> None:
    """Upgrade campaigns in the history: list, show, resume, abort."""


@campaign.command("list")
def campaign_list() -> None:
    """Every campaign, newest last."""
    with Store(readonly=True) as store:
        upgrade_mod.list_table(store, terminal())


@campaign.command("show")
@click.argument("campaign_id", type=CAMPAIGN_ID)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def campaign_show(campaign_id, fmt) -> None:
    """One campaign: hosts, steps (with attempts and times), reasons."""
    with Store(readonly=True) as store:
        doc = upgrade_mod.document(store, campaign_id)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        upgrade_mod.show_table(doc, terminal())


@campaign.command("resume")
@click.argument("campaign_id", type=CAMPAIGN_ID, required=False)
@click.option("--interrupted", is_flag=True,
              help="Every campaign at work whose process is gone (a crash or reboot); exit 0 when there is none.")
@click.option("-i", "--inventory", "inventory_path", metavar="INVENTORY", help="Default: the campaign's own.")
@click.option("-b", "--baseline", metavar="BASELINE", help="Default: the campaign's own (unchanged).")
@click.option("--window", metavar="DURATION", help="A new maintenance window from now.")
@notify_mod.options
def campaign_resume(campaign_id, interrupted, inventory_path, baseline, window) -> None:
    """Continue a campaign after a crash, or after a halt (held hosts are accepted and undrained).

    Two resumes of one campaign at once: the second refuses (exit 1) before it changes anything.
    """
    if (campaign_id is None) == (not interrupted):
        raise click.UsageError("give a CAMPAIGN_ID or --interrupted (not both)")
    window_s = upgrade_mod.parse_duration(window, "--window") if window else None
    with Store() as store:
        if interrupted:
            code, text = upgrade_mod.resume_interrupted(store, inventory_path, baseline, window_s, terminal(),
                                                        notify_mod.from_context())
        else:
            code, text = upgrade_mod.resume(store, campaign_id, inventory_path, baseline, window_s, terminal(),
                                            notify_mod.from_context())
    click.echo(render.clean(text), nl=False)
    sys.exit(code)


@campaign.command("abort")
@click.argument("campaign_id", type=CAMPAIGN_ID)
def campaign_abort(campaign_id) -> None:
    """Stop a campaign before its next wave (hosts stay where they are: roll back with fleetctl rollback)."""
    with Store() as store:
        click.echo(upgrade_mod.abort(store, campaign_id), nl=False)


@cli.command()
@click.argument("campaign_id", type=CAMPAIGN_ID)
@click.option("-i", "--inventory", "inventory_path", metavar="INVENTORY", help="Default: the campaign's own.")
@click.option("-b", "--baseline", metavar="BASELINE", help="Default: the campaign's own (unchanged).")
@notify_mod.options
def rollback(campaign_id, inventory_path, baseline) -> None:
    """Roll every host a campaign changed back to the exact packages recorded before it (exit 4 when done)."""
    with Store() as store:
        code, text = upgrade_mod.rollback(store, campaign_id, inventory_path, baseline, terminal(),
                                          notify_mod.from_context())
    click.echo(render.clean(text), nl=False)
    sys.exit(code)


@cli.group(invoke_without_command=True)
@click.option("--format", "fmt", type=click.Choice(["json", "csv", "html", "oscal"]), default="json", show_default=True)
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE instead of stdout.")
@click.option("--since", metavar="DATE", help="First day (YYYY-MM-DD, UTC) or ISO timestamp.")
@click.option("--until", metavar="DATE", help="Last day (YYYY-MM-DD, UTC) or ISO timestamp.")
@click.option("-l", "--limit", metavar="LIMIT", help="Hosts or groups (shell patterns, comma separated).")
@click.option("--sign", "sign_key", metavar="KEY", help="ed25519 private key (PEM): write FILE.sig next to -o FILE.")
@click.pass_context
def report(ctx, fmt, output, since, until, limit, sign_key) -> None:
    """Compliance exports from the history (and `report verify`: is the history intact).

    Every export states the history's hash-chain head it was made from.
    """
    if ctx.invoked_subcommand is not None:
        return
    from . import report as report_mod, signing
    if sign_key and not output:
        raise click.UsageError("--sign needs -o FILE (the signature goes to FILE.sig)")
    if sign_key:
        signing.load_private(sign_key)  # a bad key is an input error before anything is written
    writable(output)
    with Store(readonly=True) as store:
        doc = report_mod.build(store, since, until, limit)
    render = {"json": lambda d: json.dumps(d, indent=2) + "\n", "csv": report_mod.to_csv, "html": report_mod.to_html,
              "oscal": lambda d: json.dumps(report_mod.to_oscal(d), indent=2) + "\n"}
    emit(render[fmt](doc), output)
    if sign_key:
        click.echo(f"signature: {signing.sign(Path(output), sign_key, fmt, doc['chain']['digest'])}", err=True)


@report.command("verify")
@click.option("--head", metavar="DIGEST", help="The chain head an export stated: the history must end there.")
@click.option("--signature", "signature", metavar="FILE.sig", help="Check an export's detached signature instead.")
@click.option("--file", "signed_file", metavar="FILE", help="The signed export (default: named in FILE.sig).")
@click.option("--key", metavar="PUBKEY", help="The signer's ed25519 public key (PEM) the signature must be from.")
def report_verify(head, signature, signed_file, key) -> None:
    """Check the history's hash chain and name the first broken record (or, with --signature, an export's
    signature). Exit 0 intact, 1 broken."""
    from . import chain, signing
    if signature:
        ok, line = signing.verify(signature, signed_file, key)
        click.echo(line)
        sys.exit(0 if ok else 1)
    try:
        with Store(readonly=True) as store:
            verdict = chain.verify(store.db, head)
            lingering = [r["id"] for r in store.interrupted_runs()]
    except HistoryError as e:
        if "damaged" not in str(e):
            raise
        click.echo(f"history damaged: {e}")
        sys.exit(1)
    click.echo(verdict.line())
    if lingering:
        click.echo(f"note: run{'s' if len(lingering) > 1 else ''} {', '.join(map(str, lingering))} never finished: "
                   "the process that ran them is gone (a crash, kill -9, a history that could not be written); "
                   "unfinished runs are not in the chain, and the next recorded run closes them as interrupted")
    sys.exit(0 if verdict.ok else 1)


@cli.command()
@click.option("-o", "--output", metavar="FILE",
              help="Write to FILE atomically (e.g. node_exporter's textfile directory) instead of stdout.")
@click.option("-l", "--limit", metavar="LIMIT", help="Hosts or groups (shell patterns, comma separated).")
def metrics(output, limit) -> None:
    """Every host's latest state in the history as Prometheus metrics (no host is contacted): controls, driver,
    GPUs, Xids, probe medians, campaign states, and the age of the history's chain head."""
    from . import prometheus
    writable(output)
    with Store(readonly=True) as store:
        text = prometheus.history_text(store, limit)
    emit(text, output)


from .systemd import systemd_group  # noqa: E402  (needs `upgrade` above: install offers its options)
cli.add_command(systemd_group(cli))


def main() -> None:
    logs.configure()
    interrupts.install()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("fleetctl: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:  # usage errors: one line, exit 2
        click.echo(f"fleetctl: error: {one_line(e.format_message())}", err=True)
        sys.exit(EXIT_USAGE)
    except (InputError, OperationError) as e:
        click.echo(f"fleetctl: error: {one_line(e)}", err=True)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, interrupts.Interrupted) as e:
        name = e.name if isinstance(e, interrupts.Interrupted) else "SIGINT"
        hint = getattr(e, "hint", None)
        click.echo(f"fleetctl: interrupted ({name})" + (f": {hint}" if hint else ""), err=True)
        sys.exit(e.exit_code if isinstance(e, interrupts.Interrupted) else 130)
    except Exception as e:  # a bug: one line for the operator, the traceback with FLEETCTL_DEBUG=1
        if os.environ.get("FLEETCTL_DEBUG"):
            raise
        click.echo(f"fleetctl: internal error (a bug, please report it): {type(e).__name__}: {one_line(e)}", err=True)
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
