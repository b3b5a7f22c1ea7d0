"""Successive halving across a cluster: screen every config briefly, time in full only those
that can still win. Pure: no I/O.

The one home of the strategy's rules, used by the worker (how to time an item in a round),
the cost model (what round 1 costs) and the planner of round 2 (which configs survive):

- Round 1 (``timing.strategy: halving``): every forced config gets one screening sample of
  about ``timing.screen_ms`` (``measurement``); its record says ``"screened": true``. The
  ``auto`` record is the report's baseline, never a candidate, so it is timed in full at once.
- Round 2, planned once every item of round 1 has a record: per problem, the survivors
  (``survivors``) are timed in full (``repeats`` x ``target_ms``) as new units; their records
  supersede the screened ones (the newest record of an item wins the merge).

How noise is judged: one screening sample of a config that would time at ``m`` lands anywhere
in that config's spread, so two configs whose screens differ by less than that spread cannot be
told apart by their screens. The spread of one sample on this device and problem is read off
the problem's ``auto`` record, timed in full in round 1: its relative q1-q3 range covers half
the samples, so twice it covers nearly all. A config survives when its screen is within
``max(timing.noise, 2 * auto's (q3 - q1) / median)`` of the best screen, or when it is among
the ``timing.keep`` fastest screens. ``timing.noise`` (default 0.1) is the floor for problems
whose auto failed or measured a spread narrower than a short screening sample has.

A search (``planning.search``) with ``search.screen`` screens each of its rounds by the same rule
(``screens``: its odd rounds screen, the even ones time the survivors in full), and its records
say which round measured them (``Measurement.marks``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.planning.search import SEARCH
from orchestrator.spec.model import SweepSpec

HALVING = "halving"


@dataclass(frozen=True)
class Measurement:
    """How one item is timed: ``repeats`` samples of about ``target_ms``; ``screened`` marks the
    one short sample of a screening round; ``round``: the round of a search, which its records
    name (None: the strategy's records do not)."""

    repeats: int
    target_ms: float
    screened: bool = False
    round: int | None = None

    def marks(self, *, error: bool = False) -> dict[str, Any]:
        """The record fields that say how it was measured: ``screened`` on a screen's
        measurement (never on an error), ``round`` on every record of a search's round."""
        out: dict[str, Any] = {"screened": True} if self.screened and not error else {}
        if self.round is not None:
            out["round"] = self.round
        return out


def screens(spec: SweepSpec, round_: int) -> bool:
    """Whether the forced configs of ``round_`` get one screening sample: halving's round 1, and
    the odd rounds of a search with ``search.screen`` (each of whose rounds is a screen, then the
    full timing of its survivors)."""
    strategy = spec.timing.strategy
    if strategy == HALVING:
        return round_ == 1
    return strategy == SEARCH and spec.search.screen and round_ % 2 == 1


def measurement(config: str, spec: SweepSpec, round_: int = 1) -> Measurement:
    """How an item of kind ``config`` ("auto" or "forced") is timed in ``round_``."""
    timing = spec.timing
    numbered = round_ if timing.strategy == SEARCH else None
    if config == "forced" and screens(spec, round_):
        return Measurement(1, timing.screen_target_ms, screened=True, round=numbered)
    return Measurement(spec.repeats, timing.target_ms, round=numbered)


def relative_spread(rec: Mapping[str, Any] | None) -> float | None:
    """(q3 - q1) / median of a timed record; None for a failed or incomplete one."""
    if rec is None or "error" in rec:
        return None
    try:
        m, q1, q3 = float(rec["median_ms"]), float(rec["q1_ms"]), float(rec["q3_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (m > 0 and math.isfinite(q1) and math.isfinite(q3)):
        return None
    return max(0.0, q3 - q1) / m


def margin(noise: float, auto: Mapping[str, Any] | None) -> float:
    """How far above the best screen a screen may lie and still survive."""
    spread = relative_spread(auto)
    return noise if spread is None else max(noise, 2 * spread)


def survivors(
    screens: Iterable[tuple[str, float]], *, keep: int, noise: float, auto: Mapping[str, Any] | None = None
) -> list[str]:
    """The ids of one problem's screened configs to time in full, fastest screen first.

    ``screens``: (item id, screened median ms) of the configs whose screen succeeded (a config
    that failed its screen has no time and cannot win). ``auto``: the problem's auto record."""
    ranked = sorted(screens, key=lambda s: (s[1], s[0]))
    if not ranked:
        return []
    limit = ranked[0][1] * (1 + margin(noise, auto))
    return [iid for k, (iid, ms) in enumerate(ranked) if k < keep or ms <= limit]


def keeps_all(spec: SweepSpec) -> str | None:
    """The note a halving spec gets whose screen drops nothing: ``timing.keep`` at or above the
    configs of every mode's grid keeps each config it screens, so round 2 times them all in full
    after the screen, more GPU time than ``full`` spends on them."""
    from orchestrator.planning.grids import mode_grid
    from orchestrator.spec.grid import TOKAMAX_GRID

    if spec.timing.strategy != HALVING or spec.auto_only or spec.grid == TOKAMAX_GRID:
        return None
    largest, keep = max(len(mode_grid(spec, mode)) for mode in spec.modes), spec.timing.keep
    if keep < largest:
        return None
    return (
        f"timing.keep ({keep}) is at least the {largest} configs of a problem's grid, so halving's screen screens "
        "nothing out: round 2 times every config in full after screening it, more GPU time than "
        f'timing.strategy "full"; set timing.keep below {largest} for the screen to drop the configs that cannot '
        'win, or use "full"'
    )
