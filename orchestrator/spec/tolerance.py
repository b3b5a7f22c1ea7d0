"""When a config's output is wrong, not merely rounded differently: the largest ``rel_err``
against the reference that a measurement may have (``check.max_rel_err``, or its dtype's
default below).

The reference run's configs stay below 4e-3 in bfloat16 and below 1e-3 in float32 (whose dots
run as tf32 on a GPU); a kernel that computes one tile of a problem wrongly is far above. The
worker records a config whose output is wrong as an error (``WRONG_RESULT``), never timed,
never a best config, never exported. The readers take a timed record above its limit, or with
a ``rel_err`` that is not a number >= 0, as failed too: a document another tool wrote, or one
edited by hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kernels.spelling import as_json

MAX_REL_ERR: dict[str, float] = {"float32": 1e-2, "float16": 5e-2, "bfloat16": 5e-2}
OTHER_MAX_REL_ERR = 5e-2  # a dtype without a limit of its own


class WrongResult(Exception):
    """A config's output is wrong: ``check`` raises it, its text says how."""


WRONG_RESULT = WrongResult.__name__  # the kind of error the record says


def limit(dtype: object, max_rel_err: float | None = None) -> float:
    """The largest ``rel_err`` a measurement of ``dtype`` may have: ``max_rel_err`` where given
    (the sweep's ``check.max_rel_err``), else the dtype's default."""
    if max_rel_err is not None:
        return max_rel_err
    return MAX_REL_ERR.get(dtype, OTHER_MAX_REL_ERR) if isinstance(dtype, str) else OTHER_MAX_REL_ERR


def limits(max_rel_err: float | None) -> Mapping[str, float]:
    """``limit`` of every dtype with a default (another dtype: ``OTHER_MAX_REL_ERR``, or
    ``max_rel_err`` where given), for loops over many records."""
    return {dtype: limit(dtype, max_rel_err) for dtype in MAX_REL_ERR}


def wrong_result(rel_err: object, dtype: object, max_rel_err: float | None = None) -> str | None:
    """Why ``rel_err`` makes a record's output wrong, as the worker's error record says it; None
    where it does not, or where there is none (a document that leaves it out)."""
    why = _why(rel_err, dtype, max_rel_err)
    return None if why is None else f"{WRONG_RESULT}: {why}"


def check(rel_err: float, dtype: str, max_rel_err: float | None = None) -> None:
    """Raise ``WrongResult`` where ``rel_err`` makes a config's output wrong."""
    why = _why(rel_err, dtype, max_rel_err)
    if why is not None:
        raise WrongResult(why)


def _why(rel_err: object, dtype: object, max_rel_err: float | None) -> str | None:
    if rel_err is None:
        return None
    if rel_err.__class__ not in (float, int) or not math.isfinite(rel_err) or rel_err < 0:
        return f"rel_err against the reference is {as_json(rel_err)}, not a number >= 0"
    bound = limit(dtype, max_rel_err)
    if rel_err > bound:
        source = (
            "check.max_rel_err"
            if max_rel_err is not None
            else f"the default for {dtype}; check.max_rel_err sets another"
        )
        return f"rel_err {rel_err:.3g} against the reference is above {bound:g} ({source})"
    return None


def document_limit(tilesweep: object) -> float | None:
    """The ``check.max_rel_err`` of the spec in a document's ``tilesweep`` block; None where it
    names none (a document of another tool, or a spec that leaves the defaults)."""
    spec: Any = tilesweep.get("spec") if isinstance(tilesweep, Mapping) else None
    check = spec.get("check") if isinstance(spec, Mapping) else None
    value = check.get("max_rel_err") if isinstance(check, Mapping) else None
    return float(value) if value.__class__ in (float, int) and value > 0 else None
