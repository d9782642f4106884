"""Bad input, fuzzed with hypothesis: baselines, inventories, command lines, and what hosts print.

The project's rule: bad input (inventory, baseline, CLI flags, a host's odd output) gets one clear line and exit 2,
and loses nothing already recorded; a host's odd output becomes an `error` finding (or a read error of one fact),
never a traceback. Every property runs the real entry points: baseline.load, inventory.load, fleetctl's main() (in
process, on top of the history of one real audit of this machine), and the on-host parsers fed mutated real captures
from tests/testdata.

The examples are the same on every run (derandomize, no example database), so CI sees what a developer sees.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import json
import math
import os
import re
import resource
import socket
import sqlite3
import string
import subprocess
import sys
import tempfile
from datetime import timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings, strategies as st
from jsonschema import Draft202012Validator

# Ansible's Display wraps sys.stderr when first imported: let that be the real one, not a test's StringIO.
import ansible.inventory.manager  # noqa: F401
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_gpus, fleetctl_kernel_log as klog, fleetctl_throughput
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_interconnect
from orchestrator import audit, baseline, cli, controls, schemas
from orchestrator.fleet import inventory
from orchestrator import inputs as input_files  # not `inputs`: the fixture of that name
from orchestrator.errors import InputError
from orchestrator.fleet.runner import HostOutcome
from orchestrator.history.store import Store

from tests.helpers.cli import REPO, fleetctl

TESTDATA = REPO / "tests" / "testdata"
H100 = TESTDATA / "h100-580.159.04"
SMI_XML = (H100 / "nvidia-smi-q-x.xml").read_text()
SMI_CSV = (H100 / "nvidia-smi-query.csv").read_text()
KERNEL_LOGS = {name: (TESTDATA / "kernel-log" / name).read_text() for name in
               ("xid-forms.kmsg", "xid-forms.dmesg", "xid-forms.journalctl")}
KERNEL_LOGS["kmsg-nvrm.txt"] = (H100 / "kmsg-nvrm.txt").read_text()
KERNEL_LOGS["dmesg-nvrm.txt"] = (H100 / "dmesg-nvrm.txt").read_text()
XID_CATALOG = yaml.safe_load((REPO / "collections/ansible_collections/fleetctl/gpu/roles/gpu_facts/defaults/main.yml").read_text())["gpu_facts_xid_catalog"]
REAL_FACTS = json.loads((TESTDATA / "h100-580.159.04-audit/audit-nvml.json").read_text())["hosts"][0]["facts"]
DEFAULT_BASELINE_BYTES = baseline.DEFAULT_PATH.read_bytes()
DEFAULT_BASELINE_DOC = yaml.safe_load(DEFAULT_BASELINE_BYTES)
FACTS_SCHEMA = json.loads((REPO / "schemas" / "host-facts.schema.json").read_text())

# What a shell or ssh would read as nothing but a name: the spec of a usable host name or address, written here on
# its own rather than taken from the code under test.
SHELL_SAFE = re.compile(r"[A-Za-z0-9_.:\[\]-]+")
DRIVER_VERSION = re.compile(r"[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?")  # --to: branch.minor[.patch], e.g. 570.86.15


def fuzz(max_examples: int, deadline: timedelta | None = None, *extra_checks: HealthCheck) -> settings:
    """The same examples every run; the machine may be busy (benchmarks share it), so no health check on speed."""
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=deadline,
                    suppress_health_check=[HealthCheck.too_slow, *extra_checks])


def text(max_size: int, alphabet=None) -> st.SearchStrategy[str]:
    """Text a file can hold (no lone surrogates)."""
    return st.text(alphabet or st.characters(blacklist_categories=("Cs",)), max_size=max_size)


def one_line_input_error(error: InputError, source: object) -> None:
    message = str(error)
    assert message.startswith(f"{source}:"), message
    assert "\n" not in message and "\r" not in message, message


def def_validator(name: str) -> Draft202012Validator:
    return Draft202012Validator({"$schema": FACTS_SCHEMA["$schema"], "$defs": FACTS_SCHEMA["$defs"],
                                 "$ref": "#/$defs/" + name})


GPU_SCHEMA, XID_EVENT_SCHEMA = def_validator("gpu_or_lost"), def_validator("xid_event")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# ---- baseline ------------------------------------------------------------------------------------------------------

BASELINE_WORDS = ["schema_version", "name", "description", "groups", "all", "h100", "driver", "branches", "versions",
                  "flavor", "held", "nouveau", "blacklisted", "persistence", "mode", "daemon", "container_runtime",
                  "toolkit_min", "gpus", "count", "ecc", "xid", "fail_on", "overrides", "94", "gate", "alpha",
                  "campaign", "budget_hosts", "severity", "gpu.pcie", "workloads", "cuda", "fabric_manager", "required"]
yaml_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(), text(12), st.dates(),
    st.sampled_from(["570.86.15", "570", "580", "critical", "high", "open", "any", "auto", "1.17.8", "12.8",
                     "1." + "9" * 5000, "570.86.15\n", "$(reboot)", ""]))
# Keys YAML reads as something else than a string too: 94:, null:, 2024-01-01:, true:
yaml_keys = st.one_of(st.sampled_from(BASELINE_WORDS), text(8), st.integers(0, 200), st.none(), st.dates(),
                      st.booleans())
yaml_values = st.recursive(
    yaml_scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(yaml_keys, kids, max_size=4), max_leaves=16)
baseline_shaped = st.fixed_dictionaries(
    {"schema_version": st.just(1) | yaml_scalars,
     "groups": st.dictionaries(st.sampled_from(["all", "h100", "gpu", "a b"]) | yaml_keys,
                               st.dictionaries(st.sampled_from(BASELINE_WORDS), yaml_values, max_size=3), max_size=3)},
    optional={"name": yaml_scalars})


@st.composite
def mutated_default_baseline(draw) -> dict:
    """The embedded baseline with a few of its values replaced, removed or added to, anywhere in it."""
    doc = copy.deepcopy(DEFAULT_BASELINE_DOC)
    for _ in range(draw(st.integers(1, 3))):
        node = doc
        while True:  # down to a random dict or list
            items = node.items() if isinstance(node, dict) else enumerate(node)
            inner = [k for k, v in items if isinstance(v, (dict, list)) and v]
            if not inner or draw(st.booleans()):
                break
            node = node[draw(st.sampled_from(inner))]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if isinstance(node, dict):
            key = draw(st.sampled_from(list(node))) if node and action != "add" else draw(yaml_keys)
            if action == "remove":
                node.pop(key, None)
            else:
                node[key] = draw(yaml_values)
        elif action == "add" or not node:
            node.append(draw(yaml_values))
        else:
            i = draw(st.integers(0, len(node) - 1))
            node[i:i + 1] = [] if action == "remove" else [draw(yaml_values)]
    return doc


@st.composite
def mangled_bytes(draw, original: bytes) -> bytes:
    """ORIGINAL truncated, with bytes (not always UTF-8) put in, or a piece cut out."""
    data = original
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["truncate", "insert", "cut"]))
        if how == "truncate":
            data = data[:at]
        elif how == "insert":
            odd = st.binary(min_size=1, max_size=8) | st.sampled_from([b"\t", b": [", b"&a", b"*a", b"\xff", b"---\n"])
            data = data[:at] + draw(odd) + data[at:]
        else:
            data = data[:at] + data[at + draw(st.integers(1, 40)):]
    return data


def a_baseline_or_one_input_error(path: Path):
    """Load PATH as a user's -b; a baseline that loads is then usable as fleetctl uses it."""
    try:
        base = baseline.load(path)
    except InputError as e:
        one_line_input_error(e, path)
        return None
    try:
        base.check_groups({"all", "ungrouped", "gpu", "h100"})
    except InputError as e:
        one_line_input_error(e, path)
    json.dumps(base.groups)  # what travels to the hosts as extravars is JSON
    klog.catalog_index(XID_CATALOG, base.xid_overrides())  # what every host's collector does with the overrides
    for groups in (["all"], ["all", *base.groups]):
        findings = controls.evaluate(copy.deepcopy(REAL_FACTS), base.policy_for(groups))
        assert all(schemas.first_error("finding", f) is None for f in findings)
    return base


@fuzz(120)
@given(doc=yaml_values | baseline_shaped | mutated_default_baseline())
@example(doc={"schema_version": 1, "groups": {"all": {"xid": {"overrides": {None: {"class": "critical"}}}}}})
@example(doc={"schema_version": 1, "groups": {"all": {"container_runtime": {"toolkit_min": "1." + "9" * 5000}}}})
def test_any_yaml_document_is_a_usable_baseline_or_one_input_error_line(workdir, doc):
    path = workdir / "fuzzed-baseline.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    a_baseline_or_one_input_error(path)


@fuzz(120)
@given(raw=st.binary(max_size=200) | mangled_bytes(DEFAULT_BASELINE_BYTES))
@example(raw=b"[" * 5000)  # deeper than the YAML parser's recursion
@example(raw=b"schema_version: 1\ngroups: &a {all: *a}\n")  # a document that contains itself
@example(raw=b"schema_version: 1\ngroups:\n  all:\n    xid:\n      overrides:\n        2024-01-01: {class: high}\n")
def test_truncated_or_corrupted_baseline_bytes_are_one_input_error_line(workdir, raw):
    path = workdir / "mangled-baseline.yml"
    path.write_bytes(raw)
    a_baseline_or_one_input_error(path)


# ---- inventory -----------------------------------------------------------------------------------------------------

NAME_CHARS = string.ascii_letters + string.digits + "._-:[]" + ";$()`'\" |&<>*?{}#=,\\!~@%^\t"
inventory_names = st.text(NAME_CHARS, min_size=1, max_size=10)
inventory_vars = st.sampled_from(["ansible_host", "ansible_port", "ansible_user", "ansible_connection",
                                  "ansible_host_key_checking", "ansible_ssh_common_args", "ansible_ssh_extra_args", "x"])
ini_values = st.one_of(inventory_names, st.integers(-5, 70000).map(str),
                       st.sampled_from(["false", "no", "'-o StrictHostKeyChecking=no'", "'{{ inventory_hostname }}'", "²",
                                        "١٢", "22", "10.0.0.1", "''", "local", "'-o ProxyJump=bastion'"]))
ini_host_lines = st.builds(lambda n, kv: " ".join([n] + [f"{k}={v}" for k, v in kv]), inventory_names,
                           st.lists(st.tuples(inventory_vars, ini_values), max_size=3))
ini_inventories = st.lists(st.one_of(ini_host_lines, st.builds("[{}{}]".format, inventory_names,
                                                               st.sampled_from(["", ":vars", ":children"])),
                                     text(20)), min_size=1, max_size=6).map("\n".join)
yaml_var_values = st.one_of(ini_values, st.integers(), st.none(), st.booleans(), st.lists(st.integers(), max_size=2),
                            st.just("10.0.0.1\n"), st.just("22\n"))
yaml_hostvars = st.none() | st.dictionaries(inventory_vars, yaml_var_values, max_size=3)
yaml_inventories = st.fixed_dictionaries(
    {"all": st.fixed_dictionaries(
        {"hosts": st.dictionaries(inventory_names | st.just("n1\n"), yaml_hostvars, max_size=3)},
        optional={"children": st.dictionaries(inventory_names, st.fixed_dictionaries(
                      {"hosts": st.dictionaries(inventory_names, yaml_hostvars, max_size=2)}), max_size=2),
                  "vars": st.dictionaries(inventory_vars, yaml_var_values, max_size=2)})}) | yaml_values


def a_safe_fleet_or_one_input_error(path: Path, limit: str | None):
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        try:
            fleet = inventory.load(str(path), limit)
        except InputError as e:
            one_line_input_error(e, path)
            assert said.getvalue() == "", "Ansible's many-line warnings were printed around the one error line"
            return None
    for host in fleet.hosts:  # every name and address fleetctl will hand to ssh: nothing a shell would read
        assert SHELL_SAFE.fullmatch(host.name), host.name
        assert SHELL_SAFE.fullmatch(host.address) or "{{" in host.address, host.address
        port = host.vars.get("ansible_port", 22)
        assert "{{" in str(port) or (re.fullmatch(r"[0-9]+", str(port)) and 0 < host.port < 65536), port
    return fleet


@fuzz(50)
@given(text_=ini_inventories, limit=st.none() | inventory_names)
@example(text_="[gpu]\nn1 ansible_port=²\n", limit=None)  # a digit to str.isdigit(), not to int()
@example(text_="[h100\nn1\n", limit=None)  # Ansible warns over ten lines before it fails
def test_any_ini_inventory_is_a_shell_safe_fleet_or_one_input_error_line(workdir, text_, limit):
    path = workdir / "fuzzed-hosts.ini"
    path.write_text(text_)
    a_safe_fleet_or_one_input_error(path, limit)


@fuzz(50)
@given(doc=yaml_inventories)
@example(doc={"all": {"hosts": {"n1\n": None}}})  # "$" matches before a trailing newline
@example(doc={"all": {"hosts": {"n1": {"ansible_host": "10.0.0.1\n"}}}})
@example(doc={"all": {"hosts": ["a", "b"]}})
def test_any_yaml_inventory_is_a_shell_safe_fleet_or_one_input_error_line(workdir, doc):
    path = workdir / "fuzzed-hosts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    a_safe_fleet_or_one_input_error(path, None)


INJECTIONS = [";", "$(", "`", " ", "'", '"', "\n", "\r", "|", "&", ">", "<", "\\", "\t", "$"]


@fuzz(40)
@given(prefix=st.from_regex(r"[a-z][a-z0-9.-]{0,6}", fullmatch=True), bad=st.sampled_from(INJECTIONS),
       suffix=st.from_regex(r"[a-z0-9;)`]{1,6}", fullmatch=True),
       where=st.sampled_from(["name", "ansible_host", "ansible_port"]))
@example(prefix="n1", bad="\n", suffix="", where="name")
@example(prefix="10.0.0.1", bad="\n", suffix="", where="ansible_host")
@example(prefix="gpu-01", bad=";", suffix="reboot", where="name")
@example(prefix="22", bad="$(", suffix="reboot)", where="ansible_port")
def test_host_names_and_addresses_a_shell_would_read_are_refused(workdir, prefix, bad, suffix, where):
    evil = prefix + bad + suffix
    hosts = {evil: None} if where == "name" else {"n1": {where: evil}}
    path = workdir / "evil-hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(InputError) as e:
        inventory.load(str(path))
    one_line_input_error(e.value, path)


# ---- command line --------------------------------------------------------------------------------------------------

class WouldRecordARun(BaseException):
    """Raised where a command would start recording a run: its input passed every check (nothing runs here)."""


@contextlib.contextmanager
def working_directory(path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def fleetctl_in_process(home: Path, argv: list[str]) -> tuple[object, str, str]:
    """(exit code, stdout, stderr) of fleetctl's real main() with ARGV, in a fresh empty working directory (an -o or
    -i of a random word lands there); 'would run' when every input passed its checks."""
    out, err = io.StringIO(), io.StringIO()
    env = {k: v for k, v in os.environ.items() if k != "FLEETCTL_DEBUG"}
    env.update(FLEETCTL_HOME=str(home), COLUMNS="200")

    def would_run(*_args, **_kwargs):
        raise WouldRecordARun()

    with tempfile.TemporaryDirectory(dir=home.parent) as scratch, working_directory(scratch), \
            mock.patch.dict(os.environ, env, clear=True), mock.patch.object(sys, "argv", ["fleetctl", *argv]), \
            mock.patch.object(sys, "stdin", io.StringIO()), mock.patch.object(Store, "begin_run", would_run), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
            code: object = 0
        except SystemExit as e:
            code = 0 if e.code is None else e.code
        except WouldRecordARun:
            code = "would run"
    return code, out.getvalue(), err.getvalue()


def snapshot(home: Path) -> dict[str, list[tuple]]:
    """Every row of every table of the history (tables created empty by a command are no change)."""
    with contextlib.closing(sqlite3.connect(home / "history.sqlite3")) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        rows = {t: sorted(db.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
    return {t: r for t, r in rows.items() if r}


class History(SimpleNamespace):
    def __repr__(self):  # not every row of it in a failure report
        return f"History({self.home})"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A history holding one real `fleetctl audit` of this machine (no GPU: exit 1 and a critical finding)."""
    home = tmp_path_factory.mktemp("cli") / "fleetctl-home"
    home.mkdir()
    proc = fleetctl("audit", "--format", "json", "-o", str(home / "audit.json"), home=home)
    assert proc.returncode == 1, proc.stderr
    before = snapshot(home)
    assert len(before["runs"]) == 1 and before["findings"] and before["chain"]
    return History(home=home, before=before)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Files a user might pass: good ones (that get as far as recording a run) and bad ones."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "hosts.ini").write_text("[gpu]\ngpu-01 ansible_host=10.0.0.1\ngpu-02 ansible_host=10.0.0.2\n")
    (d / "broken.ini").write_text("[h100\nn1\n")
    (d / "evil.ini").write_text("[gpu]\ngpu-01 ansible_host='10.0.0.1;reboot'\n")
    (d / "bad-baseline.yml").write_text("schema_version: 1\ngroups:\n  all:\n    driver: {versions: ['570.x']}\n")
    (d / "not-a-key.pem").write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    (d / "out").mkdir()
    return d


def check_contract(history, code, out, err, argv) -> None:
    """What a script or cron job relies on, whatever the arguments."""
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    assert code in (0, 2, "would run") or (code == 1 and argv[0] == "report" and "verify" in argv), (argv, code, err)
    if code == 2:
        assert err.startswith("fleetctl: error: ") and err.endswith("\n") and err.count("\n") == 1, (argv, err)
    else:
        assert err.count("\n") <= 1, (argv, err)
    assert snapshot(history.home) == history.before, f"{argv} changed the history"


def path_args(inputs):
    return st.sampled_from([str(inputs / name) for name in ("hosts.ini", "broken.ini", "evil.ini", "bad-baseline.yml")]
                           + [str(inputs), "/nonexistent/hosts.ini", "", " ", "hosts\nini"])


bad_versions = st.one_of(
    st.sampled_from(["570.86.15; rm -rf /", "570.86.15\n", "$(reboot)", "`reboot`", "５７０.８６.１５", "570", "latest",
                     "", " 570.86.15", "570.86.15 ", "570.86.15.1", "5700.1", "570.86.15' --force", "١٢٣.1"]),
    text(20), st.from_regex(r"[0-9]{1,4}(\.[0-9]{1,4}){0,3}[;\n $`'|]?.{0,4}", fullmatch=True),
).filter(lambda v: not DRIVER_VERSION.fullmatch(v))
durations = st.one_of(st.sampled_from(["300", "10m", "2h", "45s", "0", "-5", "abc", "10x", "nan", "inf", "1e999", "5mm",
                                       "m", "999999999", "1.5.2h", " ", "10 m", "\n", "9" * 5000, "-0", "1_0m"]), text(6))
ramps = st.one_of(
    st.sampled_from(["1,10%,50%,100%", "100%", "", ",", "0,100%", "1,0%,100%", "1,150%", "10%,5%,100%", "1,1,100%",
                     "1,10%", "9" * 5000 + ",100%", "1,1." + "0" * 5000 + "1%,100%", "٣,100%", "1;10%;100%", "-1,100%"]),
    st.lists(st.one_of(st.integers(-5, 200).map(str), st.integers(-5, 200).map("{}%".format),
                       st.floats(-1, 200).map("{}%".format), text(4)), min_size=0, max_size=5).map(",".join))
dates = st.one_of(
    st.sampled_from(["2026-11-21", "2026-11-21T10:00:00Z", "2026-13-01", "2026-02-30", "0001-01-01T00:00:00+01:00",
                     "9999-12-31T23:59:59-01:00", "0001-01-01", "9999-12-31", "yesterday", "", "2026-11-21T25:00",
                     "2026-11-21\n", "+002026-11-21"]),
    st.datetimes(timezones=st.sampled_from([None, timezone.utc, timezone(timedelta(hours=14)),
                                            timezone(-timedelta(hours=12))])).map(lambda d: d.isoformat()),
    text(25))
counts = st.one_of(st.integers(-10**6, 10**6).map(str), st.sampled_from(["9" * 5000, "1e3", "", "0x10", "٣"]), text(4))
campaign_ids = st.one_of(st.integers(-2**70, 2**70).map(str), st.sampled_from(["9" * 5000, "1.5", "", "0"]), text(6))
hook_templates = st.one_of(
    st.sampled_from(["echo {host.x}", "echo {host[x]}", "echo {host[0]}", "echo {nope}", "echo {}", "echo {0}",
                     "echo '{host}", "", "   ", "scontrol update nodename={node}", "echo {host!z}", "echo {host:%}",
                     "echo {host.__class__}", "kubectl drain {node"]),
    text(16, alphabet=string.ascii_letters + " {}[]!.:'\"0"))


def option(name: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    """--name=value (or nothing): the = form, so a value starting with '-' is still this option's value."""
    return st.one_of(st.just([]), values.map(lambda v: [f"{name}={v}"]))


def command_lines(inputs) -> st.SearchStrategy[list[str]]:
    paths = path_args(inputs)
    out = st.sampled_from([str(inputs / "out" / "report.txt"), "/nonexistent/dir/out.json", str(inputs), "x\ny", ""])
    formats = st.sampled_from(["table", "json", "csv", "html", "oscal", "xml", "", "JSON"]) | text(5)

    def cmd(*parts):
        return st.tuples(*[p if isinstance(p, st.SearchStrategy) else st.just(p) for p in parts]).map(
            lambda t: [w for part in t for w in (part if isinstance(part, list) else [part])])

    common = [option("--inventory", paths), option("--baseline", paths), option("--format", formats),
              option("--forks", counts)]
    return st.one_of(
        cmd("audit", *common, option("--fail-on", st.sampled_from(["high", "never", "sometimes", ""])),
            option("--output", out)),
        cmd("plan", option("--to", bad_versions | st.just("570.86.15")), option("--waves", ramps), *common),
        cmd("upgrade", option("--to", bad_versions | st.just("570.86.15")), option("--waves", ramps),
            option("--soak", durations), option("--window", durations), option("--drain", hook_templates),
            option("--undrain", hook_templates),
            option("--drain-preset", st.sampled_from(["slurm", "kubernetes", "lsf"])),
            option("--rollback-scope", st.sampled_from(["campaign", "wave", "host"])), option("--samples", counts),
            option("--warmup", counts), st.sampled_from([["--dry-run"], ["--yes"], []]), *common[:2]),
        cmd("probe", option("--engine", st.sampled_from(["builtin", "command", "gpu"])),
            option("--command", st.sampled_from(["echo {{ lookup('pipe','id') }}", "canary.sh --token x", "", "{%"])),
            option("--samples", counts), option("--trial", counts), *common),
        cmd("report", option("--format", formats), option("--since", dates), option("--until", dates),
            option("--limit", text(8)), option("--output", out),
            option("--sign", paths | st.just(str(inputs / "not-a-key.pem")))),
        cmd("report", "verify", option("--head", text(10) | st.just("sha256:" + "0" * 64)),
            option("--signature", paths), option("--key", paths)),
        cmd("campaign", st.sampled_from(["show", "abort", "resume"]), campaign_ids),
        cmd("rollback", campaign_ids),
        cmd("campaign", "list"),
    )


@st.composite
def any_command_line(draw, inputs) -> list[str]:
    """A command line as written by a hurried person or a broken script: real flags, odd words, stray values."""
    argv = draw(command_lines(inputs))
    flags = st.sampled_from(["--to", "--waves", "-i", "-b", "-o", "-l", "--format", "--soak", "--since", "--yes",
                             "--dry-run", "-h", "--", "-", "--bogus", "-x", "verify", "list"])
    words = flags | text(10, string.ascii_letters + string.digits + " -=;$'\"\n{}%²")  # no / nor .: stays in its sandbox
    for _ in range(draw(st.integers(0, 3))):
        argv.insert(draw(st.integers(1, len(argv))), draw(words))
    return argv


@fuzz(200)
@given(data=st.data())
def test_any_command_line_is_a_result_or_one_error_line_and_the_history_is_untouched(history, inputs, data):
    argv = data.draw(any_command_line(inputs), label="argv")
    code, out, err = fleetctl_in_process(history.home, argv)
    event(f"{argv[0]}: {code}")  # pytest --hypothesis-show-statistics: how far the command lines got
    check_contract(history, code, out, err, argv)


@pytest.mark.parametrize("argv,expected", [  # each one a traceback, exit 70 or many lines before its fix
    (["campaign", "show", "99999999999999999999999"], "is not in the range"),  # SQLite cannot look it up
    (["rollback", "99999999999999999999999"], "is not in the range"),
    (["report", "--since", "0001-01-01T00:00:00+01:00"], "--since '0001-01-01T00:00:00+01:00': out of the range"),
    (["upgrade", "--to", "570.86.15", "--dry-run", "--drain", "echo {host.x}"], "--drain: an unknown placeholder"),
    (["upgrade", "--to", "570.86.15", "--dry-run", "--drain", "echo {host[x]}"], "--drain: an unknown placeholder"),
    (["plan", "--to", "570.86.15\n"], r"--to '570.86.15\n': not a driver version"),
    (["plan", "--to", "570.86.15; rm -rf /"], "--to '570.86.15; rm -rf /': not a driver version"),
    (["plan", "--to", "570.86.15", "--waves", "9" * 5000 + ",100%"], "is neither a host count"),
    (["audit", "-b", "no\nsuch.yml"], r"no\nsuch.yml: cannot read baseline"),  # shown escaped, on one line
    (["audit", "-i", "broken.ini"], "not a valid Ansible inventory"),  # Ansible's warnings do not go with it
], ids=lambda v: " ".join(v)[:40].replace("\n", "\\n") if isinstance(v, list) else "")
def test_inputs_that_once_crashed_or_spilled_lines_are_one_error_line(history, inputs, argv, expected):
    argv = [str(inputs / a) if a == "broken.ini" else a for a in argv]
    code, out, err = fleetctl_in_process(history.home, argv)
    check_contract(history, code, out, err, argv)
    assert code == 2 and expected in err, err


@fuzz(60)
@given(command=st.sampled_from(["plan", "upgrade"]), version=bad_versions)
def test_a_bad_target_version_is_refused_naming_it(history, command, version):
    argv = [command, f"--to={version}"] + (["--dry-run"] if command == "upgrade" else [])
    code, out, err = fleetctl_in_process(history.home, argv)
    check_contract(history, code, out, err, argv)
    assert code == 2 and err.startswith("fleetctl: error: --to "), err


@fuzz(60)
@given(ramp=ramps, soak=durations, window=durations)
def test_bad_waves_and_durations_are_refused_before_the_inventory_is_read(history, ramp, soak, window):
    argv = ["upgrade", "--to=570.86.15", f"--waves={ramp}", f"--soak={soak}", f"--window={window}", "--dry-run",
            "-i", "/nonexistent/hosts.ini"]
    code, out, err = fleetctl_in_process(history.home, argv)
    check_contract(history, code, out, err, argv)
    refused = (r"fleetctl: error: (--waves |Invalid value for '--soak': |Invalid value for '--window': |"
               r"/nonexistent/hosts.ini: inventory not found)")
    assert code == 2 and re.match(refused, err), err


@fuzz(60)
@given(since=st.none() | dates, until=st.none() | dates, fmt=st.sampled_from(["json", "csv", "html", "oscal"]))
def test_report_dates_are_an_export_or_one_error_line(history, since, until, fmt):
    argv = ["report", f"--format={fmt}"] + ([f"--since={since}"] if since is not None else []) \
        + ([f"--until={until}"] if until is not None else [])
    code, out, err = fleetctl_in_process(history.home, argv)
    check_contract(history, code, out, err, argv)
    if code == 2:
        assert re.match(r"fleetctl: error: --(since|until) ", err), err
    else:
        assert code == 0 and out and err == ""
        if fmt == "json":
            assert json.loads(out)["chain"]["records"] == len(history.before["chain"])


@st.composite
def signature_files(draw) -> dict | list | str:
    """A .sig file as fleetctl writes it, with its fields replaced or removed."""
    sig = {"algorithm": "ed25519", "signed": "canonical-json", "file": "report.json", "chain_head": "sha256:" + "0" * 64,
           "public_key": base64.b64encode(bytes(32)).decode(), "signature": base64.b64encode(bytes(64)).decode()}
    for key in draw(st.lists(st.sampled_from(sorted(sig)), max_size=3, unique=True)):
        if draw(st.booleans()):
            del sig[key]
        else:
            sig[key] = draw(st.one_of(st.none(), st.integers(), text(12), st.lists(st.integers(), max_size=2),
                                      st.sampled_from(["a/b", "", "..", "/etc/passwd"])))
    return draw(st.just(sig) | yaml_scalars.map(str) | st.lists(st.integers(), max_size=2))


@fuzz(40)
@given(sig=signature_files())
@example(sig={"algorithm": "ed25519", "signed": "bytes", "file": 5, "chain_head": "x",
              "public_key": base64.b64encode(bytes(32)).decode(), "signature": base64.b64encode(bytes(64)).decode()})
def test_a_bad_signature_file_is_one_error_line(history, inputs, sig):
    path = inputs / "out" / "report.json.sig"
    (inputs / "out" / "report.json").write_text("{}\n")
    path.write_text(json.dumps(sig))
    argv = ["report", "verify", "--signature", str(path)]
    code, out, err = fleetctl_in_process(history.home, argv)
    check_contract(history, code, out, err, argv)
    assert code in (1, 2)  # nothing here was signed by its key


# ---- what hosts print ----------------------------------------------------------------------------------------------

def undecodable(raw: bytes) -> str:
    """Bytes as Ansible's run_command hands them to a module: invalid UTF-8 kept as surrogate escapes."""
    return raw.decode("utf-8", "surrogateescape")


element_text = re.compile(r">([^<>]*)<")
odd_values = st.one_of(text(12), st.binary(max_size=6).map(undecodable),
                       st.sampled_from(["-1", "-5 C", "9" * 5000, "N/A", "", "Enabled", "Active", "0x" + "f" * 40,
                                        "1e999 W", "NaN", "\x00"]))


@st.composite
def garbled_smi_output(draw) -> str:
    """nvidia-smi -q -x as a sick host prints it: cut short, values replaced, bytes that are not UTF-8, or CSV."""
    out = draw(st.sampled_from([SMI_XML, SMI_XML, SMI_CSV]))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["value", "value", "truncate", "insert", "cut"]))
        if how == "value":
            spans = [m.span(1) for m in element_text.finditer(out)]
            if spans:
                a, b = draw(st.sampled_from(spans))
                out = out[:a] + draw(odd_values).replace("<", "").replace("&", "") + out[b:]
        else:
            at = draw(st.integers(0, len(out)))
            if how == "truncate":
                out = out[:at]
            elif how == "insert":
                markup = st.sampled_from(["<gpu>", "</gpu>", "<!--", "&bogus;", "]]>"])
                out = out[:at] + draw(odd_values | markup) + out[at:]
            else:
                out = out[:at] + out[at + draw(st.integers(1, 200)):]
    return out


class FakeModule:
    """What the gpu_facts Collector asks of AnsibleModule: a command that prints OUT."""

    def __init__(self, out: str, rc: int = 0):
        self.out, self.rc = out, rc

    def get_bin_path(self, name, opt_dirs=None):
        return "/usr/bin/" + name

    def run_command(self, argv, environ_update=None):
        return self.rc, self.out, ""


GPU_KEYS = set(FACTS_SCHEMA["$defs"]["gpu"]["properties"])  # the required ones and those older facts lack


@fuzz(150)
@given(out=garbled_smi_output())
@example(out=SMI_XML.replace("</product_name>", "\udcff</product_name>"))  # one byte that is not UTF-8
@example(out=SMI_XML.replace("<gpu_temp>", "<gpu_temp>" + "9" * 5000))
def test_garbled_nvidia_smi_is_parsed_or_is_a_parse_error(out):
    try:
        system, gpus = fleetctl_gpus.parse_smi_xml(out)
    except fleetctl_gpus.SmiParseError as e:
        assert str(e).startswith("nvidia-smi -q -x output ")
        return
    assert set(system) == {"driver_version", "nvml_version", "cuda_driver_version"}
    assert all(v is None or isinstance(v, str) for v in system.values())
    for gpu in gpus:  # the shape NVML's reader gives; values the schema refuses make the audit's error finding
        assert set(gpu) == GPU_KEYS
        for number in (gpu["temperature_c"], *gpu["pcie"].values(), gpu["ecc"]["uncorrected_volatile"]):
            assert number is None or isinstance(number, int)
        assert gpu["power_w"] is None or isinstance(gpu["power_w"], float)


HOST = inventory.Host("gpu-01", ("all",))
DEFAULT_BASELINE = baseline.load(None)


def host_entry(facts: dict) -> dict:
    """What the audit makes of one host's facts: its findings, or an error finding when they cannot be trusted."""
    outcome = HostOutcome("gpu-01", results={"fleetctl.gpu.gpu_facts": {"facts": facts}})
    entry = audit.evaluate_host(HOST, outcome, DEFAULT_BASELINE)
    assert all(schemas.first_error("finding", f) is None for f in entry["findings"]), entry["findings"]
    if entry["error"]:
        assert entry["error"].startswith("the host returned facts fleetctl cannot trust: ")
        assert [(f["control"], f["status"]) for f in entry["findings"]] == [("facts.collected", "error")]
    return entry


@fuzz(80)
@given(out=garbled_smi_output())
def test_a_host_printing_garbled_nvidia_smi_gets_findings_or_an_error_finding(gpu_facts_module, out):
    collector = gpu_facts_module.Collector(FakeModule(out))
    system, gpus, code = collector.nvidia_smi()
    facts = copy.deepcopy(REAL_FACTS)
    facts["gpus"], facts["errors"] = gpus, dict(collector.errors)
    entry = host_entry(facts)
    if "gpus" in collector.errors:  # the parse error is the GPU controls' `error`, not a crash
        assert gpus == [] and system == {}
        (count,) = [f for f in entry["findings"] if f["control"] == "gpu.count"]
        assert count["status"] == "error" and "nvidia-smi -q -x output" in count["message"]


xid_codes = st.one_of(st.integers(0, 200).map(str), st.sampled_from(["9" * 5000, "١٣", "", "-1", "13a", "0x4f"]))
pci_ids = st.one_of(
    st.sampled_from(["0000:9b:00", "00000000:3B:00.0", "0009:01:00", "PCI:0000:01:00", "0000:01:00.9"]),
    st.from_regex(r"(PCI:)?[0-9A-Fa-f]{1,9}:[0-9A-Fa-f]{1,3}:[0-9A-Fa-f]{1,3}(\.[0-9]{1,2})?", fullmatch=True))
pids = st.one_of(st.integers(0, 10**6).map(str), text(4),
                 st.sampled_from(["²", "'1234'", "9" * 5000, "", "<unknown>", "'"]))
xid_rests = st.builds(
    lambda pid, name, msg: "".join(p for p in (pid, name, msg) if p is not None),
    st.none() | pids.map("pid={}, ".format), st.none() | text(10, "abcd-_ ,<>'").map("name={}, ".format),
    st.one_of(text(30), st.sampled_from(["Timeout after 6s", "Contained: SM (0x1)",
                                         "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
                                         "GPU recovery action changed from 0x" + "f" * 40 + " (x) to 0x1 (y)"])))
xid_messages = st.builds(
    lambda pci, gi, code, rest: f"NVRM: Xid ({pci}{gi}): {code}" + (f", {rest}" if rest is not None else ""),
    pci_ids, st.sampled_from(["", " GPU-I:05", " GPU-I:" + "f" * 30]), xid_codes, st.none() | xid_rests) \
    | pci_ids.map("NVRM: GPU {}: GPU has fallen off the bus.".format)
log_prefixes = st.one_of(
    st.builds("6,{},{},-;".format, st.integers(0, 10**25), st.integers(0, 10**25)),
    st.builds("[{:>12.6f}] ".format, st.floats(0, 10**12)),
    st.builds("[{:>12.6f}] gpu-01 kernel: ".format, st.floats(0, 10**6)),
    st.sampled_from(["6," + "9" * 5000 + ",1,-;", "[" + "9" * 5000 + ".0] ", "", "4,12,99,-,caller=T1;"]))


@st.composite
def garbled_kernel_log(draw) -> str:
    """A real capture, some lines cut at a random point or mangled, some random Xid lines, maybe bytes not UTF-8."""
    lines = draw(st.sampled_from(sorted(KERNEL_LOGS))).splitlines()
    lines = [draw(st.sampled_from([line, line[:draw(st.integers(0, len(line)))], line + draw(text(8))]))
             for line in lines]
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, draw(log_prefixes) + draw(xid_messages))
    log = "\n".join(lines)
    if draw(st.booleans()):  # read from /dev/kmsg and decoded as the module does
        raw, at = log.encode(), draw(st.integers(0, len(log)))
        log = (raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:]).decode("utf-8", "replace")
    return log


def check_xid_events(events: list[dict]) -> None:
    for event in events:
        problem = next(XID_EVENT_SCHEMA.iter_errors(event), None)
        assert problem is None, (event, problem.message)


@fuzz(150)
@given(log=garbled_kernel_log(), since=st.none() | st.integers(-1, 10**6))
@example(log="6," + "9" * 5000 + ",1,-;NVRM: Xid (PCI:0000:01:00): 13, x", since=None)
@example(log="[ 1.0] NVRM: Xid (PCI:0000:01:00): " + "9" * 5000 + ", x", since=None)
@example(log="[ 1.0] NVRM: Xid (PCI:0000:01:00): 13, pid=², name=a, x", since=None)
@example(log="6,1," + "9" * 400 + ",-;NVRM: Xid (PCI:0000:01:00): 13, x", since=None)  # a float cannot hold it
def test_truncated_and_garbled_kernel_logs_give_well_formed_xid_events(log, since):
    records = klog.parse_kmsg(log) + klog.parse_bracketed(log)
    for record in records:
        assert isinstance(record["message"], str) and record["uptime_s"] >= 0 and math.isfinite(record["uptime_s"])
    index = klog.catalog_index(XID_CATALOG, {"94": {"class": "critical"}})
    check_xid_events(klog.xid_events(records, index, since))


@fuzz(60)
@given(log=garbled_kernel_log())
def test_a_host_with_a_garbled_kernel_log_reports_its_xid_facts(gpu_facts_module, log):
    collector = gpu_facts_module.Collector(FakeModule(""))
    records = klog.parse_kmsg(log) or klog.parse_bracketed(log)
    with mock.patch.object(gpu_facts_module, "read_kernel_log", lambda: (records, "/dev/kmsg")):
        xid = collector.xid(XID_CATALOG, {}, -1)
    check_xid_events(xid["events"])
    facts = copy.deepcopy(REAL_FACTS)
    facts["xid"] = xid
    host_entry(facts)


def canary_documents() -> st.SearchStrategy[str]:
    """stdout of an operator's canary workload: JSON close to the protocol's, or not."""
    numbers = st.one_of(st.floats(), st.integers(), st.just(10**400), st.booleans(), st.none(), text(4))
    metric = numbers | st.fixed_dictionaries({}, optional={"value": numbers, "unit": numbers, "higher_is_better": numbers})
    sample = st.one_of(st.dictionaries(st.sampled_from(["gpu", "metric", "value", "tflops"]), numbers | text(6)),
                       numbers, st.lists(numbers, max_size=2))
    samples = st.lists(sample, max_size=3) | numbers | st.dictionaries(text(3), numbers)
    doc = st.fixed_dictionaries({"metrics": st.dictionaries(text(8), metric, max_size=3) | numbers},
                                optional={"samples": samples})
    json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | text(6),
                               lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text(6), kids, max_size=3),
                               max_leaves=10)
    as_json = (doc | json_values).map(json.dumps)  # json.dumps writes NaN and Infinity, as a careless canary might
    after_junk = st.builds(lambda junk, js, cut: junk + "\n" + js[:cut], text(30), as_json, st.integers(0, 300))
    return st.one_of(as_json, after_junk, text(60))


class FakeSubprocess:
    PIPE = -1
    TimeoutExpired = TimeoutError

    def __init__(self, stdout: bytes):
        self.stdout = stdout

    def run(self, argv, **_kwargs):
        return SimpleNamespace(returncode=0, stdout=self.stdout, stderr=b"")


@fuzz(150)
@given(stdout=canary_documents().map(str.encode) | st.binary(max_size=60))
@example(stdout=b'{"metrics": {"gemm_tflops": {"unit": "TFLOP/s"}}, "samples": [1, 2]}')
@example(stdout=b'{"metrics": {"gemm_tflops": {"unit": "TFLOP/s"}}, "samples": {"gpu": 0}}')
@example(stdout=b'{"metrics": {"gemm_tflops": {"value": ' + b"9" * 400 + b"}}}")  # too big for a float
def test_a_canary_printing_odd_json_gives_samples_or_an_engine_error(stdout):
    with mock.patch.object(fleetctl_throughput, "subprocess", FakeSubprocess(stdout)):
        try:
            throughput, errors = fleetctl_throughput.measure("command", 3, 0.0, 0.1, [], cmd="canary --fast")
        except fleetctl_throughput.EngineError as e:
            assert str(e)  # gpu_probe reports it as the host's errors["throughput"]
            return
    assert errors == {} and isinstance(throughput["metrics"], dict)
    for spec in throughput["metrics"].values():
        assert isinstance(spec["unit"], str) and isinstance(spec["higher_is_better"], bool)
    for row in throughput["samples"]:
        assert isinstance(row["metric"], str) and (row["gpu"] is None or isinstance(row["gpu"], int))
        assert row["value"] is None or (isinstance(row["value"], float) and math.isfinite(row["value"]))


version_strings = st.one_of(text(12, "0123456789.-:~+abrc²٣ "), st.sampled_from(["1.17.8²", "1." + "9" * 5000, ""]))


@fuzz(60)
@given(toolkit=st.none() | version_strings, package_versions=st.lists(version_strings, min_size=1, max_size=3))
def test_odd_version_strings_from_a_host_give_findings(toolkit, package_versions):
    facts = copy.deepcopy(REAL_FACTS)
    facts["container_runtime"]["toolkit_version"] = toolkit
    facts["driver"]["packages"] = [{"name": "nvidia-container-toolkit", "version": v, "manager": "dpkg",
                                    "role": "container_toolkit", "held": False} for v in package_versions]
    entry = host_entry(facts)
    # every control judged (none turned into an error by the odd text), the toolkit's naming what the host printed
    assert entry["error"] is None and len(entry["findings"]) > 10, entry
    assert not [f for f in entry["findings"] if f["status"] == "error"], entry["findings"]
    (toolkit_finding,) = [f for f in entry["findings"] if f["control"] == "runtime.toolkit"]
    if toolkit is not None:
        assert toolkit_finding["status"] in ("pass", "fail") and toolkit in toolkit_finding["message"], toolkit_finding


@st.composite
def huge_outputs(draw) -> tuple[str, str]:
    """Megabytes: an nvidia-smi of many GPUs, and a kernel log of many lines plus one endless Xid line."""
    gpu = SMI_XML[SMI_XML.index("<gpu "):SMI_XML.rindex("</gpu>") + len("</gpu>")]
    copies = draw(st.integers(80, 120))
    xml = SMI_XML.replace(gpu, gpu * copies)
    xml = xml[:draw(st.integers(len(xml) - 1000, len(xml)))]  # maybe cut short too
    line = draw(log_prefixes) + draw(xid_messages)
    endless = draw(st.sampled_from(["pid=" + "'" * 2_000_000, "a, " * 700_000, "NVRM: Xid (PCI:0000:01:00): 1" * 70_000]))
    lines = [line] * 5_000 + [KERNEL_LOGS["xid-forms.dmesg"], "[ 5.0] NVRM: Xid (PCI:0000:01:00): 13, " + endless]
    return xml, "\n".join(lines)


@fuzz(4, timedelta(seconds=60), HealthCheck.data_too_large, HealthCheck.large_base_example)
@given(outputs=huge_outputs())
def test_huge_host_outputs_are_parsed_whole_or_refused(outputs):
    """Several MB: parsed like small ones (a generous deadline would catch a regex that backtracks)."""
    xml, log = outputs
    try:
        system, gpus = fleetctl_gpus.parse_smi_xml(xml)
        assert len(gpus) >= 80 and all(set(g) == GPU_KEYS for g in gpus) and GPU_SCHEMA.is_valid(gpus[-1])
    except fleetctl_gpus.SmiParseError:
        pass  # cut short: not XML
    records = klog.parse_kmsg(log) + klog.parse_bracketed(log)
    events = klog.xid_events(records, klog.catalog_index(XID_CATALOG))
    last = events[-1]  # the endless line: an event whose raw text is kept to 1024 characters
    assert last["code"] == 13 and last["raw"].startswith("NVRM: Xid (PCI:0000:01:00): 13, ") and len(last["raw"]) == 1024
    check_xid_events(events[:20] + events[-20:])


# ---- what multi-GPU hosts print: nvidia-smi nvlink -s / -e, topo -m, the <fabric> of -q -x -------------------------

H200 = TESTDATA / "h200x2-580.159.04"
H200_XML = (H200 / "nvidia-smi-q-x.xml").read_text()
H200_SMI = {head: body.rsplit("rc=", 1)[0] for head, _, body in
            (part.partition("\n") for part in re.split(r"^===== ", (H200 / "nvidia-smi-interconnect.txt").read_text(),
                                                        flags=re.M)[1:])}
INTERCONNECT_OUTPUTS = {"status": H200_SMI["nvidia-smi nvlink -s"], "counters": H200_SMI["nvidia-smi nvlink -e"],
                        "topo": H200_SMI["nvidia-smi topo -m"]}
INTERCONNECT_SCHEMA = Draft202012Validator({"$schema": FACTS_SCHEMA["$schema"], "$defs": FACTS_SCHEMA["$defs"],
                                            **FACTS_SCHEMA["properties"]["interconnect"]})
ERROR_KEY = re.compile(FACTS_SCHEMA["properties"]["errors"]["propertyNames"]["pattern"])


def assert_one_line(message: str) -> None:
    assert "\n" not in message and "\r" not in message, message


@st.composite
def garbled_interconnect_output(draw) -> str:
    """A real nvidia-smi nvlink/topo output, lines cut, doubled, dropped or with a value replaced, odd bytes."""
    lines = draw(st.sampled_from(sorted(INTERCONNECT_OUTPUTS.values()))).split("\n")
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["value", "value", "cut", "double", "drop", "insert"]))
        line = lines[at]
        if how == "value":
            tokens = re.split(r"(\s+|: )", line)
            spots = [i for i, t in enumerate(tokens) if t.strip() and t.strip() != ":"]
            if spots:
                tokens[draw(st.sampled_from(spots))] = draw(odd_values | st.sampled_from(
                    ["<inactive>", "NV0", "NV999999", "SOC", "X", "GPU0", "GPU 7: x", "Link 99: 1 GB/s", "\x1b[4m"]))
                lines[at] = "".join(tokens)
        elif how == "cut":
            lines[at] = line[:draw(st.integers(0, len(line)))]
        elif how == "double":
            lines.insert(at, line)
        elif how == "drop":
            del lines[at]
        else:
            lines.insert(at, draw(odd_values))
    return "\n".join(lines)


@fuzz(200)
@given(which=st.sampled_from(["status", "counters", "topo"]), out=garbled_interconnect_output(),
       xml=st.sampled_from([H200_XML]) | garbled_smi_output())
@example(which="counters", out=INTERCONNECT_OUTPUTS["counters"].replace(
    "Link 2: Recovery Errors: 0\n", "Link 2: Recovery Errors: 0\n\t Link 2: Recovery Errors: 9\n", 1), xml=H200_XML)
@example(which="topo", out="\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\t" + "9" * 5000 + "\t X \n", xml=H200_XML)
@example(which="status", out="GPU " + "9" * 5000 + ": x\n\t Link 0: 26.562 GB/s\n", xml=H200_XML)
def test_garbled_nvlink_and_topology_output_is_read_or_an_errors_entry(which, out, xml):
    """Each parser reads the output or refuses it (SmiOutputError); the interconnect built from it is always valid
    against the schema, and what could not be read is null with an errors entry (one line) - never a crash."""
    parser = {"status": fleetctl_interconnect.parse_nvlink_status, "counters": fleetctl_interconnect.parse_nvlink_errors,
              "topo": fleetctl_interconnect.parse_topo_matrix}[which]
    try:
        parser(out)
    except fleetctl_interconnect.SmiOutputError as e:
        assert_one_line(str(e))
    try:
        fleetctl_interconnect.parse_smi_fabric(xml)
    except fleetctl_interconnect.SmiOutputError as e:
        assert str(e).startswith("nvidia-smi -q -x output is not XML")
    _, gpus = fleetctl_gpus.parse_smi_xml(H200_XML)
    outputs = {name: (INTERCONNECT_OUTPUTS[name], None) for name in INTERCONNECT_OUTPUTS}
    outputs[which] = (out, None)
    errors = {}
    interconnect = fleetctl_interconnect.from_smi(gpus, xml, outputs["status"], outputs["counters"], outputs["topo"],
                                                  errors, sys_module="/nonexistent")
    assert INTERCONNECT_SCHEMA.is_valid(interconnect), list(INTERCONNECT_SCHEMA.iter_errors(interconnect))[:1]
    for key, message in errors.items():
        assert ERROR_KEY.match(key) and key.startswith("interconnect"), key
        assert_one_line(message)
        assert len(message) <= 600
    for gpu in interconnect["gpus"]:
        for part in ("nvlink", "fabric"):
            if gpu[part] is None:
                assert "interconnect.gpus[%d].%s" % (gpu["index"], part) in errors
    if interconnect["topology"] is None:
        assert "interconnect.topology" in errors
    facts = copy.deepcopy(REAL_FACTS)
    facts["interconnect"], facts["errors"] = interconnect, dict(errors)
    facts["sources"]["interconnect"] = "nvidia-smi"
    host_entry(facts)


# ---- hostile files: alias bombs, deep nesting, special files (issue 21) ---------------------------------------------
# Each of the four file inputs (-b, $FLEETCTL_CONFIG, a YAML -i, an INI -i) given what once ran fleetctl out of
# memory, hung it or crashed it (a segfault in libyaml's composer): run as a user would, in a subprocess limited to
# MEMORY_LIMIT of address space and a timeout, each is one line, exit 2, and no run begun in the history.

MEMORY_LIMIT = 2 * 1024 ** 3  # a regression fails (MemoryError: exit 70) instead of eating the machine
KINDS = ("baseline", "config", "yaml inventory", "ini inventory")
HOSTILE_NAMES = {"baseline": "hostile-baseline.yml", "config": "hostile-config.yml",
                 "yaml inventory": "hostile-hosts.yml", "ini inventory": "hostile-hosts"}  # no extension: Ansible
#                                                                   tries it as YAML first, then as INI


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def fleetctl_bounded(kind: str, path: Path | str, home: Path, timeout: int = 60) -> subprocess.CompletedProcess:
    """`fleetctl audit` given PATH as its KIND input, in a subprocess under MEMORY_LIMIT (TimeoutExpired: a hang)."""
    argv, config = ["audit"], os.devnull
    if kind == "baseline":
        argv += ["-b", str(path)]
    elif kind == "config":
        config = str(path)
    else:
        argv += ["-i", str(path)]
    env = {k: v for k, v in os.environ.items() if k != "FLEETCTL_DEBUG"}
    env.update(FLEETCTL_HOME=str(home), COLUMNS="200", FLEETCTL_CONFIG=config)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO, preexec_fn=limit_memory)


def check_refused(history, proc: subprocess.CompletedProcess, path: Path | str, expected: str) -> None:
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert err.startswith(f"fleetctl: error: {input_files.shown(path)}"), err[-2000:]
    assert err.endswith("\n") and err.count("\n") == 1 and re.search(expected, err), err[-2000:]
    assert snapshot(history.home) == history.before, "a run was begun"


def in_document(kind: str, defs: str, value: str) -> str:
    """A document of KIND: the YAML DEFS (top-level keys), and VALUE (flow YAML) where that input is read."""
    where = {"baseline": "schema_version: 1\ngroups:\n  all:\n    driver:\n      versions: {}\n",
             "config": "notify: {}\n", "yaml inventory": "all:\n  hosts:\n    n1:\n      x: {}\n",
             "ini inventory": "ungrouped: {}\n"}[kind]
    return defs + where.format(value)


@st.composite
def alias_bombs(draw, kind: str) -> tuple[str, str]:
    """Anchors of anchors, LEVELS deep and WIDTH wide (WIDTH**LEVELS > a million nodes): flow or block lists,
    mappings, or merge keys."""
    levels = draw(st.integers(6, 9))
    width = draw(st.integers(math.ceil(10 ** (6 / levels)), 12))
    style = draw(st.sampled_from(["flow", "block", "mapping", "merge"]))
    names = [f"l{i}" for i in range(levels)]
    lines = [f"{names[0]}: &{names[0]} {{" + ", ".join(f"k{i}: x" for i in range(width)) + "}"
             if style == "merge" else f"{names[0]}: &{names[0]} [" + ", ".join(["x"] * width) + "]"]
    for prev, name in zip(names, names[1:]):
        if style == "flow":
            lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
        elif style == "block":
            lines.append(f"{name}: &{name}\n" + "".join(f"- *{prev}\n" for _ in range(width)).rstrip("\n"))
        elif style == "mapping":
            lines.append(f"{name}: &{name} {{" + ", ".join(f"k{i}: *{prev}" for i in range(width)) + "}")
        else:
            lines.append(f"{name}: &{name} {{<<: [" + ", ".join([f"*{prev}"] * width) + f"], {name}: x}}")
    return in_document(kind, "\n".join(lines) + "\n", f"*{names[-1]}"), "too many YAML aliases"


@st.composite
def deep_nesting(draw, kind: str) -> tuple[str, str]:
    """Collections nested 65 to 100000 deep: flow lists or maps (as the value a file is read for), block lists or
    block mappings (the whole document)."""
    form = draw(st.sampled_from(["flow list", "flow map", "mixed", "block list", "block map"]))
    depth = draw(st.sampled_from([65, 100_000]) | st.integers(65, 100_000 if form != "block map" else 400))
    expected = "YAML nested more than 64 levels deep"
    if form == "flow list":
        return in_document(kind, "", "[" * depth + "]" * depth), expected
    if form == "flow map":
        return in_document(kind, "", "{a: " * depth + "}" * depth), expected
    if form == "mixed":
        return in_document(kind, "", "[{a: " * (depth // 2 + 1) + "}]" * (depth // 2 + 1)), expected
    if form == "block list":
        return "- " * depth + "x\n", expected
    return "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "x\n", expected


@st.composite
def nested_groups(draw, kind: str) -> tuple[str, str]:
    """Groups children of children, 65 to 20000 deep (Ansible's time grows with the cube of the depth)."""
    return group_chain(kind, draw(st.sampled_from([65, 20_000]) | st.integers(65, 20_000))), \
        "groups nested more than 64 deep"


def group_chain(kind: str, depth: int) -> str:
    """Group g{DEPTH} parent of g{DEPTH-1} ... parent of g0, which holds host n1: in INI, or in YAML."""
    if kind == "ini inventory":
        return "[g0]\nn1\n" + "".join(f"[g{i}:children]\ng{i - 1}\n" for i in range(1, depth + 1))
    return "g0:\n  hosts:\n    n1:\n" + "".join(f"g{i}:\n  children:\n    g{i - 1}:\n" for i in range(1, depth + 1))


def hostile_documents(kind: str) -> dict[str, st.SearchStrategy[tuple[str, str]]]:
    self_reference = st.sampled_from(["&a [*a]", "&a {b: *a}", "&a [x, [y, {z: *a}]]"]).map(
        lambda v: (in_document(kind, "", v), "is inside the node it names"))
    return {"aliases": alias_bombs(kind), "nesting": deep_nesting(kind), "self-reference": self_reference,
            **({"groups": nested_groups(kind)} if "inventory" in kind else {})}


@fuzz(16, timedelta(seconds=180))
@given(data=st.data())
def test_hostile_yaml_and_ini_files_are_one_line_in_bounded_time_and_memory(history, workdir, data):
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    attacks = hostile_documents(kind)
    attack = data.draw(st.sampled_from(sorted(attacks)), label="attack")
    text, expected = data.draw(attacks[attack], label="document")
    path = workdir / HOSTILE_NAMES[kind]
    path.write_text(text)
    event(f"{kind}: {attack}")
    check_refused(history, fleetctl_bounded(kind, path, history.home), path, expected)


def billion_laughs(kind: str) -> str:
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return in_document(kind, "\n".join(lines) + "\n", "*l8")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attack, expected", [
    ("billion laughs", "too many YAML aliases"),  # exit 70 (out of memory) or a hang before the fix
    ("100000 deep", "YAML nested more than 64 levels deep"),  # a segfault in libyaml's composer (inventories)
    ("60000 nested groups", "groups nested more than 64 deep"),  # Ansible busy for more than five minutes
])
def test_the_attacks_of_issue_21_are_one_line_in_bounded_time_and_memory(history, workdir, kind, attack, expected):
    if attack == "60000 nested groups" and "inventory" not in kind:
        pytest.skip("groups are an inventory's")
    path = workdir / ("issue21-" + HOSTILE_NAMES[kind])
    if attack == "billion laughs":
        path.write_text(billion_laughs(kind))
    elif attack == "100000 deep":
        path.write_text(in_document(kind, "", "[" * 100_000 + "]" * 100_000))
    else:
        path.write_text(group_chain(kind, 60_000))
    check_refused(history, fleetctl_bounded(kind, path, history.home), path, expected)


@pytest.fixture(scope="module")
def special_files(tmp_path_factory):
    """Files that are not regular (they blocked, never ended, or were an internal error), too large, or named past
    the system's limits."""
    d = tmp_path_factory.mktemp("special")
    os.mkfifo(d / "fifo.yml")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "socket.yml"))
    (d / "directory").mkdir()
    os.mkfifo(d / "directory" / "hosts.yml")  # an inventory directory: Ansible would read the FIFO in it
    with open(d / "large.yml", "wb") as f:  # sparse: 4 MiB + 1 byte, past every input's limit
        f.truncate(input_files.MAX_BYTES + 1)
    yield d
    sock.close()


SPECIALS = {  # name -> (path under special_files or absolute, what the line says)
    "fifo": ("fifo.yml", r"a FIFO, not a regular file"),
    "/dev/zero": ("/dev/zero", r"a character device, not a regular file"),
    "/dev/urandom": ("/dev/urandom", r"a character device, not a regular file"),
    "directory": ("directory", r"(a directory, not a regular file|a FIFO, not a regular file)"),
    "socket": ("socket.yml", r"a socket, not a regular file"),
    "too large": ("large.yml", r"larger than [14] MiB"),
    "5000-character path": ("x" * 5000, r"File name too long"),
    "name over NAME_MAX": ("n" * 300 + ".yml", r"File name too long"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("special", SPECIALS)
def test_special_files_and_impossible_paths_are_one_line(history, special_files, kind, special):
    name, expected = SPECIALS[special]
    path = name if name.startswith("/dev/") else str(special_files / name)
    label = {"baseline": "baseline", "config": "the config file"}.get(kind, "the inventory")
    check_refused(history, fleetctl_bounded(kind, path, history.home, timeout=60), path,
                  rf"cannot read {label}: {expected}")


def test_dev_null_is_still_no_config_file(history):
    """FLEETCTL_CONFIG=/dev/null (every test's, and the documented way to use none) reads as an empty file: the
    command gets past it, to its next input."""
    proc = fleetctl_bounded("baseline", "/nonexistent/b.yml", history.home)  # with FLEETCTL_CONFIG=/dev/null
    check_refused(history, proc, "/nonexistent/b.yml", "cannot read baseline: No such file or directory")


# ---- what a host returns: too large, too deep ----------------------------------------------------------------------

REAL_PROBE = json.loads((TESTDATA / "probe" / "h200x2-580.159.04-probe-default.json").read_text())


@st.composite
def oversized_values(draw) -> tuple[object, str]:
    """A value no GPU host's facts hold, and what the error finding says of it."""
    form = draw(st.sampled_from(["deep list", "deep dict", "wide list", "wide dict", "long text"]))
    if form.startswith("deep"):
        node: object = draw(st.none() | text(4) | st.integers())
        key = draw(st.sampled_from(["a", "gpus", "0"]))
        for _ in range(draw(st.sampled_from([33, 100_000]) | st.integers(33, 100_000))):
            node = [node] if form == "deep list" else {key: node}
        return node, "nested more than 32 levels deep"
    if form == "wide list":
        return [draw(st.none() | st.integers() | st.just({}))] * draw(st.integers(200_001, 400_000)), \
            r"more than 200000 values"
    if form == "wide dict":
        return {f"k{i}": 0 for i in range(draw(st.integers(200_000, 250_000)))}, r"more than 200000 values"
    return "x" * draw(st.integers(8 * 2 ** 20 + 1, 9 * 2 ** 20)), r"more than 8 MiB of text"


def put_somewhere(draw, doc: dict, value: object) -> None:
    """VALUE in place of a value of DOC (or as a new key), anywhere in it."""
    node = doc
    while True:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        inner = [k for k, v in items if isinstance(v, (dict, list)) and v]
        if not inner or draw(st.booleans()):
            break
        node = node[draw(st.sampled_from(inner))]
    if isinstance(node, dict):
        node[draw(st.sampled_from(sorted(node) + ["extra"]))] = value
    else:
        node[draw(st.integers(0, len(node) - 1))] = value


@fuzz(30, timedelta(seconds=60))
@given(data=st.data())
def test_an_oversized_or_absurdly_nested_host_result_is_one_error_finding(data):
    """Facts or a probe result that are too large or too deep: the host's `facts.collected` error (its facts
    cannot be trusted), one line, in bounded time; never a RecursionError, nor minutes in the schema's validator."""
    value, expected = data.draw(oversized_values(), label="value")
    facts = copy.deepcopy(REAL_FACTS)
    put_somewhere(data.draw, facts, value)
    entry = host_entry(facts)
    assert entry["error"] and re.search(expected, entry["error"]), entry["error"][:300]
    assert "\n" not in entry["error"] and len(entry["error"]) <= 600 and entry["facts"] is None
    result = copy.deepcopy(REAL_PROBE)
    put_somewhere(data.draw, result, value)
    problem = schemas.host_result_problem("probe-result", result)
    assert problem and re.search(expected, problem) and "\n" not in problem and len(problem) <= 600, problem[:300]


# ---- last: the history the bad input met is still whole -----------------------------------------------------------

def test_after_all_the_bad_input_the_history_is_whole_and_verifies(history, inputs):
    """Run as a user would (subprocesses): a broken inventory is one line, and `report verify` passes."""
    proc = fleetctl("plan", "--to", "570.86.15", "-i", str(inputs / "broken.ini"), home=history.home, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"fleetctl: error: {inputs / 'broken.ini'}: not a valid Ansible inventory")
    assert snapshot(history.home) == history.before
    proc = fleetctl("report", "verify", home=history.home, timeout=120)
    records = len(history.before["chain"])
    assert proc.returncode == 0 and proc.stdout.startswith(f"history chain intact: {records} records"), proc.stdout
