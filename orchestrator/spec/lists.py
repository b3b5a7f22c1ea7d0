"""The value rules of the spec's lists: the tile grid's axes, the problem axes, and what every
list of them shares (non-empty, each value once).

Each rule is an ``AfterValidator`` whose message names what is allowed, so a spec file's error
says the fix; the ``Annotated`` list types pair a rule with the non-empty and once-only checks.
The JSON Schema cannot state these rules, so ``rules`` says them for the spec reference
(``orchestrator.spec.reference``), from the same constants the messages use.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from kernels.config import MIN_BLOCK
from kernels.impl_triton import MAX_STAGES, MAX_WARPS
from kernels.smem import MAX_HEAD_DIM, MIN_HEAD_DIM
from kernels.spelling import as_json

# warps per block a Triton kernel launches with: the powers of two up to the kernel's limit
WARPS = tuple(1 << k for k in range(MAX_WARPS.bit_length()))


# why a Triton tile is at least MIN_BLOCK, as the refusals say it
_DOT = f"a tile is a dimension of a Triton dot, which tl.dot takes from {MIN_BLOCK}"


def _tiles(values: list[int]) -> list[int]:
    """The Triton kernels' tiles: powers of two, each a dimension of a dot, which Triton's
    ``tl.dot`` takes from ``MIN_BLOCK`` (16) up."""
    bad = [v for v in values if v < MIN_BLOCK or v & (v - 1)]
    if bad:
        raise ValueError(
            f"must be powers of two from {MIN_BLOCK} ({MIN_BLOCK}, {2 * MIN_BLOCK}, {4 * MIN_BLOCK}, ...; {_DOT}), "
            f"got {as_json(bad)}"
        )
    return values


def _one_tile(value: int) -> int:
    if value < MIN_BLOCK or value & (value - 1):
        raise ValueError(f"must be a power of two from {MIN_BLOCK} ({_DOT}), got {as_json(value)}")
    return value


def _head_dims(values: list[int]) -> list[int]:
    bad = [v for v in values if not MIN_HEAD_DIM <= v <= MAX_HEAD_DIM]
    if bad:
        raise ValueError(
            f"must be from {MIN_HEAD_DIM} to {MAX_HEAD_DIM} (80, 96, 192 are fine: the kernel pads "
            f"them to a power of two), got {bad}"
        )
    return values


def _warps(values: list[int]) -> list[int]:
    bad = [v for v in values if v not in WARPS]
    if bad:
        raise ValueError(f"must each be one of {', '.join(map(str, WARPS))} (warps per block), got {bad}")
    return values


def _stages(values: list[int]) -> list[int]:
    bad = [v for v in values if not 1 <= v <= MAX_STAGES]
    if bad:
        raise ValueError(f"must each be 1..{MAX_STAGES} (pipeline stages), got {bad}")
    return values


def _positive(values: list[int]) -> list[int]:
    bad = [v for v in values if v < 1]
    if bad:
        raise ValueError(f"must be positive integers, got {bad}")
    return values


def _unique(values: list[Any]) -> list[Any]:
    try:  # counted in one pass: a list of 200,000 values is checked at once, not in minutes
        counts = Counter(values)
        dupes = sorted({as_json(v) for v in values if counts[v] > 1})
    except TypeError:  # an unhashable value: compared one by one
        dupes = sorted({as_json(v) for v in values if values.count(v) > 1})
    if dupes:
        raise ValueError(f"lists each value once; repeated: {', '.join(dupes)}")
    return values


NonEmpty = Field(min_length=1)
Unique = AfterValidator(_unique)
Tile = Annotated[int, AfterValidator(_one_tile)]
TileList = Annotated[list[int], NonEmpty, AfterValidator(_tiles), Unique]
PosList = Annotated[list[int], NonEmpty, AfterValidator(_positive), Unique]
HeadDimList = Annotated[list[int], NonEmpty, AfterValidator(_head_dims), Unique]
WarpsList = Annotated[list[int], NonEmpty, AfterValidator(_warps), Unique]
StagesList = Annotated[list[int], NonEmpty, AfterValidator(_stages), Unique]
PositiveInt = Annotated[int, Field(ge=1)]


# How the spec reference states each rule (what the rule's error message asks for).
_SAYS: dict[Callable[..., Any], str] = {
    _tiles: f"powers of two from {MIN_BLOCK}",
    _one_tile: f"a power of two from {MIN_BLOCK}",
    _head_dims: f"each {MIN_HEAD_DIM} to {MAX_HEAD_DIM}",
    _warps: f"each one of {', '.join(map(str, WARPS))}",
    _stages: f"each 1 to {MAX_STAGES}",
    _positive: "positive",
    _unique: "each value once",
}


def rules(metadata: Iterable[object]) -> list[str]:
    """What the rules among a field's metadata (``FieldInfo.metadata``) allow, in words."""
    return [_SAYS[m.func] for m in metadata if isinstance(m, AfterValidator) and m.func in _SAYS]
