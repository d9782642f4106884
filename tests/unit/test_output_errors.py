"""Output that cannot be written (issue 36): a full disk or device, a closed pipe, a name the system refuses. One
line, the documented code (73 once the work is done, 2 for a path refused before it starts), and a run's record
says what fleetctl exited with while keeping its results. A report killed mid-write leaves no file behind."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator import files
from orchestrator.exitcodes import Exit
from tests.helpers.cli import REPO, fleetctl, runs

ENV = {**os.environ, "FLEETCTL_CONFIG": os.devnull, "COLUMNS": "200"}


def to_full_stdout(*args: str, home: Path) -> subprocess.CompletedProcess:
    """fleetctl ARGS with standard output on /dev/full (every write: ENOSPC)."""
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, env={**ENV, "FLEETCTL_HOME": str(home)}, cwd=REPO, timeout=120)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    home = tmp_path_factory.mktemp("out") / "home"
    assert fleetctl("audit", "-o", str(home.parent / "first.txt"), home=home).returncode == 1
    return home


@pytest.mark.parametrize("command", [["report", "--format", "json"], ["report", "--format", "html"], ["metrics"],
                                     ["report", "verify"], ["config", "show"], ["campaign", "list"]],
                         ids=" ".join)
def test_a_full_standard_output_is_one_line_and_exit_73(history, command):
    proc = to_full_stdout(*command, home=history)
    assert (proc.returncode, proc.stderr) == (
        Exit.OUTPUT, "fleetctl: error: cannot write the standard output: No space left on device\n")


def recorded(home: Path) -> sqlite3.Row:
    return runs(home)[-1]


@pytest.mark.parametrize("where", ["-o /dev/full", "stdout"])
def test_an_audit_whose_report_cannot_be_written_is_recorded_with_that_code_and_its_findings(tmp_path, where):
    """Was: exit 2 (or 70 on stdout), and the run recorded `done` with exit code 1."""
    home = tmp_path / "home"
    proc = fleetctl("audit", "-o", "/dev/full", home=home) if where != "stdout" else to_full_stdout("audit", home=home)
    assert proc.returncode == Exit.OUTPUT and proc.stderr.count("\n") == 1, proc.stderr
    assert "No space left on device" in proc.stderr
    row = recorded(home)
    assert (row["status"], row["exit_code"]) == ("failed", Exit.OUTPUT)  # was: `done` with 73
    summary = json.loads(row["summary"])
    assert summary["exit_code"] == Exit.FINDINGS and "No space left on device" in summary["delivery"]
    with sqlite3.connect(home / "history.sqlite3") as db:  # the results are kept
        assert db.execute("SELECT count(*) FROM findings WHERE run_id=?", (row["id"],)).fetchone()[0] > 0
    verify = fleetctl("report", "verify", home=home)
    assert verify.returncode == 0 and "history chain intact: 1 records" in verify.stdout


def test_the_report_states_the_finished_at_its_record_has(tmp_path):
    home = tmp_path / "home"
    assert fleetctl("audit", "--format", "json", "-o", str(tmp_path / "a.json"), home=home).returncode == 1
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["run"]["finished_at"] == recorded(home)["finished_at"]


@pytest.mark.parametrize("command", [["report"], ["metrics"], ["audit"]], ids=" ".join)
def test_o_with_a_name_over_name_max_is_one_line_and_exit_2_before_anything_runs(tmp_path, command):
    """Was: "OSError [Errno 36]", exit 70."""
    name = str(tmp_path / ("n" * 300))
    proc = fleetctl(*command, "-o", name, home=tmp_path / "home")
    assert proc.returncode == Exit.USAGE and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.endswith(": cannot write the report there: File name too long\n")
    assert len(proc.stderr) < 300 and runs(tmp_path / "home") == []


SLOW_WRITER = textwrap.dedent("""
    import os, sys, time
    real = os.fsync
    def stop(fd):  # the whole text is written, not yet synced nor named: the moment a SIGKILL once left a .tmp
        print("writing", flush=True)
        time.sleep(60)
    os.fsync = stop
    sys.argv = ["fleetctl", *sys.argv[1:]]
    from orchestrator.cli import main
    main()
""")


def test_a_report_killed_mid_write_leaves_no_file_behind(tmp_path):
    """Was: a hidden .NAME.XXXX.tmp of several MB beside the target. The writer stops (deterministically) where the
    text is in the file but the file not yet renamed into place, and is killed there."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "report.json").write_text("old\n")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, "report", "--format", "json", "-o",
                             str(out_dir / "report.json")], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**ENV, "FLEETCTL_HOME": str(tmp_path / "home")})
    try:
        assert proc.stdout.readline() == "writing\n"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert sorted(os.listdir(out_dir)) == ["report.json"] and (out_dir / "report.json").read_text() == "old\n"


def test_without_unnamed_files_a_named_temporary_is_used_and_removed(tmp_path, monkeypatch):
    real_open = os.open

    def no_tmpfile(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_tmpfile)
    files.write_atomically(tmp_path / "r.json", "new\n")
    assert os.listdir(tmp_path) == ["r.json"] and (tmp_path / "r.json").read_text() == "new\n"


def test_a_write_that_fails_leaves_the_old_file_and_no_other(tmp_path, monkeypatch):
    (tmp_path / "r.json").write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        files.write_atomically(tmp_path / "r.json", "new\n")
    assert os.listdir(tmp_path) == ["r.json"] and (tmp_path / "r.json").read_text() == "old\n"


def with_stdout(how: str, *args: str, home: Path) -> subprocess.CompletedProcess:
    """fleetctl ARGS with standard output a pipe whose reader is gone (every write: EPIPE) or closed (`>&-`)."""
    argv = [sys.executable, "-m", "orchestrator.cli", *args]
    env = {**ENV, "FLEETCTL_HOME": str(home)}
    if how == "closed":
        return subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *argv], stderr=subprocess.PIPE, text=True, env=env,
                              cwd=REPO, timeout=120)
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, timeout=120)
    finally:
        os.close(write)


UNWRITABLE = {"pipe": "fleetctl: error: cannot write the standard output: Broken pipe\n",
              "closed": "fleetctl: error: cannot write the standard output: Bad file descriptor\n"}


@pytest.mark.parametrize("how", ["pipe", "closed"])
@pytest.mark.parametrize("command", [["report", "verify"], ["check"], ["config", "show"],
                                     ["audit", "--no-preflight"], ["plan", "--to", "570.86.15", "--no-preflight"]],
                         ids=lambda c: " ".join(c[:2]) if c[0] in ("report", "config") else c[0])
def test_an_unwritable_standard_output_is_one_line_and_exit_73_never_1(history, tmp_path, command, how):
    """Was: a closed pipe exit 1, silently ("findings" to a script: Slurm drains a node whose check says 1), audit and
    plan recorded with 70; a closed standard output a traceback."""
    home = history if command[0] in ("report", "config", "check") else tmp_path / "home"
    proc = with_stdout(how, *command, home=home)
    assert (proc.returncode, proc.stderr) == (Exit.OUTPUT, UNWRITABLE[how])
    if command[0] in ("audit", "plan"):  # what the history says is what the command did
        row = recorded(home)
        assert (row["kind"], row["status"], row["exit_code"]) == (command[0], "failed", Exit.OUTPUT)
        assert UNWRITABLE[how].split(": ", 2)[2].strip() in json.loads(row["summary"])["delivery"]


def test_a_command_that_writes_no_standard_output_runs_with_it_closed(tmp_path):
    proc = with_stdout("closed", "audit", "--no-preflight", "-o", str(tmp_path / "a.txt"), home=tmp_path / "home")
    assert (proc.returncode, proc.stderr) == (Exit.FINDINGS, "") and (tmp_path / "a.txt").stat().st_size > 0


class ClosedPipe(io.StringIO):
    """Standard output whose reader has gone: every write fails as on a closed pipe."""

    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_a_campaign_whose_standard_output_closes_goes_on_to_its_end(store, monkeypatch, tmp_path, capsys):
    """`fleetctl upgrade ... | head -3`: the display stops at the closed pipe, said once on stderr, and the campaign
    does not: every host ends where the campaign takes it, every event reaches the history and the JSONL log."""
    from orchestrator import upgrade
    from orchestrator.campaign import progress
    from tests.helpers.campaign import Script, parts, start

    monkeypatch.setenv("FLEETCTL_HOME", str(tmp_path))
    journal, cid, engine = start(store, Script({("b", "verify"): "fail"}), ["a"], ["b"], fail_at=[1, 1])
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert upgrade.drive(journal, cid, engine.ctx.fleet, engine.ctx.base, None, None,
                         parts(Script({("b", "verify"): "fail"}))) == "rolled_back"
    assert {r["host"]: r["state"] for r in journal.hosts(cid)} == {"a": "rolled_back", "b": "rolled_back"}
    logged = [json.loads(line)["seq"] for line in progress.log_path(cid).read_text().splitlines()]
    assert logged == [e["seq"] for e in journal.events(cid)]
    assert capsys.readouterr().err == (f"fleetctl: cannot write the standard output (Broken pipe): campaign {cid} "
                                       f"goes on, its events in {progress.log_path(cid)}\n")


@pytest.mark.parametrize("code", [Exit.ROLLED_BACK, Exit.NEEDS_PERSON])
def test_a_campaigns_exit_code_outlives_its_unwritable_output(monkeypatch, capsys, code):
    """A rolled-back campaign exits 4, one that needs a person 6, whoever reads its output, with one line on stderr;
    a campaign that succeeded but could not say so fails as any command whose output failed (Exit.OUTPUT)."""
    from orchestrator.cli.main import stdout_errors
    from orchestrator.cli.output import campaign_end
    from orchestrator.errors import OutputError

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    with pytest.raises(SystemExit) as ended, stdout_errors():
        campaign_end("campaign 1: rolled back\n", code)
    assert ended.value.code == code
    assert capsys.readouterr().err == "fleetctl: error: cannot write the standard output: Broken pipe\n"
    with pytest.raises(OutputError) as failed, stdout_errors():
        campaign_end("campaign 1: done\n", Exit.OK)
    assert failed.value.exit_code == Exit.OUTPUT
