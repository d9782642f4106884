"""The lab: emulated NVIDIA GPU hosts in network + mount namespaces, reached over real SSH (see docs/lab.md).

Its own distribution (fleetctl-lab, lab/pyproject.toml), which registers `fleetctl lab` as a plugin command; the
fleetctl package never imports it."""

__version__ = "0.1.0"
