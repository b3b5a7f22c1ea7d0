"""A halving sweep's second round on disk.

``round2.json`` in the sweep directory records what planning round 2 decided (per problem what
was screened and kept, and round 2's units; ``control.rounds`` writes it); its absence means
round 2 is not planned yet. A unit of round 2 says ``"round": 2`` in its unit file and its
``units.json`` entry (``SweepDir.add_units``); a unit that does not say is of round 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernels.spelling import as_json
from orchestrator.errors import SweepDirError
from orchestrator.store.files import DAMAGED_FIX, read_json
from orchestrator.store.sweepdir import SweepDir

ROUND2_FILE = "round2.json"


def round2_path(sd: SweepDir) -> Path:
    return sd.root / ROUND2_FILE


def read_round2(sd: SweepDir) -> dict[str, Any] | None:
    """What planning round 2 decided (halving), or None while it is not planned."""
    path = round2_path(sd)
    if not path.exists():
        return None
    data = read_json(path, "round-2 file")
    why = _wrong(data)
    if why is not None:
        raise SweepDirError(f"round-2 file {path} is damaged ({why}); {DAMAGED_FIX}")
    return data


# what the round-2 file holds (``control.survivors``' record): its counts, units and problems
_COUNTS = ("screened", "survivors", "planned")


def _wrong(data: Any) -> str | None:
    """What is wrong with the round-2 file's content, or None where it has its shape."""
    if not isinstance(data, dict):
        return "not an object"
    for key in _COUNTS:
        if type(data.get(key)) is not int or data[key] < 0:
            return f"{key} is {as_json(data.get(key))}, not a count"
    units = data.get("units")
    if not isinstance(units, list) or not all(isinstance(u, str) for u in units):
        return "units is not a list of unit ids"
    ids = data.get("ids", [])  # the survivors' item ids (absent from a file of an earlier tilesweep)
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return "ids is not a list of item ids"
    problems = data.get("problems")
    if not isinstance(problems, list) or not all(isinstance(p, dict) for p in problems):
        return "problems is not a list of objects"
    return None


def unit_round(sd: SweepDir, unit_id: str) -> int:
    """The round a unit belongs to (1 unless its unit file says otherwise)."""
    data = read_json(sd.unit_path(unit_id), f"unit file of unit {unit_id}")
    value = data.get("round", 1) if isinstance(data, dict) else 1
    return value if type(value) is int and value >= 1 else 1
