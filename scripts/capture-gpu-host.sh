#!/usr/bin/env bash
# Capture what a real NVIDIA GPU host says at the interfaces fleetctl reads, for tests/testdata/.
# Usage: scripts/capture-gpu-host.sh DEST_DIR   (run as root on a GPU host; read-only, changes nothing)
set -u
dest=${1:?usage: capture-gpu-host.sh DEST_DIR}
mkdir -p "$dest"
cap() { local name=$1; shift; { "$@"; } >"$dest/$name" 2>"$dest/$name.stderr"; echo "$?" >"$dest/$name.rc"; }
cap nvidia-smi.txt nvidia-smi
cap nvidia-smi-L.txt nvidia-smi -L
cap nvidia-smi-q.txt nvidia-smi -q
cap nvidia-smi-q-x.xml nvidia-smi -q -x
cap nvidia-smi-query.csv nvidia-smi --query-gpu=index,name,uuid,serial,pci.bus_id,driver_version,vbios_version,persistence_mode,ecc.mode.current,mig.mode.current,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,temperature.gpu,power.draw,clocks_event_reasons.active --format=csv
cap nvidia-smi-version.txt nvidia-smi --version
cap proc-driver-nvidia-version.txt cat /proc/driver/nvidia/version
cap sys-module-nvidia-version.txt cat /sys/module/nvidia/version
cap sys-module-list.txt ls /sys/module
cap proc-driver-nvidia-ls.txt ls -laR /proc/driver/nvidia
cap dev-nvidia-ls.txt sh -c 'ls -la /dev/nvidia* /dev/nvidia-caps 2>&1'
cap modinfo-nvidia.txt modinfo nvidia
cap kmsg-nvrm.txt sh -c 'timeout 5 cat /dev/kmsg 2>&1 | grep -iE "nvrm|nvidia|xid" | head -200'
cap dmesg-nvrm.txt sh -c 'dmesg 2>&1 | grep -iE "nvrm|nvidia|xid" | head -200'
cap dpkg-nvidia.txt sh -c "dpkg-query -W -f='\${Package}\t\${Version}\t\${Status}\n' 2>&1 | grep -iE 'nvidia|cuda|fabric|libnvidia' "
cap ldconfig-nvml.txt sh -c 'ldconfig -p | grep -iE "nvidia-ml|libcuda"; ls -la /usr/local/nvidia/lib64 2>&1 | head -80'
cap os-release.txt cat /etc/os-release
cap uname.txt uname -a
cap proc-cmdline.txt cat /proc/cmdline
cap modprobe-d.txt sh -c 'grep -rH . /etc/modprobe.d /usr/lib/modprobe.d /lib/modprobe.d 2>&1 | head -200'
cap cdi-ls.txt sh -c 'ls -la /etc/cdi /var/run/cdi 2>&1; head -c 4000 /etc/cdi/* /var/run/cdi/* 2>&1'
cap container-configs.txt sh -c 'cat /etc/docker/daemon.json /etc/containerd/config.toml 2>&1 | head -100; ls /etc/containerd/conf.d 2>&1'
cap procs.txt sh -c 'ps -eo pid,comm,args 2>&1 | grep -iE "persistenced|fabricmanager|nvidia" '
cap efi.txt sh -c 'ls /sys/firmware/efi 2>&1; od -An -tx1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e98032b8c8e5 2>&1'
cap nvswitch.txt sh -c 'ls -la /proc/driver/nvidia-nvswitch /dev/nvidia-nvswitch* 2>&1'
cap python.txt sh -c 'command -v python3; python3 --version; python3 -c "import pynvml,sys; print(pynvml.__file__); import importlib.metadata as m; print(m.version(\"nvidia-ml-py\"))"'
cap pynvml-dump.json python3 - <<'PY'
import json, pynvml as n
n.nvmlInit()
def call(f, *a):
    try:
        v = f(*a)
        if isinstance(v, bytes): v = v.decode()
        if hasattr(v, "_fields_"):
            v = {k: (getattr(v, k).decode() if isinstance(getattr(v, k), bytes) else getattr(v, k)) for k, _ in v._fields_}
        if isinstance(v, (list, tuple)): v = [x if isinstance(x, (int, float, str)) else str(x) for x in v]
        return v
    except n.NVMLError as e:
        return {"nvml_error": str(e), "code": e.value}
    except Exception as e:
        return {"error": repr(e)}
out = {"driver": call(n.nvmlSystemGetDriverVersion), "nvml": call(n.nvmlSystemGetNVMLVersion),
       "cuda": call(n.nvmlSystemGetCudaDriverVersion_v2), "count": call(n.nvmlDeviceGetCount), "gpus": []}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    g = {"name": call(n.nvmlDeviceGetName, h), "uuid": call(n.nvmlDeviceGetUUID, h), "serial": call(n.nvmlDeviceGetSerial, h),
         "pci": call(lambda h: n.nvmlDeviceGetPciInfo(h).busId, h), "vbios": call(n.nvmlDeviceGetVbiosVersion, h),
         "persistence": call(n.nvmlDeviceGetPersistenceMode, h), "ecc": call(n.nvmlDeviceGetEccMode, h),
         "ecc_unc_vol": call(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
         "ecc_unc_agg": call(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
         "remapped": call(n.nvmlDeviceGetRemappedRows, h),
         "retired_sbe": call(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
         "retired_dbe": call(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
         "retired_pending": call(n.nvmlDeviceGetRetiredPagesPendingStatus, h),
         "mig": call(n.nvmlDeviceGetMigMode, h),
         "pcie_gen": call(n.nvmlDeviceGetCurrPcieLinkGeneration, h), "pcie_gen_max": call(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
         "pcie_gen_gpu_max": call(n.nvmlDeviceGetGpuMaxPcieLinkGeneration, h),
         "pcie_width": call(n.nvmlDeviceGetCurrPcieLinkWidth, h), "pcie_width_max": call(n.nvmlDeviceGetMaxPcieLinkWidth, h),
         "clock_events": call(n.nvmlDeviceGetCurrentClocksEventReasons, h),
         "temp": call(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU), "power_mw": call(n.nvmlDeviceGetPowerUsage, h),
         "power_limit_mw": call(n.nvmlDeviceGetEnforcedPowerLimit, h),
         "clocks_sm": call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM), "clocks_mem": call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
         "arch": call(n.nvmlDeviceGetArchitecture, h), "minor": call(n.nvmlDeviceGetMinorNumber, h),
         "memory": call(n.nvmlDeviceGetMemoryInfo, h),
         "procs": call(n.nvmlDeviceGetComputeRunningProcesses, h)}
    try:
        fv = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
        g["recovery_action"] = {"ret": fv.nvmlReturn, "value": fv.value.uiVal}
    except Exception as e:
        g["recovery_action"] = {"error": repr(e)}
    out["gpus"].append(g)
print(json.dumps(out, indent=1, default=str))
PY
exit 0
