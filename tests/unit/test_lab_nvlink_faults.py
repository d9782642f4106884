"""`fleetctl lab inject HOST nvlink-down|nvlink-errors|fabric-stuck`: what they plant in a host's hw/ files, and bad
input as one line, exit 2 (a lab recorded in a temporary $FLEETCTL_LAB_DIR; no namespaces, no root needed)."""

import pytest

from orchestrator import cli
from fleetctl_lab import faults, state
from fleetctl_lab.conf import read_conf


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """Two recorded hosts: hgx-01 (2x H100 SXM, driver 580.95.05 loaded) and pcie-01 (2x L40S)."""
    monkeypatch.setenv("FLEETCTL_LAB_DIR", str(tmp_path))
    monkeypatch.setattr("os.geteuid", lambda: 0)  # `fleetctl lab` insists on root
    hosts = []
    for index, (name, sku) in enumerate((("hgx-01", "h100-sxm"), ("pcie-01", "l40s"))):
        spec = state.HostSpec(name=name, sku=sku, gpus=2, driver="580.95.05")
        hosts.append(state.HostRecord(spec, index, f"10.0.0.{index + 2}", f"fl-{name}", f"vfl-{index}"))
        hw = tmp_path / "hosts" / name / "hw"
        hw.mkdir(parents=True)
        (hw / "gpus.conf").write_text(f"sku={sku}\ncount=2\ngpu.0.pci=00000000:18:00.0\ngpu.1.pci=00000000:2A:00.0\n")
        (hw / "faults.conf").write_text("")
        module = tmp_path / "hosts" / name / "kernel" / "sys-module" / "nvidia"
        module.mkdir(parents=True)
        (module / "version").write_text("580.95.05\n")
    state.save(state.Lab(tmp_path, "flbr0", "10.0.0.1", hosts))
    return tmp_path


def fleetctl(monkeypatch, capsys, *args):
    monkeypatch.setattr("sys.argv", ["fleetctl", *args])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def run_ok(monkeypatch, capsys, *args):
    monkeypatch.setattr("sys.argv", ["fleetctl", *args])
    try:
        cli.main()
    except SystemExit as e:
        assert e.code in (0, None), capsys.readouterr()
    return capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (("nvlink-down", "--gpu", "2", "--link", "0"), "hgx-01 has GPUs 0..1, not 2"),
    (("nvlink-down", "--gpu", "0", "--link", "18"), "GPU 0 of hgx-01 has NVLinks 0..17, not 18"),
    (("nvlink-down", "--link", "-1"), "has NVLinks 0..17, not -1"),
    (("nvlink-down", "--gpu", "0", "--link", "3", "--driver", "newest"), "'newest' is not a driver version"),
    (("nvlink-errors", "--gpu", "0", "--count", "-5"), "--count must be 0 or more, not -5"),
    (("nvlink-errors", "--gpu", "7", "--count", "5"), "hgx-01 has GPUs 0..1, not 7"),
    (("nvlink-errors", "--link", "40", "--count", "5"), "not 40"),
    (("nvlink-errors", "--count", "many"), "'many' is not a valid integer"),
    (("nvlink-down", "--gpu", "0"), "Missing option '--link'"),
])
def test_bad_input_is_one_line_exit_2(lab, monkeypatch, capsys, args, message):
    code, out, err = fleetctl(monkeypatch, capsys, "lab", "inject", "hgx-01", *args)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1, err
    assert read_conf(lab / "hosts/hgx-01/hw/faults.conf") == {}


@pytest.mark.parametrize("args,message", [
    (("nvlink-down", "--link", "0"), "pcie-01 (NVIDIA L40S) has no NVLink"),
    (("nvlink-errors", "--count", "1"), "pcie-01 (NVIDIA L40S) has no NVLink"),
    (("fabric-stuck",), "pcie-01 (NVIDIA L40S) has no NVSwitch fabric"),
])
def test_a_pcie_board_has_no_nvlink_to_break(lab, monkeypatch, capsys, args, message):
    code, _out, err = fleetctl(monkeypatch, capsys, "lab", "inject", "pcie-01", *args)
    assert code == 2 and message in err and err.count("\n") == 1


def test_what_the_faults_plant(lab, monkeypatch, capsys):
    hw = lab / "hosts/hgx-01/hw"
    out = run_ok(monkeypatch, capsys, "lab", "inject", "hgx-01", "nvlink-down", "--gpu", "1", "--link", "4")
    assert out.startswith("hgx-01: NVLink 4 of GPU 1 down")
    run_ok(monkeypatch, capsys, "lab", "inject", "hgx-01", "nvlink-down", "--gpu", "1", "--link", "2")
    run_ok(monkeypatch, capsys, "lab", "inject", "hgx-01", "nvlink-errors", "--gpu", "0", "--link", "3", "--count", "9")
    run_ok(monkeypatch, capsys, "lab", "inject", "hgx-01", "nvlink-errors", "--count", "2", "--driver", "570.86.15")
    run_ok(monkeypatch, capsys, "lab", "inject", "hgx-01", "fabric-stuck", "--driver", "570.124.06")
    gpus, planted = read_conf(hw / "gpus.conf"), read_conf(hw / "faults.conf")
    assert gpus["gpu.1.nvlink_down"] == "2,4"
    assert {k: v for k, v in gpus.items() if k.startswith("gpu.0.nvlink_")} == {
        "gpu.0.nvlink_crc_flit": "3:9", "gpu.0.nvlink_replay": "3:9", "gpu.0.nvlink_symbol": "3:9",
        "gpu.0.nvlink_effective": "3:9"}
    assert planted == {"nvlink_down.580.95.05": "1:4,1:2", "nvlink_errors.570.86.15": "0:0:2",
                       "fabric_stuck.570.124.06": "1"}
    kmsg = (lab / "hosts/hgx-01/kernel/kmsg").read_text()
    assert "NVRM: Xid (PCI:0000:2A:00): 74, " in kmsg and "NVLink: fatal error detected on link 4(" in kmsg
    # A load of 580.95.05 (what the supervisor does at boot or modprobe): counters restart, links 2 and 4 stay down
    after = dict(gpus)
    assert faults.apply_link_faults(after, planted, "580.95.05")
    assert after["gpu.1.nvlink_down"] == "2,4" and "gpu.0.nvlink_crc_flit" not in after
    assert "fabric_stuck" not in after
    # ... and of 570.86.15: links up again, the planted errors counted, on GPU 0 link 0
    after = dict(gpus)
    faults.apply_link_faults(after, planted, "570.86.15")
    assert "gpu.1.nvlink_down" not in after and after["gpu.0.nvlink_crc_flit"] == "0:2"
    after = dict(gpus)
    faults.apply_link_faults(after, planted, "570.124.06")
    assert after["fabric_stuck"] == "1"
    out = run_ok(monkeypatch, capsys, "lab", "inject", "hgx-01", "fabric-stuck")
    assert read_conf(hw / "gpus.conf")["fabric_stuck"] == "1"
    assert read_conf(hw / "faults.conf")["fabric_stuck.580.95.05"] == "1"


def test_a_pcie_downgrade_sets_the_current_link_and_keeps_the_maximum(lab, monkeypatch, capsys):
    hw = lab / "hosts/hgx-01/hw"
    out = run_ok(monkeypatch, capsys, "lab", "inject", "hgx-01", "pcie-downgrade", "--gpu", "1")
    assert out == "hgx-01: GPU 1: PCIe link Gen5 x8 (of Gen5 x16)\n"
    run_ok(monkeypatch, capsys, "lab", "inject", "pcie-01", "pcie-downgrade", "--width", "16", "--gen", "3")
    gpus = read_conf(hw / "gpus.conf")
    assert (gpus["gpu.1.pcie_width"], gpus["gpu.1.pcie_gen"]) == ("8", "5")
    assert "gpu.0.pcie_width" not in gpus and "gpu.1.pcie_width_max" not in gpus
    assert read_conf(lab / "hosts/pcie-01/hw/gpus.conf")["gpu.0.pcie_gen"] == "3"  # an L40S is Gen4 x16


@pytest.mark.parametrize("args,message", [
    (("--width", "32"), "--width must be 1, 2, 4, 8 or 16 lanes, at most GPU 0's x16, not 32"),
    (("--width", "6"), "not 6"),
    (("--gen", "6"), "--gen must be 1..5 (GPU 0's Gen5), not 6"),
    (("--gpu", "2"), "hgx-01 has GPUs 0..1, not 2"),
])
def test_a_pcie_downgrade_out_of_range_is_one_line_exit_2(lab, monkeypatch, capsys, args, message):
    code, out, err = fleetctl(monkeypatch, capsys, "lab", "inject", "hgx-01", "pcie-downgrade", *args)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1, err
    assert "pcie" not in (lab / "hosts/hgx-01/hw/gpus.conf").read_text()
