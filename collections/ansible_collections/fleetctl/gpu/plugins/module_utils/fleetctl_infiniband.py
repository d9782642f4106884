# -*- coding: utf-8 -*-
# InfiniBand / RoCE port facts from /sys/class/infiniband for fleetctl's on-host modules.
# Pure Python 3.6+, standard library only: it runs on the managed host.
#
# Layout and meaning: the kernel's Documentation/ABI/stable/sysfs-class-infiniband
#   /sys/class/infiniband/<device>/ports/<port-num>/{state,phys_state,rate,link_layer}
#   /sys/class/infiniband/<device>/ports/<port-num>/counters/{link_downed,symbol_error,link_error_recovery,...}
# Formats: drivers/infiniband/core/sysfs.c - state "%d: %s" (DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER),
# phys_state "%u: %s" (Sleep, Polling, Disabled, PortConfigurationTraining, LinkUp, LinkErrorRecovery, Phy Test),
# rate "%d%s Gb/sec (%dX%s)" ("400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)"), link_layer "InfiniBand" or "Ethernet"
# (RoCE); each counter one decimal number.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import re

SYSFS_INFINIBAND = "/sys/class/infiniband"
COUNTERS = ("link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors")
_NUMBERED = re.compile(r"^(\d{1,3}):\s*(\S.*)$")
_RATE = re.compile(r"^(\d{1,6}(?:\.\d{1,3})?) Gb/sec(?: \((\d{1,3})X\s*([A-Za-z0-9]*)\))?")
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def _read(path, limit=4096):
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace").strip()


def parse_numbered(text):
    """'4: ACTIVE' -> (4, 'ACTIVE'); None for anything else."""
    m = _NUMBERED.match(text or "")
    return (int(m.group(1)), m.group(2).strip()) if m else None


def parse_rate(text):
    """'400 Gb/sec (4X NDR)' -> (400.0, 4, 'NDR'); None for anything else."""
    m = _RATE.match(text or "")
    if not m:
        return None
    return float(m.group(1)), int(m.group(2)) if m.group(2) else None, m.group(3) or None


def _counter(path):
    try:
        text = _read(path, 64)
    except (IOError, OSError):
        return None  # a counter the device does not have (or cannot read) is null, as NVLink's are
    return int(text) if re.match(r"^[0-9]{1,20}$", text) else None


def read_port(port_dir):
    """One port's facts, and what could not be read (a list of messages)."""
    problems = []
    port = {}
    for name, parse in (("state", parse_numbered), ("phys_state", parse_numbered)):
        try:
            text = _read(os.path.join(port_dir, name))
        except (IOError, OSError) as e:
            port[name], port[name + "_code"] = None, None
            problems.append("%s: %s" % (name, e.strerror or e))
            continue
        parsed = parse(text)
        if parsed is None:
            problems.append("%s: unexpected %r" % (name, text[:80]))
        port[name + "_code"], port[name] = parsed if parsed else (None, None)
    try:
        text = _read(os.path.join(port_dir, "rate"))
    except (IOError, OSError) as e:
        text = None
        problems.append("rate: %s" % (e.strerror or e))
    rate = parse_rate(text)
    if text is not None and rate is None:
        problems.append("rate: unexpected %r" % text[:80])
    port["rate"] = text
    port["rate_gbps"], port["width"], port["speed"] = rate if rate else (None, None, None)
    try:
        port["link_layer"] = _read(os.path.join(port_dir, "link_layer"), 64) or None
    except (IOError, OSError):
        port["link_layer"] = None  # older kernels (before 2.6.37) have no link_layer: InfiniBand
    port["counters"] = dict((c, _counter(os.path.join(port_dir, "counters", c))) for c in COUNTERS)
    return port, problems


def read_infiniband(errors, root=SYSFS_INFINIBAND):
    """{"ports": [...]} for every port of every RDMA device under ROOT; None when ROOT is absent or has no device.
    A port whose state, physical state or rate cannot be read keeps nulls and an entry in ERRORS
    (infiniband.ports[I])."""
    try:
        devices = sorted(os.listdir(root))
    except (IOError, OSError) as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        errors["infiniband"] = "%s: %s" % (root, e.strerror or e)
        return None
    ports = []
    for device in devices:
        if not _NAME.match(device):
            continue
        ports_dir = os.path.join(root, device, "ports")
        try:
            numbers = sorted(int(n) for n in os.listdir(ports_dir) if re.match(r"^[0-9]{1,4}$", n))
        except (IOError, OSError) as e:
            errors["infiniband.ports[%d]" % len(ports)] = "%s: %s" % (ports_dir, e.strerror or e)
            ports.append({"device": device, "port": None, "state": None, "state_code": None, "phys_state": None,
                          "phys_state_code": None, "rate": None, "rate_gbps": None, "width": None, "speed": None,
                          "link_layer": None, "counters": dict((c, None) for c in COUNTERS)})
            continue
        for number in numbers:
            port, problems = read_port(os.path.join(ports_dir, str(number)))
            if problems:
                errors["infiniband.ports[%d]" % len(ports)] = "%s port %d: %s" % (device, number, "; ".join(problems))
            ports.append(dict(port, device=device, port=number))
    if not ports:
        return None
    return {"ports": ports}
