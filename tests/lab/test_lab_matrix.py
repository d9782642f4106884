"""The blessed matrix gates the target (issue 26), on one lab of 2 H100 hosts on 570.86.15 whose workloads need
CUDA 12.8: no campaign to a driver the baseline's own rules fail, and a forward verify as strict as the rollback's."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.lab import FAST, TO, assert_on, fleetctl_lab, hosts_of, show

pytestmark = pytest.mark.lab

OLDER, NEWER = "550.163.01", "570.124.06"  # CUDA 12.4 and 12.8
HOSTS = ("h100-01", "h100-02")


def packages(lab, host: str) -> str:
    """Every NVIDIA package's name, version and selection (hold) and status, byte for byte."""
    return lab.ssh(host, "dpkg-query -W -f='${Package} ${Version} ${Status}\\n' '*nvidia*' | sort").stdout


def test_no_campaign_to_a_driver_the_baselines_own_rules_fail_and_verify_judges_the_whole_host(tmp_path):
    started = time.monotonic()
    baseline = tmp_path / "b.yml"
    baseline.write_text("schema_version: 1\nname: lab-matrix\ngroups:\n  all:\n"
                        "    driver: {branches: ['550', '570', '580'], held: true}\n"
                        "    workloads: {cuda: ['12.8']}\n"
                        "    container_runtime: {cdi: true}\n"
                        "    campaign: {fabric_wait_s: 15}\n")
    with fleetctl_lab(tmp_path, (f"2xh100-sxm/2@{TO}",)) as lab:
        _, report = lab.audit("-b", str(baseline))
        for h in report["hosts"]:
            controls = {f["control"]: f["status"] for f in h["findings"]}
            assert controls["driver.cuda_support"] == controls["runtime.cdi"] == "pass", h["name"]
        # plan: no host takes 550 (CUDA 12.4), with the message the audit would give after the change
        proc = lab.fleetctl("plan", "--to", OLDER, "-i", lab.inventory, "-b", str(baseline), "--format", "json")
        assert proc.returncode == 0, proc.stderr
        made = json.loads(proc.stdout)
        assert made["waves"] == [] and [h["code"] for h in made["excluded"]] == ["target_not_blessed"] * 2
        assert "driver.cuda_support high: driver 550.163.01 supports CUDA up to 12.4; workloads need 12.8" in \
            made["excluded"][0]["reason"]
        assert [(g["group"], g["takes_target"]) for g in made["target_groups"]] == [("h100_sxm", False)]
        # upgrade: refused in one line, exit 2, nothing changed on any host
        before = {h: packages(lab, h) for h in HOSTS}
        proc = lab.fleetctl("upgrade", "--to", OLDER, "-i", lab.inventory, "-b", str(baseline), *FAST,
                            "--waves", "1,100%")
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
        assert proc.stderr.count("\n") == 1 and "no host's baseline allows 550.163.01: h100-01: " in proc.stderr
        assert {h: packages(lab, h) for h in HOSTS} == before
        assert lab.fleetctl("campaign", "show", "1").returncode == 2  # no campaign was started

        # A CDI spec the job scheduler keeps beside fleetctl's: the activation regenerates fleetctl's own, this one
        # stays generated for the old driver. runtime.cdi passed at the precheck and fails after: verify rolls back.
        lab.ssh("h100-01", "cp /etc/cdi/nvidia.yaml /etc/cdi/nvidia-jobs.yaml")
        proc = lab.fleetctl("upgrade", "--to", NEWER, "-i", lab.inventory, "-l", "h100-01", "-b", str(baseline), *FAST,
                            "--waves", "100%", timeout=900)
        assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr
        host = hosts_of(show(lab))["h100-01"]
        verify = next(s for s in host["steps"] if s["step"] == "verify")
        assert verify["status"] == "fail", verify
        assert "runtime.cdi: CDI spec /etc/cdi/nvidia-jobs.yaml was generated for driver 570.86.15" in verify["reason"]
        assert "(it was pass at the pre-check)" in verify["reason"]
        assert host["state"] == "rolled_back"
        for name in HOSTS:
            assert_on(lab, name, TO)
    print(f"\nmatrix test: {time.monotonic() - started:.1f}s")
