"""Compile once, then time a compiled function the way the reference run did.

Compilation is timed apart from the runs (it is most of a sweep's cost and must not pollute a
kernel's time). A sample times ``inner`` back-to-back calls ending in one
``block_until_ready``, so dispatch overhead is amortised for sub-millisecond kernels; ``inner``
is sized from a probe call to make each sample about ``target_ms`` long. Per-call times are
sample / inner; every sample is kept so a report can show spread, and selection uses the median.

Two timers, named in each result: ``wall`` is perf_counter around the calls and one
block_until_ready (dispatch included); ``device`` times the same calls and takes the device's
own execution time from jax's profiler trace (``kernels.devicetime``), so dispatch overhead is
left out. With the device timer the wall time of every sample is kept too. An optional
``flush`` (``kernels.l2``) runs before each sample, outside the timed calls.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from kernels import devicetime
from kernels.config import PROBES, inner_for

logger = logging.getLogger(__name__)

TIMER = "wall_clock+block_until_ready"
# timing.timer -> the name records carry in their ``timer`` field
TIMERS = {"wall": TIMER, "device": devicetime.TIMER}


@dataclasses.dataclass
class Timing:
    """Per-call times in milliseconds; ``samples_ms`` holds every sample (already / inner) by the
    timer named in ``timer``, ``wall_samples_ms`` the same samples by wall clock. ``timed_s`` is
    the wall time the measurement took (warm-up, probes, flushes and samples)."""

    median_ms: float
    q1_ms: float
    q3_ms: float
    inner: int
    samples_ms: list[float]
    timer: str
    wall_samples_ms: list[float] = dataclasses.field(default_factory=list)
    timed_s: float = 0.0


def compile_fn(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[jax.stages.Compiled, float]:
    """``jax.jit(fn).lower(*args).compile()`` and its wall time (lower + compile) in seconds."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def _timed_calls(compiled: Any, args: Sequence[Any], n: int) -> float:
    """Seconds for ``n`` back-to-back calls, waiting only for the last result."""
    start = time.perf_counter()
    out = None
    for _ in range(n):
        out = compiled(*args)
    jax.block_until_ready(out)
    return time.perf_counter() - start


def measure(
    compiled: Any,
    args: Sequence[Any],
    *,
    repeats: int,
    target_ms: float = 50.0,
    max_inner: int = 200,
    warmup: int = 1,
    timer: str = "wall",
    flush: Callable[[], None] | None = None,
) -> Timing:
    """Warm up, probe to size ``inner``, then take ``repeats`` samples by ``timer`` ("wall" or
    "device"), calling ``flush`` (if given) before each sample.

    The probe is the fastest of up to ``PROBES`` single calls (fewer once they add up to
    ``target_ms``): one call alone is noisy enough to halve or double ``inner``. With
    ``max_inner`` 1 a sample is one call whatever the probe says, so there is none
    (``kernels.config.probe_calls``).
    """
    if repeats < 1 or max_inner < 1 or warmup < 0:
        raise ValueError(f"need {repeats=} >= 1, {max_inner=} >= 1, {warmup=} >= 0")
    if timer not in TIMERS:
        raise ValueError(f"{timer=} must be one of {', '.join(TIMERS)}")
    start = time.perf_counter()
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    probes: list[float] = []
    while max_inner > 1 and len(probes) < PROBES and sum(probes) < target_ms:
        probes.append(_timed_calls(compiled, args, 1) * 1e3)
    probe_ms = min(probes, default=0.0)
    inner = inner_for(probe_ms, target_ms=target_ms, max_inner=max_inner)
    samples: list[float] = []
    walls: list[float] = []
    for _ in range(repeats):
        if flush is not None:
            flush()
        if timer == "wall":
            walls.append(_timed_calls(compiled, args, inner) * 1e3 / inner)
            samples.append(walls[-1])
            continue
        with devicetime.DeviceClock() as clock:
            walls.append(_timed_calls(compiled, args, inner) * 1e3 / inner)
        samples.append(clock.busy_ms / inner)
    q1, median, q3 = np.percentile(samples, [25, 50, 75])
    logger.debug("probe %.3f ms -> inner %d, median %.4f ms (%s)", probe_ms, inner, median, timer)
    return Timing(
        median_ms=float(median),
        q1_ms=float(q1),
        q3_ms=float(q3),
        inner=inner,
        samples_ms=samples,
        timer=TIMERS[timer],
        wall_samples_ms=walls,
        timed_s=time.perf_counter() - start,
    )
