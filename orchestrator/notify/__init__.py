"""Notifications: what fleetctl tells people and other programs.

    send.py     each event to commands and webhooks
    events.py   which events fleetctl notifies, and what each says
    webhook.py  a webhook target: the POST, its tries, the proxy

May import: the shared helpers, the history (what an event reports), the audit's blocking findings and a
campaign's journal, capacity and transitions (events are made from its records). Never the engine, the
fleet nor a command.
"""

# What this package's modules may import of fleetctl besides each other and the shared helpers (orchestrator.SHARED;
# tests/unit/test_layers.py checks every import against them).
MAY_IMPORT = (
    "orchestrator.history",
    "orchestrator.audit",
    "orchestrator.campaign.capacity",
    "orchestrator.campaign.journal",
    "orchestrator.campaign.transitions",
)
