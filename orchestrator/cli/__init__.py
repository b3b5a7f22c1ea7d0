"""The ``tilesweep`` command line: the only place that prints or configures logging."""

from orchestrator.cli.main import main

__all__ = ["main"]
