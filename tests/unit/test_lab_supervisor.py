"""The lab host's supervisor answers a malformed request with exit 1 and goes on serving (it used to die with a
NameError: the error was read after its except block had unbound it)."""

from __future__ import annotations

import json

from fleetctl_lab.supervisor import Host


def test_a_malformed_request_is_answered_not_fatal(tmp_path):
    hostdir = tmp_path / "h"
    for d in ("control", "kernel/sys-module", "hw", "root"):
        (hostdir / d).mkdir(parents=True)
    (hostdir / "host.json").write_text(json.dumps({"name": "gpu-a", "address": "10.77.0.2"}))
    host = Host(hostdir)
    for name, text in (("request.1.req", "{not json"), ("request.2.req", '["reboot-the-world"]')):
        (host.control / name).write_text(text)
        host.answer(host.control / name)
        rc, out, err = json.loads((host.control / name).with_suffix(".done").read_text())
        assert (rc, out) == (1, "") and err.startswith("lab: cannot read the request: ")
        assert not (host.control / name).exists()
