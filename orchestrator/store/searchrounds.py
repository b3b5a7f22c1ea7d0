"""A search's rounds on disk (``timing.strategy: search``): one record per round planned.

``search/round<N>.json`` in the sweep directory records what planning round N decided (round 1
at plan time, each later one when the round before it had every record: ``control.searchplan``
and ``control.searchrounds`` write them) and, per problem, where its search stands: the configs
measured or chosen so far, carried ones included (``measured``; per round, ``measured_in``), its
best so far, whether it searches on (``state``: ``planning.search``'s reasons) and the configs
no round has chosen (``never_measured``). ``search/end.json`` says the search ended, with every
problem's final account; its presence means no round is left to plan. A round's record is
written last, after its units are in the index, so its presence means the round is planned.

Round 1's units are the sweep's plan, so ``sweep.json``'s ``planned`` counts its items (and the
carried ones); each later round adds the items it measures that no round planned before
(``new``; a screened search times its survivors again, which adds none). ``planned_total`` is
what merge and status count a search's records against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from orchestrator.errors import SweepDirError
from orchestrator.store.files import atomic_write_json, read_json
from orchestrator.store.provenance import SearchBlock
from orchestrator.store.sweepdir import SweepDir

SEARCH_DIR = "search"
END_FILE = "end.json"

# What a round of the search does (``SearchRound.kind``).
DESIGN, SEARCH_STEP, SURVIVORS, END = "design", "search", "survivors", "end"


class ProblemState(TypedDict):
    """One problem's search after a round was planned."""

    problem: list[Any]  # records.problem_key
    fields: list[str]  # the config fields its configs list the values of
    measured: int  # forced configs measured or chosen so far, carried ones included
    measured_in: dict[str, int]  # round of the search -> configs it chose (carried: round 1)
    new: int  # configs this round measures
    state: str  # planning.search: searching, converged, budget, max_rounds, exhausted
    best: dict[str, Any] | None  # {"config": [...], "median_ms": ...}: the best timed so far
    never_measured: list[list[Any]]  # runnable configs no round chose, in plan order
    portfolio: NotRequired[int]  # round 1: configs taken from the portfolio
    space_filling: NotRequired[int]  # round 1: configs of the space-filling choice
    carried: NotRequired[int]  # round 1: configs with a carried record


class SearchRound(TypedDict):
    """``search/round<N>.json`` (or ``end.json``, ``kind`` "end", without units)."""

    round: int  # the round of units (with search.screen, two per round of the search)
    search_round: int
    kind: str  # design, search, survivors or end
    created: str
    units: list[str]
    planned: int  # items in its units
    new: int  # of them, items no round planned before
    problems: list[ProblemState]
    portfolio: NotRequired[dict[str, Any]]  # round 1: the sources and their winners
    grid: NotRequired[int]  # round 1: the items of the whole plan, the grid the search measures a part of


def search_dir(sd: SweepDir) -> Path:
    return sd.root / SEARCH_DIR


def round_path(sd: SweepDir, number: int) -> Path:
    return search_dir(sd) / f"round{number}.json"


def end_path(sd: SweepDir) -> Path:
    return search_dir(sd) / END_FILE


def _read(path: Path) -> SearchRound:
    data = read_json(path, "search round file")
    if not isinstance(data, dict) or type(data.get("round")) is not int:
        raise SweepDirError(f"{path} is damaged (not a search round); delete it and `tilesweep resume` plans it again")
    return cast(SearchRound, data)


def round_numbers(sd: SweepDir) -> list[int]:
    """The rounds planned so far, in order (from the file names alone: cheap)."""
    try:
        names = [p.name for p in search_dir(sd).iterdir()]
    except FileNotFoundError:
        return []
    return sorted(int(n[5:-5]) for n in names if n.startswith("round") and n.endswith(".json") and n[5:-5].isdigit())


def read_rounds(sd: SweepDir) -> list[SearchRound]:
    """Every planned round's record, in order."""
    return [_read(round_path(sd, n)) for n in round_numbers(sd)]


def read_end(sd: SweepDir) -> SearchRound | None:
    """The search's end, or None while it goes on."""
    path = end_path(sd)
    return _read(path) if path.exists() else None


def pending(sd: SweepDir) -> int | None:
    """The round still to plan (None: the search ended); from the file names alone."""
    if end_path(sd).exists():
        return None
    return max(round_numbers(sd), default=1) + 1


def write_round(sd: SweepDir, record: SearchRound) -> Path:
    """Write a round's record (the end's to ``end.json``), atomically."""
    path = end_path(sd) if record["kind"] == END else round_path(sd, record["round"])
    path.parent.mkdir(exist_ok=True)
    atomic_write_json(path, record, indent=1)
    return path


def forget_round(sd: SweepDir, number: int) -> None:
    """Remove a round's record (its units could not be submitted: it is planned again)."""
    round_path(sd, number).unlink(missing_ok=True)


def planned_total(sd: SweepDir) -> int:
    """The items a sweep's rounds planned: ``sweep.json``'s, plus the new items of a search's
    later rounds (halving's round 2 times planned items again: none)."""
    return sd.planned + sum(r["new"] for r in read_rounds(sd) if r["round"] > 1)


def grid_size(sd: SweepDir, first: SearchRound | None) -> int:
    """The items of a search's whole plan (its grid, of which its rounds measure a part): round
    1's record says it, else (a round 1 recorded without it) the spec's plan, expanded."""
    if first is not None and "grid" in first:
        return int(first["grid"])
    return len(sd.items())


def latest(sd: SweepDir) -> SearchRound | None:
    """Where the search stands: its end, else its last planned round (None: not a search)."""
    end = read_end(sd)
    if end is not None:
        return end
    rounds = read_rounds(sd)
    return rounds[-1] if rounds else None


def search_block(sd: SweepDir) -> SearchBlock | None:
    """The document's account of a search (the ``tilesweep`` block's ``search``): None for a
    sweep of another strategy."""
    now = latest(sd)
    if now is None:
        return None
    # the rounds that measured: round 1 always (its design may be carried whole, with no unit of
    # its own: reuse's unit holds it), a later one where it planned units
    rounds = {1} | {r["search_round"] for r in read_rounds(sd) if r["units"]}
    return {
        "rounds": len(rounds),
        "ended": now["kind"] == END,
        "problems": [
            {
                "problem": p["problem"],
                "fields": p["fields"],
                "measured": p["measured"],
                "measured_in": p["measured_in"],
                "state": p["state"],
                "never_measured": p["never_measured"],
            }
            for p in now["problems"]
        ],
    }
