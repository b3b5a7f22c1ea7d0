"""The results document's ``tilesweep`` block: its typed form, its one writer, and its reader.

The block says where a document's records come from: the sweep directory, the spec and its
fingerprint, the environment, when it was merged, how many items were planned, per unit the
attempts that measured them (so each record's ``unit`` and ``attempt`` trace it to its worker
and SLURM task), for a sweep run on SLURM the GPU-hours its tasks used, how the records were
measured, what planning reused and, for halving, what round 2 kept; for a search, what each
problem measured and what it never did. An append into a document of
another spec keeps that document's block under ``earlier`` (``append``), so provenance is never
lost. The merger writes the block (``tilesweep_block``); reuse, append, the merge target's check
and the report read it through ``blocks``.

TypedDicts, as the partial lines are (``lines`` says why): the block is a JSON object inside a
document that is read and written as plain JSON.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, TypedDict, cast

from orchestrator.spec.model import SweepSpec
from orchestrator.store.lines import DeviceBlock, ReadHeader


class AttemptEntry(TypedDict):
    """One attempt at a unit, from its partial's header; the unit's last attempt also says
    when it ended (its partial's last write: no line says when an attempt ends, and a killed
    one writes none, so an earlier attempt's end is only bounded by the next one's start)."""

    attempt: int | None
    host: str | None
    pid: int | None
    slurm_job_id: str | None
    gpu: NotRequired[str | None]
    started: str | None
    ended: NotRequired[str | None]


class Measurement(TypedDict):
    """How the merged records were measured, summed up from the attempts' headers."""

    impl: str
    strategy: str
    timers: list[str]  # every timer the records carry
    flush_l2: bool | str | None  # true or false for all, "mixed", None where no header says
    clock: list[str]  # "real", "virtual" (a replay)


class GpuHours(TypedDict, total=False):
    """What a sweep run on SLURM adds (``control.sweeps.accounting``, from sacct)."""

    gpu_hours: float
    gpu_hours_source: str


# ``from`` is a keyword: the functional form
ReusedBlock = TypedDict(
    "ReusedBlock",
    {
        "unit": str | None,
        "records": int | None,
        "from": dict[str, int],
        # a carried record's measurement (``carry.measurement_of``) -> when its source's attempt started
        "measured": NotRequired[dict[str, str]],
    },
)


class RoundsBlock(TypedDict):
    """What planning round 2 of a halving sweep decided (``round2.json``)."""

    screened: int | None
    survivors: int | None
    units: list[str] | None
    planned: int | None
    survivor_ids: NotRequired[list[str]]  # the items round 2 times in full (``records.item_id``)


class SearchProblem(TypedDict):
    """One problem's search, as the document tells it: how many forced configs were measured
    (carried ones included), how many in each round, why its search ended (or that it goes on:
    ``state``) and which of its runnable configs were never measured (values of ``fields``)."""

    problem: list[Any]  # records.problem_key
    fields: list[str]
    measured: int
    measured_in: dict[str, int]  # round of the search -> configs it measured
    state: str
    never_measured: list[list[Any]]


class SearchBlock(TypedDict):
    """What a search (``timing.strategy: search``) measured: its rounds, whether it ended, and
    per problem its account (``store.searchrounds``)."""

    rounds: int  # rounds of the search that measured something
    ended: bool
    problems: list[SearchProblem]


class TilesweepBlock(TypedDict):
    sweep_dir: str
    fingerprint: str
    env: dict[str, Any] | None
    merged: str
    planned: int
    spec: dict[str, Any]  # SweepSpec.model_dump(mode="json")
    attempts: dict[str, list[AttemptEntry]]  # unit -> its attempts
    gpu_hours: NotRequired[float]
    gpu_hours_source: NotRequired[str]
    measurement: NotRequired[Measurement]
    reused: NotRequired[ReusedBlock]
    rounds: NotRequired[RoundsBlock]
    search: NotRequired[SearchBlock]
    earlier: NotRequired[list[TilesweepBlock]]  # blocks of other specs' sweeps appended into it


class DocumentHead(TypedDict):
    """A merged document less its records: what the merger writes around them."""

    device: DeviceBlock
    config: dict[str, Any]  # SweepSpec.reference_config(): the reference run's config block
    tilesweep: TilesweepBlock


class MergedDocument(TypedDict):
    """A whole document as the merger writes it (``synthetic.document`` builds one in memory)."""

    device: DeviceBlock
    config: dict[str, Any]
    results: list[dict[str, Any]]
    tilesweep: TilesweepBlock


def attempt_entry(header: ReadHeader, ended: str | None = None) -> AttemptEntry:
    """A unit's attempt as the block lists it, from the attempt's header (``ended``: for the
    unit's last attempt, when its partial was last written)."""
    entry: AttemptEntry = {
        "attempt": header.get("attempt"),
        "host": header.get("host"),
        "pid": header.get("pid"),
        "slurm_job_id": header.get("slurm_job_id"),
        "gpu": header.get("gpu"),
        "started": header.get("started"),
    }
    if ended is not None:
        entry["ended"] = ended
    return entry


def unit_attempts(headers: Sequence[ReadHeader], last_write_ns: int) -> list[AttemptEntry]:
    """A unit's attempts, oldest first, the last one ending at its partial's last write."""
    if not headers:
        return []
    ended = _dt.datetime.fromtimestamp(last_write_ns / 1e9, _dt.UTC).isoformat(timespec="seconds")
    return [attempt_entry(h) for h in headers[:-1]] + [attempt_entry(headers[-1], ended)]


def measured_span(block: Mapping[str, Any]) -> tuple[str, str] | None:
    """When a block's records were measured: the first attempt's start and the last attempt's
    end (its start where no end is known), or None where no attempt says. The records reuse
    carried count when they were measured where they come from (``reused.measured``: their
    attempts' starts), not the reuse unit's attempt, which wrote them at plan time."""
    starts, ends = [], []
    reused = block.get("reused")
    reused = reused if isinstance(reused, dict) else {}
    for unit, attempts in attempts_of(block).items():
        for a in attempts if isinstance(attempts, list) and unit != reused.get("unit") else []:
            if isinstance(a, dict) and a.get("started"):
                starts.append(str(a["started"]))
                ends.append(str(a.get("ended") or a["started"]))
    carried = reused.get("measured")
    for started in carried.values() if isinstance(carried, dict) else []:
        if isinstance(started, str) and started:
            starts.append(started)
            ends.append(started)
    return (min(starts), max(ends)) if starts else None


def measurement(spec: SweepSpec, headers: Sequence[ReadHeader]) -> Measurement:
    """How the records of ``headers``' attempts were measured: the strategy, every timer used,
    whether samples started with a flushed L2 cache (true, false, or "mixed"), and whether the
    clock was real or virtual (a replay)."""
    seen = [h["measure"] for h in headers if isinstance(h.get("measure"), dict)]
    flushes = sorted({bool(m.get("flush_l2")) for m in seen})
    return {
        "impl": spec.kernel.impl,
        "strategy": spec.timing.strategy,
        "timers": sorted({str(m.get("timer")) for m in seen}),
        "flush_l2": flushes[0] if len(flushes) == 1 else ("mixed" if flushes else None),
        "clock": sorted({str(m.get("clock")) for m in seen}),
    }


class _Measured(TypedDict, total=False):
    measurement: Measurement


def tilesweep_block(
    *,
    sweep_dir: str,
    spec: SweepSpec,
    env: dict[str, Any] | None,
    merged: str,
    planned: int,
    attempts: dict[str, list[AttemptEntry]],
    gpu_hours: GpuHours | None = None,
    measured: Measurement | None = None,
    reused: ReusedBlock | None = None,
    rounds: RoundsBlock | None = None,
    search: SearchBlock | None = None,
) -> TilesweepBlock:
    """The block, its keys in the order every document has them."""
    measured_part: _Measured = {} if measured is None else {"measurement": measured}
    block: TilesweepBlock = {
        "sweep_dir": sweep_dir,
        "fingerprint": spec.fingerprint(),
        "env": env,
        "merged": merged,
        "planned": planned,
        "spec": spec.model_dump(mode="json"),
        "attempts": attempts,
        **(gpu_hours or {}),
        **measured_part,
    }
    if reused is not None:
        block["reused"] = reused
    if rounds is not None:
        block["rounds"] = rounds
    if search is not None:
        block["search"] = search
    return block


def with_earlier(block: TilesweepBlock, earlier: list[TilesweepBlock]) -> TilesweepBlock:
    """``block`` keeping the blocks of the sweeps appended before it (``append``)."""
    return {**block, "earlier": earlier}


def without_earlier(block: TilesweepBlock) -> TilesweepBlock:
    """``block`` less the blocks kept under it (to be kept under another)."""
    own = block.copy()
    own.pop("earlier", None)
    return own


def own_block(tilesweep: object) -> TilesweepBlock | None:
    """A document's own block (its ``tilesweep`` value, ``ResultsDoc.extra``), where it has one."""
    return cast(TilesweepBlock, tilesweep) if isinstance(tilesweep, dict) else None


def blocks(tilesweep: object) -> list[TilesweepBlock]:
    """Every block of a document, oldest first: the ``earlier`` ones of appended sweeps, then
    its own. A value that is not a block (a document of another tool) is left out."""
    own = own_block(tilesweep)
    if own is None:
        return []
    earlier = own.get("earlier")
    return [*(e for e in earlier if isinstance(e, dict)), own] if isinstance(earlier, list) else [own]


def attempts_of(block: Mapping[str, Any]) -> dict[str, list[AttemptEntry]]:
    """A block's attempts by unit (none where its ``attempts`` is not an object)."""
    attempts = block.get("attempts")
    return attempts if isinstance(attempts, dict) else {}
