"""The lab's key=value files (hw/gpus.conf, hw/faults.conf; docs/lab.md), read and written on the controller side.

The emulated tools inside a host (emu/) read the same format with their own few lines: they run on the host's
python3 and cannot import fleetctl.
"""

from __future__ import annotations

from pathlib import Path


def read_conf(path: Path) -> dict[str, str]:
    """key=value lines, '#' comments; a missing file is empty."""
    values: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return values
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def write_conf(path: Path, values: dict[str, str]) -> None:
    """Replace PATH atomically, so a host never reads half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    tmp.replace(path)
