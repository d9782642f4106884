"""`fleetctl systemd install|uninstall` (the units themselves: orchestrator/systemd.py). Every command line a unit
would run is checked here by fleetctl's own click parser, and the upgrade's values by the functions the upgrade
uses, before a unit is written."""

from __future__ import annotations

import os

import click
from click.core import ParameterSource

from .. import config as config_mod, plan as plan_mod, redact, runs, settings, systemd
from ..notify import send as notify
from ..campaign import hooks
from ..errors import InputError
from ..exitcodes import documented
from . import options


# ---- checking the command lines --------------------------------------------------------------------

def command_for(root: click.Group, words: list[str]) -> tuple[click.Command, list[str], str]:
    """The (sub)command WORDS name, the rest of the words, and its name."""
    cmd, name = root, "fleetctl"
    while isinstance(cmd, click.Group):
        sub = cmd.get_command(None, words[0]) if words else None  # the root's commands are imported when asked for
        if sub is None:
            raise InputError(f"fleetctl {' '.join(words[:1])}: no such command")
        name, words, cmd = words[0], words[1:], sub
    return cmd, words, name


def parse(root: click.Group, argv: list[str]) -> click.Context:
    """ARGV (a unit's command line, the executable first) through fleetctl's own parser: click's error as one
    line (an InputError) where it would refuse it."""
    cmd, rest, name = command_for(root, argv[1:])
    try:
        return cmd.make_context(name, rest)
    except click.ClickException as e:
        raise InputError(f"the unit's command `{' '.join(argv[1:])}` would be refused: {e.format_message()}") \
            from None


def check_commands(root: click.Group, units: systemd.Units) -> None:
    """Every command line of UNITS as fleetctl will parse it (durations too), and the upgrade's values as the upgrade
    reads them (target, ramp, drain templates, notifications): refused here rather than at 02:00 on a Saturday."""
    if units.audit:
        parse(root, units.audit.argv)
    if units.window:
        parse(root, units.window.resume_argv)
    # The upgrade's values (else the audit's), with the settings file's over them, as the units will read them.
    p = {**parse(root, units.window.upgrade_argv if units.window else units.audit.argv).params, **units.settings}
    if units.window:
        plan_mod.parse_target(p["target"])
        if p.get("waves") is not None:
            plan_mod.parse_ramp(p["waves"])
        hooks.resolve(p.get("drain_preset"), p.get("drain"), p.get("undrain"))
    notify.build(p["notify"], p["webhook"], p["webhook_format"], p["webhook_headers"], p["webhook_ca"],
                 p["notify_timeout"])


# ---- the units' commands from this one's options ----------------------------------------------------------

def option_words(param: click.Option, value) -> list[str]:
    """An upgrade option given on the command line, as words for the unit's `fleetctl upgrade`."""
    name = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    if param.is_flag:
        if value:
            return [name]
        off = next((o for o in param.secondary_opts if o.startswith("--")), None)
        return [off] if off else []
    word = param.type.text if isinstance(param.type, options.Duration) else str
    return [w for v in (value if param.multiple else [value]) for w in (name, word(v))]


def given_words(ctx: click.Context, params: dict, passthrough: list[click.Option]) -> list[tuple[str, list[str]]]:
    """The passed-on options given on the command line: (parameter name, words), file names made absolute."""
    out = []
    for o in passthrough:
        if ctx.get_parameter_source(o.name) != ParameterSource.COMMANDLINE:
            continue  # a default stays fleetctl's (or the config file's) at run time, not frozen into the unit
        value = params[o.name]
        if o.name in systemd.path_params() and value is not None:
            value = systemd.absolute(value, o.opts[-1])
        out.append((o.name, option_words(o, value)))
    return out


def build(root: click.Group, ctx: click.Context, params: dict, passthrough: list[click.Option]) -> systemd.Units:
    p = params
    given = given_words(ctx, p, passthrough)
    if p["audit_output"] is not None and p["audit_schedule"] is None:
        raise click.UsageError("--audit-output needs --audit-schedule")
    if p["window_schedule"] is None:
        audit_takes = {q.name for q in command_for(root, ["audit"])[0].params} if p["audit_schedule"] else set()
        stray = [f for f, v in (("--duration", p["duration"]), ("--to", p["target"]), ("--margin", p["margin"]))
                 if v is not None] + [words[0] for name, words in given if name not in audit_takes and words]
        if stray:
            raise click.UsageError(f"{stray[0]} needs --window-schedule")
    elif p["duration"] is None or p["target"] is None:
        raise click.UsageError("--window-schedule needs --duration and --to")
    if p["audit_schedule"] is None and p["window_schedule"] is None:
        raise click.UsageError("nothing to install: give --audit-schedule and/or --window-schedule "
                               "(with --duration, --to)")
    exe = systemd.fleetctl_executable()
    inventory = systemd.absolute(p["inventory_path"], "--inventory")
    baseline = systemd.absolute(p["baseline"], "--baseline")
    limit = p["limit"]
    runs.prepare(inventory, limit, baseline)  # a broken inventory or baseline is refused now
    common = ([] if inventory is None else ["-i", inventory]) + ([] if baseline is None else ["-b", baseline]) \
        + ([] if limit is None else ["-l", limit])

    # What the history keeps only part of (redact.ARGV_RULES: commands, URLs) goes into the settings file, root's
    # alone; the rest onto the command lines.
    text = {k.param: k.name for k in config_mod.KEYS if k.flag in redact.ARGV_RULES}
    in_file = {text[name]: list(p[name]) if isinstance(p[name], tuple) else p[name]
               for name, _ in given if name in text}
    config_mod.check_flags(in_file)  # as the units will read the file

    def extra(*command: str) -> list[str]:
        """The given options COMMAND takes (--forks: the audit's too; the notification flags: all three)."""
        takes = {q.name for q in command_for(root, list(command))[0].params}
        return [w for name, words in given if name in takes and name not in text for w in words]

    audit = window = None
    if p["audit_schedule"] is not None:
        metrics = systemd.absolute(p["audit_output"], "--audit-output", must_exist=False)
        if metrics and not os.path.isdir(os.path.dirname(metrics)):
            raise InputError(f"--audit-output {p['audit_output']}: no such directory")
        if metrics and os.path.isdir(metrics):
            raise InputError(f"--audit-output {p['audit_output']}: is a directory")
        argv = [exe, "audit", *common] + (["--format", "prometheus", "-o", metrics] if metrics else []) \
            + extra("audit")
        audit = systemd.AuditUnit(systemd.calendar(p["audit_schedule"], "--audit-schedule"), argv, metrics)
    if p["window_schedule"] is not None:
        duration_s, margin_s = p["duration"], p["margin"] or 0.0
        if margin_s >= duration_s:
            raise InputError(f"--margin {settings.duration_text(margin_s)}: not shorter than --duration "
                             f"{settings.duration_text(duration_s)}")
        target = plan_mod.parse_target(p["target"])
        soft = settings.duration_text(duration_s - margin_s)
        # The resume takes the campaign's own inventory and baseline (a changed baseline is for a person to
        # accept), and the window.
        resume = [exe, "campaign", "resume", "--interrupted", "--window", soft, *extra("campaign", "resume")]
        upgrade = [exe, "upgrade", "--to", target, "--yes", "--window", soft, *common, *extra("upgrade")]
        window = systemd.WindowUnit(systemd.calendar(p["window_schedule"], "--window-schedule"), duration_s, target,
                                    resume, upgrade)
    unit_settings = os.path.join(os.path.abspath(p["unit_dir"]), systemd.SETTINGS_FILE)
    return systemd.Units(audit, window, in_file, {**systemd.environment(), config_mod.UNIT_ENV: unit_settings})


# ---- the command group ----------------------------------------------------------------------------------

def systemd_group(root: click.Group) -> click.Group:
    """`fleetctl systemd`; the options of ROOT's `upgrade` (bar OWN_UPGRADE_PARAMS) are offered by `install`."""
    passthrough = [p for p in root.get_command(None, "upgrade").params
                   if isinstance(p, click.Option) and p.name not in systemd.OWN_UPGRADE_PARAMS]

    @click.group("systemd")
    def group() -> None:
        """A scheduled audit and a maintenance-window upgrade as systemd timers: install, uninstall."""

    @group.command("install", epilog=f"The options from {passthrough[0].opts[-1] if passthrough else '--waves'} "
                   "on are `fleetctl upgrade`'s: each given goes into every unit command that takes it (--forks and "
                   "the notification options also into the audit's and the resume's). Text (commands, URLs: "
                   f"--drain, --notify, --webhook...) is not written into the units (world-readable): it goes into "
                   f"{systemd.SETTINGS_FILE} beside them, mode 0600, which the units read over the config file.")
    @options.declared(settings.AUDIT_SCHEDULE, settings.AUDIT_OUTPUT, settings.WINDOW_SCHEDULE)
    @options.option(settings.WINDOW_DURATION)
    @options.option(settings.WINDOW_MARGIN)
    @options.target(required=False, help="Target driver version of the window's upgrade.")
    @options.inventory("Ansible inventory for both units. Default: localhost.")
    @options.baseline("Baseline YAML for both units.")
    @options.limit("Ansible host pattern for both units.")
    @options.unit_dir(systemd.DEFAULT_UNIT_DIR)
    @options.option(settings.PRINT)
    @click.pass_context
    @documented("systemd install")
    def install_cmd(ctx, **params) -> None:
        """Write the units (and enable the timers where systemd runs): an audit on --audit-schedule and/or an
        upgrade to --to in each window (--window-schedule) of --duration. The window's start first resumes a campaign
        a crash interrupted."""
        units = build(root, ctx, params, passthrough)
        check_commands(root, units)
        for line in systemd.install(units, params["unit_dir"], params["print_only"]):
            click.echo(line)

    install_cmd.params.extend(passthrough)

    @group.command("uninstall")
    @options.unit_dir(systemd.DEFAULT_UNIT_DIR)
    @documented("systemd uninstall")
    def uninstall_cmd(unit_dir) -> None:
        """Disable and remove the units `systemd install` wrote (others of the same names are left alone)."""
        for line in systemd.uninstall(unit_dir):
            click.echo(line)

    return group
