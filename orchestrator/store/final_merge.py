"""What the final merge job did last (``SWEEP/final-merge.json``): merged, or refused and why.

The job on the cluster writes it (``control.dispatch.tasks``); ``status`` reads it, so it can
say why the job failed in one line instead of pointing at its log.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.store.files import atomic_write_json, now_iso, read_text
from orchestrator.store.sweepdir import SweepDir

FINAL_MERGE_FILE = "final-merge.json"


def record_final_merge(sd: SweepDir, result: dict[str, Any]) -> None:
    """Write what the final merge job did: ``ok``, its ``job_id`` and what it merged, or the
    one-line ``error`` it refused with."""
    atomic_write_json(sd.root / FINAL_MERGE_FILE, {**result, "finished": now_iso()}, indent=1)


def final_merge(sd: SweepDir) -> dict[str, Any] | None:
    """What the final merge job wrote last; None where it has not written (or its file is damaged)."""
    try:
        data = json.loads(read_text(sd.root / FINAL_MERGE_FILE))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
