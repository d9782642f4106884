#!/usr/bin/env bash
# Capture a real GPU host's driver packaging and boot state (issue 13): installed NVIDIA packages with their
# sources, the package indices apt has for them, the kernels it can boot and the module each one has.
# Usage: scripts/device-packaging-capture.sh OUTDIR   (read-only: changes nothing on the host)
set -u
out=${1:?OUTDIR}; mkdir -p "$out"
{
  echo "### uname -r"; uname -r
  echo "### /etc/os-release"; cat /etc/os-release
  echo "### /proc/cmdline"; cat /proc/cmdline
  echo "### ls -la /boot"; ls -la /boot 2>&1
  echo "### grub-editenv list"; grub-editenv list 2>&1
  echo "### /etc/default/grub"; grep -v '^#' /etc/default/grub 2>&1 | grep -v '^$'
  echo "### /boot/loader/entries"; ls -la /boot/loader/entries 2>&1
  echo "### ls /lib/modules"; ls -la /lib/modules 2>&1
  echo "### nvidia modules on disk"; find /lib/modules -name 'nvidia*.ko*' 2>&1
  echo "### modinfo -F version nvidia"; modinfo -F version nvidia 2>&1
  echo "### /sys/module/nvidia/version"; cat /sys/module/nvidia/version 2>&1
  echo "### dkms status"; dkms status 2>&1
  echo "### ls /usr/src"; ls /usr/src 2>&1
  echo "### apt sources"; cat /etc/apt/sources.list 2>&1; for f in /etc/apt/sources.list.d/*; do echo "--- $f"; cat "$f"; done 2>&1
  echo "### apt-mark showhold"; apt-mark showhold 2>&1
} > "$out/boot-and-modules.txt" 2>&1
dpkg-query -W -f='${Package}\t${Version}\t${db:Status-Abbrev}\t${source:Package}\n' 2>/dev/null \
  | grep -Ei 'nvidia|cuda-drivers|linux-(modules|objects|signatures)-nvidia|^linux-image|^linux-modules' > "$out/dpkg-nvidia.tsv"
ls -la /var/lib/apt/lists > "$out/apt-lists.txt" 2>&1
python3 - "$out" <<'PY'
import glob, os, re, sys
out = sys.argv[1]
want = re.compile(r"^(Package: )((lib)?nvidia|cuda-drivers|linux-(modules|objects|signatures)-nvidia|nvidia-open|libnvidia)", re.M)
keep = ("Package", "Source", "Version", "Architecture", "Provides", "Depends", "Pre-Depends", "Conflicts", "Replaces", "Breaks")
with open(os.path.join(out, "apt-nvidia.Packages"), "w") as dst:
    for path in sorted(glob.glob("/var/lib/apt/lists/*_Packages")):
        n = 0
        for block in open(path, errors="replace").read().split("\n\n"):
            if not want.search(block):
                continue
            fields, cur = {}, None
            for line in block.splitlines():
                if line[:1] in (" ", "\t") and cur:
                    fields[cur] += "\n" + line
                    continue
                k, _, v = line.partition(": ")
                cur = k
                fields[k] = v
            dst.write("# from %s\n" % os.path.basename(path))
            dst.write("\n".join("%s: %s" % (k, fields[k]) for k in keep if k in fields) + "\n\n")
            n += 1
        print(path, n)
PY
ls -la "$out"
