"""The documentation: README.md (short, its command table's exit codes those of orchestrator/exitcodes.py, its links
alive) and the MkDocs site, built with `mkdocs build --strict` (offline), whose reference pages are made from the
code: every control, step, command, exit code, metric, configuration key and notification field is on its page."""

from __future__ import annotations

import collections
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from orchestrator import config, controls
from orchestrator.campaign import transitions
from orchestrator.cli.main import BUILTIN, cli
from orchestrator.exitcodes import BY_COMMAND, COMMON, Exit
from orchestrator.prometheus import METRICS

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built as CI builds it; a page's text by its path (`reference/controls`), without its tags and
    without white space (a code span's tags stand between words and brackets); with RAW, its HTML."""
    out = tmp_path_factory.mktemp("site")
    proc = build(REPO, out)
    assert proc.returncode == 0, proc.stderr

    def page(path: str, raw: bool = False) -> str:
        text = (out / path / "index.html").read_text() if path else (out / "index.html").read_text()
        return text if raw else squash(html.unescape(re.sub(r"<[^>]+>", "", text)))
    return page


def hook():
    """docs/hooks/generate.py, the module that makes the reference pages."""
    spec = importlib.util.spec_from_file_location("generate", REPO / "docs" / "hooks" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sections(page: str) -> list[tuple[int, str, str]]:
    """(level, heading, its HTML up to the next heading) of every h2 and h3 of PAGE (HTML)."""
    parts = re.split(r"<h([23]) id=\"[^\"]*\">(.*?)</h[23]>", page)[1:]
    return [(int(level), squash(html.unescape(re.sub(r"<[^>]+>", "", head)).replace("¶", "")), body)
            for level, head, body in zip(parts[::3], parts[1::3], parts[2::3])]


def build(root: Path, out: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` in ROOT as a user runs it: without --quiet, which raises the log level past the
    warnings strict mode aborts on (a dead link would pass). Its output is kept out of the test's log."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=root,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)})


def test_a_dead_link_fails_the_build(tmp_path):
    """What the site's build stands for: a link to an anchor that is not there aborts it, naming the link."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root)
    for name in ("orchestrator", "collections", "schemas", "inventory", "README.md"):
        (root / name).symlink_to(REPO / name)
    page = root / "docs" / "baseline.md"
    page.write_text(page.read_text() + "\nSee [nothing](reference/baseline.md#no-such-anchor).\n")
    proc = build(root, tmp_path / "site")
    assert proc.returncode == 1 and "#no-such-anchor" in proc.stderr, proc.stderr


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def readme_commands() -> dict[str, list[int]]:
    """The README's command table: command (without `fleetctl `) -> its exit codes."""
    rows = {}
    for line in README.split("[start:commands]", 1)[1].split("[end:commands]", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("command", "---"):
            rows[cells[0].strip("`").removeprefix("fleetctl ")] = [int(c) for c in cells[2].split(",") if c.strip()]
    return rows


def test_the_readme_is_short_and_its_table_holds_the_exit_codes():
    assert README.count("\n") <= 200
    rows = readme_commands()
    assert rows.pop("any command") == [int(e) for e in COMMON]
    assert rows.pop("lab") == [Exit.OK, Exit.UNAVAILABLE]  # a plugin: a LabError is an OperationError
    assert rows == {command: [int(e) for e in codes] for command, codes in BY_COMMAND.items()}


def test_the_readme_links_point_at_files_that_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links and [link for link in links if not (REPO / link).exists()] == []


def test_the_site_builds_and_includes_the_readme_tour_and_table(site):
    tour = README.split("[start:tour]", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    assert squash(tour) in site("getting-started")
    assert squash("fleetctl campaign resume") in site("")


def test_the_controls_page_lists_every_control_with_its_rule(site):
    page = site("reference/controls")
    for c in controls.CONTROLS:
        assert squash(f"{c.id}{c.severity}{c.evaluate.__doc__}".replace("`", "")) in page, c.id
    for role in controls.ROLES:
        assert role in page


def test_the_steps_page_has_every_row_of_the_host_table(site):
    page = site("reference/steps")
    for row in transitions.HOST_TABLE:
        state, ok, fail = (str(getattr(v, "value", v)) for v in (row.state, row.ok, row.fail))
        assert f"{state}{row.step}{ok}{fail}" in page, row.step


def commands(group: click.Group, prefix: str = "fleetctl"):
    """(heading, command) of every command under GROUP: its path, a group's arguments included (`lab inject HOST`)."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield f"{prefix}{name}", command
        if isinstance(command, click.Group):
            args = "".join(p.make_metavar(ctx) for p in command.params if isinstance(p, click.Argument))
            yield from commands(command, f"{prefix}{name}{args}")


def test_the_cli_page_has_every_command_and_option(site):
    page = site("reference/cli")
    for heading, command in commands(cli):
        assert heading in page
        for param in command.params:
            for opt in getattr(param, "opts", []) if isinstance(param, click.Option) else []:
                assert opt in page, (heading, opt)


def test_the_cli_page_lists_each_command_under_exactly_one_task(site):
    """A reader looking for what to run for a task finds every fleetctl command under one task heading, with its
    subcommands."""
    tasks = hook().TASKS
    assert sorted(name for names in tasks.values() for name in names if name in BUILTIN) == sorted(BUILTIN)
    task, under = None, {}
    for level, heading, _ in sections(site("reference/cli", raw=True)):
        task = heading if level == 2 else task
        if level == 3 and heading.startswith("fleetctl"):
            assert heading not in under, heading
            under[heading] = task
    tops = cli.list_commands(click.Context(cli))
    for heading, _ in commands(cli):
        top = next(name for name in tops if heading.startswith(f"fleetctl{name}"))
        assert under[heading] == next((squash(t) for t, names in tasks.items() if top in names), "Plugins"), heading


def test_the_cli_page_lists_a_shared_option_once(site):
    """The notification and Prometheus flags, which several commands take alike, are one row each under "Shared
    options"; each command that takes them so names their group instead of repeating them (one that words a flag
    otherwise lists it among its own)."""
    from orchestrator.cli import options

    parts = sections(site("reference/cli", raw=True))
    bodies = {heading: body for _, heading, body in parts}
    page = "".join(bodies.values())
    groups = {"Notifications": options.NOTIFICATIONS, "Prometheus": options.PROMETHEUS_SETTINGS}
    taken: dict[str, dict[str, str]] = {}  # a flag -> command heading -> its option as --help shows it
    for heading, command in commands(cli):
        for param in command.params:
            if isinstance(param, click.Option):
                taken.setdefault(param.opts[0], {})[heading] = param.get_help_record(click.Context(command))[0]
    for group, settings in groups.items():
        for s in settings:
            usual = collections.Counter(taken[s.flag].values()).most_common(1)[0][0]
            row = f"<td><code>{html.escape(usual, quote=False)}</code></td>"
            assert page.count(row) == 1 and row in bodies[group], (group, s.flag)
            for heading, shown in taken[s.flag].items():
                expected = f'href="#{group.lower()}"' if shown == usual else \
                    f"<td><code>{html.escape(shown, quote=False)}</code></td>"
                assert expected in bodies[heading], (heading, s.flag)
        assert sum(f'href="#{group.lower()}"' in body for body in bodies.values()) >= 3, group


def test_the_exit_code_page_has_every_code_and_command(site):
    page = site("reference/exit-codes")
    for command, codes in BY_COMMAND.items():
        assert squash(f"fleetctl {command} {', '.join(str(int(e)) for e in codes)}") in page
    for code in COMMON:
        assert squash(f"{int(code)} {code.name} {code.meaning}") in page


def test_the_metrics_page_has_every_metric(site):
    page = site("reference/metrics")
    for metric, (text, labels) in METRICS.items():
        assert squash(f"{metric}{', '.join(labels)}{text}") in page, metric


def test_the_notification_page_has_every_event_with_its_records_and_severities(site):
    from orchestrator.notify.events import NOTES

    page = site("reference/notification")
    for note in NOTES:
        assert squash(f"{note.event}{note.when}".replace("`", "")) in page, note.event
        assert all(squash(record) in page for record in note.records), note.event
        assert all(squash(f"{level} when {when}" if when else level) in page for level, when in note.severities)


def schema_node(doc: dict, path: str) -> dict:
    """The baseline schema's node at PATH ('policy.gate.alpha': $defs.policy, then properties)."""
    node = doc["$defs"][path.split(".")[0]]
    for key in path.split(".")[1:]:
        node = node["properties"][key]
    return node


def test_the_baseline_reference_shows_the_default_each_key_takes_in_the_code(site):
    """Each default the baseline page shows is what fleetctl does with the key left out."""
    from orchestrator import baseline, plan
    from orchestrator.judge import gate
    from orchestrator.history import offenders
    from orchestrator.campaign import context, steps
    from orchestrator.controls import gpu, interconnect

    doc = json.loads((REPO / "schemas" / "baseline.schema.json").read_text())
    bare = baseline.Baseline(path=REPO, name="b", digest="", groups={"all": {"canary": {"metrics": [
        {"name": "m", "query": "q", "good": "higher", "max_change": 0.05}]}}})
    canary = bare.canary_for([])
    applied = {
        "policy.xid.fail_on": gate.gate_policy({}).xid_fail_on,
        "policy.gate.alpha": gate.gate_policy({}).alpha,
        "policy.gate.min_samples": gate.gate_policy({}).min_samples,
        "policy.gate.floor": gate.gate_policy({}).floor,
        "policy.campaign.budget_hosts": plan.DEFAULT_BUDGET_HOSTS,
        "policy.campaign.budget_percent": plan.DEFAULT_BUDGET_PERCENT,
        "policy.campaign.activation": context.activation({}),
        "policy.campaign.fabric_wait_s": steps.FABRIC_WAIT_S,
        "policy.canary.on_missing": canary.on_missing,
        "canary_metric.kind": canary.metrics[0].kind,
        "canary_metric.host_label": canary.metrics[0].host_label,
        "policy.gpus.max_unowned_memory_mib": gpu.LEAK_MIB,
        "policy.interconnect.nvlink.errors_warn": interconnect.NVLINK_ERRORS_WARN,
        "policy.incidents.repeat_offender.classes": list(offenders.policy(
            {"incidents": {"repeat_offender": {"count": 1, "within": "1d"}}}).classes),
    }
    page = site("reference/baseline")
    for path, value in applied.items():
        node = schema_node(doc, path)
        assert node["default"] == value, path
        shown = node["default"] if isinstance(node["default"], str) else json.dumps(node["default"])
        row, shown = path.split(".", 1)[1], squash(shown)
        assert re.search(re.escape(row) + ".{0,300}?" + re.escape(shown + squash(node["description"])), page), path


def test_the_first_audit_of_audit_your_fleet_runs_as_written(tmp_path):
    """docs/fleet.md's first audit, pasted as it is (its example inventory and baseline valid), audits every host
    of the inventory; hosts that cannot be reached are one row each, exit 3 as its table of exit codes says."""
    command = (REPO / "docs/fleet.md").read_text().split("## The first audit", 1)[1].split("```sh\n", 1)[1]
    args = command.split("```", 1)[0].split()
    assert args[:2] == ["fleetctl", "audit"]
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args[1:], "--format", "json"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, "FLEETCTL_HOME": str(tmp_path), "PYTHONPATH": str(REPO)})
    report = json.loads(proc.stdout)
    assert proc.returncode == Exit.UNREACHABLE, proc.stderr
    assert sorted(h["name"] for h in report["hosts"]) == [f"gpu-h100-0{i}.example.internal" for i in range(1, 5)] + \
        [f"gpu-l40s-0{i}.example.internal" for i in range(1, 3)]
    assert {f["control"] for h in report["hosts"] for f in h["findings"]} == {"host.reachable"}


def test_the_example_configuration_file_is_read_as_written(tmp_path):
    """The file docs/configuration.md shows, pasted as it is, is a valid configuration: every key it sets is read."""
    example = (REPO / "docs/configuration.md").read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "config.yml").write_text(example)
    values = config.read(tmp_path / "config.yml")
    assert list(values) == [line.split(":", 1)[0] for line in example.splitlines() if line[:1].isalpha()]
    assert values["inventory"] == str(tmp_path / "inventory.ini")


@pytest.mark.parametrize("schema, page", [("config", "reference/config"), ("baseline", "reference/baseline"),
                                          ("notification", "reference/notification")])
def test_the_schema_pages_have_every_key(site, schema, page):
    text = site(page)
    doc = json.loads((REPO / "schemas" / f"{schema}.schema.json").read_text())
    nodes = [doc, *doc.get("$defs", {}).values()]
    for node in nodes:
        for key, sub in node.get("properties", {}).items():
            assert key in text
            assert squash(sub.get("description", "")) in text, key
