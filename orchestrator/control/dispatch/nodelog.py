"""Logging on the node: every process of a task (the task itself, each unit's worker, the
merge job) logs INFO and up to its stderr, timestamped; that stderr is the log ``tilesweep
status`` and ``tilesweep logs`` read. A unit measured in a local run's own process
(``inprocess``) logs the same way, to its unit's log."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

NODE_LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


def configure_node_logging() -> None:
    """INFO and up to stderr, timestamped (a no-op where logging is set up already, as in
    the debug executor's process)."""
    logging.basicConfig(level=logging.INFO, format=NODE_LOG_FORMAT)


@contextlib.contextmanager
def logs_to(path: Path) -> Iterator[None]:
    """While a unit runs in a process that has logging of its own (``inprocess``): its records go
    to ``path``, INFO and up, timestamped, as a worker process's go to its log, and none of them
    to the process's own handlers, which are put back afterwards."""
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(NODE_LOG_FORMAT))
    handlers, level = root.handlers[:], root.level
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.handlers = handlers
        root.setLevel(level)
        handler.close()
