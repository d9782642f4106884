"""fleetctl: keep NVIDIA GPU fleets on a known-good driver baseline."""

__version__ = "0.1.0"

# The shared helpers: what every package of orchestrator/ may import besides what its own MAY_IMPORT declares
# (tests/unit/test_layers.py; docs: reference/packages.md).
SHARED = (
    "orchestrator.errors",
    "orchestrator.exitcodes",
    "orchestrator.sanitize",
    "orchestrator.redact",
    "orchestrator.inputs",
    "orchestrator.files",
    "orchestrator.resources",
    "orchestrator.settings",
    "orchestrator.schemas",
    "orchestrator.interrupts",
    "orchestrator.history.timefmt",
)
