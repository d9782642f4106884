"""What every scheduler shares: a host's node name."""

from __future__ import annotations

from ..fleet import inventory


def node_names(fleet: inventory.Fleet, hosts: list[str]) -> dict[str, str]:
    """host -> the scheduler's node name (the `fleetctl_node_name` host variable, else the inventory name)."""
    return {h: str(fleet.host(h).vars.get("fleetctl_node_name", h)) for h in hosts}
