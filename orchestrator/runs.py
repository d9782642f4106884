"""What every recorded command shares: load the fleet and the baseline, open a run in the history, close it as
failed if anything goes wrong, and head its report with who ran what against which baseline."""

from __future__ import annotations

import sys

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from . import __version__, baseline as baseline_mod, domains, interrupts, inventory, runner
from .errors import InputError, OperationError
from .exitcodes import Exit
from .store import Store


@dataclass(frozen=True)
class Run:
    id: int
    uuid: str
    kind: str
    fleet: inventory.Fleet
    base: baseline_mod.Baseline
    limit: str | None


def prepare(inventory_path: str | None, limit: str | None,
            baseline_path: str | None) -> tuple[inventory.Fleet, baseline_mod.Baseline]:
    """(fleet, baseline), checked: input errors are raised here, before anything is recorded."""
    fleet = inventory.load(inventory_path, limit)
    base = baseline_mod.load(baseline_path)
    base.check_groups(set(fleet.groups))
    domains.check_declared(fleet)
    runner.worker_command()  # a malformed $FLEETCTL_WORKER is an input error too
    sys.stderr.write(fleet.parse_warnings)
    return fleet, base


@contextmanager
def recorded(store: Store, kind: str, argv: list[str], fleet: inventory.Fleet, base: baseline_mod.Baseline,
             limit: str | None) -> Iterator[Run]:
    """A run in the history for the block's duration; marked failed (and re-raised) if the block raises, with the
    code fleetctl exits with."""
    run_id, run_uuid = store.begin_run(kind, argv, fleet.source, limit, base)
    try:
        yield Run(run_id, run_uuid, kind, fleet, base, limit)
    except BaseException as e:
        with interrupts.deferred():  # the record is written whole, a second signal waits for it
            if isinstance(e, (KeyboardInterrupt, interrupts.Interrupted)):  # never findings: the run was stopped
                code = e.exit_code if isinstance(e, interrupts.Interrupted) else Exit.INTERRUPTED
                store.fail_run(run_id, f"interrupted by {getattr(e, 'name', 'SIGINT')}", code, status="interrupted")
            else:
                code = e.exit_code if isinstance(e, (InputError, OperationError)) else Exit.INTERNAL
                store.fail_run(run_id, f"{type(e).__name__}: {e}", code)
        raise


def header(store: Store, run: Run) -> dict[str, Any]:
    """schema_version, tool and run: the part every report shares."""
    row = store.run(run.id)
    return {
        "schema_version": 1,
        "tool": {"name": "fleetctl", "version": __version__},
        "run": {"id": run.id, "uuid": run.uuid, "kind": run.kind, "started_at": row["started_at"],
                "finished_at": row["finished_at"], "operator": row["operator"], "control_node": row["control_node"],
                "inventory": run.fleet.source, "limit": run.limit,
                "baseline": {"name": run.base.name, "path": str(run.base.path), "digest": run.base.digest}},
    }
