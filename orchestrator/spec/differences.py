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
    value first, said to come from the option that set it where one did."""
    return differences(mine.fingerprinted(), theirs.fingerprinted(), most, mine._options)


def differences(
    mine: dict[str, Any], theirs: dict[str, Any], most: int = 3, options: Mapping[str, str] | None = None
) -> str:
    """The dotted fields whose values differ (lists compared whole), at most ``most`` of them
    named, this spec's value first (``options``: the fields an option set, and that option)."""
    a, b = _flat(mine), _flat(theirs)
    keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k, _UNSET) != b.get(k, _UNSET)]
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
