"""What two specs' fingerprinted fields differ in, for a message that says why a sweep
directory refuses a spec: ``kernel.device_kind "NVIDIA H200" in this spec, "NVIDIA H100" in
the sweep's``, not two hashes; a value a command-line option set is said as its option's
(``"NVIDIA H200" from --device-kind``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.spec.model import SweepSpec

_UNSET = object()


def spec_differences(mine: SweepSpec, theirs: SweepSpec, most: int = 3) -> str:
    """The fingerprinted fields ``mine`` and ``theirs`` differ in, as a user reads them: ``mine``'s
    value first, said to come from the option that set it where one did. A field the fingerprint
    of one leaves out (a default it counts only where set otherwise, a section only a search
    has) is read from that spec with its defaults filled in: a field left at its default in one
    and written out as that default in the other is no difference."""
    filled = (mine.model_dump(mode="json"), theirs.model_dump(mode="json"))
    return differences(mine.fingerprinted(), theirs.fingerprinted(), most, mine._options, filled)


def differences(
    mine: dict[str, Any],
    theirs: dict[str, Any],
    most: int = 3,
    options: Mapping[str, str] | None = None,
    filled: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> str:
    """The dotted fields whose values differ (lists compared whole), at most ``most`` of them
    named, this spec's value first (``options``: the fields an option set, and that option;
    ``filled``: each side whole, defaults included, where a field missing from a side is read)."""
    a, b = _flat(mine), _flat(theirs)
    named = dict.fromkeys([*a, *b])
    if filled is not None:  # null, written or left out, is a field the spec does not set
        a = {k: v for k, v in {**_flat(filled[0]), **a}.items() if v is not None}
        b = {k: v for k, v in {**_flat(filled[1]), **b}.items() if v is not None}
    keys = [k for k in named if a.get(k, _UNSET) != b.get(k, _UNSET)]
    if not keys and filled is not None:  # fingerprints that differ by what they leave out alone: that, then
        return differences(mine, theirs, most, options)
    given = options or {}
    shown = [
        f"{k} {_said(a.get(k, _UNSET))} {f'from {given[k]}' if k in given else 'in this spec'}, "
        f"{_said(b.get(k, _UNSET))} in the sweep's"
        for k in keys[:most]
    ]
    return "; ".join(shown) + (f"; and {len(keys) - most} more" if len(keys) > most else "")


def _flat(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _said(value: Any) -> str:
    return "not set" if value is _UNSET else json.dumps(value)
