"""MkDocs hook: the reference pages, made from the code at each build, never copied by hand.

reference/controls.md      the controls registry (orchestrator/controls/): id, severity, the rule (the control's
                           docstring), the remediation, and the roles plan, precheck, verify and rollback use
reference/steps.md         campaign/transitions.py: the host table, the moves between tables, the campaign table
reference/baseline.md      schemas/baseline.schema.json
reference/config.md        schemas/config.schema.json (from orchestrator/settings.py), with each key's default
reference/notification.md  orchestrator/notify_events.py's NOTES, then schemas/notification.schema.json
reference/exit-codes.md    orchestrator/exitcodes.py
reference/metrics.md       the metrics orchestrator/prometheus.py exports
reference/incidents.md     the ledger's incident classes (orchestrator/ledger.py CLASSES)
reference/cli.md is a page of its own: mkdocs-click renders the click commands there. The root group imports its
commands on first use (cli/main.py), and mkdocs-click lists a group's commands from `commands` once that holds any,
so on_config has the root load every command first.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import click
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def on_config(config):
    from orchestrator.cli.main import cli
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        cli.get_command(ctx, name)
    return config


def on_files(files, config):
    for path, make in PAGES.items():
        files.append(File.generated(config, f"reference/{path}", content=make()))
    return files


def cell(text: object) -> str:
    """TEXT on one line of a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header: tuple[str, ...], rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def name(value: object) -> str:
    """A state as the history writes it (a plain string, or an enum member's value)."""
    return "" if value is None else str(getattr(value, "value", value))


def controls_page() -> str:
    from orchestrator import controls
    rows = [(f"`{c.id}`", c.severity, inspect.getdoc(c.evaluate), c.remediation) for c in controls.CONTROLS]
    roles = [(f"`{role}`", meaning, ", ".join(f"`{i}`" for i in controls.with_role(role)))
             for role, meaning in controls.ROLES.items()]
    return (
        "# Controls\n\nEvery control the audit evaluates, in the order findings are listed (made from the registry, "
        "`orchestrator/controls/`, at each build). A fact that cannot be read makes the finding `error`, never a "
        "guess. [The audit](../audit.md) says how facts are collected.\n\n"
        + table(("control", "severity", "rule", "remediation"), rows)
        + "\n## Roles\n\nWhat else a control is used for, declared with the control: [planning and upgrades]"
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


def schema_page(title: str, file: str, intro: str) -> str:
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
        """The table of ROWS; the default column only where the schema declares defaults."""
        if any(row[2] for row in rows):
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
    from orchestrator.notify_events import NOTES

    def severities(note) -> str:
        return "; ".join(level + (f" when {when}" if when else "") for level, when in note.severities)

    rows = [(f"`{n.event}`", n.when, ", ".join(f"`{r}`" for r in n.records) or "an audit or probe run",
             severities(n)) for n in NOTES]
    events = ("## Events\n\nMade from `orchestrator/notify_events.py` (`NOTES`) at each build.\n\n"
              + table(("event", "when", "made from (journal record)", "severity"), rows) + "\n## Fields\n\n")
    page = schema_page("Notification reference", "notification.schema.json",
                       "The events and every field of a notification; [notifications](../notifications.md) says "
                       "where they are sent.")
    head, rest = page.split("\n\n", 1)
    return f"{head}\n\n{events}{rest}"


def incidents_page() -> str:
    from orchestrator.ledger import CLASSES
    from orchestrator.offenders import DEFAULT_CLASSES
    rows = [(f"`{c.name}`", c.what, c.reads, "yes" if c.name in DEFAULT_CLASSES else "")
            for c in CLASSES.values()]
    return ("# Incident classes\n\nThe classes of the ledger's incidents ([each host's record](../hosts.md)), made "
            "from `orchestrator/ledger.py` (`CLASSES`) at each build. *Repeat offender*: counted by a baseline's "
            "`incidents.repeat_offender` that names no `classes` ([repeat offenders](../hosts.md#repeat-offenders)).\n\n"
            + table(("class", "what", "derived from", "repeat offender"), rows))


PAGES = {
    "incidents.md": incidents_page,
    "controls.md": controls_page,
    "steps.md": steps_page,
    "exit-codes.md": exit_codes_page,
    "metrics.md": metrics_page,
    "baseline.md": lambda: schema_page("Baseline reference", "baseline.schema.json",
                                       "Every key of a baseline file (`-b`); [the baseline](../baseline.md) says how "
                                       "a host's policy is put together."),
    "notification.md": notifications_page,
    "config.md": lambda: schema_page("Configuration reference", "config.schema.json",
                                     "Every key of the configuration file; [configuration](../configuration.md) says "
                                     "where it is read and what wins."),
}
