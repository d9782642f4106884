"""Every setting a person gives fleetctl, declared once: its flag, its config-file key, its type, bounds and default,
its help, and the commands that take it. From here follow every flag of fleetctl's commands (cli/options.py makes
the click options), the config file's keys (config.KEYS), schemas/config.schema.json (`python -m orchestrator.settings
> schemas/config.schema.json`; a test holds the file equal), the defaults of the options objects (probe.ProbeOptions,
upgrade.UpgradeOptions) and the campaign's options (campaign/options.py: a field for each setting declared
`recorded`, which `upgrade` hands on as it is given). The fleetctl.gpu collection ships on its own and keeps its own
role defaults: a test holds them equal to these.

A duration (every time flag and key) is seconds, or a number with a unit: 90, 90s, 5m, 2h, 1.5h, 14d. The options
objects and the history hold seconds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .campaign.hooks import PRESETS
from .controls.base import SEVERITIES
from .exitcodes import Exit
from .notify.send import FORMATS, HEADERS_ENV, TRIES
from .judge.promql import TRIES as PROMQL_TRIES

MAX_DURATION_S = 366 * 86400
FORKS_CAP = 64  # hosts worked on at once by default, at most: more processes would hurt the control node
DURATION = r"[0-9]+(\.[0-9]+)?[smhd]?"
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION_EXAMPLES = "90, 90s, 5m or 2h"
KINDS = ("text", "int", "number", "choice", "duration", "durations", "objects", "switch")  # switch: a flag alone

RUNS = (("audit",), ("probe",), ("plan",), ("upgrade",))
NOTIFYING = (("audit",), ("probe",), ("upgrade",), ("campaign", "resume"), ("rollback",))
UPGRADE = (("upgrade",),)
PROMETHEUS = (("plan",), *UPGRADE, ("campaign", "resume"))  # the campaign's canary metrics (baseline: canary)


def duration_text(seconds: float) -> str:
    """SECONDS as a duration the parser reads back: '3h', '90m', '45s', '0.5s', '0'."""
    if seconds == 0:
        return "0"
    if seconds == int(seconds):
        s = int(seconds)
        return f"{s // 3600}h" if s % 3600 == 0 else f"{s // 60}m" if s % 60 == 0 else f"{s}s"
    return f"{round(seconds, 3)}s"


@dataclass(frozen=True, kw_only=True)
class Setting:
    name: str  # the config file's key (where `file`), and the setting's name
    flag: str | None  # None: a key of the config file alone
    short: str | None = None  # a one-letter flag too: -i
    param: str = ""  # the commands' parameter (default: NAME)
    kind: str = "text"  # one of KINDS; durations: a comma list, one per gap between waves (the last repeated)
    default: Any = None  # as a person writes it ("5m"); `value` is it parsed
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False  # more than MINIMUM, not equal to it
    choices: tuple[str, ...] = ()
    pattern: str | None = None  # text: what each value must match (the schema checks it)
    help: str = ""
    metavar: str | None = None
    commands: tuple[tuple[str, ...], ...] = ()  # the commands that take it (from the config file, where `file`)
    file: bool = True  # a key of the config file
    path: bool = False  # a file: relative to the config file's directory, made absolute for a systemd unit
    many: bool = False  # repeatable (a list in the file)
    item: dict[str, Any] | None = None  # objects: each object of the list (JSON Schema; the schema's $defs.NAME)
    flag_value: str | None = None  # a switch that sets PARAM to this word (--promote, --rollback: `decision`)
    # A campaign's option: `upgrade` takes it and hands it to the campaign. Its key in the campaign's options
    # (campaign/options.py: a field of CampaignOptions each, as the history records it; "probe.samples": nested), or ""
    # where the campaign records what follows from it (--window: the window's end; the drain hooks; the idle wait).
    recorded: str | None = None

    def __post_init__(self) -> None:
        assert self.kind in KINDS and (self.kind == "choice") == bool(self.choices), self.name
        assert (self.kind == "objects") == bool(self.item) and (self.flag is not None or not self.commands), self.name
        assert self.kind != "switch" or not self.file, self.name
        if not self.param:
            object.__setattr__(self, "param", self.name)

    @property
    def timed(self) -> bool:
        """A duration, or a list of them."""
        return self.kind in ("duration", "durations")

    @property
    def value(self) -> Any:
        """The default, parsed: seconds for a duration."""
        return None if self.default is None else self.parse(self.default)

    @property
    def bounds(self) -> str:
        """A duration's bounds in words, where it has some besides the year every duration is within."""
        low = [f"above {duration_text(self.minimum or 0)}"] if self.above else \
            [f"at least {duration_text(self.minimum)}"] if self.minimum else []
        return ", ".join(low + ([f"at most {duration_text(self.maximum)}"] if self.maximum is not None else []))

    def parse(self, value: Any) -> Any:
        """VALUE (a word of the command line or the config file's value) as the commands take it; ValueError says
        what is wrong with it in one line."""
        if self.kind == "durations":
            parts = [p.strip() for p in str(value).split(",")] if isinstance(value, str) else [value]
            return tuple(self.duration(p) for p in parts)
        if self.kind == "duration":
            return self.duration(value)
        return value

    def duration(self, value: str | float | int) -> float:
        """'90', '90s', '5m', '2h', '14d' (or a number of seconds) -> seconds, within the setting's bounds."""
        shown = repr(value) if len(repr(value)) <= 40 else "the value"  # not a page of a file given by mistake
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            match = re.fullmatch(DURATION, value) if isinstance(value, str) else None
            if match is None:
                raise ValueError(f"{shown} is not a duration ({DURATION_EXAMPLES})")
            seconds = float(value.rstrip("smhd")) * UNITS[value[-1] if value[-1] in "smhd" else ""]
        low = self.minimum or 0.0
        if seconds != seconds or seconds < low or (self.above and seconds == low):
            raise ValueError(f"{shown} is not {'above' if self.above else 'at least'} {duration_text(low)}")
        high = MAX_DURATION_S if self.maximum is None else self.maximum
        if seconds > high:
            raise ValueError(f"{shown} is longer than a year" if high == MAX_DURATION_S else
                             f"{shown} is more than {duration_text(high)}")
        return seconds

    def schema(self) -> dict[str, Any]:
        """The config file's property (JSON Schema)."""
        if self.kind == "objects":
            one: dict[str, Any] = {"type": "array", "items": {"$ref": f"#/$defs/{self.name}"}}  # config_schema's
        elif self.kind == "choice":
            one = {"enum": list(self.choices)}
        elif self.kind == "int":
            one = {"type": "integer"}
        elif self.kind == "number":
            one = {"type": "number"}
        elif self.timed:
            word = f"{DURATION}(\\s*,\\s*{DURATION})*" if self.kind == "durations" else DURATION
            one = {"type": ["string", "number"], "pattern": f"^{word}$"}  # the bounds of strings: config.read
        else:
            one = {"type": "string", "minLength": 1} | ({"pattern": self.pattern} if self.pattern else {})
        if self.minimum is not None or self.timed:
            one["exclusiveMinimum" if self.above else "minimum"] = self.minimum or 0
        if self.maximum is not None or self.timed:
            one["maximum"] = MAX_DURATION_S if self.maximum is None else self.maximum
        out: dict[str, Any] = {"oneOf": [one, {"type": "array", "items": one}]} if self.many else one
        if self.default is not None:
            out["default"] = self.default
        commands = ", ".join(" ".join(c) for c in self.commands)
        return out | {"description": f"{self.flag} of {commands}: {self.help}" if self.flag else self.help}


INVENTORY = Setting(name="inventory", flag="--inventory", short="-i", param="inventory_path", metavar="INVENTORY",
                    path=True, commands=RUNS, help="Ansible inventory. Default: localhost over the local connection.")
BASELINE = Setting(name="baseline", flag="--baseline", short="-b", metavar="BASELINE", path=True, commands=RUNS,
                   help="Baseline YAML. Default: the embedded one.")
FORKS = Setting(name="forks", flag="--forks", kind="int", minimum=1, maximum=1000, commands=RUNS,
                help=f"Hosts worked on at once (default: all, up to {FORKS_CAP}).", recorded="forks")
FAIL_ON = Setting(name="fail_on", flag="--fail-on", kind="choice", choices=(*reversed(SEVERITIES), "never"),
                  default="high", commands=(("audit",),),
                  help="Exit 1 when a control fails at or above this severity.")
WAVES = Setting(name="waves", flag="--waves", default="1,10%,50%,100%", metavar="RAMP", commands=(("plan",), *UPGRADE),
                help="Cumulative wave targets: host counts or percentages of the eligible hosts, ending at 100%.")
# The canary soaks for hours, later waves less.
SOAK = Setting(name="soak", flag="--soak", kind="durations", default="2h,30m", metavar="DURATIONS", commands=UPGRADE,
               help="Watched soak between waves, one length per gap (the last repeated), e.g. 2h,30m; 0: none.",
               recorded="soak_s")
SOAK_INTERVAL = Setting(name="soak_interval", flag="--soak-interval", kind="duration", above=True, default="1m",
                        metavar="DURATION", commands=UPGRADE,
                        help="A health check and a canary run of every changed host this often while soaking.",
                        recorded="soak_interval_s")
SOAK_GRACE = Setting(name="soak_grace", flag="--soak-grace", kind="duration", default="5m", metavar="DURATION",
                     commands=UPGRADE, help="A changed host unreachable this long during a soak fails.",
                     recorded="soak_grace_s")
CANARY = Setting(name="canary", flag="--canary", metavar="CMD", commands=UPGRADE,
                 help="The canary workload run on changed hosts while soaking (the probe command engine's protocol; "
                      "default: the host's probe engine).", recorded="canary")
CANARY_MAX_FAILURES = Setting(name="canary_max_failures", flag="--canary-max-failures", kind="int", minimum=0,
                              maximum=100000, default=0, commands=UPGRADE,
                              help="Failed canary runs a host may have before it fails.",
                              recorded="canary_max_failures")
WINDOW = Setting(name="window", flag="--window", kind="duration", above=True, metavar="DURATION", file=False,
                 commands=(*UPGRADE, ("campaign", "resume")),
                 help=f"Maintenance window length: no wave starts after it (exit {Exit.HALTED:d}).", recorded="")
ROLLBACK_SCOPE = Setting(name="rollback_scope", flag="--rollback-scope", kind="choice", choices=("campaign", "wave"),
                         default="campaign", commands=UPGRADE,
                         help="On a failed wave roll back every changed host, or the wave's only.",
                         recorded="rollback_scope")
DRAIN_PRESET = Setting(name="drain_preset", flag="--drain-preset", kind="choice", choices=tuple(sorted(PRESETS)),
                       commands=UPGRADE,
                       help="How hosts are drained around their change: " + "; ".join(
                           p.says for _, p in sorted(PRESETS.items())) + ".", recorded="")
DRAIN = Setting(name="drain", flag="--drain", metavar="CMD", commands=UPGRADE,
                help="Drain command template run on this machine: {host} {node} {campaign}.", recorded="")
UNDRAIN = Setting(name="undrain", flag="--undrain", metavar="CMD", commands=UPGRADE, help="Undrain command template.",
                  recorded="")
IDLE_TIMEOUT = Setting(name="idle_timeout", flag="--idle-timeout", kind="duration", maximum=MAX_DURATION_S,
                       metavar="DURATION", commands=UPGRADE,
                       help="How long a drained host waits for its own jobs to end and its GPUs to be free (default: "
                            "until the window closes, else 24h).", recorded="")
PACE = Setting(name="pace", flag="--pace", kind="choice", choices=("host", "wave"), default="host", commands=UPGRADE,
               help="host: each host goes on as soon as its own jobs end; wave: the wave's hosts move step by step "
                    "together (the wave waits for its longest job).", recorded="pace")
MAX_IN_FLIGHT = Setting(name="max_in_flight", flag="--max-in-flight", metavar="N|P%", pattern=r"^[0-9]+%?$",
                        commands=UPGRADE,
                        help="Hosts (NVLink domains) out of service at once, at most: a number or a share of the "
                             "campaign's (default: a whole wave).", recorded="max_in_flight")
DRAIN_MODE = Setting(name="drain_mode", flag="--drain-mode", kind="choice", choices=("drain", "reservation"),
                     default="drain", commands=UPGRADE,
                     help="With --drain-preset slurm: drain each wave as it starts, or reserve its nodes (a Slurm "
                          "maintenance reservation) from the end of the soak before it, so jobs end in time.",
                     recorded="drain_mode")
LEAD = Setting(name="lead", flag="--lead", kind="duration", default="30m", metavar="DURATION", commands=UPGRADE,
               help="--drain-mode reservation: how long after the campaign starts the canary wave's reservation, "
                    "and its drain, start (its checks run meanwhile).", recorded="lead_s")
CAPACITY_BUDGET = Setting(name="capacity_budget", flag="--capacity-budget", kind="number", minimum=0, above=True,
                          maximum=10**7, metavar="NODE_HOURS", commands=(*UPGRADE, ("campaign", "resume")),
                          help="Node-hours the campaign may take from the fleet (hosts drained and idle, or in change; "
                               "a host is one node): no further host is drained while that would exceed it.",
                          recorded="capacity_budget_node_hours")
SAMPLES = Setting(name="samples", flag="--samples", kind="int", minimum=1, maximum=1000, default=10, file=False,
                  commands=(("probe",), *UPGRADE), help="Throughput samples per metric and GPU.",
                  recorded="probe.samples")
WARMUP = Setting(name="warmup", flag="--warmup", param="warmup_s", kind="duration", maximum=600, default="20s",
                 metavar="DURATION", file=False, commands=(("probe",), *UPGRADE),
                 help="Warm-up before the throughput samples.", recorded="probe.warmup_s")
TRIAL = Setting(name="trial", flag="--trial", param="trial_s", kind="duration", minimum=0.01, maximum=60,
                default="1s", metavar="DURATION", file=False, commands=(("probe",), *UPGRADE),
                help="Sustained work per throughput sample.", recorded="probe.trial_s")
NOTIFY = Setting(name="notify", flag="--notify", metavar="CMD", many=True, commands=NOTIFYING,
                 help="Run CMD on this machine for each event (no shell; the event as JSON on stdin; placeholders "
                      "{event} {severity} {kind} {campaign} {host} {target} {state} {run}). Repeatable.")
WEBHOOK = Setting(name="webhook", flag="--webhook", metavar="URL", many=True, pattern="^https?://",
                  commands=NOTIFYING, help=f"POST each event to URL (TLS verified, {TRIES} tries). Repeatable.")
WEBHOOK_FORMAT = Setting(name="webhook_format", flag="--webhook-format", kind="choice", choices=FORMATS,
                         default="json", commands=NOTIFYING,
                         help="The event as it is, a Slack message or a Microsoft Teams Adaptive Card.")
WEBHOOK_HEADERS = Setting(name="webhook_headers", flag="--webhook-headers", metavar="FILE", path=True,
                          commands=NOTIFYING, help=f"HTTP headers for the webhooks ('Name: value' lines; also "
                                                   f"${HEADERS_ENV}); never shown or recorded.")
WEBHOOK_CA = Setting(name="webhook_ca", flag="--webhook-ca", metavar="FILE", path=True, commands=NOTIFYING,
                     help="Also trust this CA (PEM) for https webhooks.")
NOTIFY_TIMEOUT = Setting(name="notify_timeout", flag="--notify-timeout", kind="duration", minimum=0.1, maximum=600,
                         default="10s", metavar="DURATION", commands=NOTIFYING,
                         help="For each --notify command and each webhook try.")
PROMETHEUS_URL = Setting(name="prometheus_url", flag="--prometheus-url", metavar="URL", pattern="^https?://",
                         commands=PROMETHEUS, help="The Prometheus server whose metrics judge the canary against its "
                                                   "control hosts (the baseline's canary metrics; TLS verified).")
PROMETHEUS_HEADERS = Setting(name="prometheus_headers", flag="--prometheus-headers", metavar="FILE", path=True,
                             commands=PROMETHEUS, help="HTTP headers for Prometheus ('Name: value' lines, a file only "
                                                       "its owner reads); never shown or recorded.")
PROMETHEUS_TIMEOUT = Setting(name="prometheus_timeout", flag="--prometheus-timeout", kind="duration", minimum=0.1,
                             maximum=600, default="10s", metavar="DURATION", commands=PROMETHEUS,
                             help=f"For each read of a Prometheus answer and the query's evaluation; a request gets "
                                  f"{PROMQL_TRIES} tries.")
WITHIN = Setting(name="within", flag="--within", kind="duration", above=True, default="14d", metavar="DURATION",
                 file=False, commands=(("hosts",),), help="The window of incidents counted: the last DURATION.")
DRIVERS_WITHIN = Setting(name="drivers_within", flag="--within", param="within", kind="duration", above=True,
                         metavar="DURATION", file=False, commands=(("report", "drivers"),),
                         help="The window of observations and incidents counted: the last DURATION (default: the "
                              "whole history).")
WINDOW_DURATION = Setting(name="duration", flag="--duration", kind="duration", above=True, metavar="DURATION",
                          file=False, commands=(("systemd", "install"),), help="How long the window lasts: 3h, 90m.")
WINDOW_MARGIN = Setting(name="margin", flag="--margin", kind="duration", metavar="DURATION", file=False,
                        commands=(("systemd", "install"),),
                        help="No wave starts in the window's last DURATION: the campaign halts between waves for a "
                             "person (default 0: a wave still running when the window ends is stopped, and resumed "
                             "by the next window).")

# The flags of the command line alone (no key of the config file): each command words their help for itself where
# it differs.
CAMPAIGN_CMDS = (("campaign", "resume"), ("campaign", "judge"), ("rollback",))
LIMIT = Setting(name="limit", flag="--limit", short="-l", metavar="LIMIT", file=False,
                commands=(*RUNS, ("report",), ("systemd", "install")), help="Ansible host pattern.")
OUTPUT = Setting(name="output", flag="--output", short="-o", metavar="FILE", file=False,
                 commands=(("audit",), ("probe",), ("plan",), ("report",), ("report", "drivers")),
                 help="Write the report to FILE (atomically) instead of stdout.")
FORMAT = Setting(name="format", flag="--format", param="fmt", kind="choice", file=False,
                 choices=("table", "json", "csv", "html", "oscal", "prometheus"),
                 help="The output's format (each command takes some: its first is the default).")
TARGET = Setting(name="to", flag="--to", param="target", metavar="VERSION", file=False,
                 commands=(("plan",), *UPGRADE, ("systemd", "install")),
                 help="Target driver version, e.g. 570.86.15.")
NO_PREFLIGHT = Setting(name="no_preflight", flag="--no-preflight", kind="switch", file=False,
                       commands=RUNS, help="Skip the SSH reachability and host-key pre-flight.")
UNIT_DIR = Setting(name="unit_dir", flag="--unit-dir", metavar="DIR", file=False,
                   commands=(("systemd", "install"), ("systemd", "uninstall")), help="Where the units are.")
SHOW_ALL = Setting(name="all", flag="--all", short="-a", param="show_all", kind="switch", file=False,
                   commands=(("audit",),), help="Table: show passing controls too.")
YES = Setting(name="yes", flag="--yes", kind="switch", file=False, commands=UPGRADE,
              help="Do not ask for confirmation (needed without a terminal).")
DRY_RUN = Setting(name="dry_run", flag="--dry-run", kind="switch", file=False, commands=UPGRADE,
                  help="Print what would be done, change nothing.")
VERBOSE = Setting(name="verbose", flag="--verbose", kind="switch", file=False, commands=(("campaign", "show"),),
                  help="Also every failed gate's reasons in full and its series (GPU, metric), one row each.")
INTERRUPTED = Setting(name="interrupted", flag="--interrupted", kind="switch", file=False,
                      commands=(("campaign", "resume"),),
                      help=f"Every campaign at work whose process is gone (a crash or reboot); exit {Exit.OK:d} when "
                           f"there is none.")
PROMOTE = Setting(name="promote", flag="--promote", param="decision", kind="switch", flag_value="promote", file=False,
                  commands=(("campaign", "judge"),),
                  help="Go on: the held hosts are accepted and the next wave starts (as campaign resume).")
ROLLBACK = Setting(name="rollback", flag="--rollback", param="decision", kind="switch", flag_value="rollback",
                   file=False, commands=(("campaign", "judge"),),
                   help="Roll back every host the campaign changed (as fleetctl rollback).")
REASON = Setting(name="reason", flag="--reason", metavar="TEXT", file=False, commands=(("campaign", "judge"),),
                 help="Why, recorded with the decision (one line, at most 500 characters).")
GROUP = Setting(name="group", flag="--group", short="-g", param="groups", metavar="GROUP", many=True, file=False,
                commands=(("check",),),
                help="A baseline group this node belongs to (repeatable; 'all' always applies).")
SLURM = Setting(name="slurm", flag="--slurm", param="use_slurm", kind="switch", file=False, commands=(("check",),),
                help="Drain this Slurm node on a failing critical control (reason `fleetctl check: ...`); resume it "
                     "when healthy, only if check drained it.")
NODE = Setting(name="node", flag="--node", metavar="NAME", file=False, commands=(("check",),),
               help="The Slurm node. Default: $SLURMD_NODENAME, else the short host name.")
TEXTFILE = Setting(name="textfile", flag="--textfile", metavar="DIR", file=False, commands=(("check",),),
                   help="Also write the results into DIR (atomically), for node_exporter.")
REPEAT_OFFENDERS = Setting(name="repeat_offenders", flag="--repeat-offenders", kind="switch", file=False,
                           commands=(("hosts",),),
                           help="Only the repeat offenders, to send for repair: by the baseline's "
                                "incidents.repeat_offender (its all group's), each with its evidence. --within is the "
                                "policy's then.")
THROUGHPUT = Setting(name="throughput", flag="--throughput", kind="switch", file=False, commands=(("probe",),),
                     help="Take throughput samples too (warm-up, then N sustained trials).")
ENGINE = Setting(name="engine", flag="--engine", kind="choice", choices=("builtin", "command"), file=False,
                 commands=(("probe",),),
                 help="Throughput engine (default: the host's gpu_probe_engine inventory variable, else builtin).")
COMMAND = Setting(name="command", flag="--command", param="canary", metavar="CMD", file=False, commands=(("probe",),),
                  help="Canary workload for --engine command (prints JSON metrics).")
SINCE = Setting(name="since", flag="--since", metavar="DATE", file=False, commands=(("report",), ("report", "drivers")),
                help="First day (YYYY-MM-DD, UTC) or ISO timestamp.")
UNTIL = Setting(name="until", flag="--until", metavar="DATE", file=False, commands=(("report",),),
                help="Last day (YYYY-MM-DD, UTC) or ISO timestamp.")
SIGN = Setting(name="sign", flag="--sign", param="sign_key", metavar="KEY", file=False, commands=(("report",),),
               help="ed25519 private key (PEM): write FILE.sig next to -o FILE.")
HEAD = Setting(name="head", flag="--head", metavar="DIGEST", file=False, commands=(("report", "verify"),),
               help="The chain head an export stated: the history must end there.")
SIGNATURE = Setting(name="signature", flag="--signature", metavar="FILE.sig", file=False,
                    commands=(("report", "verify"),), help="Check an export's detached signature instead.")
SIGNED_FILE = Setting(name="file", flag="--file", param="signed_file", metavar="FILE", file=False,
                      commands=(("report", "verify"),), help="The signed export (default: named in FILE.sig).")
KEY = Setting(name="key", flag="--key", metavar="PUBKEY", file=False, commands=(("report", "verify"),),
              help="The signer's ed25519 public key (PEM) the signature must be from.")
# A calendar time is a *-schedule (a systemd calendar expression); --window is a duration wherever it is taken.
AUDIT_SCHEDULE = Setting(name="audit_schedule", flag="--audit-schedule", metavar="CALENDAR", file=False,
                         commands=(("systemd", "install"),),
                         help="Audit on this systemd calendar expression: daily, hourly, 'Mon..Fri 06:00'.")
AUDIT_OUTPUT = Setting(name="audit_output", flag="--audit-output", metavar="FILE", file=False,
                       commands=(("systemd", "install"),),
                       help="The audit writes Prometheus metrics to FILE (e.g. node_exporter's textfile directory).")
WINDOW_SCHEDULE = Setting(name="window_schedule", flag="--window-schedule", metavar="CALENDAR", file=False,
                          commands=(("systemd", "install"),),
                          help="When the maintenance window opens (a systemd calendar expression): 'Sat 02:00'.")
PRINT = Setting(name="print", flag="--print", param="print_only", kind="switch", file=False,
                commands=(("systemd", "install"),), help="Print the units instead of writing them.")
EXECUTION_NODE = {
    "type": "object", "description": "An execution node: its hosts' playbooks run through its worker.",
    "additionalProperties": False, "required": ["name", "worker", "hosts"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$", "description": "Named in its hosts' errors."},
        "worker": {"type": "string", "minLength": 1,
                   "description": "An ansible-runner worker command, split as $FLEETCTL_WORKER is: ssh exec01 "
                                  "ansible-runner worker."},
        "hosts": {"oneOf": [{"type": "string", "minLength": 1},
                            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}],
                  "description": "The hosts it serves: inventory groups, or shell patterns of host names."}}}
EXECUTION_NODES = Setting(
    name="execution_nodes", flag=None, kind="objects", item=EXECUTION_NODE,
    help="Every playbook (audit, probe, plan, each campaign step) runs each node's hosts through its worker, all "
         "nodes at once; a host goes to the first node that serves it; a host no node serves runs as without nodes "
         "(in-process, or through $FLEETCTL_WORKER).")
# A worker silent this long is hung: by default the rule fleetctl's SSH holds a connection to (runner.ANSIBLE_ENV: no
# answer to 4 keepalives 15 s apart), each worker asked for a keepalive every quarter of it.
WORKER_SILENCE = Setting(
    name="worker_silence", flag=None, kind="duration", minimum=4, default="1m",
    help="An execution node's worker (or $FLEETCTL_WORKER) that sends no whole line this long, not even the keepalive "
         "fleetctl asks it for every quarter of it (--keepalive-seconds after its command, and "
         "$ANSIBLE_RUNNER_KEEPALIVE_SECONDS), is stopped and fails its hosts.")

SETTINGS = tuple(v for v in tuple(globals().values()) if isinstance(v, Setting))
CAMPAIGN = tuple(s for s in SETTINGS if s.recorded is not None)  # the campaign's options, `upgrade` takes each


def config_schema() -> dict[str, Any]:
    """schemas/config.schema.json."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://fleetctl.dev/schemas/config.schema.json",
        "title": "fleetctl configuration file",
        "description": "Defaults people set once ($FLEETCTL_CONFIG, else $XDG_CONFIG_HOME/fleetctl/config.yml, else "
                       "/etc/fleetctl/config.yml). A flag on the command line wins over the file. Relative paths are "
                       "relative to the file's directory. Generated from orchestrator/settings.py.",
        "type": "object",
        "additionalProperties": False,
        "$defs": {s.name: s.item for s in SETTINGS if s.file and s.item},
        "properties": {s.name: s.schema() for s in SETTINGS if s.file},
    }


def schema_text() -> str:
    """The schema as the file holds it: one line per key."""
    schema = config_schema()
    properties = schema.pop("properties")
    head = json.dumps(schema, indent=2)[:-2]
    keys = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in properties.items())
    return f'{head},\n  "properties": {{\n{keys}\n  }}\n}}\n'


if __name__ == "__main__":
    print(schema_text(), end="")
