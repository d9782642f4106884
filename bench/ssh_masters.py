"""The benches' SSH multiplexing masters (Ansible's ControlPersist), closed through their own sockets."""

from __future__ import annotations

import subprocess
from pathlib import Path


def close(control_dir: Path | str) -> None:
    """Ask every master with a socket in CONTROL_DIR to exit (`ssh -O exit`): no process is picked by its name."""
    for socket in Path(control_dir).glob("*"):
        if socket.is_socket():
            subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "bench"], capture_output=True,
                           check=False)
