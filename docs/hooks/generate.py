"""MkDocs hook: the reference pages, made from the code at each build, never copied by hand.

reference/controls.md      the controls registry (orchestrator/controls/): id, severity, the rule (the control's
                           docstring), the remediation, and the roles plan, precheck, verify and rollback use
reference/steps.md         campaign/transitions.py: the host table, the moves between tables, the campaign table
reference/baseline.md      schemas/baseline.schema.json
reference/config.md        schemas/config.schema.json (from orchestrator/settings.py), with each key's default
reference/notification.md  orchestrator/notify/events.py's NOTES, then schemas/notification.schema.json
reference/exit-codes.md    orchestrator/exitcodes.py
reference/metrics.md       the metrics orchestrator/prometheus.py exports
reference/incidents.md     the ledger's incident classes (orchestrator/history/ledger.py CLASSES)
reference/canary-kinds.md  the canary metrics' kinds (orchestrator/judge/canary/kinds.py KINDS)
reference/packages.md      each package of orchestrator/: its __init__ docstring (what it owns) and MAY_IMPORT
reference/cli.md           the click commands (cli/), grouped by task (TASKS); the options several commands declare
                           alike (cli/options.py; shared_groups) listed once
"""

from __future__ import annotations

import collections
import inspect
import json
from pathlib import Path

import click
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def on_files(files, config):
    for path, make in PAGES.items():
        files.append(File.generated(config, f"reference/{path}", content=make()))
    return files


def cell(text: object) -> str:
    """TEXT on one line of a Markdown table cell: its pipes escaped, and its `<` shown, not read as HTML (`<a|b>`),
    but for those in code spans, which end no cell and show a backslash as it is."""
    parts = " ".join(str(text).split()).split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|").replace("<", "&lt;") for i, part in enumerate(parts))


def table(header: tuple[str, ...], rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def name(value: object) -> str:
    """A state as the history writes it (a plain string, or an enum member's value)."""
    return "" if value is None else str(getattr(value, "value", value))


def controls_page() -> str:
    from orchestrator import controls
    families: dict[str, list] = {}  # a family (the id's prefix: driver, gpu...) -> its rows, in the registry's order
    for c in controls.CONTROLS:
        families.setdefault(c.id.split(".", 1)[0], []).append(
            (f"`{c.id}`", c.severity, inspect.getdoc(c.evaluate), c.remediation))
    roles = [(f"`{role}`", meaning, ", ".join(f"`{i}`" for i in controls.with_role(role)))
             for role, meaning in controls.ROLES.items()]
    return (
        "# Controls\n\nEvery control the audit evaluates, in the order findings are listed (made from the registry, "
        "`orchestrator/controls/`, at each build). A fact that cannot be read makes the finding `error`, never a "
        "guess. [The audit](../audit.md) says how facts are collected.\n\n"
        + "".join(f"## {family}\n\n" + table(("control", "severity", "rule", "remediation"), rows) + "\n"
                  for family, rows in families.items())
        + "## Roles\n\nWhat else a control is used for, declared with the control: [planning and upgrades]"
        "(../upgrades.md) ask for the controls of a role.\n\n" + table(("role", "meaning", "controls"), roles))


def steps_page() -> str:
    from orchestrator.campaign import transitions as t
    flags = tuple(t.ATTRIBUTES)
    hosts = [(name(r.state), f"`{r.step}`", name(r.ok), name(r.fail), name(r.inconclusive), name(r.skip),
              f"`{r.runner}`", ", ".join(f for f in flags if getattr(r, f))) for r in t.HOST_TABLE]
    moves = [(f"`{event}`", ", ".join(f"{m}: to {name(t.MOVES[m].to)}" for m in names))
             for event, names in t.EVENT_MOVES.items()]
    campaign = [(name(state), f"`{event}`", name(to)) for (state, event), to in t.CAMPAIGN_TABLE.items()]
    return (
        "# Campaign steps\n\nA campaign's host and campaign state machines, made from "
        "`orchestrator/campaign/transitions.py` at each build. A host's state names the step it does next; the "
        "step's outcome picks the next state; states without a row are terminal. Hosts that reach a step together share "
        "one playbook run (`--pace host`: each host goes on as soon as it may; `--pace wave`: the wave's hosts step by "
        "step together). [Planning and upgrades](../upgrades.md) tells what each step does.\n\n"
        "## Hosts\n\n" + table(("state", "step", "ok", "fail", "inconclusive", "skip", "runner", "attributes"), hosts)
        + "\nAttributes: " + "; ".join(f"`{k}`, {v}" for k, v in t.ATTRIBUTES.items()) + ".\n\nTerminal host states: "
        + ", ".join(name(s) for s in t.TERMINAL) + ".\n\n## Moves between the tables\n\n"
        + table(("event", "hosts moved"), moves)
        + "\n## The campaign\n\n" + table(("state", "event", "next state"), campaign)
        + "\nTerminal campaign states: " + ", ".join(name(s) for s in t.CAMPAIGN_TERMINAL) + ".\n")


def exit_codes_page() -> str:
    from orchestrator.exitcodes import BY_COMMAND, COMMON, Exit
    codes = [(int(e), f"`{e.name}`", e.meaning,
              "every command" if e in COMMON else ", ".join(f"`{c}`" for c, got in BY_COMMAND.items() if e in got))
             for e in Exit]
    commands = [(f"`fleetctl {c}`", ", ".join(str(int(e)) for e in got)) for c, got in BY_COMMAND.items()]
    return ("# Exit codes\n\nMade from `orchestrator/exitcodes.py` at each build. A code keeps its number and its "
            "one meaning: scripts, cron and systemd rely on them.\n\n"
            + table(("code", "name", "meaning", "commands"), codes)
            + "\n## By command\n\nBesides " + ", ".join(str(int(e)) for e in COMMON) + ", which every command may "
            "exit with:\n\n" + table(("command", "exit codes"), commands))


def metrics_page() -> str:
    from orchestrator.prometheus import METRICS
    rows = [(f"`{metric}`", ", ".join(labels), text) for metric, (text, labels) in METRICS.items()]
    return ("# Metrics\n\nEvery metric fleetctl exports, made from `orchestrator/prometheus.py` at each build. "
            "[Prometheus](../prometheus.md) says which command writes which.\n\n"
            + table(("metric", "labels", "meaning"), rows))


def schema_page(title: str, file: str, intro: str, every_default: bool = False) -> str:
    """The page of a schema's keys; EVERY_DEFAULT: a default column in every table (else only where one is
    declared)."""
    from orchestrator.settings import DURATION_EXAMPLES, MAX_DURATION_S, SETTINGS, duration_text
    words = {"duration": ("duration", DURATION_EXAMPLES),
             "durations": ("durations, comma-separated", f"{DURATION_EXAMPLES} each")}
    durations = {s.schema()["pattern"]: words[s.kind] for s in SETTINGS if s.timed}  # a pattern -> its words
    schema = json.loads((ROOT / "schemas" / file).read_text())
    defs = schema.get("$defs", {})
    sections: dict[str, list] = {}

    def local(node: dict) -> bool:
        """NODE refers to a definition of this schema (not another schema's)."""
        return node.get("$ref", "").startswith("#/$defs/")

    def kind(node: dict) -> str:
        if "$ref" in node and not local(node):
            return f"as in `schemas/{node['$ref'].split('#')[0].rsplit('/', 1)[1]}`"
        if "$ref" in node:
            ref = node["$ref"].rsplit("/", 1)[1]
            return f"[{ref}](#{ref})" if defs[ref].get("type") == "object" else f"{ref}: {kind(defs[ref])}"
        if "const" in node:
            return f"`{json.dumps(node['const'])}`"
        if "enum" in node:
            return ", ".join(f"`{v}`" for v in node["enum"])
        if "oneOf" in node:
            return " or ".join(kind(n) for n in node["oneOf"])
        if node.get("pattern") in durations:  # in words, seconds as durations
            what, examples = durations[node["pattern"]]
            low = node.get("minimum") and f"at least {duration_text(node['minimum'])}"
            if "exclusiveMinimum" in node:
                low = f"above {duration_text(node['exclusiveMinimum'])}"
            high = node.get("maximum", MAX_DURATION_S) < MAX_DURATION_S and f"at most {duration_text(node['maximum'])}"
            return f"{what} ({'; '.join(b for b in (examples, low, high) if b)})"
        types = node.get("type", "any")
        text = " or ".join(types) if isinstance(types, list) else types
        if text == "array":
            text = f"list of {kind(node.get('items', {}))}"
        if "pattern" in node:
            text += f" matching `{node['pattern']}`"
        bounds = [f"{op} {node[k]}" for k, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                                                  ("exclusiveMaximum", "<")) if k in node]
        return text + (f" ({', '.join(bounds)})" if bounds else "")

    def entry(path: str, node: dict, rows: list) -> None:
        items = node.get("items", {}) if node.get("type") == "array" else {}
        ref = node["$ref"].rsplit("/", 1)[1] if local(node) else items["$ref"].rsplit("/", 1)[1] if local(items) else ""
        is_object = node.get("type") == "object" and not ref
        value = node.get("default")
        default = "" if "default" not in node else f"`{value if isinstance(value, str) else json.dumps(value)}`"
        rows.append((f"`{path}`", "object" if is_object else kind(node), default, node.get("description", "")))
        if ref and defs[ref].get("type") == "object":
            section(ref)
        elif is_object:
            walk(node, path + ".", rows)
            if isinstance(node.get("additionalProperties"), dict):
                entry(path + ".<name>", node["additionalProperties"], rows)

    def walk(node: dict, prefix: str, rows: list) -> None:
        for key, sub in node.get("properties", {}).items():
            entry(prefix + key, sub, rows)

    def section(ref: str) -> None:
        if ref not in sections:
            sections[ref] = []
            walk(defs[ref], "", sections[ref])

    def keys(rows: list) -> str:
        """The table of ROWS; the default column where the schema declares defaults (every_default: always)."""
        if every_default or any(row[2] for row in rows):
            return table(("key", "type", "default", "meaning"), rows)
        return table(("key", "type", "meaning"), [(k, t, m) for k, t, _, m in rows])

    root: list = []
    walk(schema, "", root)
    out = f"# {title}\n\n{intro} Made from `schemas/{file}` at each build.\n\n{schema.get('description', '')}\n\n"
    out += keys(root)
    for ref, rows in sections.items():
        out += f"\n## {ref}\n\n{defs[ref].get('description', '')}\n\n" + keys(rows)
    return out


def notifications_page() -> str:
    """The events, from notify_events.NOTES, then every field, from the notification schema."""
    from orchestrator.notify.events import NOTES

    def severities(note) -> str:
        return "; ".join(level + (f" when {when}" if when else "") for level, when in note.severities)

    rows = [(f"`{n.event}`", n.when, ", ".join(f"`{r}`" for r in n.records) or "an audit or probe run",
             severities(n)) for n in NOTES]
    events = ("## Events\n\nMade from `orchestrator/notify/events.py` (`NOTES`) at each build.\n\n"
              + table(("event", "when", "made from (journal record)", "severity"), rows) + "\n## Fields\n\n")
    page = schema_page("Notification reference", "notification.schema.json",
                       "The events and every field of a notification; [notifications](../notifications.md) says "
                       "where they are sent.")
    head, rest = page.split("\n\n", 1)
    return f"{head}\n\n{events}{rest}"


def incidents_page() -> str:
    from orchestrator.history.ledger import CLASSES
    from orchestrator.history.offenders import DEFAULT_CLASSES
    rows = [(f"`{c.name}`", c.what, c.reads, "yes" if c.name in DEFAULT_CLASSES else "")
            for c in CLASSES.values()]
    return ("# Incident classes\n\nThe classes of the ledger's incidents ([each host's record](../hosts.md)), made "
            "from `orchestrator/history/ledger.py` (`CLASSES`) at each build. *Repeat offender*: counted by a "
            "baseline's "
            "`incidents.repeat_offender` that names no `classes` ([repeat offenders](../hosts.md#repeat-offenders)).\n\n"
            + table(("class", "what", "derived from", "repeat offender"), rows))


def canary_kinds_page() -> str:
    from orchestrator.judge.canary.kinds import DEFAULT, KINDS
    rows = [(f"`{k.name}`" + (" (default)" if k.name == DEFAULT else ""), k.says,
             "yes" if k.drift else "") for k in KINDS.values()]
    return ("# Canary metric kinds\n\nThe values of a canary metric's `kind` ([the canary](../canary.md)), made "
            "from `orchestrator/judge/canary/kinds.py` (`KINDS`) at each build. *Fleet drift*: its control cohort's "
            "movement (a metric where higher is good) is the drift taken out of a host's comparison with its own "
            "past.\n\n" + table(("kind", "what", "fleet drift"), rows))


def packages_page() -> str:
    import ast
    from orchestrator import SHARED
    out = ["# The package's rooms\n\nEach package of `orchestrator/`, made from its `__init__.py` at each build: what it "
           "owns (its docstring) and what its modules may import of fleetctl besides each other (`MAY_IMPORT`, "
           "checked by `tests/unit/test_layers.py`). The modules at the top are the commands' services and the "
           "shared helpers, which every package may import: " + ", ".join(f"`{m}`" for m in SHARED) + ".\n"]
    for init in sorted((ROOT / "orchestrator").rglob("__init__.py")):
        tree = ast.parse(init.read_text())
        may = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "MAY_IMPORT" for t in n.targets)), None)
        doc = ast.get_docstring(tree) or ""
        package = init.parent.relative_to(ROOT).as_posix()
        first, _, rest = doc.partition("\n")
        out.append(f"## `{package}/`\n\n{first}\n")
        if rest.strip():
            out.append("```text\n" + rest.strip("\n") + "\n```\n")
        if may is not None:
            out.append("May import, besides the shared helpers: " + (", ".join(f"`{m}`" for m in may) or "nothing")
                       + "\n")
    return "\n".join(out)


# The commands by task: each of fleetctl's commands (cli/main.py BUILTIN) in exactly one (tests/unit/test_docs.py);
# a plugin's command not named here is listed under "Plugins". A group's subcommands follow it.
TASKS = {
    "Audit and check": ("audit", "check", "probe"),
    "Plan, upgrade and roll back": ("plan", "upgrade", "campaign", "rollback"),
    "History, reports and hosts": ("report", "hosts", "metrics"),
    "Set-up": ("config", "completion", "systemd", "lab"),
}


def shared_groups() -> dict[str, tuple[str, ...]]:
    """Options several commands declare alike (cli/options.py), by group: a group's name -> its options' first
    flags."""
    from orchestrator.cli import options
    return {"Notifications": tuple(s.short or s.flag for s in options.NOTIFICATIONS),
            "Prometheus": tuple(s.short or s.flag for s in options.PROMETHEUS_SETTINGS),
            "Hosts": ("--forks", "--no-preflight"),  # -i, -l and -b: each command words them for itself
            "Output": ("--format", "-o")}


def command_tree(group: click.Group, parent: click.Context):
    """(context, command) of every visible command under GROUP, depth first, each with its parents' contexts (a
    command's path then names its parents' arguments: `fleetctl lab inject HOST xid`)."""
    for name in group.list_commands(parent):
        command = group.get_command(parent, name)
        if command is None or command.hidden:
            continue
        ctx = click.Context(command, info_name=name, parent=parent)
        yield ctx, command
        if isinstance(command, click.Group):
            yield from command_tree(command, ctx)


def text(help_text: str) -> str:
    """A command's or option's help as Markdown: click's no-rewrap marks dropped, HTML's brackets and stars kept
    as they are."""
    lines = [line for line in inspect.cleandoc(help_text or "").splitlines() if line.strip() != "\b"]
    return "\n".join(lines).replace("<", "&lt;").replace("*", "\\*")


def cli_page() -> str:
    """The commands by task (TASKS), each with its usage, help and own options; the options of shared_groups()
    once, as most commands that take them word them, a command naming the groups it takes."""
    from markdown.extensions.toc import slugify

    from orchestrator.cli.main import cli
    root = click.Context(cli, info_name="fleetctl")
    tree: dict[str, list] = {}  # a top-level command -> (context, command) of it and its subcommands
    for ctx, command in command_tree(cli, root):
        top = ctx
        while top.parent is not root:
            top = top.parent
        tree.setdefault(top.info_name, []).append((ctx, command))
    records: dict[str, collections.Counter] = {}  # a shared option's first flag -> its help records, how often seen
    groups = shared_groups()
    first = {flag: name for name, flags in groups.items() for flag in flags}

    def options(ctx, command):
        """(first flag, help record) of COMMAND's options, --help left out."""
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record and "--help" not in param.opts:
                yield param.opts[0], record

    for entries in tree.values():
        for ctx, command in entries:
            for flag, record in options(ctx, command):
                if flag in first:
                    records.setdefault(flag, collections.Counter())[record] += 1
    # A shared option as most commands word it, where at least two do alike.
    usual = {flag: record for flag, seen in records.items() for record, n in seen.most_common(1) if n > 1}

    def option_rows(rows) -> str:
        return table(("option", "meaning"), [(f"`{opts}`", text(help_text)) for opts, help_text in rows])

    def entry(ctx, command) -> str:
        usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
        own, shared = [], {}  # shared: the groups it takes, in the order of their first option
        for flag, record in options(ctx, command):
            if usual.get(flag) == record:
                shared[first[flag]] = True
            else:
                own.append(record)
        out = f"### {ctx.command_path}\n\n```text\n{usage}\n```\n\n{text(command.help)}\n\n"
        if isinstance(command, click.Group):
            subs = [(name, click.Context(command.get_command(ctx, name), info_name=name, parent=ctx).command_path)
                    for name in command.list_commands(ctx)]
            out += "Commands: " + ", ".join(f"[`{name}`](#{slugify(path, '-')})" for name, path in subs) + ".\n\n"
        if own:
            out += option_rows(own) + "\n"
        if shared:
            out += "Shared options: " + ", ".join(f"[{g}](#{g.lower()})" for g in shared) + ".\n\n"
        return out

    out = ("# Command line\n\nEvery command with its options and defaults, made from fleetctl's click commands at "
           "each build, grouped by task; options several commands take alike are listed once, under [shared "
           "options](#shared-options). A flag's default can come from the [configuration file](../configuration.md): "
           "`fleetctl config show` says where each value comes from. Exit codes: [exit codes](exit-codes.md). "
           "`-h`, `--help` shows a command's help.\n\n"
           f"```text\nUsage: fleetctl [OPTIONS] COMMAND [ARGS]...\n```\n\n{text(cli.help)}\n\n")
    placed = [name for names in TASKS.values() for name in names]
    tasks = {**TASKS, "Plugins": tuple(name for name in tree if name not in placed)}
    for task, names in tasks.items():
        present = [name for name in names if name in tree]
        if present:
            out += f"## {task}\n\n" + "".join(entry(ctx, c) for name in present for ctx, c in tree[name])
    out += ("## Shared options\n\nEach as most commands that take it word it (a command that words it otherwise "
            "lists it among its own).\n\n")
    for name, flags in groups.items():
        rows = [usual[flag] for flag in flags if flag in usual]
        if rows:
            out += f"### {name}\n\n" + option_rows(rows) + "\n"
    return out


PAGES = {
    "cli.md": cli_page,
    "incidents.md": incidents_page,
    "canary-kinds.md": canary_kinds_page,
    "packages.md": packages_page,
    "controls.md": controls_page,
    "steps.md": steps_page,
    "exit-codes.md": exit_codes_page,
    "metrics.md": metrics_page,
    "baseline.md": lambda: schema_page("Baseline reference", "baseline.schema.json",
                                       "Every key of a baseline file (`-b`) with its default; [the baseline]"
                                       "(../baseline.md) says how a host's policy is put together. A key without a "
                                       "default is not checked where left out, unless its meaning says otherwise.",
                                       every_default=True),
    "notification.md": notifications_page,
    "config.md": lambda: schema_page("Configuration reference", "config.schema.json",
                                     "Every key of the configuration file; [configuration](../configuration.md) says "
                                     "where it is read and what wins."),
}
