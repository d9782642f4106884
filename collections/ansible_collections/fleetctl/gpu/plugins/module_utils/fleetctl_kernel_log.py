# -*- coding: utf-8 -*-
# Kernel log reading and Xid event parsing for fleetctl's on-host modules.
# Pure Python 3.6+, standard library only: it runs on the managed host.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import re
import subprocess

KMSG_PATH = "/dev/kmsg"

# Numbers have bounded digits: a mangled line with thousands of them is no record (int() and float() refuse them).
# /dev/kmsg record: "PRIO,SEQ,USEC,FLAGS[,...];MESSAGE" (continuation lines start with a space).
_KMSG_RECORD = re.compile(r"^(\d{1,20}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$")
# dmesg / journalctl short-monotonic prefix: "[   12.345678] MESSAGE"
_BRACKET_TIME = re.compile(r"^\[\s*(\d{1,15}\.\d{1,9})\]\s?(.*)$")

# Every Xid form seen in the wild (README "What the audit checks"):
#   NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s ...
#   NVRM: Xid (0000:03:00): 14, Channel 00000001                      (old: no "PCI:")
#   NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: ...  (MIG instance)
#   NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
    r"(?:\s+GPU-I:(?P<gi>[0-9A-Fa-f]+))?\):\s*(?P<code>\d{1,9})(?:,\s*(?P<rest>.*))?$"
)
# "pid=N, name=NAME, MSG" (119, 79, 48...) or "pid=N, MSG" without a name (94, 95: "pid=7194, Contained: ...").
_PID_NAME = re.compile(r"^pid=(?P<pid>'?[^,]*'?),\s*(?:name=(?P<name>[^,]*),\s*)?(?P<msg>.*)$")
_RECOVERY = re.compile(r"GPU recovery action changed from (0x[0-9A-Fa-f]+) \(([^)]*)\) to (0x[0-9A-Fa-f]+) \(([^)]*)\)")
#   NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.   (no Xid number at all)
_FALLEN = re.compile(r"NVRM: GPU (?:at PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?):? GPU has fallen off the bus")


class KernelLogUnreadable(Exception):
    pass


def parse_kmsg(text):
    """Records of /dev/kmsg text: list of dicts with seq, uptime_s and message."""
    records = []
    for line in text.splitlines():
        m = _KMSG_RECORD.match(line)
        if m:
            records.append({"seq": int(m.group(2)), "uptime_s": int(m.group(3)) / 1e6, "message": m.group(4)})
    return records


def parse_bracketed(text):
    """Records of `dmesg` or `journalctl -k -o short-monotonic` text (no sequence numbers)."""
    records = []
    for line in text.splitlines():
        # journalctl short-monotonic: "[   12.345678] host kernel: MESSAGE"
        m = _BRACKET_TIME.match(line)
        if not m:
            continue
        message = m.group(2)
        k = message.find(" kernel: ")
        if k != -1 and not message.startswith("NVRM"):
            message = message[k + len(" kernel: "):]
        records.append({"seq": None, "uptime_s": float(m.group(1)), "message": message})
    return records


def _read_kmsg(path):
    """All records still in the kernel ring buffer, without blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    break
                if e.errno == errno.EPIPE:  # a record was overwritten while reading: go on
                    continue
                raise
            if not chunk:  # a plain file (not the character device) ends here
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def read_kernel_log(kmsg_path=KMSG_PATH, run=subprocess.run):
    """(records, source) from the first readable source: /dev/kmsg, journalctl -k -b, dmesg."""
    problems = []
    try:
        return parse_kmsg(_read_kmsg(kmsg_path)), kmsg_path
    except OSError as e:
        problems.append("%s: %s" % (kmsg_path, e.strerror or e))
    for argv, name in ((["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"], "journalctl -k -b"),
                       (["dmesg"], "dmesg")):
        try:
            proc = run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            problems.append("%s: %s" % (name, e))
            continue
        if proc.returncode == 0:
            return parse_bracketed(proc.stdout.decode("utf-8", "replace")), name
        problems.append("%s: exit %d %s" % (name, proc.returncode, proc.stderr.decode("utf-8", "replace").strip()[:200]))
    raise KernelLogUnreadable("; ".join(problems))


def normalize_pci(pci):
    """'0000:9b:00' / '00000000:9B:00.0' -> '00000000:9b:00.0' (NVML's bus id form, lower case)."""
    pci = pci.lower()
    if "." not in pci:
        pci += ".0"
    domain, rest = pci.split(":", 1)
    return domain.rjust(8, "0") + ":" + rest


def parse_xid(message):
    """One Xid event from a kernel log message, or None when the message is not an Xid report."""
    m = _XID.search(message)
    if m:
        rest = (m.group("rest") or "").strip()
        event = {"code": int(m.group("code")), "pci_bus_id": normalize_pci(m.group("pci")),
                 "gpu_instance": int(m.group("gi"), 16) if m.group("gi") else None,
                 "pid": None, "process": None, "message": rest, "recovery_action": None}
        pn = _PID_NAME.match(rest)
        if pn:
            pid = pn.group("pid").strip("'")
            event["pid"] = int(pid) if re.match(r"^[0-9]{1,10}$", pid) else None  # '²'.isdigit() is True
            process = (pn.group("name") or "").strip()
            event["process"] = process if process and process != "<unknown>" else None
            event["message"] = pn.group("msg").strip()
        ra = _RECOVERY.search(rest)
        if ra:
            event["recovery_action"] = {"from_code": int(ra.group(1), 16), "from": ra.group(2),
                                        "to_code": int(ra.group(3), 16), "to": ra.group(4)}
        return event
    m = _FALLEN.search(message)
    if m:
        return {"code": 79, "pci_bus_id": normalize_pci(m.group("pci")), "gpu_instance": None, "pid": None,
                "process": None, "message": "GPU has fallen off the bus", "recovery_action": None}
    return None


def catalog_index(catalog, overrides=None):
    """Xid code -> catalog entry, with the baseline's overrides laid over the shipped table."""
    index = {}
    for entry in catalog or []:
        index[int(entry["code"])] = dict(entry)
    for code, change in (overrides or {}).items():
        merged = dict(index.get(int(code), {"code": int(code), "name": "Xid %s" % code}))
        merged.update(change)
        merged.setdefault("source", "baseline override")
        if "source" not in change:
            merged["source"] = "baseline override of: %s" % index.get(int(code), {}).get("source", "none")
        index[int(code)] = merged
    return index


def classify(event, index):
    entry = index.get(event["code"])
    if entry is None:
        event.update({"name": "unknown Xid %d" % event["code"], "class": "unknown", "severity": "high",
                      "action": "look the code up in NVIDIA's Xid catalog", "source": "fleetctl default for codes not in the table"})
    else:
        event.update({"name": entry.get("name"), "class": entry.get("class", "unknown"),
                      "severity": entry.get("severity", "high"), "action": entry.get("action"),
                      "source": entry.get("source")})
    return event


def xid_events(records, index, since_seq=None):
    """Classified Xid events among kernel log records (only those after since_seq when given)."""
    events = []
    for rec in records:
        if since_seq is not None and rec["seq"] is not None and rec["seq"] <= since_seq:
            continue
        event = parse_xid(rec["message"])
        if event is None:
            continue
        event["seq"] = rec["seq"]
        event["uptime_s"] = rec["uptime_s"]
        event["raw"] = rec["message"][:1024]
        events.append(classify(event, index))
    # The driver often writes both "Xid (...): 79, ..." and "GPU ...: GPU has fallen off the bus." for one loss.
    numbered_79 = set(e["pci_bus_id"] for e in events if e["code"] == 79 and "Xid" in e["raw"])
    return [e for e in events if not (e["code"] == 79 and "Xid" not in e["raw"] and e["pci_bus_id"] in numbered_79)]
