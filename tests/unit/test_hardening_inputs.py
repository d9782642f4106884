"""Bounded time and memory on every input (issue 21), in process: each bound at its edge (the last size accepted,
the first refused), the files that are not regular, and what a host returns. tests/unit/test_fuzz_inputs.py runs
the same attacks through fleetctl as a user would (subprocesses under a memory limit)."""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator import audit, baseline, config, inputs, probe, schemas
from orchestrator.fleet import inventory
from orchestrator.errors import InputError
from orchestrator.fleet.runner import HostOutcome
from tests.helpers.cli import REPO, fleetctl

TESTDATA = REPO / "tests" / "testdata"
REAL_FACTS = json.loads((TESTDATA / "h100-580.159.04-audit/audit-nvml.json").read_text())["hosts"][0]["facts"]
REAL_PROBE = json.loads((TESTDATA / "probe/h200x2-580.159.04-probe-default.json").read_text())


def billion_laughs(levels: int = 9, width: int = 9, indent: str = "") -> str:
    """a: &a [x, x, ...], b: &b [*a, *a, ...], ...: WIDTH**LEVELS strings from a few hundred bytes."""
    names = [f"l{i}" for i in range(levels)]
    lines = [f"{indent}{names[0]}: &{names[0]} [" + ", ".join(["x"] * width) + "]"]
    for prev, name in zip(names, names[1:]):
        lines.append(f"{indent}{name}: &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def refused(match: str):
    return pytest.raises(InputError, match=match)


# ---- YAML: aliases, depth, self-reference --------------------------------------------------------------------------

def test_the_billion_laughs_is_refused_while_parsing_in_every_yaml_input(tmp_path):
    bomb = billion_laughs()
    start = time.monotonic()
    base = tmp_path / "baseline.yml"
    base.write_text("schema_version: 1\n" + bomb + "groups: {all: {driver: {versions: *l8}}}\n")
    with refused(rf"^{base}: line \d+ column \d+: too many YAML aliases \(they expand to more than 100000 nodes\)$"):
        baseline.load(base)
    conf = tmp_path / "config.yml"
    conf.write_text(bomb + "notify: *l8\n")
    with refused(rf"^{conf}: line \d+ column \d+: too many YAML aliases"):
        config.read(conf)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts: {n1: }\n  vars:\n" + billion_laughs(indent="    "))
    with refused(rf"^{inv}: line \d+ column \d+: too many YAML aliases"):
        inventory.load(str(inv))
    assert time.monotonic() - start < 30  # in fact milliseconds: nothing was ever expanded


def test_aliases_within_the_budget_are_fine(tmp_path):
    # 10000 aliases of a list of 9 (10 nodes): 100000 nodes, the budget exactly; one alias more is past it
    doc = "a: &a [" + ", ".join(["x"] * 9) + "]\nb: [" + ", ".join(["*a"] * 10_000) + "]\n"
    assert len(inputs.load_yaml(doc.encode(), "doc", max_items=None)["b"]) == 10_000
    with refused(r"^doc: line 3 column 4: too many YAML aliases"):
        inputs.load_yaml((doc + "c: *a\n").encode(), "doc", max_items=None)
    # a baseline sharing one group's policy with anchors and merge keys loads as before
    shared = ("schema_version: 1\ngroups:\n  all: &common {driver: {branches: ['570']}, persistence: {mode: true}}\n"
              "  h100: {<<: *common, gpus: {count: 8}}\n")
    path = tmp_path / "shared.yml"
    path.write_text(shared)
    assert baseline.load(path).groups["h100"]["driver"] == {"branches": ["570"]}


def test_merge_keys_count_as_aliases(tmp_path):
    lines = ["m0: &m0 {" + ", ".join(f"k{i}: x" for i in range(10)) + "}"]
    for level in range(1, 7):
        merged = ", ".join([f"*m{level - 1}"] * 10)
        lines.append(f"m{level}: &m{level} {{<<: [{merged}], k: x}}")
    with refused("too many YAML aliases"):
        inputs.load_yaml("\n".join(lines).encode(), "merge.yml")


@pytest.mark.parametrize("text", [
    "a: &a [*a]\n", "a: &a {b: *a}\n", "schema_version: 1\ngroups: &g {all: *g}\n"])
def test_a_document_that_contains_itself_is_refused(text):
    with refused(r"^doc: line \d+ column \d+: the YAML alias \*\w+ is inside the node it names"):
        inputs.load_yaml(text.encode(), "doc")


@pytest.mark.parametrize("opening,closing", [("[", "]"), ("{a: ", "}"), ("- ", "")])
def test_nesting_is_read_to_64_levels_and_refused_past_them(opening, closing):
    assert inputs.load_yaml((opening * 64 + "x" + closing * 64).encode(), "doc") is not None
    with refused(r"^doc: line 1 column \d+: YAML nested more than 64 levels deep$"):
        inputs.load_yaml((opening * 65 + "x" + closing * 65).encode(), "doc")


def test_block_mappings_nested_by_indentation_are_refused_too():
    text = "".join("  " * i + f"k{i}:\n" for i in range(80)) + "  " * 80 + "x\n"
    with refused(r"line 65 column \d+: YAML nested more than 64 levels deep"):
        inputs.load_yaml(text.encode(), "doc")


@pytest.mark.parametrize("depth", [65, 5_000, 400_000])
def test_deep_nesting_never_recurses(tmp_path, depth):
    """The C composer segfaulted past some ten thousand levels, the Python one raised RecursionError: the guard
    refuses the 65th level before either is reached, in every input."""
    base = tmp_path / "deep.yml"
    base.write_text("schema_version: 1\ngroups: " + nested(depth) + "\n")
    with refused(r"YAML nested more than 64 levels deep"):
        baseline.load(base)
    with refused(r"YAML nested more than 64 levels deep"):
        config.read(base)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    n1:\n      x: " + nested(depth) + "\n")
    with refused(rf"^{inv}: line 4 column \d+: YAML nested more than 64 levels deep$"):
        inventory.load(str(inv))


def test_a_list_of_more_than_1000_items_is_refused_in_a_baseline(tmp_path):
    """jsonschema's uniqueItems compares every pair when the items cannot be sorted: 100000 versions and one {}
    took minutes."""
    path = tmp_path / "many.yml"
    versions = [f"570.{i // 1000}.{i % 1000}" for i in range(999)]

    def write(items):
        path.write_text(yaml.safe_dump({"schema_version": 1, "groups": {"all": {"driver": {"versions": items}}}}))
    write(versions + [{}])
    with refused(r"versions\[999\]: expected string, found a mapping"):  # 1000 items: read, and refused by the schema
        baseline.load(path)
    write(versions + ["x", {}])
    with refused(r"a YAML list of more than 1000 items"):
        baseline.load(path)


@pytest.mark.parametrize("text, expected", [
    ("schema_version: " + "9" * 5000 + "\ngroups: {}\n", r"line 1 column 17: not valid YAML: cannot read the integer: "
                                                          r"Exceeds the limit \(4300 digits\)"),
    ("schema_version: 1\ngroups: {all: {x: 2024-13-01}}\n", r"not valid YAML: month must be in 1..12"),
])
def test_values_python_cannot_hold_are_yaml_errors_not_internal_errors(tmp_path, text, expected):
    path = tmp_path / "odd.yml"
    path.write_text(text)
    with refused(expected):
        baseline.load(path)
    with refused(expected):
        config.read(path)


# ---- files that are not regular, too large, or named past the system's limits --------------------------------------

@pytest.fixture
def specials(tmp_path):
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock.yml"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    directory = tmp_path / "dir.yml"
    directory.mkdir()
    yield {"fifo": (fifo, "a FIFO"), "socket": (sock_path, "a socket"), "directory": (directory, "a directory"),
           "zero": (Path("/dev/zero"), "a character device"), "urandom": (Path("/dev/urandom"), "a character device")}
    sock.close()


@pytest.mark.parametrize("special", ["fifo", "socket", "directory", "zero", "urandom"])
def test_a_file_that_is_not_regular_is_refused_without_blocking(specials, special):
    path, kind = specials[special]
    with refused(rf"^{path}: cannot read baseline: {kind}, not a regular file$"):
        baseline.load(path)
    with refused(rf"^{path}: cannot read the config file: {kind}, not a regular file$"):
        config.read(path)
    if special != "directory":  # a directory is an inventory (Ansible reads the files in it)
        with refused(rf"^{path}: cannot read the inventory: {kind}, not a regular file$"):
            inventory.load(str(path))


def test_an_inventory_directory_is_read_and_what_is_in_it_is_checked(tmp_path):
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.ini").write_text("[gpu]\ngpu-01 ansible_host=10.0.0.1\n")
    (inv / "group_vars" / "gpu.yml").write_text("x: 1\n")
    (inv / "README.md").write_text("not read by Ansible, nor by fleetctl\n")
    assert [h.name for h in inventory.load(str(inv)).hosts] == ["gpu-01"]
    os.mkfifo(inv / "more.yml")
    with refused(rf"^{inv / 'more.yml'}: cannot read the inventory: a FIFO, not a regular file$"):
        inventory.load(str(inv))
    (inv / "more.yml").unlink()
    (inv / "group_vars" / "all.yml").write_text(billion_laughs())  # what ansible-playbook would read
    with refused(rf"^{inv / 'group_vars' / 'all.yml'}: line \d+ column \d+: too many YAML aliases"):
        inventory.load(str(inv))
    (inv / "group_vars" / "all.yml").unlink()
    (inv / "loop").symlink_to(inv)  # a directory inside itself
    with refused("cannot read the inventory: directories nested more than 16 deep"):
        inventory.load(str(inv))


def test_host_vars_beside_an_inventory_file_are_checked(tmp_path):
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "gpu-01").write_text("[" * 100 + "]" * 100 + "\n")
    (tmp_path / "hosts.ini").write_text("[gpu]\ngpu-01\n")
    with refused(rf"^{tmp_path / 'host_vars' / 'gpu-01'}: line 1 column 65: YAML nested more than 64 levels deep$"):
        inventory.load(str(tmp_path / "hosts.ini"))


def test_dev_null_is_an_empty_config_file_and_nothing_else():
    assert config.read(Path(os.devnull)) == {}
    with refused(r"^/dev/null: cannot read baseline: a character device, not a regular file$"):
        baseline.load(os.devnull)
    with refused(r"^/dev/null: cannot read the inventory: a character device, not a regular file$"):
        inventory.load(os.devnull)


def test_files_are_read_up_to_their_limit(tmp_path):
    path = tmp_path / "big.yml"
    with open(path, "wb") as f:  # sparse: no disk used
        f.truncate(inputs.MAX_DOCUMENT_BYTES + 1)
    with refused(rf"^{path}: cannot read baseline: larger than 1 MiB$"):
        baseline.load(path)
    with refused(rf"^{path}: cannot read the config file: larger than 1 MiB$"):
        config.read(path)
    assert inputs.read_regular(path, "the inventory") == bytes(inputs.MAX_DOCUMENT_BYTES + 1)
    with open(path, "wb") as f:
        f.truncate(inputs.MAX_BYTES + 1)
    with refused(rf"^{path}: cannot read the inventory: larger than 4 MiB$"):
        inventory.load(str(path))
    path.write_text("x" * 10)
    assert inputs.read_regular(path, "baseline", limit=10) == b"x" * 10
    with refused("larger than 9 bytes"):
        inputs.read_regular(path, "baseline", limit=9)


def test_a_file_that_grows_past_its_limit_is_refused_while_read(monkeypatch, tmp_path):
    """/proc files say size 0; a file may grow between stat and read: the read itself is bounded."""
    path = tmp_path / "growing.yml"
    path.write_text("x" * 100)
    real_stat, real_fstat = os.stat, os.fstat

    def size_0(st: os.stat_result) -> os.stat_result:
        return os.stat_result((*st[:6], 0, *st[7:10]))
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: size_0(real_stat(p, *a, **k)))
    monkeypatch.setattr(os, "fstat", lambda fd: size_0(real_fstat(fd)))
    with refused("larger than 50 bytes"):
        inputs.read_regular(path, "baseline", limit=50)


@pytest.mark.parametrize("name", ["x" * 5000, "y" * 300, "d/" * 2100 + "f"])
def test_a_path_past_the_systems_limits_is_one_short_line(tmp_path, monkeypatch, name):
    """ENAMETOOLONG (a 5000-character path, a name over NAME_MAX) was an internal error."""
    path = str(tmp_path / name)
    shown = inputs.shown(path)
    assert len(shown) < 200 and shown.startswith(str(tmp_path)[:100])
    for load, label in ((baseline.load, "baseline"), (config.read, "the config file"),
                        (lambda p: inventory.load(str(p)), "the inventory")):
        with pytest.raises(InputError) as e:
            load(Path(path) if label == "the config file" else path)
        assert str(e.value) in (f"{shown}: cannot read {label}: File name too long",
                                f"{shown}: cannot read {label}: No such file or directory",  # "d/d/...": ENOENT first
                                f"{shown}: inventory not found"), str(e.value)
    monkeypatch.setenv(config.ENV, path)
    with pytest.raises(InputError, match="File name too long|config file not found"):
        config.load()


# ---- groups nested deep: Ansible's time grows with the cube of the depth -------------------------------------------

def ini_chain(n: int) -> str:
    lines = ["[g0]", "n1"]
    for i in range(1, n + 1):
        lines += [f"[g{i}:children]", f"g{i - 1}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("n", [65, 60_000])
def test_groups_nested_past_64_are_refused_before_ansible_reads_them(tmp_path, n):
    """60000 nested groups (1.4 MB of INI) kept Ansible busy for more than five minutes."""
    ini = tmp_path / "hosts"
    ini.write_text(ini_chain(n))
    start = time.monotonic()
    with refused(rf"^{ini}: cannot read the inventory: groups nested more than 64 deep"):
        inventory.load(str(ini))
    doc = {f"g{i}": {"children": {f"g{i - 1}": None}} for i in range(1, min(n, 5000) + 1)}
    doc["g0"] = {"hosts": {"n1": None}}
    yml = tmp_path / "hosts.yml"
    yml.write_text(yaml.safe_dump(doc))
    with refused(rf"^{yml}: cannot read the inventory: groups nested more than 64 deep"):
        inventory.load(str(yml))
    assert time.monotonic() - start < 60


def test_groups_nested_64_deep_or_in_wide_diamonds_are_read(tmp_path):
    ini = tmp_path / "hosts.ini"
    ini.write_text(ini_chain(64))
    assert [h.name for h in inventory.load(str(ini)).hosts] == ["n1"]
    edges = [(f"l{d}_{a}", f"l{d + 1}_{b}") for d in range(60) for a in range(3) for b in range(3)]  # 3**60 paths
    assert inputs.group_depth_problem(iter(edges)) is None
    assert inputs.group_depth_problem(iter([("a", "b"), ("b", "a")])) is None  # a loop: Ansible refuses it


def test_a_yaml_inventory_with_ansible_tags_is_still_checked(tmp_path):
    yml = tmp_path / "hosts.yml"
    yml.write_text("all:\n  hosts:\n    n1: {x: !unsafe '{{ y }}'}\n")
    assert [h.name for h in inventory.load(str(yml)).hosts] == ["n1"]


# ---- what a host returns -------------------------------------------------------------------------------------------

def deep_list(depth: int):
    node: object = "x"
    for _ in range(depth):
        node = [node]
    return node


@pytest.mark.parametrize("where, value, expected", [
    (("gpus", 0, "name"), deep_list(100_000), r"\$\.gpus\[0\]\.name[\[\]0.]*: nested more than 32 levels deep"),
    (("errors",), {"gpus": deep_list(40)}, r"\$\.errors\.gpus[\[\]0.]*: nested more than 32 levels deep"),
    (("xid", "events"), [0] * 200_001, r"\$: more than 200000 values"),
    (("host", "hostname"), "h" * (8 * 1024 * 1024 + 1), r"\$: more than 8 MiB of text"),
    (("driver",), {"k" * (9 * 1024 * 1024): 1}, r"\$: more than 8 MiB of text"),
])
def test_an_oversized_or_absurdly_nested_host_result_is_one_error_finding(where, value, expected):
    facts = copy.deepcopy(REAL_FACTS)
    node = facts
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    host = inventory.Host("gpu-01", ("all",))
    start = time.monotonic()
    entry = audit.evaluate_host(host, HostOutcome("gpu-01", results={"fleetctl.gpu.gpu_facts": {"facts": facts}}),
                                baseline.load(None))
    assert time.monotonic() - start < 30
    assert entry["error"].startswith("the host returned facts fleetctl cannot trust: ")
    assert re.search(expected, entry["error"]), entry["error"]
    assert "\n" not in entry["error"] and len(entry["error"]) < 600
    assert entry["facts"] is None and [(f["control"], f["status"]) for f in entry["findings"]] == [
        ("facts.collected", "error")]
    assert all(schemas.first_error("finding", f) is None for f in entry["findings"])


def test_schema_errors_of_a_host_result_are_looked_at_in_bounded_number():
    """200000 wrong GPUs took minutes to validate (every error was collected to find the shallowest)."""
    facts = copy.deepcopy(REAL_FACTS)
    facts["gpus"] = [{"index": i} for i in range(99_000)]
    start = time.monotonic()
    problem = schemas.host_result_problem("host-facts", facts)
    assert time.monotonic() - start < 30
    assert problem.startswith("$.gpus[0]: "), problem
    assert schemas.host_result_problem("host-facts", REAL_FACTS) is None
    assert schemas.host_result_problem("probe-result", REAL_PROBE) is None


def test_a_probe_result_too_large_is_that_hosts_error_and_the_others_are_kept(monkeypatch):
    fleet = inventory.Fleet("hosts.ini", tuple(inventory.Host(n, ("all",)) for n in ("good", "deep", "huge")),
                            frozenset({"all"}), "hosts.ini")
    results = {"good": REAL_PROBE, "deep": dict(REAL_PROBE, errors={"x": deep_list(50_000)}),
               "huge": dict(REAL_PROBE, throughput={"samples": [{}] * 300_000})}
    outcomes = {n: HostOutcome(n, results={"fleetctl.gpu.gpu_probe": {"probe": r}}) for n, r in results.items()}
    fleet = inventory.Fleet(fleet.source, fleet.hosts + (inventory.Host("dropped", ("all",)),), fleet.groups,
                            fleet.runner_inventory)
    outcomes["dropped"] = HostOutcome("dropped", results={"fleetctl.gpu.gpu_probe": {}})  # what ansible-runner
    #                                                     hands on of a result over MAX_EVENT_RES characters
    monkeypatch.setattr(probe.runner.Runner, "run_on_fleet", lambda *a, **k: outcomes)
    collected = probe.collect(probe.runner.Runner(), probe.ProbeOptions(), fleet, baseline.load(None))
    assert collected["good"] == {"reachable": True, "error": None, "probe": REAL_PROBE}
    for name, why in (("deep", r"\$\.errors\.x[\[\]0.]*: nested more than 32 levels deep"),
                      ("huge", r"\$: more than 200000 values"),
                      ("dropped", r"\$: larger than ansible-runner hands on \(MAX_EVENT_RES: \d+ characters\)")):
        entry = collected[name]
        assert entry["reachable"] and entry["probe"] is None, entry
        assert entry["error"].startswith("the host returned a probe result fleetctl cannot trust: ")
        assert re.search(why, entry["error"]) and "\n" not in entry["error"], entry["error"]


def test_an_audit_goes_on_when_hosts_return_facts_too_large_or_too_deep(tmp_path):
    """End to end (ansible-runner on this machine): hosts whose module prints absurd JSON are each one error
    finding; the audit finishes, and the good host's facts are there."""
    deep = "{\"changed\": false, \"facts\": {\"schema_version\": 1, \"x\": " + "[" * 100 + "]" * 100 + "}}"
    wide = "{\"changed\": false, \"facts\": {\"schema_version\": 1, \"gpus\": [" + ",".join(["0"] * 200_001) + "]}}"
    huge = "{\"changed\": false, \"facts\": {\"schema_version\": 1, \"gpus\": [" + ",".join(["0"] * 300_000) + "]}}"
    hosts = []
    for name, output in (("deep", deep), ("wide", wide), ("huge", huge)):
        (tmp_path / f"{name}.json").write_text(output)
        fake = tmp_path / f"{name}-python"
        fake.write_text(f"#!/bin/sh\ncat >/dev/null\ncat {tmp_path / f'{name}.json'}\n")
        fake.chmod(0o755)
        hosts.append(f"{name} ansible_connection=local ansible_python_interpreter={fake}")
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"good ansible_connection=local ansible_python_interpreter={sys.executable}\n" + "\n".join(hosts)
                   + "\n")
    out = tmp_path / "r.json"
    proc = fleetctl("audit", "-i", str(inv), "--format", "json", "-o", str(out), home=tmp_path / "home")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(out.read_text())
    assert schemas.first_error("audit-report", report) is None
    by_name = {h["name"]: h for h in report["hosts"]}
    assert by_name["good"]["facts"]["driver"]["state"] == "not_installed"
    for name, why in (("deep", r"\$\.x[\[\]0]*: nested more than 32 levels deep"),
                      ("wide", r"\$: more than 200000 values"),  # ansible-runner drops more than 700000 characters:
                      ("huge", r"\$: larger than ansible-runner hands on \(MAX_EVENT_RES: 700000 characters\)")):
        entry = by_name[name]
        assert entry["reachable"] and entry["facts"] is None
        assert re.fullmatch(rf"the host returned facts fleetctl cannot trust: {why}", entry["error"]), entry["error"]
        assert [(f["control"], f["status"]) for f in entry["findings"]] == [("facts.collected", "error")]


TEN_KB = "x" * 10_240


@pytest.mark.parametrize("argv, what, why", [
    (["audit", "--forks", TEN_KB], "Invalid value for '--forks': 'xxx", "' is not a valid integer range."),
    (["audit", "--format", TEN_KB], "Invalid value for '--format': 'xxx",
     "' is not one of 'table', 'json', 'prometheus'."),
    (["report", "--since", TEN_KB], "--since 'xxx", "': not a date (YYYY-MM-DD) or ISO timestamp"),
    (["plan", "--to", TEN_KB], "--to 'xxx", "': not a driver version (expected e.g. 570.86.15: branch.minor[.patch])"),
    (["campaign", "show", TEN_KB], "Invalid value for 'CAMPAIGN_ID': 'xxx", "' is not a valid integer range."),
    ([TEN_KB], "No such command 'xxx", "'."),
    (["report", "--until", "x " * 5_120], "--until 'x x", "': not a date (YYYY-MM-DD) or ISO timestamp"),
], ids=["option int", "option choice", "option date", "option version", "positional", "command", "with spaces"])
def test_an_error_about_a_10_kb_argument_shows_it_cut(tmp_path, argv, what, why):
    """Was: the whole argument echoed, a 10 KB line. Its start and its end are shown, and what is wrong with it."""
    proc = fleetctl(*argv, home=tmp_path / "home")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[:300]
    line = proc.stderr.rstrip("\n")
    assert line.startswith(f"fleetctl: error: {what}") and line.endswith(why) and "..." in line
    assert len(line) < (1100 if " " in argv[-1] else 300)  # a word cut to 200 characters, a line to 1000
