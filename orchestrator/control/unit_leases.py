"""What the units' leases say of a sweep's units, for ``status``: a live worker that holds a unit's
lease (``store.leases``) runs it, whichever way it was started (by ``run`` or ``resume``, by hand
as ``python -m jobs.worker SWEEP UNIT``, by a site's own launcher), on the GPU the lease names,
and is said stopped where /proc says that worker is (Ctrl-Z, SIGSTOP): it records nothing until
it is continued; a stopped controller of a worker that runs on is no stopped unit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.control.history import History
from orchestrator.control.status_model import ACTIVE, SweepStatus, UnitStatus
from orchestrator.control.unit_state import existing, stopped_holder, stopped_process
from orchestrator.control.why import last_word
from orchestrator.store.leases import live_unit_holders
from orchestrator.store.locks import HolderRecord
from orchestrator.store.pidspace import in_this_pid_space


def unit_leases(root: Path, st: SweepStatus, hist: History) -> None:
    """A live worker holding a unit's lease runs it, whatever its last job says (a stray
    second job of the unit may have ended beside it); the lease also names its GPU. A lease
    of the unit's own last job that SLURM says has ended is that job's, left by a worker
    that died with it: ignored. A unit of a running whole-node task that no live worker
    holds, whose log's last word is its failure (the task wrote why its worker died), failed
    now, not once the whole task ends."""
    todo = [u for u in st.units if u.state != "done"]
    holders = live_unit_holders(root, [u.id for u in todo])
    for u in todo:
        h = holders.get(u.id)
        if h is None:
            died_in_a_running_task(u, hist.latest.get(u.id))
            continue
        own_job = h.fields.get("job") is not None and h.fields.get("job") == u.job_id
        if u.state in ACTIVE or not own_job:
            u.gpu = h.fields.get("gpu") or u.gpu
        u.leased = True
        if u.state != "running" and not own_job:
            u.state, u.detail, u.log = "running", f"by {h.describe()}", None
        if u.state == "running" and not u.stopped and (said := stopped_holder(h.fields, u.detail)):
            u.stopped, u.detail = True, said
        elif u.stopped:
            _worker_runs_on(u, h.fields)


def _worker_runs_on(u: UnitStatus, holder: HolderRecord) -> None:
    """A unit whose job's process is stopped where that process is the controller of a worker
    (``resume --no-wait``), not the worker: the worker that holds the lease, in this pid space
    and not stopped, runs on and records, so the unit is not stopped."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or str(pid) == u.job_id or not in_this_pid_space(holder):
        return
    if stopped_process(holder) is None:
        u.stopped = False
        u.detail = f"local process {u.job_id}, the controller of its worker, is stopped; its worker (pid {pid}) runs on"


def died_in_a_running_task(u: UnitStatus, job: dict[str, Any] | None) -> None:
    """A unit of a whole-node task (running, or cancelled since) whose log's last word is the
    task's line on its worker's death: failed, and why (a cancel after it does not hide it)."""
    if u.state not in ("running", "cancelled") or job is None or (job.get("units_in_task") or 1) == 1:
        return
    said = last_word(job.get("log"), u.id)
    if said is not None and said[0] == "failed":
        u.state, u.detail, u.log = "failed", said[1], existing(job.get("log"), job.get("stderr"))
