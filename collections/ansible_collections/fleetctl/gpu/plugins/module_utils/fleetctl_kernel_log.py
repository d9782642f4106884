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


# ---- NVSwitch SXids ---------------------------------------------------------------------------------------------
# The nvswitch driver prints every SXid as `nvidia-<dev>: SXid (PCI:<dddd:bb:dd.f>): <code %05d>, <text>`
# (NVSWITCH_PRINT_SXID, open-gpu-kernel-modules src/common/nvswitch/kernel/inc/common_nvswitch.h). One error is a
# headline whose text starts with its class - "Fatal, Link 48 LTSSM Fault Up", "Non-fatal, Link 00 Minion Link
# DLREQ interrupt (First)", "Correctable, ..." (intr_nvswitch.h NVSWITCH_REPORT_FATAL/_NONFATAL/_CORRECTABLE) -
# followed by "Severity N Engine instance NN Sub-engine instance NN" (N: NVSWITCH_ERROR_SEVERITY_NONFATAL 0,
# _FATAL 1, ctrl_dev_nvswitch.h) and one or two "Data {0x..., ...}" lines (error_nvswitch.c).
_SXID = re.compile(
    r"nvidia-(?P<device>nvswitch\d{1,4}): SXid \(PCI:(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\):"
    r"\s*(?P<code>\d{1,9}),\s*(?P<rest>.*)$")
_SXID_HEADLINE = re.compile(r"^(?P<word>Fatal|Non-fatal|Correctable),\s*(?:Link (?P<link>\d{1,4})\s*)?(?P<text>.*)$")
_SXID_SEVERITY = re.compile(r"^Severity (?P<severity>\d{1,3}) Engine instance (?P<engine>\d{1,4})")

# Where the table's words come from:
_FM = ("NVIDIA Fabric Manager User Guide DU-09883-001 v1.3 (Oct 2023), %s NVSwitch SXid Errors (as transcribed in "
       "leptonai/gpud components/accelerator/nvidia/sxid/sxid.go)")
FM_NON_FATAL = _FM % "Non-Fatal"
FM_FATAL = _FM % "Fatal"
FM_ALWAYS_FATAL = _FM % "Always Fatal"
FM_NOTABLE = _FM % "Other Notable"
# Mnemonics: enum nvswitch_err_type (NVSWITCH_ERR_HW_<mnemonic> = code) in open-gpu-kernel-modules
# src/common/nvswitch/interface/ctrl_dev_nvswitch.h (595.45.04).
# class: non_fatal (the error is contained; jobs may go on), fatal (fatal to the NVSwitch port and the GPUs' jobs
# across it: reset the GPUs and NVSwitches, i.e. reboot a bare-metal host), always_fatal (fatal to the whole fabric:
# reboot), notable (the guide lists it without a class: the log line's own word decides).
SXID_TABLE = {
    # code: (mnemonic, meaning, class, source)
    10001: ("HOST_PRIV_ERROR", "host PRIV error", "notable", FM_NOTABLE),
    10002: ("HOST_PRIV_TIMEOUT", "host PRIV timeout", "notable", FM_NOTABLE),
    10003: ("HOST_UNHANDLED_INTERRUPT", "host unhandled interrupt", "always_fatal", FM_NOTABLE),
    10004: ("HOST_THERMAL_EVENT_START", "NVSwitch thermal event start", "notable", FM_NOTABLE),
    10005: ("HOST_THERMAL_EVENT_END", "NVSwitch thermal event end", "notable", FM_NOTABLE),
    11001: ("NPORT_INGRESS_CMDDECODEERR", "ingress invalid command", "fatal", FM_FATAL),
    11004: ("NPORT_INGRESS_ACLFAIL", "ingress invalid ACL (a fabric partition misconfiguration)", "non_fatal", FM_NON_FATAL),
    11009: ("NPORT_INGRESS_INVALIDVCSET", "ingress invalid VCSet", "fatal", FM_FATAL),
    11012: ("NPORT_INGRESS_NCISOC_HDR_ECC_LIMIT_ERR", "single-bit ECC errors (corrected)", "non_fatal", FM_NON_FATAL),
    11013: ("NPORT_INGRESS_NCISOC_HDR_ECC_DBE_ERR", "ingress header double-bit ECC error", "fatal", FM_FATAL),
    11018: ("NPORT_INGRESS_RIDTAB_ECC_DBE_ERR", "ingress RID table double-bit ECC error", "fatal", FM_FATAL),
    11019: ("NPORT_INGRESS_RLANTAB_ECC_DBE_ERR", "ingress RLAN table double-bit ECC error", "fatal", FM_FATAL),
    11020: ("NPORT_INGRESS_NCISOC_PARITY_ERR", "ingress control parity error", "fatal", FM_FATAL),
    11021: ("NPORT_INGRESS_REMAPTAB_ECC_LIMIT_ERR", "single-bit ECC errors (corrected)", "non_fatal", FM_NON_FATAL),
    11022: ("NPORT_INGRESS_RIDTAB_ECC_LIMIT_ERR", "single-bit ECC errors (corrected)", "non_fatal", FM_NON_FATAL),
    11023: ("NPORT_INGRESS_RLANTAB_ECC_LIMIT_ERR", "single-bit ECC errors (corrected)", "non_fatal", FM_NON_FATAL),
    12001: ("NPORT_EGRESS_EGRESSBUFERR", "egress crossbar overflow", "fatal", FM_FATAL),
    12002: ("NPORT_EGRESS_PKTROUTEERR", "egress packet route error", "fatal", FM_FATAL),
    12020: ("NPORT_EGRESS_SEQIDERR", "egress sequence ID error", "always_fatal", FM_ALWAYS_FATAL),
    12021: ("NPORT_EGRESS_NXBAR_HDR_ECC_LIMIT_ERR", "single-bit ECC errors (corrected)", "non_fatal", FM_NON_FATAL),
    12022: ("NPORT_EGRESS_NXBAR_HDR_ECC_DBE_ERR", "egress input double-bit ECC error", "fatal", FM_FATAL),
    12023: ("NPORT_EGRESS_RAM_OUT_HDR_ECC_LIMIT_ERR", "single-bit ECC errors (corrected)", "non_fatal", FM_NON_FATAL),
    12024: ("NPORT_EGRESS_RAM_OUT_HDR_ECC_DBE_ERR", "egress output double-bit ECC error", "fatal", FM_FATAL),
    12025: ("NPORT_EGRESS_NCISOCCREDITOVFL", "egress credit overflow", "fatal", FM_FATAL),
    12026: ("NPORT_EGRESS_REQTGTIDMISMATCHERR", "egress destination request ID error", "fatal", FM_FATAL),
    12027: ("NPORT_EGRESS_RSPREQIDMISMATCHERR", "egress destination response ID error", "fatal", FM_FATAL),
    12028: ("NPORT_EGRESS_PRIVRSPERR", "egress non-posted PRIV error", "non_fatal", FM_NON_FATAL),
    12030: ("NPORT_EGRESS_NXBAR_HDR_PARITY_ERR", "egress control parity error", "fatal", FM_FATAL),
    12031: ("NPORT_EGRESS_NCISOC_CREDIT_PARITY_ERR", "egress credit parity error", "fatal", FM_FATAL),
    12032: ("NPORT_EGRESS_NXBAR_FLITTYPE_MISMATCH_ERR", "egress flit type mismatch", "fatal", FM_FATAL),
    14017: ("NPORT_TSTATE_ATO_ERR", "TSTATE ATO timeout", "fatal", FM_FATAL),
    15001: ("NPORT_ROUTE_ROUTEBUFERR", "route buffer over/underflow", "fatal", FM_FATAL),
    15006: ("NPORT_ROUTE_TRANSDONERESVERR", "route transdone over/underflow", "fatal", FM_FATAL),
    15008: ("NPORT_ROUTE_GLT_ECC_LIMIT_ERR", "single-bit ECC errors (corrected)", "non_fatal", FM_NON_FATAL),
    15009: ("NPORT_ROUTE_GLT_ECC_DBE_ERR", "route GLT double-bit ECC error", "fatal", FM_FATAL),
    15010: ("NPORT_ROUTE_PDCTRLPARERR", "route parity error", "fatal", FM_FATAL),
    15011: ("NPORT_ROUTE_NVS_ECC_LIMIT_ERR", "single-bit ECC errors (corrected)", "non_fatal", FM_NON_FATAL),
    15012: ("NPORT_ROUTE_NVS_ECC_DBE_ERR", "route incoming double-bit ECC error", "fatal", FM_FATAL),
    15013: ("NPORT_ROUTE_CDTPARERR", "route credit parity error", "fatal", FM_FATAL),
    19047: ("NVLTLC_TX_SYS_NCISOC_HDR_ECC_DBE_ERR", "NCISOC header double-bit ECC error", "fatal", FM_FATAL),
    19048: ("NVLTLC_TX_SYS_NCISOC_DAT_ECC_DBE_ERR", "NCISOC data double-bit ECC error", "fatal", FM_FATAL),
    19049: ("NVLTLC_TX_SYS_NCISOC_ECC_LIMIT_ERR", "single-bit ECC errors (corrected)", "non_fatal", FM_NON_FATAL),
    19084: ("NVLTLC_RX_LNK_AN1_HEARTBEAT_TIMEOUT_ERR", "AN1 heartbeat timeout", "non_fatal", FM_NON_FATAL),
    20001: ("DLPL_TX_REPLAY", "TX replay error", "non_fatal", FM_NON_FATAL),
    20012: ("DLPL_RX_CRC_COUNTER", "broken or inconsistent connection (RX CRC counter)", "non_fatal", FM_NON_FATAL),
    20034: ("DLPL_LTSSM_FAULT_UP", "LTSSM fault up: the link went down from active", "fatal", FM_FATAL),
    22003: ("MINION_HALT", "MINION halt", "always_fatal", FM_ALWAYS_FATAL),
    22011: ("MINION_EXTERR", "MINION external error", "always_fatal", FM_ALWAYS_FATAL),
    22012: ("MINION_FATAL_LINK_INTR", "MINION link NA interrupt", "fatal", FM_FATAL),
    22013: ("MINION_NONFATAL", "MINION link DLREQ interrupt", "non_fatal", FM_NON_FATAL),
    23001: ("NXBAR_TILE_INGRESS_BUFFER_OVERFLOW", "NXBAR ingress SRC-VC buffer overflow", "always_fatal", FM_ALWAYS_FATAL),
    23002: ("NXBAR_TILE_INGRESS_BUFFER_UNDERFLOW", "NXBAR ingress SRC-VC buffer underflow", "always_fatal", FM_ALWAYS_FATAL),
    23003: ("NXBAR_TILE_EGRESS_CREDIT_OVERFLOW", "NXBAR egress DST-VC credit overflow", "always_fatal", FM_ALWAYS_FATAL),
    23004: ("NXBAR_TILE_EGRESS_CREDIT_UNDERFLOW", "NXBAR egress DST-VC credit underflow", "always_fatal", FM_ALWAYS_FATAL),
    23009: ("NXBAR_TILE_INGRESS_PKT_PARITY_ERROR", "NXBAR ingress packet parity error", "always_fatal", FM_ALWAYS_FATAL),
    24004: ("NPORT_SOURCETRACK_CREQ_TCEN0_CRUMBSTORE_ECC_DBE_ERR", "sourcetrack TCEN0 crumbstore double-bit ECC error", "fatal", FM_FATAL),
    24005: ("NPORT_SOURCETRACK_CREQ_TCEN0_TD_CRUMBSTORE_ECC_DBE_ERR", "sourcetrack TCEN0 TD crumbstore double-bit ECC error", "fatal", FM_FATAL),
    24006: ("NPORT_SOURCETRACK_CREQ_TCEN1_CRUMBSTORE_ECC_DBE_ERR", "sourcetrack TCEN1 crumbstore double-bit ECC error", "fatal", FM_FATAL),
    24007: ("NPORT_SOURCETRACK_SOURCETRACK_TIME_OUT_ERR", "sourcetrack timeout", "fatal", FM_FATAL),
}
# fleetctl's severity of an SXid by whether it is fatal (True / False / None: not said by the line nor the table).
SXID_SEVERITY = {True: "critical", False: "medium", None: "high"}
_SXID_WORD = {"Fatal": True, "Non-fatal": False, "Correctable": False}


def _sxid_event(m, rec):
    code = int(m.group("code"))
    mnemonic, meaning, klass, source = SXID_TABLE.get(code, (None, None, "unknown", None))
    return {"code": code, "device": m.group("device"), "pci": m.group("pci").lower(), "link": None,
            "name": meaning or "unknown SXid %d" % code, "mnemonic": ("NVSWITCH_ERR_HW_" + mnemonic) if mnemonic else None,
            "class": klass, "message": None, "fatal": None, "fatal_from": None, "severity": None,
            "source": source or "not in fleetctl's SXid table", "seq": rec["seq"], "uptime_s": rec["uptime_s"],
            "raw": rec["message"][:1024]}


def _settle(event):
    """The event's fatal flag and severity: the driver's own word, else the table's class."""
    if event["fatal"] is None and event["class"] in ("fatal", "always_fatal", "non_fatal"):
        event["fatal"], event["fatal_from"] = event["class"] != "non_fatal", "table"
    event["severity"] = SXID_SEVERITY[event["fatal"]]
    return event


def sxid_events(records, since_seq=None):
    """NVSwitch SXid errors among kernel log records, one event per error (its Severity and Data lines folded in)."""
    events, last = [], {}  # (device, code) -> the latest event of that switch and code
    for rec in records:
        if since_seq is not None and rec["seq"] is not None and rec["seq"] <= since_seq:
            continue
        m = _SXID.search(rec["message"])
        if not m:
            continue
        rest = m.group("rest").strip()
        key = (m.group("device"), int(m.group("code")))
        headline, severity = _SXID_HEADLINE.match(rest), _SXID_SEVERITY.match(rest)
        open_event = last.get(key)
        if headline:
            event = _sxid_event(m, rec)
            event["fatal"], event["fatal_from"] = _SXID_WORD[headline.group("word")], "log"
            event["link"] = int(headline.group("link")) if headline.group("link") else None
            text = headline.group("text").strip()
            event["message"] = text[:-len("(First)")].strip() if text.endswith("(First)") else text
        elif severity and open_event is not None and not open_event.get("_severity_seen"):
            open_event["_severity_seen"] = True
            if open_event["fatal"] is None and severity.group("severity") in ("0", "1"):
                open_event["fatal"], open_event["fatal_from"] = severity.group("severity") == "1", "log"
            continue
        elif rest.startswith("Data {") and open_event is not None:
            continue
        else:  # a Severity or Data line of an error whose headline is not in the log (rotated out), or other text
            event = _sxid_event(m, rec)
            if severity:
                event["_severity_seen"] = True
                if severity.group("severity") in ("0", "1"):
                    event["fatal"], event["fatal_from"] = severity.group("severity") == "1", "log"
            elif not rest.startswith("Data {"):
                event["message"] = rest[:512]
        events.append(event)
        last[key] = event
    for event in events:
        event.pop("_severity_seen", None)
        _settle(event)
    return events
