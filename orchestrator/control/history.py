"""A sweep's ``jobs.jsonl`` read once: the last job of each unit and the sweep's events.

``jobs.jsonl`` is appended by every command that submits, resumes or cancels (one fsynced
JSON object a line; a torn last line after a crash is skipped). Status, resume and wait
rebuild from it which job runs each unit now and what was done to the sweep.
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator.control.scheduler import array_of
from orchestrator.store.sweepdir import SweepDir

# the event ``arrays.submit_with_merge`` notes where sbatch took arrays but refused their final
# merge job: ``after`` (the arrays), ``why`` (sbatch's words), ``ts``
MERGE_REFUSED = "merge_job_refused"


@dataclass
class History:
    """jobs.jsonl read once: the last job of each unit and the sweep's events."""

    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    submissions: Counter = field(default_factory=Counter)
    cancelled: dict[str, float] = field(default_factory=dict)  # task (or array) id -> when `tilesweep cancel` ran
    resumed: set[str] = field(default_factory=set)
    merge_jobs: list[dict[str, Any]] = field(default_factory=list)
    merge_refused: str | None = None  # why sbatch refused the last final merge job, where none was submitted since
    first_submitted: float | None = None
    slurm_jobs: list[str] = field(default_factory=list)  # every SLURM job the sweep ever had (GPU-hours)
    round2_deferred: str | None = None  # the last merge job's reason for not submitting round 2
    deferred: dict[int, str] = field(default_factory=dict)  # round -> the last such reason for any round
    last_resume: list[str] = field(default_factory=list)  # the units the last resume that submitted any submitted


def read_history(sd: SweepDir) -> History:
    h = History()
    for e in sd.job_history():
        event = e.get("event")
        if event is None and "unit" in e:
            h.latest[e["unit"]] = e
            h.submissions[e["unit"]] += 1
            if h.first_submitted is None:
                h.first_submitted = submitted_ts(e)
            if e.get("executor") == "slurm" and e.get("job_id"):
                h.slurm_jobs.append(str(e["job_id"]))
        elif event == "cancel":  # the tasks it cancelled; a cancel that named only arrays, each of their tasks
            for j in e.get("jobs", e.get("arrays", [])):
                h.cancelled[str(j)] = float(e.get("ts") or 0)
        elif event == "resume":
            h.resumed.update(e.get("replaces", []))
            h.resumed.difference_update(e.get("units", []))
            h.last_resume = list(e.get("units") or h.last_resume)
        elif event == "merge_job":
            h.merge_jobs.append(e)
            h.merge_refused = None
        elif event == MERGE_REFUSED:
            h.merge_refused = str(e.get("why"))
        elif isinstance(event, str) and (number := _deferred_round(event)) is not None:
            h.deferred[number] = str(e.get("why"))
            if event == "round2_deferred":
                h.round2_deferred = str(e.get("why"))
    return h


def _deferred_round(event: str) -> int | None:
    """N of a ``roundN_deferred`` event (``rounds.after_merge`` could not submit round N)."""
    number = event.removeprefix("round").removesuffix("_deferred")
    return int(number) if event.startswith("round") and event.endswith("_deferred") and number.isdigit() else None


def cancelled_since(cancelled: dict[str, float], job: dict[str, Any]) -> bool:
    """Whether ``tilesweep cancel`` cancelled ``job``'s task after the job was submitted
    (``History.cancelled``: the id of each task it cancelled, or of each array a cancel event that
    names no tasks cancelled, -> when)."""
    jid = str(job.get("job_id", ""))
    when = max(cancelled.get(jid, -1.0), cancelled.get(array_of(jid), -1.0))
    return when >= (submitted_ts(job) or 0.0)


def submitted_ts(entry: dict[str, Any]) -> float | None:
    """When a job was submitted (epoch seconds), from its ``jobs.jsonl`` line."""
    if "submitted_ts" in entry:
        return float(entry["submitted_ts"])
    try:
        return _dt.datetime.fromisoformat(entry["submitted"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None
