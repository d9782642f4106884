"""facts.interconnect (docs/interconnect.md): the nvidia-smi readers against the real 2x H200 captures
(tests/testdata/h200x2-580.159.04), expected values taken from a second view of the same capture (the raw text, the
`nvidia-smi -q` report, `nvlink -c`, `topo -p2p`), not from the code under test; the NVML reader against a fake
pynvml that answers as the real NVML does (and dies, like the real library, when the fabric struct is passed by
value); the collector on both paths; the schema."""
import copy
import importlib.util
import ctypes
import json
import re
import sys
import types
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_gpus as gpus_utils
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_interconnect as ic

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests" / "testdata" / "h200x2-580.159.04"
SCHEMA = json.loads((REPO / "schemas" / "host-facts.schema.json").read_text())
ERROR_KEY = re.compile(SCHEMA["properties"]["errors"]["propertyNames"]["pattern"])
INTERCONNECT = Draft202012Validator({"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"],
                                     **SCHEMA["properties"]["interconnect"]})


def sections():
    """nvidia-smi-interconnect.txt: "===== ARGS" -> output (the capture's own "rc=N" line cut off)."""
    text = (H200 / "nvidia-smi-interconnect.txt").read_text()
    out = {}
    for part in re.split(r"^===== ", text, flags=re.M)[1:]:
        head, _, body = part.partition("\n")
        m = re.search(r"\nrc=(\d+)\n?$", body)
        out[head] = (body[:m.start() + 1] if m else body, int(m.group(1)) if m else None)
    return out


SMI = sections()
XML = (H200 / "nvidia-smi-q-x.xml").read_text()


def smi(args):
    body, rc = SMI["nvidia-smi " + args]
    assert rc == 0
    return body


def q_report():
    """`nvidia-smi -q` per GPU: bus id -> {Fabric key: value}."""
    gpus, current, in_fabric = {}, None, False
    for line in smi("-q").splitlines():
        m = re.match(r"^GPU ([0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7])$", line)
        if m:
            current, in_fabric = m.group(1).lower(), False
            gpus[current] = {}
            continue
        if line.strip() == "Fabric":
            in_fabric = True
            continue
        if in_fabric:
            m = re.match(r"^ {8}(\w[\w ]*?)\s+: (.*)$", line)
            if m:
                gpus[current][m.group(1)] = m.group(2).strip()
            elif not line.startswith(" " * 9):
                in_fabric = False
    return gpus


def check_schema(interconnect):
    errors = sorted(INTERCONNECT.iter_errors(interconnect), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join("%s: %s" % ("/".join(map(str, e.absolute_path)), e.message) for e in errors)


# ---- nvidia-smi on the real 2x H200 ---------------------------------------------------------------------------

def test_capture_is_what_the_readme_says():
    assert "CUDA Version        : 13.0" in SMI["uname"][0] and "DRIVER version      : 580.159.04" in SMI["uname"][0]
    assert SMI["nvidia-smi -q -d FABRIC"][1] == 2  # not a display flag: fabric comes from -q -x
    assert "No such file or directory" in SMI["modules"][0] and "peermem" not in SMI["modules"][0].split("ls:")[0]


def test_a_gpu_whose_links_are_all_inactive_lists_none_and_is_no_parse_problem():
    """The real capture with GPU 1's link lines replaced by what nvidia-smi prints for a GPU whose every link is
    inactive (a PCIe board without bridges; also reported for B200s in the wild)."""
    raw = smi("nvlink -s")
    head, gpu1 = raw.split("GPU 1: ")
    header = gpu1.splitlines()[0]
    text = head + "GPU 1: " + header + "\n\t NVML: Unable to retrieve NVLink information as all links are inActive\n"
    links, problems = ic.parse_nvlink_status(text)
    assert problems == {} and links[1] == [] and len(links[0]) == 18


def test_nvlink_status_equals_the_capture():
    links, problems = ic.parse_nvlink_status(smi("nvlink -s"))
    assert problems == {}
    raw = smi("nvlink -s")
    supported = smi("nvlink -c")  # "Link N, Link is supported: true" per link and GPU: a second view
    for gpu in (0, 1):
        block = raw.split("GPU %d: " % gpu)[1].split("GPU %d: " % (gpu + 1))[0]
        speeds = re.findall(r"Link (\d+): ([\d.]+) GB/s", block)
        assert [(l["link"], l["gbps"]) for l in links[gpu]] == [(int(k), float(v)) for k, v in speeds]
        assert len(speeds) == 18 and {v for _, v in speeds} == {"26.562"}
        caps = supported.split("GPU %d: " % gpu)[1].split("GPU %d: " % (gpu + 1))[0]
        assert len(re.findall(r"Link \d+, Link is supported: true", caps)) == len(links[gpu]) == 18
        assert {l["state"] for l in links[gpu]} == {"up"}


def test_nvlink_error_counters_equal_the_capture():
    counts, problems = ic.parse_nvlink_errors(smi("nvlink -e"))
    assert problems == {}
    raw = smi("nvlink -e")
    for gpu in (0, 1):
        block = raw.split("GPU %d: " % gpu)[1].split("GPU %d: " % (gpu + 1))[0]
        lines = re.findall(r"Link (\d+): (Replay|Recovery|CRC) Errors: (\d+)", block)
        assert len(lines) == 18 * 3
        assert sorted(counts[gpu]) == list(range(18))
        for link, name, value in lines:
            key = {"Replay": "replay", "Recovery": "recovery", "CRC": "crc"}[name]
            assert counts[gpu][int(link)][key] == int(value) == 0


def test_a_counter_line_printed_twice_is_one_counter():
    """Real nvidia-smi may print one counter line twice (the captures' README: link 2's Recovery Errors)."""
    raw = smi("nvlink -e")
    line = "\t Link 2: Recovery Errors: 0\n"
    assert raw.count(line) == 2  # once per GPU in this capture
    doubled = raw.replace(line, line + line, 1)
    assert ic.parse_nvlink_errors(doubled) == ic.parse_nvlink_errors(raw)
    differently = raw.replace(line, line + line.replace(": 0", ": 7"), 1)
    counts, problems = ic.parse_nvlink_errors(differently)
    assert "link 2 recovery printed twice, differently" in problems[0] and 1 not in problems


def test_topology_equals_the_capture():
    raw = smi("topo -m")
    assert "\x1b[4m" in raw  # the header row's ANSI underline, as the real tool prints it
    pairs = ic.parse_topo_matrix(raw)
    assert pairs == [{"gpus": [0, 1], "link": "NV18", "nvlinks": 18}]
    links, _ = ic.parse_nvlink_status(smi("nvlink -s"))
    assert pairs[0]["nvlinks"] == len(links[0]) == len(links[1])  # NV18: the 18 links up on each GPU
    p2p = smi("topo -p2p n")
    assert re.search(r"GPU0\s+X\s+OK", p2p) and re.search(r"GPU1\s+OK\s+X", p2p)


def test_fabric_equals_the_q_report():
    fabrics = ic.parse_smi_fabric(XML)
    report = q_report()
    _, gpus = gpus_utils.parse_smi_xml(XML)
    assert len(fabrics) == len(gpus) == len(report) == 2
    for (fabric, problem), gpu in zip(fabrics, gpus):
        seen = report[gpu["pci_bus_id"]]
        assert problem is None
        assert fabric == {"state": seen["State"].lower(), "status": seen["Status"].lower(),
                          "clique_id": int(seen["CliqueId"]), "cluster_uuid": seen["ClusterUUID"], "health_mask": None}
        assert fabric["state"] == "completed" and fabric["status"] == "success" and fabric["clique_id"] == 0
        assert fabric["cluster_uuid"] == "00000000-0000-0000-0000-000000000000"


def test_fabric_of_a_gpu_without_one_is_not_supported():
    """The real single H100 capture prints N/A throughout its <fabric>."""
    xml = (REPO / "tests" / "testdata" / "h100-580.159.04" / "nvidia-smi-q-x.xml").read_text()
    assert ic.parse_smi_fabric(xml) == [({"state": "not_supported", "status": None, "clique_id": None,
                                          "cluster_uuid": None, "health_mask": None}, None)]


@pytest.mark.parametrize("state, status, expected, problem", [
    ("In Progress", "N/A", {"state": "in_progress", "status": None}, None),
    ("Not Started", "N/A", {"state": "not_started", "status": None}, None),
    ("Completed", "Insufficient Resources", {"state": "completed", "status": "NVML_ERROR_INSUFFICIENT_RESOURCES"}, None),
    ("Completed", "Unknown Error", {"state": "completed", "status": "NVML_ERROR_UNKNOWN"}, None),
    ("Completed", "Something New", {"state": "completed", "status": None}, "unknown fabric status"),
])
def test_fabric_states_and_statuses(state, status, expected, problem):
    xml = XML.replace("<state>Completed</state>", "<state>%s</state>" % state, 1) \
             .replace("<status>Success</status>", "<status>%s</status>" % status, 1)
    fabric, why = ic.parse_smi_fabric(xml)[0]
    assert {k: fabric[k] for k in expected} == expected
    assert (why is None) if problem is None else (problem in why)


def test_fabric_of_an_unknown_state_is_null_with_a_reason():
    fabric, why = ic.parse_smi_fabric(XML.replace("<state>Completed</state>", "<state>Degraded</state>", 1))[0]
    assert fabric is None and "unknown fabric state 'Degraded'" in why
    no_fabric = re.sub(r"<fabric>.*?</fabric>", "", XML, count=1, flags=re.S)
    assert ic.parse_smi_fabric(no_fabric)[0] == (None, "nvidia-smi -q -x has no <fabric> for this GPU "
                                                       "(a driver without fabric info)")


def smi_facts(status=None, counters=None, topo=None, xml=XML):
    errors = {}
    _, gpus = gpus_utils.parse_smi_xml(xml)
    facts = ic.from_smi(gpus, xml, status or (smi("nvlink -s"), None), counters or (smi("nvlink -e"), None),
                        topo or (smi("topo -m"), None), errors, sys_module="/nonexistent")
    check_schema(facts)
    assert all(ERROR_KEY.match(k) for k in errors), errors
    return facts, errors


def test_smi_interconnect_of_the_real_h200s():
    facts, errors = smi_facts()
    assert errors == {}
    report = q_report()
    assert [g["pci_bus_id"] for g in facts["gpus"]] == list(report) == ["00000000:00:06.0", "00000000:00:07.0"]
    for gpu in facts["gpus"]:
        nvlink = gpu["nvlink"]
        assert (nvlink["supported"], nvlink["up"], nvlink["total"]) == (True, 18, 18)
        for link in nvlink["links"]:
            assert link["state"] == "up" and link["version"] is None  # nvidia-smi nvlink -s does not show it
            assert link["remote"] == {"type": None, "pci_bus_id": None}
            assert link["errors"] == {"replay": 0, "recovery": 0, "crc": 0, "crc_flit": None, "crc_data": None,
                                      "ecc_data": None, "recovery_failed": None, "symbol": None, "effective": None}
        assert gpu["fabric"]["state"] == "completed" and gpu["fabric"]["status"] == "success"
    assert facts["topology"] == [{"gpus": [0, 1], "link": "NV18", "nvlinks": 18}]
    assert facts["peermem_loaded"] is False


def test_smi_link_down_and_a_gpu_without_nvlink():
    status = smi("nvlink -s").replace("\t Link 5: 26.562 GB/s", "\t Link 5: <inactive>", 1)
    gpu1 = status.index("GPU 1: ")
    status = status[:gpu1] + status[gpu1:].split("\n", 1)[0] + "\n"  # GPU 1 lists no link: no NVLink
    facts, errors = smi_facts(status=(status, None))
    assert errors == {}
    g0, g1 = facts["gpus"]
    assert (g0["nvlink"]["up"], g0["nvlink"]["total"]) == (17, 18)
    assert g0["nvlink"]["links"][5]["state"] == "down"
    assert g1["nvlink"] == {"supported": False, "up": 0, "total": 0, "links": []}


@pytest.mark.parametrize("status, counters, topo, nulls", [
    (("", "nvidia-smi nvlink -s exited 3: Not Supported"), None, None, {"interconnect.gpus[0].nvlink",
                                                                         "interconnect.gpus[1].nvlink"}),
    (("garbage\n", None), None, None, {"interconnect.gpus[0].nvlink", "interconnect.gpus[1].nvlink"}),
    (("", None), None, None, {"interconnect.gpus[0].nvlink", "interconnect.gpus[1].nvlink"}),
    (None, ("", "nvidia-smi nvlink -e exited 1: x"), None, {"interconnect.gpus[0].nvlink",
                                                             "interconnect.gpus[1].nvlink"}),
    (None, None, ("", "nvidia-smi topo -m exited 2: x"), {"interconnect.topology"}),
    (None, None, ("\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tPIX\t X \n", None), {"interconnect.topology"}),
    (None, None, ("\tGPU0\tGPU1\nGPU0\t X \tNV18\n", None), {"interconnect.topology"}),
    (None, None, ("\tGPU0\tGPU1\nGPU0\t X \tQQQ\nGPU1\tQQQ\t X \n", None), {"interconnect.topology"}),
])
def test_smi_failures_are_errors_entries_never_guesses(status, counters, topo, nulls):
    facts, errors = smi_facts(status, counters, topo)
    assert set(errors) == nulls
    for key in nulls:
        if key == "interconnect.topology":
            assert facts["topology"] is None
        elif counters is not None:  # states read, counters not
            gpu = facts["gpus"][int(key.split("[")[1][0])]
            assert gpu["nvlink"]["up"] == 18
            assert {v for link in gpu["nvlink"]["links"] for v in link["errors"].values()} == {None}
        else:
            assert facts["gpus"][int(key.split("[")[1][0])]["nvlink"] is None


def test_smi_garbled_lines_name_the_gpu():
    status = smi("nvlink -s").replace("\t Link 17: 26.562 GB/s\nGPU 1", "\t Link 17: 26.5?? GB/s\nGPU 1", 1)
    facts, errors = smi_facts(status=(status, None))
    assert facts["gpus"][0]["nvlink"] is None and facts["gpus"][1]["nvlink"]["up"] == 18
    assert set(errors) == {"interconnect.gpus[0].nvlink"} and "Link 17: 26.5??" in errors["interconnect.gpus[0].nvlink"]
    counters = smi("nvlink -e").replace("Link 3: CRC Errors: 0", "Link 3: CRC Errors: lots", 1)
    facts, errors = smi_facts(counters=(counters, None))
    assert set(errors) == {"interconnect.gpus[0].nvlink"} and "unexpected value 'lots'" in errors[
        "interconnect.gpus[0].nvlink"]
    assert facts["gpus"][0]["nvlink"]["links"][3]["errors"]["crc"] is None


def test_topology_of_pcie_hosts_and_old_names():
    text = ("\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\n"
            "GPU0\t X \tPIX\tSOC\tNODE\t0-15\t0\n"
            "GPU1\tPIX\t X \tSYS\tNODE\t0-15\t0\n"
            "GPU2\tSYS\tSYS\t X \tSYS\t16-31\t1\n"
            "NIC0\tNODE\tNODE\tSYS\t X \n\nLegend:\n\n  X    = Self\n")
    assert ic.parse_topo_matrix(text) == [{"gpus": [0, 1], "link": "PIX", "nvlinks": 0},
                                          {"gpus": [0, 2], "link": "SYS", "nvlinks": 0},
                                          {"gpus": [1, 2], "link": "SYS", "nvlinks": 0}]


def test_peermem(tmp_path):
    assert ic.peermem_loaded(str(tmp_path)) is False
    (tmp_path / "nv_peermem").mkdir()
    assert ic.peermem_loaded(str(tmp_path)) is True
    (tmp_path / "nv_peermem").rmdir()
    (tmp_path / "nvidia_peermem").mkdir()
    assert ic.peermem_loaded(str(tmp_path)) is True


# ---- NVML: a fake pynvml with the real NVML's answers ----------------------------------------------------------

pynvml = pytest.importorskip("pynvml")  # a dependency of fleetctl: the real structs and constants


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {3: "Not Supported", 2: "Invalid Argument", 13: "Function Not Found", 15: "GPU is lost",
                999: "Unknown Error", 1: "Uninitialized"}.get(self.value, "NVML error %d" % self.value)


class Segfault(BaseException):
    """What the real library does with a struct passed by value: not an exception anyone may catch."""


FFFF = b"FFFFFFFF:FF:FF.0"
LINK_FIELDS = (161, 162, 163, 214, 219, 221)


def h200(pci, links=18, **kw):
    gpu = {"pci": pci, "links": [{"up": True, "version": pynvml.NVML_NVLINK_VERSION_4_0,
                                  "remote": pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, "remote_pci": FFFF,
                                  "counters": {0: 0, 1: 0, 2: 0, 3: 10, 4: 17}, "fields": {161: 0, 162: 0, 163: 0}}
                                 for _ in range(links)],
           "max_link_error": pynvml.NVML_ERROR_INVALID_ARGUMENT,
           "fabric": {"state": 3, "status": 0, "cliqueId": 0, "clusterUuid": [0] * 16, "healthMask": 0}}
    gpu.update(kw)
    return gpu


def l40s(pci):
    return {"pci": pci, "links": None, "fabric": "not_supported_error"}


class FakeNvml(types.SimpleNamespace):
    """pynvml as the collector uses it, answering like the real NVML: NOT_SUPPORTED for NVLink on a GPU without it,
    INVALID_ARGUMENT past a GPU's links, the real VM's FFFFFFFF:FF:FF.0 remote PCI id; the fabric struct must come
    by reference (by value the real library segfaults). Functions a test names in `missing` do not exist."""

    def __init__(self, gpus, missing=(), function_not_found=(), ancestor=pynvml.NVML_TOPOLOGY_NODE, broken=None):
        super().__init__()
        self.gpus, self.missing, self.function_not_found = gpus, set(missing), set(function_not_found)
        self.ancestor, self.broken = ancestor, broken or {}
        self.calls, self.initialized, self.inits = [], False, 0
        self.NVMLError = NVMLError
        for name in dir(pynvml):
            if (name.startswith(("NVML_", "c_nvml", "nvmlGpuFabricInfo")) and name not in self.missing):
                setattr(self, name, getattr(pynvml, name))

    def __getattribute__(self, name):
        if name.startswith("nvml") and name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)
        value = object.__getattribute__(self, name)
        if name.startswith("nvmlDevice") or name.startswith("nvmlSystem"):
            object.__getattribute__(self, "calls").append(name)
            if not object.__getattribute__(self, "initialized"):
                raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            if name in object.__getattribute__(self, "function_not_found"):
                def absent(*args):
                    raise NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
                return absent
        return value

    def __getattr__(self, name):  # NvmlReader's per-GPU health calls: not what these tests are about
        if name.startswith("nvml") and name not in self.missing:
            def unsupported(*args):
                raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return unsupported
        raise AttributeError(name)

    def nvmlInit(self):
        self.initialized, self.inits = True, self.inits + 1

    def nvmlShutdown(self):
        self.initialized = False

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.gpus[i] == "lost":
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.gpus[i]

    def nvmlDeviceGetPciInfo(self, h):
        return types.SimpleNamespace(busId=h["pci"].upper().encode())

    def _link(self, h, link):
        if h["links"] is None:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(h["links"]):
            raise NVMLError(h["max_link_error"])
        return h["links"][link]

    def _maybe_broken(self, name, link):
        if (name, link) in self.broken:
            raise NVMLError(self.broken[(name, link)])

    def nvmlDeviceGetNvLinkState(self, h, link):
        self._maybe_broken("state", link)
        return 1 if self._link(h, link)["up"] else 0

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return self._link(h, link)["version"]

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        entry = self._link(h, link)
        assert entry["up"], "remote of a down link asked"
        return entry["remote"]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        entry = self._link(h, link)
        assert entry["up"], "remote of a down link asked"
        return types.SimpleNamespace(busId=entry["remote_pci"])

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        self._maybe_broken("counter", link)
        counters = self._link(h, link)["counters"]
        if counter not in counters:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # H100/H200: no DL ECC data counter
        return counters[counter]

    def nvmlDeviceGetFieldValues(self, h, ids):
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for value, field_id in zip(values, ids):
            field, link = field_id if isinstance(field_id, tuple) else (field_id, 0)
            value.fieldId, value.scopeId = field, link
            if field == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:  # 18 on the real H200 (the NVML dump)
                count = h.get("link_count", len(h["links"] or []))
                if h["links"] is None or count is None:
                    value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                else:
                    value.nvmlReturn, value.valueType = 0, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                    value.value.uiVal = count
                continue
            if field not in LINK_FIELDS:  # GPU-wide fields (recovery action): not this fake's business
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            fields = self._link(h, link)["fields"]
            if isinstance(fields.get(field), NVMLError):
                value.nvmlReturn = fields[field].value
            elif field in fields:
                value.nvmlReturn, value.valueType = 0, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = fields[field]
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def _fabric(self, h, arg, struct):
        if not isinstance(arg, type(ctypes.byref(ctypes.c_int()))):
            raise Segfault("the fabric struct was passed by value: the real library reads it as a pointer")
        info = arg._obj
        assert isinstance(info, struct)
        if h["fabric"] == "not_supported_error":
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if hasattr(info, "version") and info.version != pynvml.nvmlGpuFabricInfo_v2:
            raise NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        answer = h.get("fabric_legacy", h["fabric"]) if struct is pynvml.c_nvmlGpuFabricInfo_t else h["fabric"]
        for field, value in answer.items():
            if field == "clusterUuid":
                info.clusterUuid[:] = value
            elif hasattr(info, field):
                setattr(info, field, value)
        return 0

    def nvmlDeviceGetGpuFabricInfoV(self, h, arg):
        return self._fabric(h, arg, pynvml.c_nvmlGpuFabricInfoV_t)

    def nvmlDeviceGetGpuFabricInfo(self, h, arg):
        return self._fabric(h, arg, pynvml.c_nvmlGpuFabricInfo_t)

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.ancestor


def nvml_facts(fake):
    errors = {}
    fake.nvmlInit()
    try:
        facts = ic.NvmlInterconnect(fake, errors, sys_module="/nonexistent").read()
    finally:
        fake.nvmlShutdown()
    if facts is not None:
        check_schema(facts)
    assert all(ERROR_KEY.match(k) for k in errors), errors
    return facts, errors


def test_the_fake_dies_on_a_struct_by_value_like_the_real_library():
    fake = FakeNvml([h200("00000000:00:06.0")])
    fake.nvmlInit()
    with pytest.raises(Segfault):
        fake.nvmlDeviceGetGpuFabricInfoV(fake.gpus[0], pynvml.c_nvmlGpuFabricInfoV_t())
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    fake.nvmlDeviceGetGpuFabricInfoV(fake.gpus[0], ctypes.byref(info))
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED


def test_nvml_h200_pair_reads_as_nvidia_smi_shows_it():
    facts, errors = nvml_facts(FakeNvml([h200("00000000:00:06.0"), h200("00000000:00:07.0")]))
    assert errors == {}
    smi_view, _ = smi_facts()
    assert facts["topology"] == smi_view["topology"] == [{"gpus": [0, 1], "link": "NV18", "nvlinks": 18}]
    for gpu, seen in zip(facts["gpus"], smi_view["gpus"]):
        assert gpu["pci_bus_id"] == seen["pci_bus_id"]
        assert {k: gpu["nvlink"][k] for k in ("supported", "up", "total")} == \
               {k: seen["nvlink"][k] for k in ("supported", "up", "total")} == {"supported": True, "up": 18, "total": 18}
        for link, seen_link in zip(gpu["nvlink"]["links"], seen["nvlink"]["links"]):
            assert link["state"] == seen_link["state"] == "up"
            assert link["version"] == "4.0"
            assert link["remote"] == {"type": "switch", "pci_bus_id": None}  # FFFFFFFF:FF:FF.0: the VM hides them
            assert link["errors"] == {"replay": 0, "recovery": 0, "crc": 0, "crc_flit": 0, "crc_data": 10,
                                      "ecc_data": 17, "recovery_failed": None, "symbol": None, "effective": None}
            assert {k: link["errors"][k] for k in ("replay", "recovery", "crc")} == \
                   {k: seen_link["errors"][k] for k in ("replay", "recovery", "crc")}
        assert gpu["fabric"] == dict(seen["fabric"], health_mask=0)
    assert facts["peermem_loaded"] is False


DUMP = json.loads((H200 / "nvml-interconnect-machine2.json").read_text())


def from_dump(gpu):
    """One GPU of the real NVML dump (a second 2x H200 machine) as the fake's GPU: every NVLink answer as NVML gave it."""
    links = []
    for link in gpu["links"]:
        fields = {}
        for name, (ret, value) in link["fields"].items():
            field = getattr(pynvml, name, None)
            if field in LINK_FIELDS and ret == 0:
                fields[field] = int(value)
            elif field in LINK_FIELDS and ret != pynvml.NVML_ERROR_NOT_SUPPORTED:
                fields[field] = NVMLError(ret)
        links.append({"up": bool(link["state"]), "version": link["version"], "remote": link["remote_type"],
                      "remote_pci": link["remote_pci"].encode(),
                      "counters": {int(k): v for k, v in link["errors"].items() if isinstance(v, int)},
                      "fields": fields})

    def fabric(answer):
        return {"state": answer["state"], "status": answer["status"], "cliqueId": answer["cliqueId"],
                "clusterUuid": list(bytes.fromhex(answer["clusterUuid"]))[:16], "healthMask": answer["healthMask"] or 0}
    return {"pci": gpu["pci_bus_id"], "links": links, "max_link_error": pynvml.NVML_ERROR_INVALID_ARGUMENT,
            "fabric": fabric(gpu["nvmlDeviceGetGpuFabricInfoV"]),
            "fabric_legacy": fabric(gpu["nvmlDeviceGetGpuFabricInfo"])}


def test_nvml_reading_of_the_real_nvml_answers_equals_nvidia_smi():
    """The real H200 NVML answers (machine 2) read as nvidia-smi shows the same kind of machine (machine 1): 18 links
    up, replay/recovery/crc 0, fabric completed; the legacy data counters kept as facts (non-zero on healthy links)."""
    assert DUMP["driver"] == "580.159.04" and len(DUMP["gpus"]) == 2
    facts, errors = nvml_facts(FakeNvml([from_dump(g) for g in DUMP["gpus"]],
                                        ancestor=DUMP["pairs"][0]["common_ancestor"]))
    assert errors == {}
    smi_view, _ = smi_facts()
    assert facts["topology"] == smi_view["topology"] == [{"gpus": [0, 1], "link": "NV18", "nvlinks": 18}]
    for gpu, seen, dump in zip(facts["gpus"], smi_view["gpus"], DUMP["gpus"]):
        assert gpu["pci_bus_id"] == dump["pci_bus_id"].lower() == seen["pci_bus_id"]
        assert {k: gpu["nvlink"][k] for k in ("supported", "up", "total")} == \
               {k: seen["nvlink"][k] for k in ("supported", "up", "total")}
        for link, seen_link, raw in zip(gpu["nvlink"]["links"], seen["nvlink"]["links"], dump["links"]):
            assert link["version"] == "4.0" and link["remote"] == {"type": "switch", "pci_bus_id": None}
            judged = {k: link["errors"][k] for k in ("replay", "recovery", "crc")}
            assert judged == {k: seen_link["errors"][k] for k in judged} == {"replay": 0, "recovery": 0, "crc": 0}
            assert (link["errors"]["crc_flit"], link["errors"]["crc_data"], link["errors"]["ecc_data"]) == \
                   (raw["errors"]["2"], raw["errors"]["3"], raw["errors"]["4"])
            assert (link["errors"]["recovery_failed"], link["errors"]["symbol"], link["errors"]["effective"]) == \
                   (None, None, None)  # NOT_SUPPORTED on this driver
        assert gpu["fabric"] == dict(seen["fabric"], health_mask=0)
    legacy = [link["errors"]["crc_data"] for g in facts["gpus"] for link in g["nvlink"]["links"]]
    assert max(legacy) > 0  # why these are facts and not judged


def test_nvml_legacy_fabric_call_only_where_v_is_missing():
    """On the real H200 the legacy call answers state 0 (not supported) where V answers completed."""
    facts, errors = nvml_facts(FakeNvml([from_dump(DUMP["gpus"][0])], missing=("nvmlDeviceGetGpuFabricInfoV",)))
    assert errors == {} and facts["gpus"][0]["fabric"]["state"] == "not_supported"
    facts, _ = nvml_facts(FakeNvml([from_dump(DUMP["gpus"][0])]))
    assert facts["gpus"][0]["fabric"]["state"] == "completed"


def test_nvml_without_field_values_the_judged_counters_are_the_legacy_ones():
    gpu = h200("00000000:18:00.0", links=2)
    for link in gpu["links"]:
        link["fields"] = {}
        link["counters"] = {0: 1, 1: 2, 2: 3, 3: 40, 4: 50}
    gpu["links"][1]["fields"] = {161: NVMLError(pynvml.NVML_ERROR_UNKNOWN), 214: NVMLError(pynvml.NVML_ERROR_UNKNOWN)}
    facts, errors = nvml_facts(FakeNvml([gpu]))
    for link in facts["gpus"][0]["nvlink"]["links"]:
        assert link["errors"] == {"replay": 1, "recovery": 2, "crc": 3, "crc_flit": 3, "crc_data": 40, "ecc_data": 50,
                                  "recovery_failed": None, "symbol": None, "effective": None}
    # An odd answer for a judged field falls back quietly; for recovery_failed (no fallback) it is an error.
    assert errors == {"interconnect.gpus[0].nvlink": "link 1 recovery_failed: NVML return NVML_ERROR_UNKNOWN"}


def test_nvml_gpu_without_nvlink_and_without_fabric():
    facts, errors = nvml_facts(FakeNvml([l40s("00000000:01:00.0"), l40s("00000000:81:00.0")],
                                        ancestor=pynvml.NVML_TOPOLOGY_SYSTEM))
    assert errors == {}
    for gpu in facts["gpus"]:
        assert gpu["nvlink"] == {"supported": False, "up": 0, "total": 0, "links": []}
        assert gpu["fabric"] == {"state": "not_supported", "status": None, "clique_id": None, "cluster_uuid": None,
                                 "health_mask": None}
    assert facts["topology"] == [{"gpus": [0, 1], "link": "SYS", "nvlinks": 0}]


@pytest.mark.parametrize("level, shown", [(pynvml.NVML_TOPOLOGY_INTERNAL, "PIX"), (pynvml.NVML_TOPOLOGY_SINGLE, "PIX"),
                                          (pynvml.NVML_TOPOLOGY_MULTIPLE, "PXB"), (pynvml.NVML_TOPOLOGY_HOSTBRIDGE, "PHB"),
                                          (pynvml.NVML_TOPOLOGY_NODE, "NODE"), (pynvml.NVML_TOPOLOGY_SYSTEM, "SYS")])
def test_nvml_pcie_relations(level, shown):
    facts, _ = nvml_facts(FakeNvml([l40s("00000000:01:00.0"), l40s("00000000:02:00.0")], ancestor=level))
    assert facts["topology"] == [{"gpus": [0, 1], "link": shown, "nvlinks": 0}]


def test_nvml_hopper_without_fabric_says_not_supported_in_the_struct():
    gpu = h200("00000000:01:00.0", links=0, fabric={"state": 0, "status": 0, "cliqueId": 0, "clusterUuid": [0] * 16,
                                                     "healthMask": 0})
    gpu["links"] = None  # an H100 PCIe without a bridge
    facts, errors = nvml_facts(FakeNvml([gpu]))
    assert errors == {} and facts["topology"] == []
    assert facts["gpus"][0]["fabric"] == {"state": "not_supported", "status": None, "clique_id": None,
                                          "cluster_uuid": None, "health_mask": None}


def test_nvml_without_any_fabric_call():
    fake = FakeNvml([h200("00000000:00:06.0")], missing=("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"))
    facts, errors = nvml_facts(fake)
    assert facts["gpus"][0]["fabric"] is None and facts["gpus"][0]["nvlink"]["up"] == 18
    assert errors == {"interconnect.gpus[0].fabric": "this pynvml has no fabric call (nvmlDeviceGetGpuFabricInfoV, "
                                                     "nvmlDeviceGetGpuFabricInfo): install nvidia-ml-py >= 12.535 on "
                                                     "the host"}


def test_nvml_older_binding_or_driver_falls_back_to_the_unversioned_fabric_call():
    for fake in (FakeNvml([h200("00000000:00:06.0")], missing=("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t")),
                 FakeNvml([h200("00000000:00:06.0")], function_not_found=("nvmlDeviceGetGpuFabricInfoV",))):
        facts, errors = nvml_facts(fake)
        assert errors == {}
        assert facts["gpus"][0]["fabric"] == {"state": "completed", "status": "success", "clique_id": 0,
                                              "cluster_uuid": "00000000-0000-0000-0000-000000000000",
                                              "health_mask": None}  # no health mask without the V call
    fake = FakeNvml([h200("00000000:00:06.0")], function_not_found=("nvmlDeviceGetGpuFabricInfoV",
                                                                    "nvmlDeviceGetGpuFabricInfo"))
    facts, errors = nvml_facts(fake)  # a driver from before fabric registration: no state to judge, no error
    assert errors == {} and facts["gpus"][0]["fabric"] == {"state": "not_supported", "status": None, "clique_id": None,
                                                           "cluster_uuid": None, "health_mask": None}


@pytest.mark.parametrize("state, status, expected", [
    (1, 0, {"state": "not_started", "status": None, "clique_id": None, "cluster_uuid": None, "health_mask": 0}),
    (2, 0, {"state": "in_progress", "status": None, "clique_id": None, "cluster_uuid": None, "health_mask": 0}),
    (3, pynvml.NVML_ERROR_NOT_READY, {"state": "completed", "status": "NVML_ERROR_NOT_READY", "clique_id": 7,
                                      "cluster_uuid": "0f0e0d0c-0b0a-0908-0706-050403020100", "health_mask": 0}),
])
def test_nvml_fabric_states(state, status, expected):
    gpu = h200("00000000:00:06.0", fabric={"state": state, "status": status, "cliqueId": 7,
                                            "clusterUuid": list(range(15, -1, -1)), "healthMask": 0})
    facts, errors = nvml_facts(FakeNvml([gpu]))
    assert errors == {} and facts["gpus"][0]["fabric"] == expected


def test_nvml_link_down_counters_and_remote_gpus():
    a, b = h200("00000000:18:00.0"), h200("00000000:2a:00.0")
    a["links"][3]["up"] = False
    a["links"][1]["fields"][161] = 5  # replay
    a["links"][1]["fields"][163] = 3  # crc
    a["links"][1]["counters"][0] = 99  # the legacy replay counter: not asked when the field value answers
    a["links"][2]["fields"][214] = 2  # recovery failed
    facts, errors = nvml_facts(FakeNvml([a, b]))
    assert errors == {}
    links = facts["gpus"][0]["nvlink"]["links"]
    assert (facts["gpus"][0]["nvlink"]["up"], facts["gpus"][0]["nvlink"]["total"]) == (17, 18)
    assert links[3]["state"] == "down" and links[3]["remote"] == {"type": None, "pci_bus_id": None}
    assert links[1]["errors"]["replay"] == 5 and links[1]["errors"]["crc"] == 3 and links[1]["errors"]["crc_flit"] == 0
    assert links[2]["errors"]["recovery_failed"] == 2
    assert facts["topology"] == [{"gpus": [0, 1], "link": "NV17", "nvlinks": 17}]  # min of the switch links up


def test_nvml_direct_links_between_gpus():
    """Two GPUs bridged to each other (no NVSwitch): remote type gpu with the peer's PCI id."""
    a, b = h200("00000000:18:00.0", links=4), h200("00000000:2a:00.0", links=4)
    for gpu, peer in ((a, b), (b, a)):
        for link in gpu["links"]:
            link["remote"], link["remote_pci"] = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, peer["pci"].upper().encode()
    c = l40s("00000000:3a:00.0")
    facts, errors = nvml_facts(FakeNvml([a, b, c], ancestor=pynvml.NVML_TOPOLOGY_HOSTBRIDGE))
    assert errors == {}
    assert facts["gpus"][0]["nvlink"]["links"][0]["remote"] == {"type": "gpu", "pci_bus_id": "00000000:2a:00.0"}
    assert facts["topology"] == [{"gpus": [0, 1], "link": "NV4", "nvlinks": 4},
                                 {"gpus": [0, 2], "link": "PHB", "nvlinks": 0},
                                 {"gpus": [1, 2], "link": "PHB", "nvlinks": 0}]


def test_nvml_link_to_a_gpu_without_pci_id_is_no_topology_guess():
    a, b = h200("00000000:18:00.0", links=2), h200("00000000:2a:00.0", links=2)
    for link in a["links"] + b["links"]:
        link["remote"] = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU  # remote PCI FFFFFFFF:FF:FF.0
    facts, errors = nvml_facts(FakeNvml([a, b]))
    assert facts["topology"] is None and facts["gpus"][0]["nvlink"]["up"] == 2
    assert "far end NVML does not name" in errors["interconnect.topology"]


def test_nvml_remote_types():
    gpu = h200("00000000:18:00.0", links=4)
    for link, kind in zip(gpu["links"], (0, 1, 2, 0xFF)):
        link["remote"] = kind
    gpu["links"][2]["remote_pci"] = b"00000000:05:00.0"
    facts, _ = nvml_facts(FakeNvml([gpu]))
    assert [l["remote"]["type"] for l in facts["gpus"][0]["nvlink"]["links"]] == ["gpu", "other", "switch", "other"]
    assert facts["gpus"][0]["nvlink"]["links"][2]["remote"]["pci_bus_id"] == "00000000:05:00.0"


def test_nvml_link_count_ends_however_nvml_says_so():
    gpu = h200("00000000:18:00.0", links=12, max_link_error=pynvml.NVML_ERROR_NOT_SUPPORTED)  # an A100
    facts, errors = nvml_facts(FakeNvml([gpu]))
    assert errors == {} and facts["gpus"][0]["nvlink"]["total"] == 12


def test_nvml_links_past_the_count_nvml_gives_are_not_links_whatever_they_answer():
    """pynvml 13 says NVML_NVLINK_MAX_LINKS 36; a 580 driver's GPU has 18 (NVML_FI_DEV_NVLINK_LINK_COUNT)."""
    gpu = h200("00000000:18:00.0", max_link_error=pynvml.NVML_ERROR_UNKNOWN)
    facts, errors = nvml_facts(FakeNvml([gpu]))
    assert errors == {} and facts["gpus"][0]["nvlink"]["total"] == 18
    gpu["link_count"] = None  # NVML does not say how many: an odd answer is then an error, not a missing link
    facts, errors = nvml_facts(FakeNvml([gpu]))
    assert facts["gpus"][0]["nvlink"] is None
    assert errors["interconnect.gpus[0].nvlink"] == "link 18 state: NVML: Unknown Error"


def test_nvml_read_failures_are_errors_entries():
    a, b = h200("00000000:18:00.0"), h200("00000000:2a:00.0")
    facts, errors = nvml_facts(FakeNvml([a, b], broken={("counter", 4): pynvml.NVML_ERROR_UNKNOWN}))
    assert facts["gpus"][0]["nvlink"]["links"][4]["errors"]["crc_data"] is None
    assert facts["gpus"][0]["nvlink"]["links"][4]["errors"]["replay"] == 0  # from its field value
    assert facts["topology"] is not None
    # The legacy counters are evidence only when the judged ones came from the field values: null, no error (a
    # driver deprecating the old call must not make every link unread). Without field values they are the source.
    assert errors == {}
    facts, errors = nvml_facts(FakeNvml([a, b], broken={("counter", 4): pynvml.NVML_ERROR_UNKNOWN},
                                        function_not_found=("nvmlDeviceGetFieldValues",)))
    assert set(errors) == {"interconnect.gpus[0].nvlink", "interconnect.gpus[1].nvlink"}
    assert errors["interconnect.gpus[0].nvlink"].startswith("link 4 replay errors: NVML: Unknown Error; ")
    assert "crc_data" not in errors["interconnect.gpus[0].nvlink"]
    assert len(errors["interconnect.gpus[0].nvlink"]) <= 600
    facts, errors = nvml_facts(FakeNvml([a, b], broken={("state", 0): pynvml.NVML_ERROR_UNKNOWN}))
    assert [g["nvlink"] for g in facts["gpus"]] == [None, None] and facts["topology"] is None
    assert set(errors) == {"interconnect.gpus[0].nvlink", "interconnect.gpus[1].nvlink", "interconnect.topology"}
    facts, errors = nvml_facts(FakeNvml([a], function_not_found=("nvmlDeviceGetNvLinkState",)))
    assert facts["gpus"][0]["nvlink"] is None
    assert errors == {"interconnect.gpus[0].nvlink": "this driver's NVML has no nvmlDeviceGetNvLinkState"}


def test_nvml_counters_a_driver_lacks_are_null_without_errors():
    fake = FakeNvml([h200("00000000:18:00.0")], function_not_found=("nvmlDeviceGetNvLinkErrorCounter",
                                                                     "nvmlDeviceGetFieldValues"))
    facts, errors = nvml_facts(fake)
    assert errors == {}
    assert {v for link in facts["gpus"][0]["nvlink"]["links"] for v in link["errors"].values()} == {None}
    fake = FakeNvml([h200("00000000:18:00.0")])

    def without_scope(h, ids):  # nvidia-ml-py before scopeId: values[i].fieldId = (field, link) -> TypeError
        raise TypeError("an integer is required")
    fake.nvmlDeviceGetFieldValues = without_scope
    facts, errors = nvml_facts(fake)
    assert errors == {} and facts["gpus"][0]["nvlink"]["links"][0]["errors"]["symbol"] is None


def test_nvml_lost_gpu():
    """A GPU off the bus is a fact (gpu.count fails on it), not an unread interconnect: no errors, no pairs."""
    facts, errors = nvml_facts(FakeNvml([h200("00000000:18:00.0"), "lost", h200("00000000:2a:00.0")]))
    assert facts["gpus"][1] == {"index": 1, "pci_bus_id": None, "lost": True, "nvlink": None, "fabric": None}
    assert facts["topology"] == [{"gpus": [0, 2], "link": "NV18", "nvlinks": 18}]
    assert errors == {}


def test_nvml_one_gpu_and_no_gpu():
    facts, errors = nvml_facts(FakeNvml([h200("00000000:18:00.0")]))
    assert errors == {} and facts["topology"] == []
    facts, errors = nvml_facts(FakeNvml([]))
    assert facts == {"gpus": [], "topology": [], "peermem_loaded": False} and errors == {}


# ---- the real pynvml wrappers, their C calls answered by Python -----------------------------------------------

# ---- what `fleetctl check` asks NVML (issue 45) ----------------------------------------------------------------

def hgx(gpus=4):
    """An HGX node: GPUS H200s, 18 links each to the NVSwitches, the fake's real-H200 answers, odd counters here and
    there (so that a value read from the wrong place shows)."""
    nodes = [h200("00000000:%02x:00.0" % (0x18 + 0x10 * g)) for g in range(gpus)]
    for g, gpu in enumerate(nodes):
        for k, link in enumerate(gpu["links"]):
            link["counters"] = {0: 0, 1: 0, 2: g + k, 3: 10 * g + k, 4: 17 + k}
            link["fields"] = {161: k % 3, 162: g, 163: (g * k) % 5, 214: 0}
    nodes[1]["links"][5]["up"] = False
    return nodes


def check_facts(fake, cache, boot_id, evidence=False):
    """facts.interconnect as `fleetctl check` reads it (the table: no evidence counters; a per-boot cache), and the
    NVML calls it made, by name."""
    errors = {}
    fake.calls.clear()
    fake.nvmlInit()
    try:
        facts = ic.NvmlInterconnect(fake, errors, sys_module="/nonexistent", evidence=evidence, cache=str(cache),
                                    boot_id_path=str(boot_id)).read()
    finally:
        fake.nvmlShutdown()
    check_schema(facts)
    calls = {}
    for name in fake.calls:
        calls[name] = calls.get(name, 0) + 1
    return facts, errors, calls


def without_evidence(facts):
    facts = copy.deepcopy(facts)
    for gpu in facts["gpus"]:
        for link in gpu["nvlink"]["links"]:
            link["errors"].update(crc_flit=None, crc_data=None, ecc_data=None)
    return facts


def test_check_asks_nvml_a_fraction_of_what_the_audit_asks_and_reads_the_same(tmp_path):
    """4 GPUs x 18 links: the audit's reading (every counter, every link's version and remote end asked) against
    check's, first of the boot and after: the same facts but the evidence counters, in far fewer calls."""
    boot = tmp_path / "boot_id"
    boot.write_text("5b3e1c7a-0001\n")
    fake = FakeNvml(hgx(4))
    fake.nvmlInit()
    audit, errors = nvml_facts(fake)
    audit_calls = len(fake.calls)
    assert errors == {} and audit["gpus"][2]["nvlink"]["links"][7]["errors"]["crc_data"] == 27
    first, errors, calls = check_facts(fake, tmp_path / "cache" / "nvlink.json", boot)
    assert errors == {} and first == without_evidence(audit)
    assert "nvmlDeviceGetNvLinkErrorCounter" not in calls  # the judged counters came with the field values
    assert calls["nvmlDeviceGetNvLinkState"] == 4 * 18  # not past the 18 links NVML counts
    again, errors, calls = check_facts(fake, tmp_path / "cache" / "nvlink.json", boot)
    assert errors == {} and again == first
    assert not [name for name in calls if name.startswith(("nvmlDeviceGetNvLinkVersion", "nvmlDeviceGetNvLinkRemote",
                                                          "nvmlDeviceGetNvLinkErrorCounter"))]
    assert sum(calls.values()) <= audit_calls // 5, (sum(calls.values()), audit_calls)
    shown, errors, calls = check_facts(fake, tmp_path / "cache" / "nvlink.json", boot, evidence=True)
    assert shown == audit and calls["nvmlDeviceGetNvLinkErrorCounter"] == 4 * 18 * 3  # check --format json


def test_check_per_boot_cache_is_of_one_boot_and_never_an_error(tmp_path):
    """The links' versions and remote ends are asked once a boot: a rewired link shows after the next boot, not
    before; a cache of another boot, garbled or unreadable is read again, without an error."""
    boot, cache = tmp_path / "boot_id", tmp_path / "nvlink.json"
    boot.write_text("boot-1\n")
    gpus = hgx(2)
    fake = FakeNvml(gpus)
    first, errors, _ = check_facts(fake, cache, boot)
    assert errors == {} and first["gpus"][0]["nvlink"]["links"][0]["remote"] == {"type": "switch", "pci_bus_id": None}
    for link in gpus[0]["links"]:  # the node rewired: GPU 0 bridged straight to GPU 1
        link["remote"], link["remote_pci"] = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, gpus[1]["pci"].upper().encode()
    same_boot, errors, _ = check_facts(fake, cache, boot)
    assert errors == {} and same_boot == first
    boot.write_text("boot-2\n")
    rebooted, errors, calls = check_facts(fake, cache, boot)
    assert errors == {} and calls["nvmlDeviceGetNvLinkRemoteDeviceType"] == 18 + 17
    assert rebooted["gpus"][0]["nvlink"]["links"][0]["remote"] == {"type": "gpu", "pci_bus_id": "00000000:28:00.0"}
    for garbage in (b"\xff\x00 not json", b"[]", b'{"boot_id": "boot-2", "gpus": {"x": {"0": {"version": "6"}}}}',
                    b'{"boot_id": "boot-2", "gpus": {"x": {"0": {"remote_pci": 5}}}}', b"{" * 100000):
        cache.write_bytes(garbage)
        facts, errors, calls = check_facts(fake, cache, boot)
        assert errors == {} and facts == rebooted and calls["nvmlDeviceGetNvLinkVersion"] == 2 * 18, garbage[:40]
    cache.unlink()
    cache.mkdir()  # unreadable, and cannot be written: asked every time
    facts, errors, calls = check_facts(fake, cache, boot)
    assert errors == {} and facts == rebooted and calls["nvmlDeviceGetNvLinkVersion"] == 2 * 18
    cache.rmdir()
    facts, errors, calls = check_facts(fake, cache, tmp_path / "no-boot-id")  # no boot id: no cache
    assert errors == {} and facts == rebooted and not cache.exists()


def test_real_pynvml_wrappers_get_the_fabric_struct_and_link_scopes_by_reference(monkeypatch):
    """pynvml's nvmlDeviceGetGpuFabricInfoV hands its argument to C unchanged: a C function that takes a pointer
    gets one only because fleetctl passes ctypes.byref (a struct there is refused by ctypes here, and read as a
    pointer by the real library: SIGSEGV). nvmlDeviceGetFieldValues sends (field, link) pairs as scopeIds."""
    seen = {}

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    def fabric_v(handle, info):
        s = ctypes.cast(info, ctypes.POINTER(pynvml.c_nvmlGpuFabricInfoV_t)).contents
        seen["version"] = s.version
        s.state, s.status, s.cliqueId, s.healthMask = 3, 0, 5, 0
        s.clusterUuid[:] = list(range(16))
        return 0

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p)
    def field_values(handle, count, values):
        arr = ctypes.cast(values, ctypes.POINTER(pynvml.c_nvmlFieldValue_t * count)).contents
        seen["fields"] = [(v.fieldId, v.scopeId) for v in arr]
        for v in arr:
            v.nvmlReturn, v.valueType, v.value.ullVal = 0, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, v.scopeId * 10
        return 0

    functions = {"nvmlDeviceGetGpuFabricInfoV": fabric_v, "nvmlDeviceGetFieldValues": field_values}
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lambda name: functions[name])
    errors = {}
    reader = ic.NvmlInterconnect(pynvml, errors)
    assert reader.fabric(None, 0) == {"state": "completed", "status": "success", "clique_id": 5,
                                      "cluster_uuid": "00010203-0405-0607-0809-0a0b0c0d0e0f", "health_mask": 0}
    assert seen["version"] == pynvml.nvmlGpuFabricInfo_v2
    with pytest.raises(ctypes.ArgumentError):  # what fleetctl must never do
        pynvml.nvmlDeviceGetGpuFabricInfoV(None, pynvml.c_nvmlGpuFabricInfoV_t())
    links = [{"link": k, "state": "up"} for k in (0, 1)]
    found = reader._field_counters(None, links, "interconnect.gpus[0].nvlink")
    assert seen["fields"] == [(f, link) for link in (0, 1) for f in (161, 162, 163, 214, 221, 219)]
    assert found == [dict.fromkeys(("replay", "recovery", "crc", "recovery_failed", "symbol", "effective"), n)
                     for n in (0, 10)]
    assert errors == {}


def test_constants_match_pynvml():
    assert ic.NVLINK_VERSIONS == {getattr(pynvml, n): n[len("NVML_NVLINK_VERSION_"):].replace("_", ".")
                                  for n in dir(pynvml) if re.match(r"^NVML_NVLINK_VERSION_\d+_\d+$", n)}
    assert ic.REMOTE_TYPES == {pynvml.NVML_NVLINK_DEVICE_TYPE_GPU: "gpu", pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH: "switch"}
    assert dict(ic.ERROR_COUNTERS) == {"replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
                                       "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                                       "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                                       "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
                                       "ecc_data": pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA}
    assert dict(ic.FIELD_COUNTERS) == {"replay": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                                       "recovery": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
                                       "crc": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
                                       "recovery_failed": pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
                                       "symbol": pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
                                       "effective": pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS}
    assert ic.FABRIC_STATES == {pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "not_supported",
                                pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not_started",
                                pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in_progress",
                                pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed"}
    assert ic.TOPOLOGY_LEVELS == {pynvml.NVML_TOPOLOGY_INTERNAL: "PIX", pynvml.NVML_TOPOLOGY_SINGLE: "PIX",
                                  pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB", pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
                                  pynvml.NVML_TOPOLOGY_NODE: "NODE", pynvml.NVML_TOPOLOGY_SYSTEM: "SYS"}
    assert ic.NVML_ERROR_NAMES == {getattr(pynvml, n): n for n in dir(pynvml)
                                   if n.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, n), int)}
    for name in ("NVML_SUCCESS", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_SUPPORTED",
                 "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"):
        assert getattr(ic, name) == getattr(pynvml, name), name
    assert ic._VALUE_MEMBERS == {getattr(pynvml, "NVML_VALUE_TYPE_" + t): m for t, m in (
        ("DOUBLE", "dVal"), ("UNSIGNED_INT", "uiVal"), ("UNSIGNED_LONG", "ulVal"), ("UNSIGNED_LONG_LONG", "ullVal"),
        ("SIGNED_LONG_LONG", "sllVal"), ("SIGNED_INT", "siVal"), ("UNSIGNED_SHORT", "usVal"))}


def test_every_pynvml_name_the_reader_uses_exists():
    source = Path(ic.__file__).read_text()
    used = set(re.findall(r"\"((?:nvml|c_nvml|NVML_)\w+)\"", source)) | set(re.findall(r"\bn\.((?:nvml|NVML)\w+)", source))
    assert {"nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetNvLinkRemotePciInfo", "c_nvmlGpuFabricInfoV_t"} <= used
    used -= {"NVML_ERROR_", "nvmlReturn"}  # a name prefix; a c_nvmlFieldValue_t member (below)
    assert sorted(name for name in used if not hasattr(pynvml, name)) == []
    assert {"nvmlReturn", "valueType", "value"} <= {f[0] for f in pynvml.c_nvmlFieldValue_t._fields_}
    assert "healthMask" in {f[0] for f in pynvml.c_nvmlGpuFabricInfoV_t._fields_}
    assert pynvml.c_nvmlGpuFabricInfoV_t().version == pynvml.nvmlGpuFabricInfo_v2  # set in __init__


# ---- the collector ---------------------------------------------------------------------------------------------

class CommandModule:
    """AnsibleModule for the Collector: the commands it may run and what they print; records what it ran."""

    def __init__(self, outputs):
        self.outputs, self.ran = outputs, []

    def get_bin_path(self, name, opt_dirs=None):
        return "/usr/bin/" + name if any(argv[0] == name for argv in self.outputs) else None

    def run_command(self, argv, environ_update=None):
        argv = tuple([argv[0].rsplit("/", 1)[1]] + list(argv[1:]))
        self.ran.append(argv)
        return self.outputs.get(argv, (1, "", "no such output"))


def test_collector_without_pynvml_reads_nvidia_smi(gpu_facts_module, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    module = CommandModule({("nvidia-smi", "-q", "-x"): (0, XML, ""),
                            ("nvidia-smi", "nvlink", "-s"): (0, smi("nvlink -s"), ""),
                            ("nvidia-smi", "nvlink", "-e"): (0, smi("nvlink -e"), ""),
                            ("nvidia-smi", "topo", "-m"): (0, smi("topo -m"), "")})
    collector = gpu_facts_module.Collector(module)
    driver, gpus = collector.driver_and_gpus([])
    assert [argv for argv in module.ran if argv[0] == "nvidia-smi"] == [
        ("nvidia-smi", "-q", "-x"), ("nvidia-smi", "nvlink", "-s"), ("nvidia-smi", "nvlink", "-e"),
        ("nvidia-smi", "topo", "-m")]
    assert collector.sources["interconnect"] == "nvidia-smi"
    assert not [k for k in collector.errors if k.startswith("interconnect")]
    expected, _ = smi_facts()
    assert collector.interconnect == dict(expected, peermem_loaded=collector.interconnect["peermem_loaded"])
    check_schema(collector.interconnect)


def test_collector_without_pynvml_and_one_gpu_runs_no_topology(gpu_facts_module, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    h100 = (REPO / "tests" / "testdata" / "h100-580.159.04" / "nvidia-smi-q-x.xml").read_text()
    module = CommandModule({("nvidia-smi", "-q", "-x"): (0, h100, ""),
                            ("nvidia-smi", "nvlink", "-s"): (0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)\n", ""),
                            ("nvidia-smi", "nvlink", "-e"): (0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)\n", "")})
    collector = gpu_facts_module.Collector(module)
    collector.driver_and_gpus([])
    assert ("nvidia-smi", "topo", "-m") not in module.ran
    assert collector.interconnect["topology"] == [] and collector.interconnect["gpus"][0]["nvlink"]["supported"] is False
    check_schema(collector.interconnect)


def test_collector_without_a_driver_has_no_interconnect(gpu_facts_module, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    module = CommandModule({("nvidia-smi", "-q", "-x"): (
        9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "")})
    collector = gpu_facts_module.Collector(module)
    collector.driver_and_gpus([])
    assert collector.interconnect is None and "interconnect" not in collector.sources
    assert module.ran == [("nvidia-smi", "-q", "-x")]  # no nvlink / topo run after that


def test_collector_reads_the_interconnect_inside_its_one_nvml_session(gpu_facts_module, monkeypatch):
    fake = FakeNvml([h200("00000000:00:06.0"), h200("00000000:00:07.0")])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    module = CommandModule({})
    collector = gpu_facts_module.Collector(module)
    driver, gpus = collector.driver_and_gpus([])
    assert fake.inits == 1 and fake.initialized is False  # one nvmlInit, shut down after the interconnect
    assert module.ran == []  # no nvidia-smi on the NVML path
    assert collector.sources["interconnect"] == "nvml"
    assert collector.interconnect["topology"] == [{"gpus": [0, 1], "link": "NV18", "nvlinks": 18}]
    assert "nvmlDeviceGetGpuFabricInfoV" in fake.calls
    assert not [k for k in collector.errors if k.startswith("interconnect")]


def test_collector_survives_a_reader_bug(gpu_facts_module, monkeypatch):
    fake = FakeNvml([h200("00000000:00:06.0")])
    fake.nvmlDeviceGetNvLinkState = lambda h, link: 1 / 0
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    collector = gpu_facts_module.Collector(CommandModule({}))
    collector.driver_and_gpus([])
    assert collector.interconnect is None
    assert collector.errors["interconnect"] == "reading the interconnect failed: ZeroDivisionError: division by zero"


# ---- schema ----------------------------------------------------------------------------------------------------

def test_captured_facts_without_interconnect_stay_valid():
    validator = Draft202012Validator(SCHEMA)
    for name in ("audit-nvml.json", "audit-smi.json"):
        report = json.loads((REPO / "tests" / "testdata" / "h100-580.159.04-audit" / name).read_text())
        for host in report["hosts"]:
            assert "interconnect" not in host["facts"]
            validator.validate(host["facts"])
            facts = copy.deepcopy(host["facts"])
            facts["interconnect"] = None
            validator.validate(facts)
            facts["interconnect"], _ = smi_facts()
            facts["sources"]["interconnect"] = "nvidia-smi"
            facts["errors"]["interconnect.gpus[0].nvlink"] = "x"
            validator.validate(facts)


def test_real_facts_of_the_2x_h200_are_valid():
    """The real 2x H200 audits (tests/testdata/h200x2-580.159.04-audit), both paths, with the judged `crc` counter."""
    validator = Draft202012Validator(SCHEMA)
    for name in ("audit-nvml.json", "audit-smi.json"):
        facts = json.loads((REPO / "tests" / "testdata" / "h200x2-580.159.04-audit" / name).read_text())["hosts"][0]["facts"]
        assert facts["interconnect"]["gpus"][0]["nvlink"]["links"][0]["errors"]["crc"] == 0
        validator.validate(facts)


def test_schema_is_strict():
    facts, _ = smi_facts()
    for path, bad in ((("gpus", 0, "nvlink", "links", 0, "errors"), {"extra": 1}),
                      (("gpus", 0, "fabric"), {"state": "degraded"}),
                      (("gpus", 0, "fabric"), {"status": "Success"}),
                      (("gpus", 0, "nvlink", "links", 0), {"state": "half"}),
                      (("gpus", 0), {"nvswitch": True}),
                      ((), {"nics": []})):
        doc = copy.deepcopy(facts)
        target = doc
        for part in path:
            target = target[part]
        target.update(bad)
        assert not INTERCONNECT.is_valid(doc), (path, bad)
    doc = copy.deepcopy(facts)
    doc["topology"][0]["link"] = "NV0"
    assert not INTERCONNECT.is_valid(doc)


def test_nvml_link_of_unknown_far_end_is_no_topology_guess():
    """An up link whose remote type NVML cannot say would count as no NVLink: PCIe would be a guess."""
    a, b = h200("00000000:18:00.0", links=2), h200("00000000:2a:00.0", links=2)
    for link in a["links"] + b["links"]:
        link["remote"] = None
    facts, errors = nvml_facts(FakeNvml([a, b]))
    assert facts["topology"] is None and "far end NVML does not name" in errors["interconnect.topology"]


def test_a_single_gpu_without_nvlink_reads_the_same_through_nvidia_smi_as_through_nvml():
    """A real single H100 (tests/testdata/h100-580.159.04-health): `nvidia-smi nvlink -s` and `-e` print nothing and
    exit 0. Without pynvml that read as an unread NVLink ("does not list GPU 0": gpu.nvlink error, high), so such a
    host could never pass an audit; it is a GPU without NVLink, as NVML says, and gpu.nvlink does not apply."""
    from orchestrator.controls import interconnect as ic_controls
    health = REPO / "tests" / "testdata" / "h100-580.159.04-health"
    xml = (REPO / "tests" / "testdata" / "h100-580.159.04" / "nvidia-smi-q-x.xml").read_text()
    errors = {}
    _, gpus = gpus_utils.parse_smi_xml(xml)
    facts = ic.from_smi(gpus, xml, ((health / "nvidia-smi-nvlink-s.txt").read_text(), None),
                        ((health / "nvidia-smi-nvlink-e.txt").read_text(), None), None, errors,
                        sys_module="/nonexistent")
    check_schema(facts)
    assert errors == {}
    assert [g["nvlink"] for g in facts["gpus"]] == [{"supported": False, "up": 0, "total": 0, "links": []}]
    verdict = ic_controls.gpu_nvlink({"interconnect": facts}, {}, None)
    assert (verdict.status, verdict.message) == ("not_applicable", "no NVLink on this GPU")
    # on a host whose nvidia-smi lists some GPUs, one left out is still a reading fleetctl cannot trust
    two = [dict(gpus[0]), dict(gpus[0], index=1)]
    errors = {}
    ic.from_smi(two, xml, ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)\n\t Link 0: 26.562 GB/s\n", None), ("", None),
                None, errors, sys_module="/nonexistent")
    assert errors.get("interconnect.gpus[1].nvlink") == "nvidia-smi nvlink -s does not list GPU 1"


def test_the_nvlink_reads_bench_runs_with_pynvml_alone(monkeypatch, capsys):
    """bench/nvlink_reads.py, which the lead runs on real GPUs, on the fake: batched and per-call values compared,
    fleetctl's reading timed the audit's way and check's."""
    fake = FakeNvml(hgx(2))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    spec = importlib.util.spec_from_file_location("nvlink_reads", REPO / "bench" / "nvlink_reads.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.main(["--repeat", "1"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report))
    assert report["gpus"] == 2 and report["links"] == [18, 18]
    # The fake answers the DL fields and the legacy counters alike; state, version and speed only per call.
    assert report["field_values"] == {"asked": 2 * 18 * 6, "returned": 2 * 18 * 3, "not_returned": [
        "speed: error 3", "state: error 3", "version: error 3"]}
    assert report["per_call"] == {"asked": 2 * 18 * 5, "returned": 2 * 18 * 5}
    assert report["compared"] == 2 * 18 * 3 and report["differ"]["gpu 0 link 1 replay"] == {"field": 1, "call": 0}
    differ = [(gpu, link, name) for gpu, g in enumerate(hgx(2)) for link, entry in enumerate(g["links"])
              for name, field, counter in (("replay", 161, 0), ("recovery", 162, 1), ("crc", 163, 2))
              if entry["fields"][field] != entry["counters"][counter]]
    assert report["equal"] == report["compared"] - len(differ) and len(report["differ"]) == min(50, len(differ))
    assert set(report["ms"]) == {"field_values", "per_call", "per_call_version_remote_type_remote_pci",
                                 "per_call_crc_data_ecc_data"}
    assert report["fleetctl_interconnect_ms"]["errors"] == {} and fake.initialized is False


def test_fleetctl_check_reads_nvlink_as_it_shows_it(monkeypatch, tmp_path):
    """`fleetctl check`'s collection on a 4x H200 node (the fake NVML): the table's reading leaves the evidence
    counters unread and keeps the links' versions and remote ends in fleetctl's cache for the boot; the JSON's shows
    them all."""
    from orchestrator import baseline, check
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fake = FakeNvml(hgx(4))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    policy = baseline.load(None).policy_for(["all"])
    table = check.collect_facts(policy, evidence=False)["interconnect"]
    assert (tmp_path / "fleetctl" / check.NVLINK_CACHE).is_file()
    fake.calls.clear()
    assert check.collect_facts(policy, evidence=False)["interconnect"] == table
    assert not {"nvmlDeviceGetNvLinkVersion", "nvmlDeviceGetNvLinkRemoteDeviceType",
                "nvmlDeviceGetNvLinkErrorCounter"} & set(fake.calls)
    shown = check.collect_facts(policy)["interconnect"]
    assert shown["gpus"][2]["nvlink"]["links"][7]["errors"]["crc_data"] == 27 and without_evidence(shown) == table
