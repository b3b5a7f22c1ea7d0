"""Logging on the node: every process of a task (the task itself, each unit's worker, the
merge job) logs INFO and up to its stderr, timestamped; that stderr is the log ``tilesweep
status`` and ``tilesweep logs`` read."""

from __future__ import annotations

import logging

NODE_LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


def configure_node_logging() -> None:
    """INFO and up to stderr, timestamped (a no-op where logging is set up already, as in
    the debug executor's process)."""
    logging.basicConfig(level=logging.INFO, format=NODE_LOG_FORMAT)
