"""The fleet: the hosts and how fleetctl reaches them.

    inventory.py        hosts, groups and connection settings from an Ansible inventory
    preflight.py        the SSH pre-flight
    domains.py          NVLink domains: the unit of change of a rack
    runner.py           one playbook through ansible-runner, each host's outcome
    execution_nodes.py  the execution nodes that run the playbooks of the hosts they serve

May import: the shared helpers only.
"""

# What this package's modules may import of fleetctl besides each other and the shared helpers (orchestrator.SHARED;
# tests/unit/test_layers.py checks every import against them).
MAY_IMPORT = ()
