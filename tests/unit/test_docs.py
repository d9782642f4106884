"""The documentation: README.md (short, its command table's exit codes those of orchestrator/exitcodes.py, its links
alive) and the MkDocs site, built with `mkdocs build --strict` (offline), whose reference pages are made from the
code: every control, step, command, exit code, metric, configuration key and notification field is on its page."""

from __future__ import annotations

import html
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
from orchestrator.cli.main import cli
from orchestrator.exitcodes import BY_COMMAND, COMMON, Exit
from orchestrator.prometheus import METRICS

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built as CI builds it; a page's text by its path (`reference/controls`), without its tags and
    without white space (a code span's tags stand between words and brackets)."""
    out = tmp_path_factory.mktemp("site")
    proc = build(REPO, out)
    assert proc.returncode == 0, proc.stderr

    def page(path: str) -> str:
        text = (out / path / "index.html").read_text() if path else (out / "index.html").read_text()
        return squash(html.unescape(re.sub(r"<[^>]+>", "", text)))
    return page


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
    for name in ("orchestrator", "collections", "schemas", "README.md"):
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
    from orchestrator.notify_events import NOTES

    page = site("reference/notification")
    for note in NOTES:
        assert squash(f"{note.event}{note.when}".replace("`", "")) in page, note.event
        assert all(squash(record) in page for record in note.records), note.event
        assert all(squash(f"{level} when {when}" if when else level) in page for level, when in note.severities)


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
