"""facts.imex (docs/interconnect.md): the IMEX readers on the documented formats (tests/testdata/imex, written from
NVIDIA's IMEX guide: no multi-node machine is lent here), the collector on a rack tray and on hosts without a
multi-node NVLink domain (where nothing IMEX is run or read), the package role, the schema."""
import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_imex as imex
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_packaging as packaging

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "testdata" / "imex"
SCHEMA = json.loads((REPO / "schemas" / "host-facts.schema.json").read_text())
IMEX_FACTS = Draft202012Validator({"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"],
                                   **SCHEMA["properties"]["imex"]})
ME = ["10.213.0.2"]
CLUSTER = "4f2b7c1e-9a3d-4e8b-b6c5-0d1e2f3a4b5c"


def text(name):
    return (DATA / name).read_text()


def domain(name, own=ME):
    parsed, problem = imex.parse_domain(text(name), own)
    assert problem is None
    return parsed


def states(parsed):
    return [(n["hostname"], n["status"], n["version"], n["connection"]) for n in parsed["nodes"]]


# ---- the parsers -----------------------------------------------------------------------------------------------

def test_version_line():
    assert imex.parse_version(text("nvidia-imex-version.txt")) == "570.86.15"
    assert imex.parse_version("nvidia-imex: unrecognized option '--version'\n") is None


def test_config_skips_comments_and_unquotes():
    config = imex.parse_config(text("config.cfg"))
    assert config["IMEX_NODE_CONFIG_FILE"] == "/etc/nvidia-imex/nodes_config.cfg"  # its quotes dropped
    assert config["IMEX_CMD_PORT"] == "50005" and config["BIND_INTERFACE_IP"] == ""
    assert not [k for k in config if k.startswith("#")] and len(config) == 8


@pytest.mark.parametrize("cfg, expected", [
    ("IMEX_NODE_CONFIG_FILE='/etc/racks/a.cfg'\n", "/etc/racks/a.cfg"),
    ("SERVER_PORT=50000\n", imex.DEFAULT_NODES_CONFIG),   # absent: the documented default
    ("IMEX_NODE_CONFIG_FILE=\n", imex.DEFAULT_NODES_CONFIG),
    ("# IMEX_NODE_CONFIG_FILE=/commented/out.cfg\n", imex.DEFAULT_NODES_CONFIG),
])
def test_the_node_list_a_config_names(cfg, expected):
    assert imex.nodes_config_file(imex.parse_config(cfg)) == expected


def test_node_list_in_file_order_and_what_is_not_an_address():
    assert imex.parse_nodes(text("nodes_config.cfg")) == (["10.213.0.2", "10.213.0.3", "10.213.0.4"], [])
    nodes, problems = imex.parse_nodes("10.0.0.1\nnot an address\nfd00::7\n")
    assert nodes == ["10.0.0.1", "fd00::7"] and problems == ["line 2 is not an address: 'not an address'"]


def test_channels_major_and_nodes():
    assert imex.parse_channels(text("proc-devices.txt"), ["channel0"]) == {"major": 234, "count": 1}
    names = ["channel0", "channel1", "README"]
    assert imex.parse_channels(text("proc-devices.txt"), names) == {"major": 234, "count": 2}
    assert imex.parse_channels("Character devices:\n195 nvidia\n", []) == {"major": None, "count": 0}


def test_own_addresses_from_the_kernel():
    v6 = "fd000000000000000000000000000002 02 40 00 80 eth0\n"
    assert imex.local_addresses(text("proc-net-fib_trie.txt"), v6) == ["10.213.0.2", "127.0.0.1", "fd00::2"]


def test_domain_up():
    parsed = domain("ctl-up.json")
    assert parsed["status"] == "UP"
    assert [n["address"] for n in parsed["nodes"]] == ["10.213.0.2", "10.213.0.3", "10.213.0.4"]
    assert states(parsed) == [(h, "READY", "570.86.15", "CONNECTED") for h in ("gb200-01", "gb200-02", "gb200-03")]


def test_domain_degraded_names_the_unavailable_peer():
    parsed = domain("ctl-degraded.json")
    assert parsed["status"] == "DEGRADED"
    assert states(parsed)[2] == ("gb200-03", "UNAVAILABLE", None, "INVALID")
    assert [n["connection"] for n in parsed["nodes"][:2]] == ["CONNECTED", "CONNECTED"]


def test_domain_down():
    parsed = domain("ctl-down.json")
    assert parsed["status"] == "DOWN" and {s for _, s, _, _ in states(parsed)} == {"UNAVAILABLE"}
    assert {c for _, _, _, c in states(parsed)} == {"INVALID"}


def test_a_peer_on_another_version_is_told_apart_by_its_version():
    parsed = domain("ctl-other-version.json")
    assert parsed["status"] == "UP"
    assert [n["version"] for n in parsed["nodes"]] == ["570.86.15", "570.86.15", "580.95.05"]


def test_connections_are_this_hosts_own():
    """Read on gb200-03 (the one down), every connection is its own view: INVALID."""
    parsed = domain("ctl-degraded.json", own=["10.213.0.4"])
    assert {n["connection"] for n in parsed["nodes"]} == {"INVALID"}


def test_no_member_is_this_host():
    parsed, problem = imex.parse_domain(text("ctl-up.json"), ["192.0.2.9"])
    assert {n["connection"] for n in parsed["nodes"]} == {None}
    assert problem == "nvidia-imex-ctl -N -j: no member is this host (192.0.2.9)"


def test_addresses_are_compared_as_addresses_host_names_as_names():
    """Issue 42: this host at FD00:0:0::2 is the member fd00::2, its connection to fd00::3 is the one to
    fd00:0000::3; host names compare whatever their case."""
    assert [imex.address_key(a) for a in ("FD00:0:0::1", "fd00::1", "10.0.0.1", "GB200-01.Rack.")] == \
        ["fd00::1", "fd00::1", "10.0.0.1", "gb200-01.rack"]
    ctl = {"status": "UP", "nodes": {
        "0": {"status": "READY", "host": "fd00::2", "hostName": "n1", "connections": {
            "0": {"host": "fd00:0000::2", "status": "CONNECTED"}, "1": {"host": "FD00::3", "status": "CONNECTED"},
            "2": {"host": "N3.rack", "status": "CONNECTED"}}},
        "1": {"status": "READY", "host": "fd00:0:0::3", "hostName": "n2"},
        "2": {"status": "READY", "host": "n3.RACK", "hostName": "n3"}}}
    parsed, problem = imex.parse_domain(json.dumps(ctl), ["FD00:0:0::2"])
    assert problem is None and [n["connection"] for n in parsed["nodes"]] == ["CONNECTED"] * 3


def test_a_node_list_or_a_domain_past_the_cap_is_one_problem():
    """Issue 42: more nodes than an IMEX domain holds (MAX_NODES) is one line, read in linear time."""
    cap = imex.MAX_NODES
    nodes, problems = imex.parse_nodes("\n".join("10.0.%d.%d" % divmod(i, 256) for i in range(cap)))
    assert len(nodes) == cap and problems == []
    nodes, problems = imex.parse_nodes("\n".join("10.%d.%d.%d" % (i >> 16, i >> 8 & 255, i & 255)
                                                 for i in range(95_000)))
    assert len(nodes) == cap and problems == ["more than %d addresses (an IMEX domain holds at most %d)"
                                              % (cap, cap)]
    ctl = {"status": "UP", "nodes": {str(i): {"status": "READY", "host": "10.%d.%d.%d" % (i >> 16, i >> 8 & 255,
                                                                                          i & 255)}
                                     for i in range(cap + 1)}}
    with pytest.raises(imex.ImexOutputError) as e:
        imex.parse_domain(json.dumps(ctl), ME)
    assert str(e.value) == "nvidia-imex-ctl -N -j: %d nodes, more than an IMEX domain holds (%d)" % (cap + 1, cap)
    del ctl["nodes"][str(cap)]
    ctl["nodes"]["0"]["connections"] = {str(i): {"host": n["host"], "status": "CONNECTED"}
                                        for i, n in enumerate(ctl["nodes"].values())}
    parsed, problem = imex.parse_domain(json.dumps(ctl), ["10.0.0.0"])
    assert problem is None and {n["connection"] for n in parsed["nodes"]} == {"CONNECTED"}


@pytest.mark.parametrize("out, says", [
    (text("ctl-not-json.txt"), "nvidia-imex-ctl -N -j: not JSON (Expecting value: line 1 column 1 (char 0)): "
                               "'IMEX domain status: UP\\nNode 0"),
    ('{"nodes": []}', "nvidia-imex-ctl -N -j: no domain status and nodes in '{\"nodes\": []}'"),
    ('{"status": "UP", "nodes": {"0": {"status": "READY"}}}', "nvidia-imex-ctl -N -j: node '0' has no host and status"),
    ("", "nvidia-imex-ctl -N -j: not JSON"),
])
def test_output_that_does_not_parse_is_one_line(out, says):
    with pytest.raises(imex.ImexOutputError) as e:
        imex.parse_domain(out, ME)
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_nvlink_domains_from_the_fabric_facts():
    def ic(*uuids):
        return {"gpus": [{"fabric": None if u is False else {"cluster_uuid": u, "clique_id": 7}} for u in uuids]}
    assert imex.nvlink_domains(ic(CLUSTER, CLUSTER, False)) == [CLUSTER + "/7"]  # a lost GPU has no fabric
    assert imex.nvlink_domains(ic(imex.ZERO_UUID, imex.ZERO_UUID)) == []  # an HGX board
    assert imex.nvlink_domains(ic(None)) == [] and imex.nvlink_domains(None) == []


# ---- the package role ------------------------------------------------------------------------------------------

def test_imex_packages_are_their_own_role_and_follow_the_branch(gpu_facts_module):
    assert [packaging.role(n) for n in ("nvidia-imex-570", "nvidia-imex", "nvidia-imex-ctl")] == ["imex", "imex", None]
    assert packaging.on_branch("nvidia-imex-570", "580") == "nvidia-imex-580"
    assert packaging.on_branch("nvidia-imex", "580") == "nvidia-imex"  # rpm: the branch is the repository's
    assert packaging.stale({"nvidia-imex-570": "570.86.15-1"},
                           {"nvidia-imex-580": "580.95.05-1"}) == ["nvidia-imex-570"]
    dpkg = gpu_facts_module.parse_dpkg_query("nvidia-imex-570\t570.86.15-1\thold ok installed\n"
                                             "nvidia-driver-570-open\t570.86.15-0ubuntu1\thold ok installed\n")
    assert [(p["name"], p["role"]) for p in dpkg] == [("nvidia-imex-570", "imex"), ("nvidia-driver-570-open", "driver")]
    rpm = gpu_facts_module.parse_rpm_query("nvidia-imex\t570.86.15-1.el9\n", "")
    assert [(p["name"], p["role"]) for p in rpm] == [("nvidia-imex", "imex")]


# ---- the collector ---------------------------------------------------------------------------------------------

class Host:
    """AnsibleModule and the file system for the Collector: the commands it may run (argv without the path ->
    (rc, out, err)) and the files it may read; records both."""

    def __init__(self, outputs, files):
        self.outputs, self.files, self.ran, self.reads = outputs, files, [], []

    def get_bin_path(self, name, opt_dirs=None):
        return "/usr/bin/" + name if name == "timeout" or any(argv[0] == name for argv in self.outputs) else None

    def run_command(self, argv, environ_update=None):
        argv = [a.rsplit("/", 1)[-1] for a in argv[:1]] + list(argv[1:])
        if argv[0] == "timeout":
            argv = [argv[4].rsplit("/", 1)[-1]] + argv[5:]
        self.ran.append(tuple(argv))
        return self.outputs.get(tuple(argv), (1, "", "no such output"))

    def read(self, path, fact):
        self.reads.append(path)
        return self.files.get(path)


TRAY_FILES = {"/etc/nvidia-imex/config.cfg": text("config.cfg"),
              "/etc/nvidia-imex/nodes_config.cfg": text("nodes_config.cfg"),
              "/proc/devices": text("proc-devices.txt"), "/proc/net/fib_trie": text("proc-net-fib_trie.txt"),
              "/proc/net/if_inet6": ""}
CTL = ("nvidia-imex-ctl", "-N", "-j", "-H")
PACKAGES = [{"name": "nvidia-imex-570", "version": "570.86.15-1", "manager": "dpkg", "role": "imex", "held": True}]


def tray(gpu_facts_module, monkeypatch, tmp_path, ctl=(0, text("ctl-up.json"), ""), files=TRAY_FILES,
         uuid=CLUSTER, channels=("channel0",)):
    host = Host({("nvidia-imex", "--version"): (0, text("nvidia-imex-version.txt"), ""), CTL: ctl}, dict(files))
    collector = gpu_facts_module.Collector(host)
    monkeypatch.setattr(collector, "read", host.read)
    monkeypatch.setattr(collector, "processes", {"nvidia-imex"})
    monkeypatch.setattr(collector, "unit_enabled", lambda unit: unit == "nvidia-imex.service")
    (tmp_path / "channels").mkdir()
    for name in channels:
        (tmp_path / "channels" / name).write_text("")
    monkeypatch.setattr(gpu_facts_module, "CHANNELS_DIR", str(tmp_path / "channels"))
    collector.interconnect = {"gpus": [{"index": i, "fabric": {"state": "completed", "status": "success",
                                                                "clique_id": 32766, "cluster_uuid": uuid}}
                                       for i in range(4)]}
    return collector, host


def check_schema(facts):
    errors = sorted(IMEX_FACTS.iter_errors(facts), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join("%s: %s" % ("/".join(map(str, e.absolute_path)), e.message) for e in errors)


def test_collector_on_a_tray_of_a_rack(gpu_facts_module, monkeypatch, tmp_path):
    collector, host = tray(gpu_facts_module, monkeypatch, tmp_path)
    facts = collector.imex(PACKAGES)
    assert facts == {"package": "nvidia-imex-570", "package_version": "570.86.15-1", "version": "570.86.15",
                     "running": True, "enabled": True, "config_file": "/etc/nvidia-imex/config.cfg",
                     "nodes_config_file": "/etc/nvidia-imex/nodes_config.cfg",
                     "nodes": ["10.213.0.2", "10.213.0.3", "10.213.0.4"], "channels": {"major": 234, "count": 1},
                     "domain": domain("ctl-up.json")}
    assert collector.errors == {}
    assert host.ran == [("nvidia-imex", "--version"), CTL]
    check_schema(facts)


@pytest.mark.parametrize("uuid", [imex.ZERO_UUID, None])
def test_nothing_imex_is_run_or_read_without_a_multi_node_domain(gpu_facts_module, monkeypatch, tmp_path, uuid):
    """An HGX H100/H200 (the zero cluster UUID) or a GPU without fabric: imex null, and not one IMEX command or file."""
    collector, host = tray(gpu_facts_module, monkeypatch, tmp_path, uuid=uuid)
    assert collector.imex(PACKAGES) is None
    assert host.ran == [] and host.reads == [] and collector.errors == {}


def test_collector_without_interconnect_facts_has_no_imex(gpu_facts_module):
    collector = gpu_facts_module.Collector(Host({}, {}))
    assert collector.interconnect is None and collector.imex(PACKAGES) is None


def test_degraded_domain_and_no_channel_yet(gpu_facts_module, monkeypatch, tmp_path):
    collector, _ = tray(gpu_facts_module, monkeypatch, tmp_path, ctl=(0, text("ctl-degraded.json"), ""), channels=())
    facts = collector.imex(PACKAGES)
    assert facts["domain"]["status"] == "DEGRADED" and facts["channels"] == {"major": 234, "count": 0}
    assert collector.errors == {}
    check_schema(facts)


def test_exit_255_is_one_error_and_no_domain(gpu_facts_module, monkeypatch, tmp_path):
    collector, _ = tray(gpu_facts_module, monkeypatch, tmp_path, ctl=(255, "", text("ctl-exit-255.txt")))
    facts = collector.imex(PACKAGES)
    assert facts["domain"] is None and facts["nodes"] == ["10.213.0.2", "10.213.0.3", "10.213.0.4"]
    assert collector.errors == {"imex.domain": "nvidia-imex-ctl -N -j -H exited 255: nvidia-imex-ctl: failed to read "
                                               "the node configuration file /etc/nvidia-imex/nodes_config.cfg"}
    check_schema(facts)


def test_output_that_is_not_json_is_one_error(gpu_facts_module, monkeypatch, tmp_path):
    collector, _ = tray(gpu_facts_module, monkeypatch, tmp_path, ctl=(0, text("ctl-not-json.txt"), ""))
    facts = collector.imex(PACKAGES)
    assert facts["domain"] is None and list(collector.errors) == ["imex.domain"]
    assert collector.errors["imex.domain"].startswith("nvidia-imex-ctl -N -j: not JSON")
    check_schema(facts)


def test_a_hung_nvidia_imex_ctl_is_cut_off(gpu_facts_module, monkeypatch, tmp_path):
    collector, host = tray(gpu_facts_module, monkeypatch, tmp_path, ctl=(124, "", ""))
    assert collector.imex(PACKAGES)["domain"] is None
    assert collector.errors == {"imex.domain": "nvidia-imex-ctl -N -j -H: no answer in 10 s"}


def test_bind_interface_ip_names_this_host(gpu_facts_module, monkeypatch, tmp_path):
    files = dict(TRAY_FILES, **{"/etc/nvidia-imex/config.cfg": "BIND_INTERFACE_IP=10.213.0.4\n"})
    collector, host = tray(gpu_facts_module, monkeypatch, tmp_path, ctl=(0, text("ctl-degraded.json"), ""),
                           files=files)
    facts = collector.imex(PACKAGES)
    assert {n["connection"] for n in facts["domain"]["nodes"]} == {"INVALID"}  # gb200-03's own view
    assert "/proc/net/fib_trie" not in host.reads


def test_a_tray_without_imex_installed_or_configured(gpu_facts_module, monkeypatch, tmp_path):
    collector, host = tray(gpu_facts_module, monkeypatch, tmp_path, files={"/proc/devices": "Character devices:\n"},
                           channels=())
    host.outputs = {}  # neither nvidia-imex nor nvidia-imex-ctl installed
    collector.processes = set()
    facts = collector.imex([])
    assert facts == {"package": None, "package_version": None, "version": None, "running": False, "enabled": True,
                     "config_file": "/etc/nvidia-imex/config.cfg", "nodes_config_file": None, "nodes": None,
                     "channels": {"major": None, "count": 0}, "domain": None}
    assert collector.errors == {} and host.ran == []
    check_schema(facts)


def test_version_output_that_does_not_parse(gpu_facts_module, monkeypatch, tmp_path):
    collector, host = tray(gpu_facts_module, monkeypatch, tmp_path)
    host.outputs[("nvidia-imex", "--version")] = (0, "IMEX 570\n", "")
    assert collector.imex(PACKAGES)["version"] is None
    assert collector.errors == {"imex.version": "nvidia-imex --version: unexpected output 'IMEX 570'"}


def test_a_collector_bug_costs_only_the_imex_facts(gpu_facts_module, monkeypatch, tmp_path):
    collector, host = tray(gpu_facts_module, monkeypatch, tmp_path)
    monkeypatch.setattr(gpu_facts_module, "parse_channels", lambda *a: 1 / 0)
    assert collector.guarded(lambda: collector.imex(PACKAGES), "imex") is None
    assert collector.errors == {"imex": "reading the imex failed: ZeroDivisionError: division by zero"}


# ---- schema ----------------------------------------------------------------------------------------------------

def test_facts_of_hosts_without_imex_stay_valid():
    validator = Draft202012Validator(SCHEMA)
    report = json.loads((REPO / "tests" / "testdata" / "h200x2-580.159.04-audit" / "audit-nvml.json").read_text())
    facts = report["hosts"][0]["facts"]
    assert "imex" not in facts
    validator.validate(facts)  # recorded before the key existed
    validator.validate(dict(facts, imex=None))
    assert list(validator.iter_errors(dict(facts, imex={"package": None})))  # an object has every key
