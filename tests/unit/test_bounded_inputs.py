"""Every file a user names, on every option and config key, is read as -b, -i and the config file are
(orchestrator/inputs.py): a FIFO, a device or a file past its bound is one line and exit 2, at once (issue 36).

Run as a user would, in a subprocess under a memory limit and a timeout: before the fix `--webhook-headers
/dev/zero` ate memory until it ran out and a FIFO given to `--webhook-ca` never returned. The settings are walked
from orchestrator/settings.py (every `path` one), so a new file setting is tested without being named here; the
flags that are not settings are listed, and a guard test fails on a file flag found in neither."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import click
import pytest

from orchestrator import inputs, settings
from orchestrator.cli import cli
from orchestrator.exitcodes import Exit
from tests.helpers.cli import REPO, runs

MEMORY_LIMIT = 2 * 1024 ** 3
PATH_SETTINGS = [s for s in settings.SETTINGS if s.path]
# What a file setting's first command needs besides it to get as far as reading the file.
COMPANIONS = {"webhook_headers": ["--webhook", "http://127.0.0.1:9/x"],
              "webhook_ca": ["--webhook", "https://127.0.0.1:9/x"],
              "prometheus_headers": ["--to", "570.86.15", "--prometheus-url", "http://127.0.0.1:9"]}
# Files named by flags that are not settings: flag -> the command line reading it (FILE: where the path goes).
OTHER_FILES = {"--sign": ["report", "-o", "{out}", "--sign", "FILE"],
               "--signature": ["report", "verify", "--signature", "FILE"],
               "--file": ["report", "verify", "--signature", "{sig}", "--file", "FILE"],
               "--key": ["report", "verify", "--signature", "{sig}", "--key", "FILE"]}
OUTPUTS = {"--output", "--audit-output", "--textfile", "--unit-dir"}  # written, not read: test_output_errors.py
FILE_METAVARS = re.compile(r"FILE|KEY|INVENTORY|BASELINE|DIR|PATH")


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def fleetctl_bounded(*args: str, home: Path, config: str = os.devnull, **env: str) -> subprocess.CompletedProcess:
    """fleetctl ARGS under MEMORY_LIMIT; a hang is TimeoutExpired after 20 s, not a stuck test run."""
    environ = {k: v for k, v in os.environ.items() if k != "FLEETCTL_DEBUG"}
    environ.update(FLEETCTL_HOME=str(home), FLEETCTL_CONFIG=config, COLUMNS="200", **env)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=environ, cwd=REPO, timeout=20, preexec_fn=limit_memory)


def refused(proc: subprocess.CompletedProcess, path: object, why: str) -> None:
    err = proc.stderr
    assert proc.returncode == Exit.USAGE, (proc.returncode, err[-2000:])
    assert err.count("\n") == 1 and err.startswith(f"fleetctl: error: {inputs.shown(path)}: cannot read "), err
    assert re.search(why, err), err


@pytest.fixture(scope="module")
def specials(tmp_path_factory):
    d = tmp_path_factory.mktemp("specials")
    os.mkfifo(d / "fifo")
    with open(d / "large", "wb") as f:  # sparse: past every file's bound (the largest, a signed export's)
        f.truncate(256 * inputs.MiB + 1)
    return {"fifo": (d / "fifo", "a FIFO, not a regular file"),
            "/dev/zero": (Path("/dev/zero"), "a character device, not a regular file"),
            "too large": (d / "large", r"larger than \d+ (MiB|bytes)")}


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "too large"])
@pytest.mark.parametrize("setting", PATH_SETTINGS, ids=lambda s: s.flag)
def test_every_file_setting_refuses_a_fifo_a_device_and_a_file_too_large(tmp_path, specials, setting, special):
    path, why = specials[special]
    proc = fleetctl_bounded(*setting.commands[0], setting.flag, str(path), *COMPANIONS.get(setting.name, []),
                            home=tmp_path / "home")
    refused(proc, path, why)
    assert runs(tmp_path / "home") == []  # refused before anything ran


@pytest.mark.parametrize("setting", [s for s in PATH_SETTINGS if s.file], ids=lambda s: s.name)
def test_every_file_key_of_the_config_file_refuses_a_fifo(tmp_path, specials, setting):
    path, why = specials["fifo"]
    config = tmp_path / "config.yml"
    config.write_text(f"{setting.name}: {path}\n")
    proc = fleetctl_bounded(*setting.commands[0], *COMPANIONS.get(setting.name, []), home=tmp_path / "home",
                            config=str(config))
    refused(proc, path, why)


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """A signed export and its signature, and the key that made them."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = tmp_path_factory.mktemp("signed")
    key = Ed25519PrivateKey.generate()
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    proc = fleetctl_bounded("report", "-o", str(d / "r.json"), "--sign", str(d / "key.pem"), home=d / "home")
    assert proc.returncode == 0, proc.stderr
    return d


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "too large"])
@pytest.mark.parametrize("flag", OTHER_FILES)
def test_every_other_file_flag_refuses_a_fifo_a_device_and_a_file_too_large(tmp_path, specials, signed, flag,
                                                                               special):
    path, why = specials[special]
    argv = [str(path) if a == "FILE" else a.format(out=tmp_path / "out.json", sig=signed / "r.json.sig")
            for a in OTHER_FILES[flag]]
    refused(fleetctl_bounded(*argv, home=signed / "home"), path, why)


def test_ssl_cert_file_is_checked_before_openssl_opens_it(tmp_path, specials):
    path, why = specials["fifo"]
    proc = fleetctl_bounded("audit", *COMPANIONS["webhook_ca"], home=tmp_path / "home", SSL_CERT_FILE=str(path))
    refused(proc, path, why)


def test_a_webhook_ca_is_still_trusted_when_read_bounded(tmp_path):
    """The CA is handed to OpenSSL as data now: a real PEM (this machine's bundle) loads, garbage is one line."""
    from orchestrator.notify import send as notify
    from orchestrator.errors import InputError

    import ssl
    bundle = ssl.get_default_verify_paths().cafile
    if not bundle or not os.path.isfile(bundle):
        pytest.skip("no CA bundle on this machine")
    assert notify.ssl_context(bundle).cert_store_stats()["x509_ca"] > 0
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    with pytest.raises(InputError, match=r"garbage.pem: not a PEM CA certificate"):
        notify.ssl_context(str(tmp_path / "garbage.pem"))


def file_flags(command: click.Command, path: tuple[str, ...] = ()) -> set[tuple[tuple[str, ...], str]]:
    """(command path, flag) of every option whose metavar names a file or directory, in COMMAND's tree."""
    out = set()
    for name, sub in getattr(command, "commands", {}).items():
        out |= file_flags(sub, (*path, name))
    for param in command.params:
        if isinstance(param, click.Option) and param.metavar and FILE_METAVARS.search(param.metavar):
            out.add((path, max(param.opts, key=len)))
    return out


def test_every_file_flag_is_tested_here_or_written_not_read():
    ctx = click.Context(cli)
    flags = set()
    for name in cli.list_commands(ctx):
        if name in ("lab",):  # a plugin's
            continue
        flags |= file_flags(cli.get_command(ctx, name), (name,))
    assert {(("audit",), "--webhook-ca"), (("report", "verify"), "--key"), (("report",), "--output")} <= flags
    covered = {s.flag for s in PATH_SETTINGS} | set(OTHER_FILES) | OUTPUTS
    assert {flag for _, flag in flags} - covered == set(), "a file flag not read through inputs.read_regular?"
