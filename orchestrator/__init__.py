"""fleetctl: keep NVIDIA GPU fleets on a known-good driver baseline."""

__version__ = "0.1.0"
