"""What a search knows of a problem's configs before it measures them: its own timings
(``Timed``), what the other problems of its mode and implementation measured (``predicted``:
the family's model, and ``promising``: what is worth a capped round), what each would cost
to measure (``affordable``: the cost model's seconds) and, for a problem no other problem
speaks for, which way along each axis its own timings lean (``leanings``). Pure: no I/O. Used
by the search's rules (``planning.search``).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Config = tuple[Any, ...]  # a config's values, in the order of its grid's axes


@dataclass(frozen=True)
class Timed:
    """A config timed in full: its median and the q1-q3 spread it was measured with (ms)."""

    config: Config
    median_ms: float
    q1_ms: float
    q3_ms: float


def timed(config: Config, rec: Mapping[str, Any]) -> Timed | None:
    """A record as a ``Timed``: None for an error, a screen, or a record without a median."""
    if "error" in rec or rec.get("screened"):
        return None
    try:
        m = float(rec["median_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    q1, q3 = rec.get("q1_ms", m), rec.get("q3_ms", m)
    low = float(q1) if isinstance(q1, (int, float)) and math.isfinite(q1) else m
    high = float(q3) if isinstance(q3, (int, float)) and math.isfinite(q3) else m
    return Timed(config, m, min(low, m), max(high, m))


# How alike two problems' timings must be for one to speak for the other: a problem whose
# slowdowns differ from another's by this much (log of the median ratio, about 10%) on average
# over the configs both measured weighs 1/e of one that agrees exactly.
ALIKE = 0.1


def slowdowns(times: Iterable[Timed]) -> dict[Config, float]:
    """Each config's slowdown against the fastest of ``times``: log(median / best median)."""
    listed = list(times)
    best = min((t.median_ms for t in listed), default=None)
    if best is None or best <= 0:
        return {}
    return {t.config: math.log(t.median_ms / best) for t in listed if t.median_ms > 0}


def predicted(own: Iterable[Timed], others: Iterable[Iterable[Timed]]) -> dict[Config, float]:
    """What the other problems (``others``: their full timings) say of each config: its slowdown
    on them (``slowdowns``), averaged with each problem weighted by how alike its slowdowns are
    to ``own``'s on the configs both measured (exp(-mean |difference| / ``ALIKE``); a problem
    with none in common weighs 1). A config none of them measured is absent."""
    mine = slowdowns(own)
    sums: dict[Config, list[float]] = {}
    for theirs in map(slowdowns, others):
        both = [c for c in mine if c in theirs]
        weight = math.exp(-sum(abs(mine[c] - theirs[c]) for c in both) / len(both) / ALIKE) if both else 1.0
        for c, slow in theirs.items():
            acc = sums.setdefault(c, [0.0, 0.0])
            acc[0] += weight * slow
            acc[1] += weight
    return {c: total / weight for c, (total, weight) in sums.items() if weight > 0}


# A config the problems alike measured this much slower than their best (log of the median
# ratio, about 10%), weighted as ``predicted`` weighs them, is not worth a capped round: the
# family's model says it will not win. One no other problem measured is always worth it.
UNLIKELY = 0.1


def promising(
    configs: Iterable[Config], outlook: Mapping[Config, float] | None, lead: Config | None = None
) -> set[Config]:
    """The configs the other problems' slowdowns (``predicted``) leave within ``UNLIKELY`` of a
    best and no slower than ``lead`` (the problem's own best so far), where they measured it:
    what they rate slower than the config a problem already has cannot beat it."""
    said = outlook or {}
    bar = min(UNLIKELY, said.get(lead, UNLIKELY)) if lead is not None else UNLIKELY
    return {c for c in configs if said.get(c, 0.0) <= bar}


# A config the cost model says costs more than this many of the problem's typical config (the
# median of its runnable ones) to compile and time (a spilling tile: the model's register
# term, which also marks a slow kernel) is worth a capped round only where the alike problems
# rate it faster than the problem's best: it is the price of two configs that can win.
COSTLY = 2.0


def affordable(
    configs: Iterable[Config],
    costs: Mapping[Config, float] | None,
    outlook: Mapping[Config, float] | None = None,
    lead: Config | None = None,
) -> set[Config]:
    """The ``configs`` whose predicted seconds (``costs``: ``planning.costs``, per config) are
    at most ``COSTLY`` times the median of them all, and the dearer ones the other problems'
    slowdowns (``predicted``) rate faster than ``lead``, the problem's best so far, where they
    measured both. Without ``costs``: every config."""
    listed = list(configs)
    priced = {c: costs[c] for c in listed if c in costs} if costs else {}
    if not priced:
        return set(listed)
    bar = COSTLY * statistics.median_high(priced.values())
    said = outlook or {}
    faster = said.get(lead, 0.0) if lead is not None else None
    return {c for c in listed if priced.get(c, 0.0) <= bar or (faster is not None and c in said and said[c] < faster)}


def leanings(times: Iterable[Timed]) -> dict[tuple[int, Any], float]:
    """Per axis (its place in a config) and value, how much faster or slower than its average
    the problem timed the configs with that value: the mean of their log medians less the mean
    of all (negative: faster). A value it timed no config with is absent. The climb of a
    problem the others say nothing of takes, along each axis, the step its timings lean to
    first: a few configs spread over the grid say which way each axis goes, not how far."""
    logs = [(t.config, math.log(t.median_ms)) for t in times if t.median_ms > 0]
    if not logs:
        return {}
    mean = sum(y for _, y in logs) / len(logs)
    sums: dict[tuple[int, Any], list[float]] = defaultdict(list)
    for config, y in logs:
        for i, v in enumerate(config):
            sums[(i, v)].append(y - mean)
    return {k: sum(ys) / len(ys) for k, ys in sums.items()}
