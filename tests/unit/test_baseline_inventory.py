"""Loading the blessed matrix and the inventory: what a host is held to, and one-line errors for bad input."""

from __future__ import annotations

import pytest
import yaml

from orchestrator import baseline
from orchestrator.fleet import inventory
from orchestrator.errors import InputError

REPO = baseline.resources.root()


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_embedded_and_example_baselines_are_valid():
    default = baseline.load(None)
    assert default.name == "fleetctl-default" and default.digest.startswith("sha256:")
    example = baseline.load(REPO / "inventory" / "baseline.example.yml")
    assert set(example.groups) == {"all", "h100", "l40s"}


def test_a_host_gets_all_then_its_groups_in_inventory_order():
    example = baseline.load(REPO / "inventory" / "baseline.example.yml")
    fleet = inventory.load(str(REPO / "inventory" / "hosts.example.ini"))
    example.check_groups(set(fleet.groups))
    l40s = next(h for h in fleet.hosts if h.name.startswith("gpu-l40s-01"))
    assert l40s.groups == ("all", "gpu", "l40s")
    p = example.policy_for(list(l40s.groups))
    assert p["driver"] == {"branches": ["550"], "flavor": "proprietary", "held": True}  # lists replace, dicts merge
    assert p["gpus"]["count"] == 4 and p["gpus"]["ecc"] is True
    assert p["xid"]["overrides"]["94"]["class"] == "critical"


def test_the_digest_is_the_files_sha256(tmp_path):
    import hashlib
    path = write(tmp_path, "b.yml", "schema_version: 1\ngroups:\n  all: {driver: {branches: ['570']}}\n")
    assert baseline.load(path).digest == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("text,expected", [
    ("schema_version: 1\ngroups:\n  all:\n    driver: {versions: ['570.86']}\n    gpus: {count: -1}\n",
     "$.groups.all.gpus.count: -1 is less than the minimum of 0"),
    ("schema_version: 1\ngroups:\n  all:\n    driver: {versions: ['latest']}\n",
     "$.groups.all.driver.versions[0]: 'latest' does not match"),
    ("schema_version: 1\ngroups:\n  all:\n    driver: {flavour: open}\n",
     "$.groups.all.driver: Additional properties are not allowed ('flavour' was unexpected)"),
    ("schema_version: 2\ngroups: {all: {}}\n", "$.schema_version: 1 was expected"),
    ("groups: {all: {}}\n", "$: 'schema_version' is a required property"),
    ("schema_version: 1\ngroups:\n  all:\n    driver: {branches: [570]\n", "line 5 column 1: not valid YAML"),
    ("- just\n- a list\n", "$: expected object, found a list"),
    # a key given twice: PyYAML would keep the second silently, the first setting lost without a word
    ("schema_version: 1\ngroups:\n  all:\n    gpus: {max_pcie_replays: 5}\n    gpus: {count: 8}\n",
     "line 5 column 5: not valid YAML: key 'gpus' given twice (first on line 4)"),
])
def test_a_bad_baseline_is_one_line_naming_the_file_and_json_path(tmp_path, text, expected):
    path = write(tmp_path, "bad.yml", text)
    with pytest.raises(InputError) as e:
        baseline.load(path)
    message = str(e.value)
    assert message.startswith(f"{path}:") and expected in message and "\n" not in message


CANARY = """schema_version: 1
groups:
  all:
    canary:
      metrics:
        - name: tensor_active
          query: 'avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"{hosts}"})'
          host_label: Hostname
          good: higher
          max_change: 5%
        - name: xid
          query: 'sum by (Hostname) (DCGM_FI_DEV_XID_ERRORS{Hostname=~"{hosts}"})'
          good: lower
          max_change: 0.5
          kind: rate
  h100:
    canary: {on_missing: fail, min_samples: 60}
  l40s:
    canary:
      metrics: [{name: power, query: 'DCGM_FI_DEV_POWER_USAGE{instance=~"{hosts}"}', good: lower, max_change: 10%}]
"""


def test_the_canary_metrics_of_a_host_inherit_as_the_rest_of_its_policy(tmp_path):
    loaded = baseline.load(write(tmp_path, "b.yml", CANARY))
    everyone = loaded.canary_for(["all", "gpu"])
    assert everyone == baseline.Canary(on_missing="hold", min_samples=None, metrics=(
        baseline.CanaryMetric(name="tensor_active", query='avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE'
                              '{Hostname=~"{hosts}"})', good="higher", max_change=0.05, host_label="Hostname"),
        baseline.CanaryMetric(name="xid", query='sum by (Hostname) (DCGM_FI_DEV_XID_ERRORS{Hostname=~"{hosts}"})',
                              good="lower", max_change=0.5, kind="rate")))
    h100 = loaded.canary_for(["all", "gpu", "h100"])  # its own keys over all's; all's metrics
    assert (h100.on_missing, h100.min_samples, h100.metrics) == ("fail", 60, everyone.metrics)
    l40s = loaded.canary_for(["all", "gpu", "l40s"])  # a list of its own replaces all's
    assert [(m.name, m.max_change, m.host_label, m.kind) for m in l40s.metrics] == [("power", 0.1, "instance", "level")]
    assert baseline.load(None).canary_for(["all"]) == baseline.Canary()  # none: nothing judged


@pytest.mark.parametrize("where, change, expected", [
    (1, "name: tensor_active", "$.groups.all.canary.metrics[1].name: a second metric named 'tensor_active' in group "
                               "all"),
    (0, "max_change: 0%", "$.groups.all.canary.metrics[0].max_change: '0%' is not above 0% and at most 100%"),
    (0, "max_change: 150%", "$.groups.all.canary.metrics[0].max_change: '150%' is not above 0% and at most 100%"),
    (0, "max_change: 1.5", "$.groups.all.canary.metrics[0].max_change: 1.5 is greater than the maximum of 1"),
    (0, "max_change: five", "$.groups.all.canary.metrics[0].max_change: 'five' does not match"),
    (0, "max_change: 0", "$.groups.all.canary.metrics[0].max_change: 0 is less than or equal to the minimum of 0"),
    (0, "name: Tensor-Active", "$.groups.all.canary.metrics[0].name: 'Tensor-Active' does not match"),
    (0, "query: [up]", "$.groups.all.canary.metrics[0].query: expected string, found a list"),
    (0, "query: 'up{hosts}'", "$.groups.all.canary.metrics[0].query: {hosts} at character 3 is outside a quoted "
                              "label matcher"),
    (0, "good: up", "$.groups.all.canary.metrics[0].good: 'up' is not one of ['higher', 'lower']"),
    (0, "kind: counter", "$.groups.all.canary.metrics[0].kind: 'counter' is not one of ['level', 'rate']"),
    (0, "window: 5m", "$.groups.all.canary.metrics[0]: Additional properties are not allowed ('window' was "
                      "unexpected)"),
    (None, "on_missing: wait", "$.groups.all.canary.on_missing: 'wait' is not one of ['hold', 'fail', 'ignore']"),
])
def test_a_bad_canary_section_is_one_line_naming_the_metric(tmp_path, where, change, expected):
    """WHERE: the metric CHANGE is made to (None: the section)."""
    doc = yaml.safe_load(CANARY)
    section = doc["groups"]["all"]["canary"]
    (section if where is None else section["metrics"][where]).update(yaml.safe_load(change))
    path = write(tmp_path, "bad.yml", yaml.safe_dump(doc))
    with pytest.raises(InputError) as e:
        baseline.load(path)
    assert str(e.value).startswith(f"{path}: {expected}") and "\n" not in str(e.value)


def test_a_baseline_group_missing_from_the_inventory_is_an_input_error(tmp_path):
    path = write(tmp_path, "b.yml", "schema_version: 1\ngroups:\n  all: {}\n  a100: {gpus: {count: 8}}\n")
    fleet = inventory.load(str(REPO / "inventory" / "hosts.example.ini"))
    with pytest.raises(InputError, match=r"\$\.groups\.a100: group 'a100' is not in the inventory"):
        baseline.load(path).check_groups(set(fleet.groups))


def test_a_missing_baseline_file(tmp_path):
    with pytest.raises(InputError, match="cannot read baseline"):
        baseline.load(tmp_path / "nope.yml")


def test_inventory_limit_and_host_vars(tmp_path):
    inv = write(tmp_path, "hosts.yml", yaml.safe_dump({"all": {"children": {"h100": {
        "hosts": {"n1": {"ansible_host": "10.0.0.1", "ansible_port": 2222}, "n2": {}},
        "vars": {"ansible_user": "ops"}}}}}))
    fleet = inventory.load(str(inv), "n1")
    (n1,) = fleet.hosts
    assert (n1.name, n1.address, n1.port, n1.vars["ansible_user"], n1.groups) == ("n1", "10.0.0.1", 2222, "ops", ("all", "h100"))
    assert "h100" in fleet.groups


@pytest.mark.parametrize("text,limit,expected", [
    ("[h100\nn1\n", None, "not a valid Ansible inventory"),
    ("[h100]\nn1\n", "nothere", "--limit 'nothere' matches no host"),
])
def test_bad_inventory_input(tmp_path, text, limit, expected):
    inv = write(tmp_path, "hosts.ini", text)
    with pytest.raises(InputError) as e:
        inventory.load(str(inv), limit)
    assert expected in str(e.value) and str(e.value).startswith(str(inv)) and "\n" not in str(e.value)


def test_no_inventory_means_localhost_over_the_local_connection():
    fleet = inventory.load(None)
    assert [h.name for h in fleet.hosts] == ["localhost"] and fleet.hosts[0].connection == "local"
    with pytest.raises(InputError):
        inventory.load(None, "gpu-*")
    with pytest.raises(InputError, match="inventory not found"):
        inventory.load("/nonexistent/hosts.ini")


@pytest.mark.parametrize("line,expected", [
    ("n1 ansible_port=abc", "ansible_port 'abc' is not a port number"),
    ("n1 ansible_host_key_checking=false", "turns host key checking off"),
    ("n1 ansible_ssh_common_args='-o StrictHostKeyChecking=no'", "StrictHostKeyChecking=no"),
    ("n1 ansible_host='10.0.0.1;reboot'", "may hold letters, digits"),
])
def test_hosts_fleetctl_must_not_work_on_are_input_errors(tmp_path, line, expected):
    inv = write(tmp_path, "hosts.ini", f"[gpu]\n{line}\n")
    with pytest.raises(InputError, match=expected):
        inventory.load(str(inv))


def test_templated_addresses_and_jump_hosts_are_left_to_openssh(tmp_path):
    inv = write(tmp_path, "hosts.ini", "[gpu]\nn1 ansible_host='{{ inventory_hostname }}.mgmt'\n"
                                       "n2 ansible_ssh_common_args='-o ProxyJump=bastion'\nn3 ansible_host=10.0.0.3\n")
    fleet = inventory.load(str(inv))
    assert [h.plain_ssh for h in fleet.hosts] == [False, False, True]


def test_a_limit_with_a_broken_regex_is_refused_not_read_as_the_whole_fleet(tmp_path):
    """Ansible matches every host with an invalid `~regex` pattern: for an upgrade that would be the whole fleet."""
    from orchestrator.fleet import inventory
    from orchestrator.errors import InputError

    path = tmp_path / "hosts.ini"
    path.write_text("[gpu]\nn1\nn2\n")
    with pytest.raises(InputError, match=r"--limit '~\[': '~\[' is not a valid regular expression"):
        inventory.load(str(path), "~[")
    assert [h.name for h in inventory.load(str(path), "~n[1]").hosts] == ["n1"]
