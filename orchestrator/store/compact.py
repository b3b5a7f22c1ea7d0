"""A record held compactly: its values in a tuple, the keys shared by every record of its layout.

Planning with reuse holds each carried record from the moment it is chosen until the reuse unit's
partial is written (``carried``): half a million of them at the scale of ``bench/reuse``. As dicts
they cost 1.7 kB each; as a ``CompactRecord`` under half of that (one tuple of values, the
key-to-place table shared by the handful of layouts a document has), which keeps that plan under a
gigabyte. Read-only, a ``Mapping`` with the look-ups of a dict (``get`` without an exception);
``dict(record)`` gives the record back, in its key order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# a layout (the record's keys, in order) -> each key's place in the values
_LAYOUTS: dict[tuple[str, ...], dict[str, int]] = {}


class CompactRecord(Mapping[str, Any]):
    __slots__ = ("_places", "_values")

    def __init__(self, rec: Mapping[str, Any]) -> None:
        keys = tuple(rec)
        places = _LAYOUTS.get(keys)
        if places is None:
            places = _LAYOUTS[keys] = {k: i for i, k in enumerate(keys)}
        self._places = places
        self._values = tuple(rec.values())

    def __getitem__(self, key: str) -> Any:
        return self._values[self._places[key]]

    def get(self, key: str, default: Any = None) -> Any:
        i = self._places.get(key)
        return default if i is None else self._values[i]

    def __contains__(self, key: object) -> bool:
        return key in self._places

    def __iter__(self) -> Iterator[str]:
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"CompactRecord({dict(self)!r})"
