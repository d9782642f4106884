"""The interface every scheduler a campaign drains through implements (Scheduler), and the campaign's own (of).
Its own module, so that `fleetctl check --slurm` imports slurmctl.py without the campaign's schedulers."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..fleet import inventory
from ..campaign import hooks
from .slurm import Slurm
from .templates import Kubernetes, Templates

if TYPE_CHECKING:
    from ..campaign.context import Context, Outcome
    from ..campaign.journal import Journal
    from ..campaign.options import CampaignOptions


class Scheduler(Protocol):
    """What a campaign asks of the scheduler that runs its hosts' jobs. HOSTS are inventory names (the scheduler
    maps them to its own: `node_names`); a step's methods answer every host of the batch."""

    name: str
    reserves: bool  # holds a wave's nodes ahead of it (--drain-mode reservation)

    def left_out(self, fleet: inventory.Fleet, hosts: list[str]) -> list[dict[str, Any]]:
        """At plan: the hosts a campaign must not touch ({name, code, reason} each): taken out of service by
        someone else."""

    def drain(self, ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
        """No new job starts on the hosts; running jobs run on. A host already drained by this campaign is ok."""

    def busy(self, ctx: Context, hosts: list[str]) -> dict[str, str]:
        """One look, never waiting: host -> why the scheduler still has work on it; a host not named is idle as
        far as the scheduler knows (the GPU check follows)."""

    def reboot_commands(self, ctx: Context, hosts: list[str], rollback: bool) -> dict[str, str]:
        """host -> the shell command the activation runs on it to reboot it through the scheduler (the scheduler
        then shows it rebooting, and keeps it out of service until undrain); a host not named reboots by itself
        (the role's `shutdown -r`). ROLLBACK: the rollback's activation."""

    def undrain(self, ctx: Context, hosts: list[str]) -> dict[str, Outcome]:
        """The hosts back in service: only what this campaign took out; a reboot it asked that has not happened is
        withdrawn."""

    def failed_jobs(self, ctx: Context, hosts: list[str]) -> tuple[dict[str, list[dict[str, Any]]], str | None]:
        """For the soak: host -> the jobs that failed on it since its undrain; and what kept them from being read
        (None: read, or nothing to read)."""

    def reserve(self, ctx: Context, wave: int, hosts: list[str], start: datetime) -> None:
        """Hold wave WAVE's HOSTS from START on: no job that would still run at START starts on them, running jobs
        run on. Made once; asked again (a resume) it holds exactly HOSTS. Raises InputError for what the operator
        must fix, OperationError when the scheduler refuses."""

    def release(self, journal: Journal, campaign: int, keep: int | None = None) -> None:
        """Let go of every hold the campaign made (KEEP: but that wave's); never anyone else's. Needs no
        inventory: `campaign abort` calls it."""




def of(options: CampaignOptions) -> Scheduler:
    """The campaign's scheduler, from its drain options (hooks.resolve: --drain-preset, --drain, --undrain)."""
    h = options.hooks
    if h.slurm:
        return Slurm()
    kubernetes = hooks.PRESETS["kubernetes"]
    if (h.drain, h.undrain) == (kubernetes.drain, kubernetes.undrain):
        return Kubernetes(h)
    return Templates(h)


# What this package's modules may import of fleetctl besides each other and orchestrator itself
# (tests/unit/test_layers.py checks every import against it).
