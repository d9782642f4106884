"""What every recorded command shares: load the fleet and the baseline, open a run in the history, close it as
failed if anything goes wrong, head its report with who ran what against which baseline, and deliver the report
before the run is sealed (so the record holds the code the command exits with)."""

from __future__ import annotations

import sys

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import __version__, baseline as baseline_mod, interrupts
from .fleet import domains, inventory, runner
from .errors import InputError, OperationError
from .exitcodes import Exit
from .history.store import Store, now


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
        if store.run(run_id)["status"] != "running":  # sealed, its report then not delivered (close())
            raise
        with interrupts.deferred():  # the record is written whole, a second signal waits for it
            if status_of(e) == "interrupted":  # never findings: the run was stopped
                store.fail_run(run_id, f"interrupted by {getattr(e, 'name', 'SIGINT')}", exit_code_of(e),
                               status="interrupted")
            else:
                store.fail_run(run_id, f"{type(e).__name__}: {e}", exit_code_of(e))
        raise


def close(report: dict[str, Any], seal: Callable[[int, str, str], None],
          deliver: Callable[[dict[str, Any]], None] | None = None,
          notify: Callable[[], None] | None = None) -> dict[str, Any]:
    """REPORT (a run's, header() first) notified by NOTIFY (what became of it in the summary's `notifications`),
    given to DELIVER (the command's output), then its run sealed by SEAL(exit code, finished_at, status) with the
    finished_at the report states. Either failing (an output that cannot be written, a signal) keeps the results
    but the run is the command's: sealed failed (or interrupted) with the code the command then exits with, and why
    in its summary's `delivery`."""
    at = report["run"]["finished_at"]
    try:
        if notify is not None:
            notify()
        if deliver is not None:
            deliver(report)
    except BaseException as e:
        with interrupts.deferred():
            report["summary"]["delivery"] = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            seal(exit_code_of(e), at, status_of(e))
        raise
    seal(report["summary"]["exit_code"], at, "done")
    return report


def status_of(e: BaseException) -> str:
    """The status of a run E ended: interrupted (a signal), else failed."""
    return "interrupted" if isinstance(e, (KeyboardInterrupt, interrupts.Interrupted)) else "failed"


def exit_code_of(e: BaseException) -> int:
    """The code fleetctl exits with when E ends a command (cli/main.py's)."""
    if isinstance(e, (interrupts.Interrupted, InputError, OperationError)):
        return e.exit_code
    return Exit.INTERRUPTED if isinstance(e, KeyboardInterrupt) else Exit.INTERNAL


def header(store: Store, run: Run) -> dict[str, Any]:
    """schema_version, tool and run: the part every report shares. A run not sealed yet finishes now (close())."""
    row = store.run(run.id)
    return {
        "schema_version": 1,
        "tool": {"name": "fleetctl", "version": __version__},
        "run": {"id": run.id, "uuid": run.uuid, "kind": run.kind, "started_at": row["started_at"],
                "finished_at": row["finished_at"] or now(), "operator": row["operator"], "control_node": row["control_node"],
                "inventory": run.fleet.source, "limit": run.limit,
                "baseline": {"name": run.base.name, "path": str(run.base.path), "digest": run.base.digest}},
    }
