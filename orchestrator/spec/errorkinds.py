"""The kinds of error a record may carry, and which error records ``resume --retry-errors KIND``
redoes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# What the worker records for a config it gives up on after ``executor.max_config_attempts``
# deaths while that config was alone in flight: "WorkerTimeout" when the time limit found it
# hung each time, "WorkerCrashed" otherwise. ``resume --retry-errors`` redoes records by kind.
CRASHED_ERROR = "WorkerCrashed"
TIMEOUT_ERROR = "WorkerTimeout"
RETRY_KINDS: tuple[str, ...] = ("crashed", "timeout", "all")


def error_kind(rec: Mapping[str, Any]) -> str | None:
    """ "crashed", "timeout", "other" (any other error), or None for a measurement."""
    err = rec.get("error")
    if not isinstance(err, str):
        return None
    if err.startswith(CRASHED_ERROR + ":"):
        return "crashed"
    if err.startswith(TIMEOUT_ERROR + ":"):
        return "timeout"
    return "other"


def retried(rec: Mapping[str, Any], kind: str) -> bool:
    """Whether ``--retry-errors KIND`` redoes this record (``all``: every error record)."""
    found = error_kind(rec)
    return found is not None and (kind == "all" or found == kind)
