"""What ``tilesweep status`` knows of a sweep: one ``UnitStatus`` per unit and the sweep's
``SweepStatus`` over them (``status.sweep_status`` builds them, ``status_text`` renders them).

Unit states: ``done`` (marker, or every item recorded), ``replaced`` (never submitted, and
nothing is left to it: ``tilesweep resume`` gave its items to later units, or other units
recorded every item of it), ``pending``, ``running``,
``requeued`` (pending again after it ran: preempted or past its time limit), ``failed``
(with the worker's own reason), ``interrupted`` (a local worker a stop signal ended: Ctrl-C,
SIGTERM), ``cancelled``, ``timed out``. A unit never submitted is ``pending`` while a live
``tilesweep run`` holds the sweep (it starts the unit when a worker is free); with nothing to
start it, it does not keep the sweep in progress. A unit whose missing items
``tilesweep resume`` handed to new units is marked ``resumed``; it keeps the state its last
job ended in.

A halving sweep (``timing.strategy: halving``) has two rounds: each unit says which it belongs
to, progress counts round 1's records and then round 2's (its size is known once it is planned:
``round2.json``), and the sweep is complete only when round 2 is planned and done. A search
(``timing.strategy: search``) has as many rounds as it needs: progress counts each planned
round's items (``search/round<N>.json``), and the sweep is complete once the search ended
(``search/end.json``) and every round is done.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator import PROG
from orchestrator.control.scheduler import SchedulerView
from orchestrator.store.runstop import RunStop
from orchestrator.store.searchrounds import SURVIVORS, SearchRound

ACTIVE = ("pending", "running", "requeued")
# Ended without finishing its items: what `tilesweep resume` is for.
FAILED = ("failed", "interrupted", "cancelled", "timed out")
# Never submitted, and nothing is left to it: not pending work.
REPLACED = "replaced"
STATE_ORDER = ("done", REPLACED, "running", "requeued", "pending", "failed", "interrupted", "timed out", "cancelled")


@dataclass(frozen=True)
class RoundCount:
    """One round of a sweep: its number, the timings done and planned (round 1: every item)."""

    number: int
    done: int
    total: int


@dataclass
class UnitStatus:
    id: str
    total: int
    done: int
    complete: bool
    state: str = "pending"  # one of STATE_ORDER
    errors: int | None = None
    log: str | None = None  # the unit's log (or its task's), when it exists and the unit ended unfinished
    job_id: str | None = None  # last job: "<array>_<task>", or a plain id
    gpu: str | None = None  # the GPU its worker runs (ran) on, as the task's CUDA_VISIBLE_DEVICES names it
    executor: str | None = None
    submissions: int = 0  # jobs this unit was submitted as (resubmissions keep the history)
    detail: str | None = None  # display text only: SLURM state, pending reason, exit code
    resumed: bool = False  # its missing items were handed to later units by `tilesweep resume`
    covered: bool = False  # never submitted, and other units recorded every item of it
    leased: bool = False  # a live worker holds its lease (a job of it, or a worker started by hand)
    stuck: bool = False  # pending for a reason waiting alone does not end (see scheduler.TaskState.stuck)
    held: str = ""  # the hold it waits under, where SLURM holds its task (see scheduler.HELD_REASONS)
    retry: bool = False  # redoes error records of other units (`resume --retry-errors`): its items are counted there
    round: int = 1  # the halving strategy's round 2 times the survivors of round 1 in full
    stopped: bool = False  # its local worker is stopped (Ctrl-Z, SIGSTOP): it records nothing until continued
    carried: bool = False  # the reuse unit: records carried from earlier documents at plan time, none run

    @property
    def submitted(self) -> bool:
        """Whether any job was ever submitted for it (a unit never submitted is "pending"
        too, but nothing will run it)."""
        return self.submissions > 0

    @property
    def run_elsewhere(self) -> bool:
        """Whether another process runs the unit: a live worker holds its lease, or the local
        process its last job started (a controller ``resume --no-wait`` left) lives, whose worker
        may not have taken the lease yet."""
        return self.leased or (self.executor == "local" and self.state == "running")

    @property
    def to_run_here(self) -> bool:
        """Whether a ``run`` here starts a worker on it: not complete, its missing items not handed
        to later units by ``resume`` nor recorded by other units (replaced), and run by no other process."""
        return not (self.complete or self.resumed or self.covered or self.run_elsewhere)


@dataclass
class SweepStatus:
    sweep_dir: str
    planned: int
    units: list[UnitStatus] = field(default_factory=list)
    scheduler: str | None = None  # what was asked, or why nothing was
    merge_jobs: list[dict[str, Any]] = field(default_factory=list)
    # why sbatch refused the final merge job of the sweep's last arrays that asked for one: none follows them
    merge_refused: str | None = None
    # units wait or run, and no final merge job follows them: sbatch refused it, or it ended first (scancel)
    no_merge_follows: bool = False
    first_submitted: float | None = None
    # the units whose records set the ETA's pace, and since when: those of the last resume or round, or every one
    paced: frozenset[str] | None = None
    pace_from: float | None = None
    taken: float = field(default_factory=time.time)
    view: SchedulerView | None = field(default=None, repr=False)  # the scheduler's answer used
    gpu_hours: float | None = None  # sacct: elapsed x allocated GPUs over every run of every task

    halving: bool = False  # timing.strategy: halving (two rounds)
    round2: dict[str, Any] | None = None  # round2.json once round 2 is planned
    round2_deferred: str | None = None  # why the merge job could not submit round 2
    search: list[SearchRound] | None = None  # a search's round records (store.searchrounds), in order
    search_end: SearchRound | None = None  # search/end.json once the search ended
    grid: int | None = None  # a search's whole plan: the configs of its grid, of which it measures a part
    search_deferred: str | None = None  # why the merge job could not submit a search's next round
    search_rounds: tuple[int, bool] | None = None  # a search's max_rounds and whether it screens (its spec)
    on_slurm: bool = False  # a SLURM job ran a unit: its final merge job plans later rounds
    # why the last final merge job wrote no document (it refused, or SLURM ended it first), where no
    # merge of the sweep wrote its output since
    unmerged: str | None = None
    output: str = ""  # the results document the sweep's merge writes
    output_exists: bool = False  # whether it is there (not merged: since its last records, or ever)
    # it is there and holds none of the sweep's records: another sweep's merge of the same output replaced it
    output_foreign: bool = False
    # it is there and holds, as the sweep that measured them merged them, the records this sweep's plan
    # carried from it (the output was a reuse source): this sweep's merge writes them as its own
    output_carried: bool = False
    # the document exists and holds every record the partials hold now (``store.merged``)
    merged: bool = False
    merging: str | None = None  # what writes it without a user's word, where it is not merged
    replay_of: str | None = None  # a replay (kernel.impl replay): the document it answers from
    # a live `tilesweep run` (or a resume run here) holds the sweep's run lease: it starts the
    # units not submitted yet, so they wait for it; without one nothing starts them
    runner_live: bool = False
    runner: str = f"`{PROG} run`"  # the command that holds it, as a message names it (``Holder.command``)
    runner_stopped: int | None = None  # that run's pid, where it is stopped (Ctrl-Z, SIGSTOP): it starts nothing
    # the last run here stopped on the sweep directory's full disk, and no job was submitted since
    run_stop: RunStop | None = None
    # its plan was cut short before its units were written (its unit index is empty,
    # ``sweep_paths.UNITS_CUT_SHORT``): the commands that finish it
    plan_finish: str | None = None

    # round -> the timings planned for it, for each round after the first that is planned
    # (the units its strategy made of it: origin "round<N>"); round 1 times every planned item
    later_rounds: dict[int, int] = field(default_factory=dict)

    def done_of(self, round_: int, cap: int) -> int:
        """Records done by the units of one round (at most ``cap``), retry units aside."""
        return min(cap, sum(min(u.done, u.total) for u in self.units if u.round == round_ and not u.retry))

    @property
    def round2_total(self) -> int:
        return self.later_rounds.get(2, 0)

    def rounds(self) -> list[RoundCount]:
        """Each round planned so far: its timings done and planned (round 1: the items)."""
        planned = {1: self.planned, **self.later_rounds}
        return [RoundCount(n, self.done_of(n, total), total) for n, total in sorted(planned.items())]

    @property
    def items_done(self) -> int:
        """Planned items with a record (each gets one in round 1, which times every item): what
        a user planned, counted apart from the timings of later rounds."""
        return self.done_of(1, self.planned)

    @property
    def done(self) -> int:
        """Records done over every round: round 1's (every planned item), then each later
        round's. A retry unit's items were recorded (as errors) before it ran, so it adds none."""
        return sum(r.done for r in self.rounds())

    @property
    def total(self) -> int:
        """Records to make: the planned items, plus each later round's timings once it is planned."""
        return sum(r.total for r in self.rounds())

    @property
    def round2_pending(self) -> bool:
        """A halving sweep whose round 2 is not planned yet."""
        return self.halving and self.round2 is None

    @property
    def search_pending(self) -> bool:
        """A search that has not ended: a round is still to plan once the last one is done."""
        return self.search is not None and self.search_end is None

    @property
    def round_stalled(self) -> bool:
        """A round still to plan (halving's round 2, a search's next) that nothing running will
        plan: every unit settled and its last round done, no final merge job pending or running
        (``resume`` plans it)."""
        if not (self.round2_pending or self.search_pending) or not self.settled or self.done < self.total:
            return False
        return not any(m.get("state") in ("PENDING", "RUNNING") for m in self.merge_jobs)

    @property
    def next_round(self) -> int:
        """The round a search plans next (the one after its last planned round)."""
        return max((r["round"] for r in self.search or []), default=1) + 1

    @property
    def errors(self) -> int:
        """Items whose newest record is an error: a retry unit's measurements supersede errors."""
        errors = sum(u.errors or 0 for u in self.units if not u.retry)
        return max(0, errors - sum(u.done - (u.errors or 0) for u in self.units if u.retry))

    @property
    def complete(self) -> bool:
        """Every unit done (or resumed by later ones) and no round left to plan (halving's
        round 2, a search that has not ended); a sweep whose unit index is empty (its planning
        was cut short) is not."""
        done = all(u.complete or u.done >= u.total or u.resumed or u.covered for u in self.units)
        return bool(self.units) and not self.round2_pending and not self.search_pending and done

    @property
    def merge_left(self) -> bool:
        """Complete, but its document is missing or lacks records written since it was merged,
        and nothing running will write it: ``tilesweep merge`` does."""
        return self.complete and not self.merged and self.merging is None

    @property
    def records_unmerged(self) -> bool:
        """Ended unfinished (no unit waits or runs), with records its document does not hold, and
        nothing running to merge them: no final merge job (sbatch refused it, or the spec asks for
        none) or one that ended first. ``wait`` merges them, so does ``merge``; status says so."""
        return self.settled and not self.complete and self.done > 0 and not self.merged and self.merging is None

    @property
    def command_left(self) -> bool:
        """Whether the sweep waits for a user's command, nothing running doing it (``status``
        exits 1): units ended without finishing, or never started, whose items nothing took
        over, or a round still to plan (``resume`` does them); its plan cut short before its units
        were written (the command that started it does); its final merge job refused, or
        ended before merging, with no merge since, or it is complete and its document missing
        or short of records (``merge`` does)."""
        left = self.ended_unfinished() or self.never_started() or self.round_stalled or self.plan_finish
        return bool(left or self.unmerged or self.merge_left)

    def _waits(self, u: UnitStatus) -> bool:
        """Whether something will run the unit or runs it: a job of it is pending or running,
        or a live run holds the sweep and starts it when a worker is free."""
        return u.state in ACTIVE and (u.submitted or u.leased or self.runner_live)

    @property
    def settled(self) -> bool:
        """No unit waits or runs: every one is done, ended, or not submitted with nothing to
        start it."""
        return not any(self._waits(u) for u in self.units)

    def never_submitted(self) -> list[UnitStatus]:
        """Units never submitted and held by no worker, their items not handed to later units
        yet: those nothing will start, and those a live ``run`` starts when a worker is free."""
        return [u for u in self.units if u.state in ACTIVE and not (u.submitted or u.resumed or u.leased)]

    def never_started(self) -> list[UnitStatus]:
        """Units never submitted that nothing will start (``resume`` does), their items not
        handed to later units yet."""
        return [] if self.runner_live else self.never_submitted()

    @property
    def configs_measured(self) -> int:
        """The configs of a search's grid with a record: round 1's planned items (carried ones
        included), then each later round's, not the rounds that time a screen's survivors again
        (search.screen)."""
        later = [r for r in self.search or [] if r["round"] > 1 and r["kind"] != SURVIVORS]
        return self.items_done + sum(self.done_of(r["round"], r["planned"]) for r in later)

    def _search_json(self) -> dict[str, Any]:
        """A search's rounds in ``--json``: per round its kind, items, units and records done."""
        rounds = [
            {
                "round": r["round"],
                "kind": r["kind"],
                "planned": r["planned"],
                "done": self.done_of(r["round"], r["planned"]),
                "units": len(r["units"]),
                "searching": sum(1 for p in r["problems"] if p.get("state") == "searching"),
            }
            for r in self.search or []
        ]
        return {
            "rounds": rounds,
            "ended": self.search_end is not None,
            "deferred": self.search_deferred,
            "configs_measured": self.configs_measured,
            "grid": self.grid,
        }

    def stopped(self) -> list[UnitStatus]:
        """Running units whose worker is stopped (Ctrl-Z, SIGSTOP)."""
        return [u for u in self.units if u.stopped and u.state == "running"]

    def counts(self) -> dict[str, int]:
        c = Counter(u.state for u in self.units)
        return {s: c[s] for s in STATE_ORDER if c[s]}

    def unsettled(self) -> list[UnitStatus]:
        return [u for u in self.units if self._waits(u)]

    def ended_unfinished(self) -> list[UnitStatus]:
        """Units that ended without finishing and whose missing items no later unit took
        over: what ``tilesweep resume`` would redo."""
        return [u for u in self.units if u.state in FAILED and not u.resumed]

    def eta_s(self) -> float | None:
        """Seconds to go at the pace of the records written since the first submission, or since
        the last resume, or the last round's submission, by the units it submitted (a resume days
        after a failure, a round after the one before it: not the time before); None when
        unknown, and while a unit's worker, or the run that starts the units, is stopped: nothing
        moves until it is continued. The records carried from earlier documents (the reuse
        unit's) were there before any job: they set no pace."""
        if self.paced is None:
            measured = self.done - sum(min(u.done, u.total) for u in self.units if u.carried)
        else:
            measured = sum(min(u.done, u.total) for u in self.units if u.id in self.paced and not u.retry)
        if self.complete or self.settled or not self.pace_from or measured <= 0 or self.stopped():
            return None
        if self.runner_stopped is not None:
            return None
        elapsed = self.taken - self.pace_from
        return elapsed * (self.total - self.done) / measured if elapsed > 0 else None

    def to_json(self) -> dict[str, Any]:
        eta = self.eta_s()
        return {
            "sweep_dir": self.sweep_dir,
            "planned": self.planned,
            "done": self.done,
            "total": self.total,
            "items_done": self.items_done,
            "rounds": [r.__dict__ for r in self.rounds()],
            "errors": self.errors,
            "complete": self.complete,
            "output": self.output,
            "output_exists": self.output_exists,
            "output_foreign": self.output_foreign,
            "output_carried": self.output_carried,
            "merged": self.merged,
            "merging": self.merging,
            "settled": self.settled,
            "plan_cut_short": self.plan_finish is not None,
            "states": self.counts(),
            "strategy": "halving" if self.halving else "search" if self.search is not None else "full",
            "round2": self.round2,
            "round2_deferred": self.round2_deferred,
            **({} if self.search is None else {"search": self._search_json()}),
            "eta_s": None if eta is None else round(eta, 1),
            "scheduler": self.scheduler,
            "gpu_hours": self.gpu_hours,
            "replay_of": self.replay_of,
            "run_stopped": None if self.run_stop is None else self.run_stop.to_json(),
            "runner_stopped": self.runner_stopped,
            "merge_jobs": self.merge_jobs,
            "merge_refused": self.merge_refused,
            "no_merge_follows": self.no_merge_follows,
            "units": [dict(u.__dict__) for u in self.units],
        }
