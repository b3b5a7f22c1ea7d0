"""A unit's summary and its completion marker: their typed forms and their one writer.

A worker's attempt at a unit ends with a summary (what ``jobs.worker.run_unit`` returns; through
submitit, a plain dict); when the unit is complete, the same summary is its completion marker
(``done/<unit>.json``, written atomically), with the ``partial`` block that says which partial
it vouches for and when it was written. The reuse unit written at plan time (``carried``) has a
marker of the same form. ``progress`` reads markers back (``read_marker``, ``trusted_block``).

TypedDicts, as the partial lines are (``lines`` says why): a summary is a JSON object on disk and
a dict for the callers of ``run_unit``, so its type costs nothing on either path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from orchestrator.store.files import atomic_write_json, now_iso, open_file
from orchestrator.store.partials import loads
from orchestrator.store.sweepdir import SweepDir


class PartialBlock(TypedDict):
    """Which partial a marker vouches for: its inode, size and mtime (ns), and what it held."""

    stat: list[int]
    records: int
    errors: int


class UnitSummary(TypedDict):
    """What one attempt at a unit did. A worker's summary holds every key but ``reused``; a reuse
    unit's holds ``reused`` and none of the worker's measuring keys. ``compile_sum_s`` and
    ``timed_s`` are seconds of a virtual clock for a replay (``clock: virtual``); ``wall_s`` is
    always the worker's real time."""

    unit: str
    attempt: int
    round: int
    done: int  # records this attempt wrote
    errors: int  # of those, error records
    screened: int
    total: int  # the unit's items
    already: int  # items recorded before this attempt began
    stopped: bool  # stopped early: the unit is not complete
    reused: NotRequired[int]
    wall_s: NotRequired[float]
    clock: NotRequired[str]
    compile_workers: NotRequired[int]
    compiled: int
    compile_cached: NotRequired[int]
    compile_sum_s: NotRequired[float]
    compile_wall_s: NotRequired[float]
    timed_s: NotRequired[float]
    compile_mode: NotRequired[str | None]  # None: nothing was compiled (a replay)
    compile_deaths: NotRequired[int]  # compile processes that died with a config in flight
    load_sum_s: NotRequired[float]  # loading compile processes' executables into the worker
    timer: NotRequired[str | None]  # kernels.timing's name of the unit's timer; None: nothing timed
    gpu: NotRequired[str | None]
    job: NotRequired[str | None]  # the SLURM task (jobs.node_env.slurm_task)
    handed_on: NotRequired[dict[str, int]]  # later unit -> items `resume` gave it, left to it (store.handed_on)


class CompletionMarker(UnitSummary):
    partial: PartialBlock
    finished: str


@dataclass
class UnitCounts:
    """What an attempt has done so far, as its summary reports it."""

    done: int = 0
    errors: int = 0
    screened: int = 0
    compiled: int = 0
    compile_cached: int = 0
    compile_sum_s: float = 0.0
    compile_wall_s: float = 0.0
    timed_s: float = 0.0  # seconds spent timing (warm-up, probes, samples)
    load_sum_s: float = 0.0
    compile_deaths: int = 0


def worker_summary(
    *,
    unit: str,
    attempt: int,
    unit_round: int,
    total: int,
    already: int,
    stopped: bool,
    wall_s: float,
    counts: UnitCounts,
    clock: str,
    compile_workers: int,
    compile_mode: str | None,
    timer: str | None,
    gpu: str | None,
    job: str | None,
) -> UnitSummary:
    """A worker's summary of its attempt (``clock``, ``compile_workers``, ``compile_mode``,
    ``timer``: how its measurer measured)."""
    return {
        "unit": unit,
        "attempt": attempt,
        "round": unit_round,
        "done": counts.done,
        "errors": counts.errors,
        "screened": counts.screened,
        "total": total,
        "already": already,
        "stopped": stopped,
        "wall_s": round(wall_s, 3),
        "clock": clock,
        "compile_workers": compile_workers,
        "compiled": counts.compiled,
        "compile_cached": counts.compile_cached,
        "compile_sum_s": round(counts.compile_sum_s, 3),
        "compile_wall_s": round(counts.compile_wall_s, 3),
        "timed_s": round(counts.timed_s, 4),
        "compile_mode": compile_mode,
        "compile_deaths": counts.compile_deaths,
        "load_sum_s": round(counts.load_sum_s, 3),
        "timer": timer,
        "gpu": gpu,
        "job": job,
    }


def reuse_summary(unit: str, *, records: int, errors: int, screened: int) -> UnitSummary:
    """The summary of the reuse unit: every item recorded at plan time, nothing measured."""
    return {
        "unit": unit,
        "attempt": 1,
        "round": 1,
        "done": records,
        "errors": errors,
        "screened": screened,
        "total": records,
        "already": 0,
        "stopped": False,
        "reused": records,
        "compiled": 0,
    }


def partial_block(path: os.PathLike[str] | str, records: int, errors: int) -> PartialBlock:
    """The ``partial`` block of a marker for the partial at ``path`` as it is now (what
    ``trusted_block`` checks), holding ``records`` records of which ``errors`` errors."""
    st = os.stat(path)
    return {"stat": [st.st_ino, st.st_size, st.st_mtime_ns], "records": records, "errors": errors}


def write_marker(sd: SweepDir, summary: UnitSummary, *, records: int, errors: int) -> None:
    """The unit is complete: its marker, vouching for its partial as it is now, which holds
    ``records`` records (``errors`` of them errors), written atomically."""
    unit = summary["unit"]
    marker: CompletionMarker = {
        **summary,
        "partial": partial_block(sd.partial_path(unit), records, errors),
        "finished": now_iso(),
    }
    atomic_write_json(sd.marker_path(unit), marker)


def read_marker(path: os.PathLike[str] | str) -> CompletionMarker | None:
    """A marker as it was written, or None where there is none or it is not a JSON object
    (``trusted_block`` says whether it still vouches for its partial)."""
    try:
        with open_file(Path(path)) as f:
            m = loads(f.read())
    except (OSError, ValueError):
        return None
    return cast(CompletionMarker, m) if isinstance(m, dict) else None


def trusted_block(marker: CompletionMarker | None, st: os.stat_result | None) -> PartialBlock | None:
    """The ``partial`` block of a marker that still describes the partial (``st``: its stat now):
    one truncated, appended to, replaced or copied over since does not match."""
    block = marker.get("partial") if marker is not None else None
    if not isinstance(block, dict) or st is None or block.get("stat") != [st.st_ino, st.st_size, st.st_mtime_ns]:
        return None
    return block if type(block.get("records")) is int and type(block.get("errors")) is int else None
