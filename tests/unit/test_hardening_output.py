"""Issue 21, hardening: text from hosts and files is data (never rich markup, never terminal escapes), CSV cells are
never live formulas, secrets stay out of `config show`, the history, units and error lines, the history is private,
and -o never writes through a symbolic link planted in a directory others can write.

Every check is what an operator would see: the exit code, the one error line, the output, the files left behind.
No root, no lab: audits and plans are of this machine (localhost, no NVIDIA driver), campaigns are scripted."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import stat
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from rich.console import Console

from orchestrator import cli, files, systemd
from orchestrator.notify import send as notify
from orchestrator.campaign import readmodel
from orchestrator.campaign import progress
from orchestrator.cli import campaign_view, render
from orchestrator.errors import InputError
from orchestrator.history.store import Store
from tests.helpers.campaign import Script, start
from tests.helpers.cli import REPO, fleetctl, runs

MARKUP = "[/red] [/x] [bold]"
OSC_TITLE = "\x1b]0;pwned\x07"
CSI_RED = "\x1b[31mred\x1b[0m"
HOSTILE = f"{MARKUP} {OSC_TITLE}{CSI_RED} \x1bc\x9b2J\x7f\x00end"
SECRET = "S3CRETt0ken"


def no_escapes(text: str) -> bool:
    """Nothing a terminal would act on: no ESC, BEL, C1 or other control character but newline and tab."""
    return not any((ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f for c in text)


def plain(printer, *args) -> str:
    """What PRINTER writes to a file or a pipe (no terminal: rich adds no escape of its own)."""
    buf = io.StringIO()
    printer(*args, Console(file=buf, width=200, force_terminal=False))
    return buf.getvalue()


def on_terminal(printer, *args) -> str:
    buf = io.StringIO()
    printer(*args, Console(file=buf, width=200, force_terminal=True, color_system="truecolor"))
    return buf.getvalue()


# ---- 1. text from hosts and files is data ----------------------------------------------------------------

@pytest.fixture(scope="module")
def evil_baseline(tmp_path_factory):
    """The embedded baseline, named '[/red]' with a window-title escape (YAML's \\e and \\a)."""
    path = tmp_path_factory.mktemp("baseline") / "evil.yml"
    text = (REPO / "orchestrator" / "data" / "default-baseline.yml").read_text()
    lines = [r'name: "[/red] \e]0;pwned\a"' if line.startswith("name:") else line for line in text.splitlines()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_baseline_named_like_markup_is_shown_not_a_crash_after_the_run_was_recorded(tmp_path, evil_baseline):
    """Before: `rich.errors.MarkupError`, exit 70 "internal error", with the run already recorded."""
    home = tmp_path / "home"
    audit = fleetctl("audit", "--fail-on", "never", "-b", str(evil_baseline), home=home)
    assert audit.returncode == 0 and audit.stderr == "", audit.stderr
    assert "fleetctl audit - baseline [/red]" in audit.stdout and "driver.installed" in audit.stdout
    assert no_escapes(audit.stdout)
    out = tmp_path / "audit.txt"
    to_file = fleetctl("audit", "--fail-on", "never", "-b", str(evil_baseline), "-o", str(out), home=home)
    assert to_file.returncode == 0 and "baseline [/red]" in out.read_text() and no_escapes(out.read_text())
    planned = fleetctl("plan", "--to", "570.86.15", "-b", str(evil_baseline), home=home)
    assert planned.returncode == 0 and "baseline [/red]" in planned.stdout and no_escapes(planned.stdout), \
        planned.stderr
    as_json = fleetctl("audit", "--fail-on", "never", "--format", "json", "-b", str(evil_baseline), home=home)
    assert json.loads(as_json.stdout)["run"]["baseline"]["name"] == "[/red] \x1b]0;pwned\x07"  # JSON keeps the data
    assert [r["status"] for r in runs(home)] == ["done"] * 4


def audit_report() -> dict:
    finding = {"control": "driver.installed", "severity": "critical", "status": "fail", "message": HOSTILE}
    return {"run": {"id": 7, "baseline": {"name": MARKUP}},
            "hosts": [{"name": "gpu-a[b]", "groups": ["all", f"rack{MARKUP}"], "findings": [
                finding, {**finding, "control": "nouveau.blacklisted", "status": "pass", "severity": "high"}]}],
            "summary": {"hosts": 1, "compliant": 0, "noncompliant": 1, "unreachable": 0, "exit_code": 1,
                        "findings": {"fail": 1, "error": 0, "warn": 0}, "fail_on": "high", "duration_s": 1.0}}


def probe_report() -> dict:
    health = {"gpu_count": 2, "gpus": [{}, {}], "xid": {"events": [{"code": 79}]}}
    return {"run": {"id": 8}, "hosts": [{"name": "gpu-a", "reachable": True, "probe": {"health": health},
                                         "health": {"status": "fail", "reasons": [HOSTILE]}}],
            "summary": {"hosts": 1, "healthy": 0, "unhealthy": 1, "unreachable": 0, "exit_code": 1, "duration_s": 1}}


def plan_report() -> dict:
    return {"target": "570.86.15", "ramp": ["1", "100%"], "run": {"id": 9, "baseline": {"name": MARKUP}},
            "waves": [{"index": 1, "size": 1, "cumulative": 1, "budget": {"canary": True, "fail_at": 1},
                       "hosts": [{"name": "gpu-a", "from_version": f"550{MARKUP}{OSC_TITLE}"}]}],
            "skipped": [], "excluded": [{"name": "gpu-b", "code": "unhealthy", "reason": HOSTILE}],
            "target_groups": [{"group": f"g{MARKUP}\n{CSI_RED}", "takes_target": False}],
            "summary": {"hosts": 2, "eligible": 1, "waves": 1, "skipped": 0, "excluded": 1, "unreachable": 0,
                        "exit_code": 0, "duration_s": 1.0}}


@pytest.mark.parametrize("printer, report", [
    (lambda r, c: render.print_audit(r, c, True), audit_report()),
    (render.print_probe, probe_report()),
    (render.print_plan, plan_report()),
], ids=["audit", "probe", "plan"])
def test_host_text_in_tables_is_shown_as_it_is_without_its_escapes(printer, report):
    text = plain(printer, report)
    assert "[/x]" in text and "[/red]" in text and "end" in text
    assert no_escapes(text)
    coloured = on_terminal(printer, report)  # rich's own colours, but not the host's title, colour or reset
    assert "\x1b]" not in coloured and "\x07" not in coloured and "\x1bc" not in coloured and "\x9b" not in coloured
    assert "\x1b[31mred" not in coloured


class Hostile(Script):
    """Scripted steps whose failure reasons carry markup and escapes, as a hook's or a host's output may."""

    def __getitem__(self, step):
        run = super().__getitem__(step)

        def hostile(ctx, hosts):
            out = run(ctx, hosts)
            for outcome in out.values():
                if outcome.reason:
                    outcome.reason = f"{outcome.reason}: {HOSTILE}"
            return out
        return hostile


def test_campaign_list_show_and_progress_show_host_text_as_data(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FLEETCTL_HOME", str(home))
    with Store(home / "history.sqlite3") as store:
        journal, cid, engine = start(store, Hostile({("gpu[b]", "verify"): "fail"}), ["gpu[b]"])
        assert engine.run() == "rolled_back"
        doc = readmodel.document(store, cid)
        listed = plain(campaign_view.list_table, store)
        events = journal.events(cid)
    shown = plain(campaign_view.show_table, doc)
    for text in (listed, shown):
        assert no_escapes(text)
    assert "gpu[b]" in shown and "[/x]" in shown and "[/red]" in listed
    for proc in (fleetctl("campaign", "list", home=home), fleetctl("campaign", "show", str(cid), home=home)):
        assert proc.returncode == 0 and proc.stderr == "" and no_escapes(proc.stdout), proc.stderr
        assert "[/red]" in proc.stdout
    lines = io.StringIO()
    sink = progress.PlainLines(lines)
    for record in events:
        sink({**record, "reason": record.get("reason") or HOSTILE + "\nforged line"})
    assert no_escapes(lines.getvalue()) and "[/red]" in lines.getvalue()
    assert len(lines.getvalue().splitlines()) == len(events)  # a newline in a reason forges no line
    view = campaign_view.LiveView(Console(file=io.StringIO(), force_terminal=False), [
        {"host": "gpu[b]", "wave": 1, "position": 0, "state": "failed", "reason": HOSTILE}], f"campaign {MARKUP}")
    view.soak_until = datetime.now(timezone.utc)
    view.last_check = HOSTILE
    view.recent.append(HOSTILE)
    table = plain(lambda c: c.print(view.render()))
    assert no_escapes(table) and "[/red]" in table


# ---- 2. CSV cells are never formulas ---------------------------------------------------------------------

FORMULAS = ['=HYPERLINK("http://x","y")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)", "\t=1+1", "\r=1+1"]


def test_csv_export_neutralises_formulas_from_hosts_inventories_and_baselines(tmp_path):
    home = tmp_path / "home"
    base = SimpleNamespace(name="=1+1", path="/x.yml", digest="sha256:" + "0" * 64)
    controls = ["driver.installed", "driver.loaded", "nouveau.blacklisted", "persistence.mode", "gpus.ecc",
                "container_runtime.toolkit"]
    with Store(home / "history.sqlite3") as store:
        run_id, _ = store.begin_run("audit", ["audit"], "hosts.yml", None, base)
        store.finish_run(run_id, 1, {}, [{
            "name": "gpu-a", "reachable": True, "groups": [FORMULAS[0], "all"], "facts": None,
            "findings": [{"control": c, "severity": "high", "status": "fail", "message": m, "evidence": {"seen": m},
                          "remediation": None} for c, m in zip(controls, FORMULAS)]}])
    env = dict(os.environ, FLEETCTL_HOME=str(home), FLEETCTL_CONFIG=os.devnull)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", "--format", "csv"], cwd=REPO,
                          capture_output=True, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()  # as bytes: a text pipe would read a lone CR as a line end
    rows = list(csv.DictReader(io.StringIO(out[:out.rindex("# chain head")], newline="")))
    assert len(rows) == len(FORMULAS)
    for row in rows:
        for value in row.values():
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), (value, row)
    assert rows[0]["groups"] == "'" + FORMULAS[0] + " all"  # a single quote first, the value otherwise kept
    assert sorted(r["message"] for r in rows) == sorted(["'" + f for f in FORMULAS[:4]] + ["\\t=1+1", "\\r=1+1"])
    doc = json.loads(fleetctl("report", home=home).stdout)  # JSON keeps the data as it is
    assert doc["hosts"][0]["groups"][0] == FORMULAS[0]


# ---- 3. secrets ------------------------------------------------------------------------------------------

def test_config_show_names_commands_by_their_program_only(tmp_path):
    config = tmp_path / "config.yml"
    config.write_text(f'notify: ["pager --token {SECRET} {{event}}", "notify-send"]\n'
                      f'drain: "curl -H \'Authorization: Bearer {SECRET}\' https://sched/drain/{{node}}"\n'
                      f'undrain: "kubectl --token={SECRET} uncordon {{node}}"\n'
                      f'canary: "/opt/canary --key {SECRET}"\n'
                      f"webhook: https://hooks.slack.com/services/T0/B0/{SECRET}\n")
    env = dict(os.environ, FLEETCTL_HOME=str(tmp_path / "home"), FLEETCTL_CONFIG=str(config))
    table, as_json = (subprocess.run([sys.executable, "-m", "orchestrator.cli", "config", "show", *fmt],
                                     capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
                      for fmt in ([], ["--format", "json"]))
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr + as_json.stderr
    for out in (table.stdout, as_json.stdout):
        assert SECRET not in out and "Bearer" not in out
    values = {k: v["value"] for k, v in json.loads(as_json.stdout)["values"].items()}
    assert values["notify"] == ["pager [arguments not shown]", "notify-send"]
    assert values["drain"] == "curl [arguments not shown]" and values["undrain"] == "kubectl [arguments not shown]"
    assert values["canary"] == "/opt/canary [arguments not shown]"
    assert values["webhook"] == ["https://hooks.slack.com/…"]
    assert "curl [arguments not shown]" in table.stdout and "pager [arguments not shown], notify-send" in table.stdout


@pytest.mark.parametrize("template, expected", [
    (f"pager --token {SECRET} 'unclosed", "--notify: cannot split the command into words: No closing quotation"),
    (f'curl -d {{"token":"{SECRET}"}} https://x', "--notify: unknown placeholder 'token'"),  # shlex took the "
    (f"pager {{{SECRET}_and_then_some_more_of_it}}", "--notify: a '{' or '}' that is not a placeholder"),
    ("pager {nobody}", "--notify: unknown placeholder 'nobody'"),
])
def test_a_bad_notify_template_is_named_never_echoed(tmp_path, template, expected):
    home = tmp_path / "home"
    proc = fleetctl("audit", "--notify", template, home=home)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("fleetctl: error: " + expected) and SECRET not in proc.stderr, proc.stderr
    assert not (home / "history.sqlite3").exists()


def test_drain_and_undrain_arguments_stay_out_of_the_history(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fleetctl", "upgrade", "--to", "570.86.15", "--drain",
                                      f"curl -H 'Authorization: Bearer {SECRET}' https://x/{{node}}",
                                      f"--undrain=kubectl --token={SECRET} uncordon {{node}}", "--drain-preset",
                                      "slurm", "--canary", f"/opt/canary {SECRET}"])
    argv = cli.stored_argv()
    assert argv == ["upgrade", "--to", "570.86.15", "--drain", "curl [arguments not recorded]",
                    "--undrain=kubectl [arguments not recorded]", "--drain-preset", "slurm", "--canary",
                    "/opt/canary [arguments not recorded]"]


@pytest.fixture
def unit_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETCTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLEETCTL_WORKER", raising=False)
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "config.yml"
    config.write_text("")
    monkeypatch.setenv("FLEETCTL_CONFIG", str(config))
    shutil.copy(REPO / "inventory" / "hosts.example.ini", etc / "inventory.ini")
    shutil.copy(REPO / "inventory" / "baseline.example.yml", etc / "baseline.yml")
    units = tmp_path / "units"
    units.mkdir()
    return SimpleNamespace(config=config, units=units, install=[
        "systemd", "install", "--window-schedule", "Sat 02:00", "--duration", "3h", "--to", "570.86.15",
        "-i", str(etc / "inventory.ini"), "-b", str(etc / "baseline.yml"), "--unit-dir", str(units)])


def main(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", [str(Path(sys.executable).parent / "fleetctl"), *args])
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("flag, template", [
    ("--drain", f"curl -H 'Authorization: Bearer {SECRET}' https://sched/drain/{{node}}"),
    ("--undrain", f"kubectl --token={SECRET} uncordon {{node}}"),
    ("--drain", "drain-node --key=ghp_16C7e42F292c6912E7710c838347Ae178B4a {node}"),
    ("--drain", "curl https://ops:hunter2@sched.example/drain/{node}"),
])
def test_systemd_install_keeps_a_drain_template_out_of_the_units(unit_env, monkeypatch, capsys, flag, template):
    code, out, err = main(monkeypatch, capsys, *unit_env.install, flag, template)
    assert code == 0 and err == "", err
    held = unit_env.units / systemd.SETTINGS_FILE  # root's alone: the units read it
    units = [p.read_text() for p in unit_env.units.iterdir() if p != held]
    for secret in (SECRET, "ghp_", "hunter2"):
        assert secret not in out and units and not any(secret in text for text in units)
    assert stat.S_IMODE(held.stat().st_mode) == 0o600 and yaml.safe_load(held.read_text())[flag[2:]] == template


def test_systemd_units_read_a_secret_drain_template_from_the_config_file(unit_env, monkeypatch, capsys):
    unit_env.config.write_text(f'drain: "curl -H \'Authorization: Bearer {SECRET}\' https://sched/{{node}}"\n')
    code, out, err = main(monkeypatch, capsys, *unit_env.install, "--drain-preset", "slurm",
                          "--drain", "scontrol update nodename={node} state=drain")  # no secret: written
    assert code == 0, err
    texts = [p.read_text() for p in unit_env.units.iterdir()]
    assert texts and not any(SECRET in t for t in texts)
    assert any(f"FLEETCTL_CONFIG={unit_env.config}" in t for t in texts)


def test_the_history_and_its_directory_are_private(tmp_path):
    home = tmp_path / "a" / "home"
    proc = fleetctl("campaign", "list", home=home)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "history.sqlite3").stat().st_mode) == 0o600
    old = os.umask(0)  # whatever the umask
    try:
        with Store(tmp_path / "b" / "history.sqlite3") as s:
            s.db.execute("SELECT 1")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o700
    for p in (tmp_path / "b").iterdir():  # the history and SQLite's -wal and -shm files
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    (home / "history.sqlite3").chmod(0o644)  # a history written by an older fleetctl
    Store(home / "history.sqlite3").close()  # opened to be written (audit, probe, plan, upgrade...)
    assert stat.S_IMODE((home / "history.sqlite3").stat().st_mode) == 0o640  # other users lose it, the group keeps
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    shared.chmod(0o750)
    assert fleetctl("campaign", "list", home=shared).returncode == 0
    assert stat.S_IMODE(shared.stat().st_mode) == 0o750  # an existing directory is left as it is


SHADOW = [
    "root:$6$rounds=5000$saltsalt$H4shL1neSecretValueXYZabc123.:19000:0:99999:7:::",
    "daemon:*:19000:0:99999:7:::",
    "bob:$6$Zz9saltQ$AnotherSecretHashLine/abcdef0123456789:19001:0:99999:7:::",
]
SHADOW_WORDS = ["H4shL1neSecretValueXYZabc123", "AnotherSecretHashLine", "Zz9saltQ", "saltsalt"]
@pytest.mark.parametrize("lines, args", [
    pytest.param(SHADOW, ["-b", "{f}"], id="baseline"),
    pytest.param([line.rstrip(":") for line in SHADOW], ["-b", "{f}"], id="baseline-scalar"),
    pytest.param(["\t" + SHADOW[0]] + SHADOW[1:], ["-b", "{f}"], id="baseline-not-yaml"),
    pytest.param([SHADOW[0] + " [", SHADOW[1]], ["-b", "{f}"], id="baseline-bad-flow"),
    pytest.param(SHADOW, ["-i", "{f}"], id="inventory"),
    pytest.param([line.rstrip(":") for line in SHADOW], ["-i", "{f}"], id="inventory-hosts"),
    pytest.param(SHADOW, ["--config"], id="config"),
    pytest.param(["\t" + SHADOW[0]] + SHADOW[1:], ["--config"], id="config-not-yaml"),
    pytest.param(SHADOW, ["--webhook-headers"], id="webhook-headers"),  # /etc/shadow's mode: 0640
    pytest.param(["-----BEGIN OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAAB"
                  + SHADOW_WORDS[0], "-----END OPENSSH PRIVATE KEY-----"], ["--webhook-headers"], id="key-as-headers"),
])
def test_a_file_that_fails_to_parse_is_never_echoed(tmp_path, lines, args):
    f = tmp_path / "shadow"
    f.write_text("\n".join(lines) + "\n")
    f.chmod(0o640 if lines == SHADOW and args == ["--webhook-headers"] else 0o600)
    env = dict(os.environ, FLEETCTL_HOME=str(tmp_path / "home"), COLUMNS="200", FLEETCTL_CONFIG=os.devnull)
    if args == ["--config"]:
        env["FLEETCTL_CONFIG"], argv = str(f), ["plan", "--to", "570.86.15"]
    elif args == ["--webhook-headers"]:
        argv = ["audit", "--webhook", "https://example.com/x", "--webhook-headers", str(f)]
    else:
        argv = ["plan", "--to", "570.86.15", *(a.format(f=f) for a in args)]
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("fleetctl: error: ") and str(f) in proc.stderr
    assert not any(w in proc.stderr for w in SHADOW_WORDS), proc.stderr
    assert runs(tmp_path / "home") == []  # nothing recorded


def test_a_webhook_headers_file_others_can_read_is_refused(tmp_path):
    headers = tmp_path / "headers"
    headers.write_text(f"Authorization: Bearer {SECRET}\n")
    headers.chmod(0o644)
    home = tmp_path / "home"
    proc = fleetctl("audit", "--webhook", "https://example.com/x", "--webhook-headers", str(headers), home=home)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == (f"fleetctl: error: {headers}: the webhook headers file is readable by others (mode 0644): "
                           "chmod 600 it\n")
    assert not (home / "history.sqlite3").exists()
    headers.chmod(0o640)
    with pytest.raises(InputError, match="readable by others"):
        notify.load_headers(str(headers))
    headers.chmod(0o600)
    assert notify.load_headers(str(headers)) == [("Authorization", f"Bearer {SECRET}", str(headers))]


# ---- 4. -o FILE never writes through a planted symbolic link ---------------------------------------------

@pytest.fixture
def planted(tmp_path):
    """A sticky world-writable directory (/tmp's mode) holding a link to another file."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "report.csv").symlink_to(victim)
    return SimpleNamespace(victim=victim, shared=shared, link=shared / "report.csv", home=tmp_path / "home")


@pytest.mark.parametrize("command", [["report", "--format", "csv"], ["audit", "--fail-on", "never"],
                                     ["metrics"], ["plan", "--to", "570.86.15"]], ids=lambda c: c[0])
def test_o_at_a_link_planted_in_a_shared_directory_is_refused_before_anything_runs(planted, command):
    proc = fleetctl(*command, "-o", str(planted.link), home=planted.home)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == (
        f"fleetctl: error: {planted.link}: a symbolic link in a directory others can write: not written through it "
        "(remove the link or write elsewhere)\n")
    assert planted.victim.read_text() == "precious\n" and planted.link.is_symlink()
    assert runs(planted.home) == []  # nothing recorded


def test_a_signature_link_planted_in_a_shared_directory_is_refused_before_the_export_is_written(planted, tmp_path):
    """Was: the export written, then its .sig refused."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = tmp_path / "key.pem"
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    export = planted.shared / "report.json"
    (planted.shared / "report.json.sig").symlink_to(planted.victim)
    proc = fleetctl("report", "-o", str(export), "--sign", str(key), home=planted.home)
    assert proc.returncode == 2 and proc.stderr == (
        f"fleetctl: error: {export}.sig: a symbolic link in a directory others can write: not written through it "
        "(remove the link or write elsewhere)\n")
    assert not export.exists() and planted.victim.read_text() == "precious\n"


def test_a_link_planted_after_the_check_is_not_followed_either(planted):
    with pytest.raises(InputError, match="a symbolic link in a directory others can write"):
        files.write_atomically(planted.link, "mine\n")
    assert planted.victim.read_text() == "precious\n"
    files.write_atomically(planted.shared / "new.csv", "mine\n")  # a new name there is fine
    assert (planted.shared / "new.csv").read_text() == "mine\n" and not (planted.shared / "new.csv").is_symlink()


def test_a_link_in_a_private_directory_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "out.csv"
    link.symlink_to(victim)
    home = tmp_path / "home"
    proc = fleetctl("report", "--format", "csv", "-o", str(link), home=home)
    assert proc.returncode == 0, proc.stderr
    assert not link.is_symlink() and link.read_text().startswith("host,groups,")
    assert victim.read_text() == "precious\n"
