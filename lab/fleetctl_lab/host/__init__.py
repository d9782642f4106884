"""One lab host from the inside: what its supervisor (fleetctl_lab.supervisor, PID 1 of the host) runs, one module
per concern (hosts.py is the controller's side). The supervisor's Host is made of these parts:

    base.HostBase              the host's directory, config and state for the controller; the GPUs' hardware file
    rootfs.RootFilesystem      the root (overlay over /), the emulated kernel files, /run, the host's own files, shims
    provision.Provisioning     the starting driver, installed before the first boot (apt, Debian's packages or dnf)
    kernel_modules.KernelModules  each boot's kernel state, and the host's modprobe, rmmod and modinfo
    daemons.InitSystem         processes, the driver's daemons, sshd and the host's systemctl

Each part uses the others' attributes and methods through self (the one Host object); standard library and the
lab's own modules only.
"""
