"""A unit file (``SWEEP/units/<id>.json``) read and held to its entry in ``units.json``: the one
reader every command goes through (``SweepDir.unit_items`` for resume, run and the worker;
``partials.UnitItems`` for status and merge).

A unit file edited by hand, truncated, or copied over from another unit no longer says what its
entry in ``units.json`` says of it: its id, how many items it holds, its round, and which items
(``items_digest``, kept in the entry: an item swapped for another unit's, or for one of no unit,
leaves the count as it was). Read as it is, the
merge dropped the records of the items it lost (as records of no item of the unit), status called
its unit failed, resume measured them again or stopped with a traceback. Each command refuses it
instead, in one line naming the file and what does not match, before anything is written.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from orchestrator.errors import SweepDirError
from orchestrator.store.files import DAMAGED_FIX, cannot_access, read_file, read_json
from orchestrator.store.jsonline import compact, loads

INDEX = "units.json"

# sweep root -> (units.json's stat, its entries by unit id): read once per version of the file
_ENTRIES: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def items_digest(items: Sequence[Any]) -> str:
    """The digest of a unit file's items ((plan position, item id) pairs, in its order) that its
    entry in ``units.json`` keeps (``SweepDir.add_units``): the unit file is held to it."""
    return hashlib.blake2b(compact(items), digest_size=12).hexdigest()


def read_items(root: Path, unit: str) -> list[tuple[int, str]]:
    """The items (plan position, item id) the unit file of ``unit`` lists, once it matches its
    entry in ``units.json``; ``SweepDirError`` in one line where it is missing, unreadable or
    does not match."""
    return [(index, iid) for index, iid in _read(root, unit, deep=True)["items"]]


def check(root: Path, unit: str) -> None:
    """``read_items``'s refusals of the unit file of ``unit``, but for those of a single item's
    shape: what a merge asks of a unit whose partial an earlier merge parsed (its cached
    segment holds the items), at about half the cost."""
    _read(root, unit, deep=False)


def _read(root: Path, unit: str, *, deep: bool) -> dict[str, Any]:
    path = root / "units" / f"{unit}.json"
    try:
        data = loads(read_file(path))
    except FileNotFoundError:
        raise SweepDirError(f"unit file {path} is missing; {DAMAGED_FIX}") from None
    except PermissionError as exc:
        raise SweepDirError(cannot_access(exc)) from None
    except (OSError, ValueError) as exc:
        raise SweepDirError(f"unit file {path} is unreadable ({exc}); {DAMAGED_FIX}") from None
    wrong = _mismatch(data, unit, _entry(root, unit), deep)
    if wrong is not None:
        raise SweepDirError(f"unit file {path} does not match its entry in {root / INDEX} ({wrong}); {DAMAGED_FIX}")
    return cast(dict[str, Any], data)


def _mismatch(data: Any, unit: str, entry: Any, deep: bool) -> str | None:
    """What of the unit file ``data`` does not match ``entry`` (None: all of it does); each
    item's shape too where ``deep``."""
    if type(data) is not dict:
        return "it is not a JSON object"
    if data.get("id") != unit:
        return f"it names unit {data.get('id')!s}, not {unit}"
    items = data.get("items")
    if (
        type(items) is not list
        or deep
        and not all(
            type(it) is list and len(it) == 2 and type(it[0]) is int and it[0] >= 0 and type(it[1]) is str
            for it in items
        )
    ):
        return "its items are not a list of [plan position, item id] pairs"
    if entry is None:
        return None
    if type(entry.get("n_items")) is int and len(items) != entry["n_items"]:
        return f"it lists {len(items)} items, {INDEX} {entry['n_items']}"
    if data.get("round", 1) != entry.get("round", 1):
        return f"its round is {data.get('round', 1)!s}, {INDEX}'s {entry.get('round', 1)!s}"
    if "items_digest" in entry and items_digest(items) != entry["items_digest"]:
        return f"it lists other items than the {len(items)} it was planned with ({INDEX} keeps their digest)"
    return None


def _entry(root: Path, unit: str) -> Any:
    """The entry of ``unit`` in ``units.json`` (None where it has none: a unit being added)."""
    try:
        st = os.stat(root / INDEX)
    except OSError:
        return None
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    cached = _ENTRIES.get(root)
    if cached is None or cached[0] != key:
        data = read_json(root / INDEX, "unit index")  # its shape is ``SweepDir.unit_index``'s to refuse
        entries = data if isinstance(data, list) else []
        cached = _ENTRIES[root] = (key, {e["id"]: e for e in entries if isinstance(e, dict) and "id" in e})
    return cached[1].get(unit)
