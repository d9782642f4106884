"""`python -m orchestrator.cli`: fleetctl."""

from .main import main

main()
