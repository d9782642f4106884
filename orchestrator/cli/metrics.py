"""`fleetctl metrics`: the history as Prometheus metrics."""

from __future__ import annotations

import click

from ..exitcodes import documented
from ..files import writable
from ..history.store import Store
from . import options
from .output import emit


@click.command()
@options.output("Write to FILE atomically (e.g. node_exporter's textfile directory) instead of stdout.")
@options.limit(options.HOST_PATTERNS_HELP)
@documented("metrics")
def metrics(output, limit) -> None:
    """Every host's latest state in the history as Prometheus metrics (no host is contacted): controls, driver,
    GPUs, Xids, probe medians, campaign states, and the age of the history's chain head."""
    from .. import prometheus
    writable(output)
    with Store(readonly=True) as store:
        text = prometheus.history_text(store, limit)
    emit(text, output)
