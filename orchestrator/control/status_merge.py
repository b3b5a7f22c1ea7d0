"""What ``status`` says of a sweep's merge: its final merge jobs as SLURM and ``final-merge.json``
say, the one sbatch refused at submission (``history.MERGE_REFUSED``), whether one follows the units
that still run (not where sbatch refused it or it ended first: a ``scancel``), and its results
document: whether it holds what the partials hold now, and where it does not, why nothing wrote it
or what will."""

from __future__ import annotations

import os
from typing import Any

from orchestrator.control.history import History
from orchestrator.control.scheduler import SchedulerView
from orchestrator.control.status_model import SweepStatus
from orchestrator.store.carried import carried_from_output
from orchestrator.store.final_merge import final_merge
from orchestrator.store.merged import document_current, output_of
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.target import holds_sweep

# the states of a final merge job that ended without merging (COMPLETED: it merged, or refused)
_MERGE_ENDED = ("CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
# why a settled sweep whose final merge job sbatch refused holds records no document does
REFUSED_AT_SUBMIT = "sbatch refused its final merge job"


def document(sd: SweepDir, st: SweepStatus, partials: dict[str, tuple[int, int]]) -> None:
    """The sweep's results document: where, whether it is there and holds what ``partials``
    hold now, and where it does not, why its final merge job wrote none or what will write it."""
    st.output, st.merged = str(output_of(sd)), document_current(sd, partials)
    st.output_exists = os.path.exists(st.output)
    # a complete sweep's document that another sweep's merge of the same output replaced; not the
    # document this sweep's plan carried records from, as it was then (its records are those carried)
    unmerged = st.complete and st.output_exists and not st.merged and not holds_sweep(sd, output_of(sd))
    st.output_carried = unmerged and carried_from_output(sd, output_of(sd))
    st.output_foreign = unmerged and not st.output_carried
    last = st.merge_jobs[-1] if st.merge_jobs and st.merge_refused is None else None
    ended = last is not None and (bool(last["error"]) or last["state"] in _MERGE_ENDED)
    st.no_merge_follows = not st.settled and (ended or st.merge_refused is not None)
    # said once the units settled: until then they are what a merge waits for
    st.unmerged = None if st.merged or not st.settled else _unmerged(st, last)
    st.merging = None if st.merged else _merging(st)


def _unmerged(st: SweepStatus, last: dict[str, Any] | None) -> str | None:
    """Why the sweep's document was not written, where nothing will write it: sbatch refused its
    last final merge job, the job refused, or SLURM ended it (cancelled, failed, out of time or
    memory) before its merge."""
    if st.merge_refused is not None:
        return REFUSED_AT_SUBMIT
    if last is None:
        return None
    if last["error"]:
        return "its final merge job refused"
    if last["state"] in _MERGE_ENDED:
        return f"its final merge job {last['state'].lower().replace('_', ' ')}"
    return None


def _merging(st: SweepStatus) -> str | None:
    """What will write the sweep's document without a user's word: its final merge job, pending
    or running, or the live ``tilesweep run`` that runs the sweep (it merges when it ends)."""
    last = st.merge_jobs[-1] if st.merge_jobs and st.merge_refused is None else None
    if last is not None and last["state"] in ("PENDING", "RUNNING"):
        return f"its final merge job {last['job_id']} ({last['state'].lower()})"
    if st.runner_stopped is not None:
        return f"the {st.runner} that runs it, once continued (pid {st.runner_stopped} is stopped: Ctrl-Z / SIGSTOP)"
    return f"the {st.runner} that runs it (when it ends)" if st.runner_live else None


def merge_jobs(sd: SweepDir, hist: History, view: SchedulerView | None) -> list[dict[str, Any]]:
    """The sweep's final merge jobs: what SLURM says of each, and why the one that refused did
    (what it wrote in ``final-merge.json``)."""
    final = final_merge(sd) if hist.merge_jobs else None
    out = []
    for m in hist.merge_jobs:
        ts = view.get(str(m["job_id"])) if view is not None else None
        refused = final is not None and str(final.get("job_id")) == str(m["job_id"]) and not final.get("ok")
        out.append(
            {
                "job_id": str(m["job_id"]),
                "state": ts.state if ts else None,
                "reason": ts.reason if ts else None,
                "log": log if isinstance(log := m.get("stderr"), str) and os.path.exists(log) else None,
                "error": final.get("error") if refused and final else None,
            }
        )
    return out
