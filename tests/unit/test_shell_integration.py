"""How fleetctl meets the operator's shell: completion scripts that complete real commands and choices, and
NO_COLOR (https://no-color.org) turning colour off even where colour is forced."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import fleetctl

BIN = Path(sys.executable).parent
COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-8]|9[0-7])[0-9;]*m")  # a foreground colour SGR


def complete(words: list[str], cword: int) -> list[str]:
    """What bash offers after sourcing `fleetctl completion bash` and pressing TAB at word CWORD."""
    script = ('eval "$(fleetctl completion bash)"; COMP_WORDS=("$@"); COMP_CWORD=%d; COMPREPLY=(); '
              '_fleetctl_completion fleetctl; printf "%%s\\n" "${COMPREPLY[@]}"' % cword)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(["bash", "-c", script, "bash", *words], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_bash_completion_completes_commands_and_option_choices():
    assert complete(["fleetctl", "camp"], 1) == ["campaign"]
    assert complete(["fleetctl", "campaign", "re"], 2) == ["resume"]
    assert complete(["fleetctl", "audit", "--fail-on", ""], 3) == ["critical", "high", "medium", "low", "info", "never"]


@pytest.mark.parametrize("shell, marker", [("zsh", "#compdef fleetctl"), ("fish", "complete --no-files --command fleetctl")])
def test_zsh_and_fish_scripts_name_fleetctl(shell, marker, tmp_path):
    proc = fleetctl("completion", shell, home=tmp_path)
    assert proc.returncode == 0 and marker in proc.stdout, proc.stdout + proc.stderr


def test_an_unknown_shell_is_a_usage_error(tmp_path):
    proc = fleetctl("completion", "tcsh", home=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def run_coloured(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    env.update(FLEETCTL_HOME=str(tmp_path), FORCE_COLOR="1", TERM="xterm-256color", **extra)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "audit", "--fail-on", "never"],
                          capture_output=True, text=True, env=env, timeout=300)


def test_no_color_turns_the_forced_colour_of_the_table_off(tmp_path):
    coloured = run_coloured(tmp_path)
    assert COLOUR.search(coloured.stdout), "FORCE_COLOR should colour the findings table"
    plain = run_coloured(tmp_path, NO_COLOR="1")
    assert plain.returncode == coloured.returncode == 0, plain.stderr
    assert not COLOUR.search(plain.stdout + plain.stderr)
    assert "driver.installed" in plain.stdout
