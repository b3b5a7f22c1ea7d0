"""Replay (``kernel.impl: replay``): measure nothing, answer from a results document.

Kernel Tuner's simulation mode is the model. The worker's measurer for it (``ReplayMeasurer``,
behind the one protocol of ``jobs.measurer``) looks up, for each item, the record of the same
config in ``replay.source`` (``orchestrator.store.replaysource``) and writes the record the
compile-and-time measurer would have written, with samples drawn from that record's measured
spread instead of timed. Everything around it is real: the plan, the units, the executor (local
or SLURM), the partials, the merge, the report. So full-size sweeps, and strategies such as
successive halving, can be run on a CPU in seconds, and their outcome compared.

- Samples: the source record gives three points of its time distribution (q1, median, q3); the
  quantile function through them is piecewise linear, extended below q1 and above q3 with the
  slopes of the quartile ranges (to 2*q1 - median and 2*q3 - median, floored at half of q1).
  ``repeats`` samples are drawn from it, stratified (one uniform draw in each of ``repeats``
  equal slices of the probability range) with a RNG seeded by ``timing.seed``, the item and the
  round, so the same sweep replays the same numbers. Stratifying guarantees that the median of
  3 or more samples lands inside the record's q1-q3; with 1 or 2 samples the draws are taken
  from the middle half (q1-q3) for the same reason. A screening sample (halving) is one draw
  from the whole range. The record keeps its draws in ``samples_ms``, as a timed one keeps its samples.
- Time: nothing sleeps. Each record's ``compile_s`` is the source's; the seconds a real worker
  would spend timing (warm-up, probes, samples: ``kernels.config.timed_calls`` at the source's
  median) are added to a virtual clock. The worker's summary reports both as virtual
  (``"clock": "virtual"``) and each replayed record's ``timer`` is ``"virtual"``. With
  ``replay.pace: real`` the worker also waits those seconds out before writing each record (idle,
  not computing), so a unit lasts as long as it did where the source was measured: time limits,
  USR2 requeues and array sizing can be rehearsed on a CPU partition at no cost in CPU.
- Errors: a source record with an error replays as the same error; a config the source has
  no record of becomes an error record saying so. ``rel_err`` is the source's.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kernels.config import timed_calls
from orchestrator.planning import WorkItem
from orchestrator.planning.halving import Measurement, measurement
from orchestrator.spec.model import SweepSpec
from orchestrator.store.lines import DeviceBlock
from orchestrator.store.replayed import VIRTUAL
from orchestrator.store.replaysource import ReplaySource, load_source

from .attempt import Attempt
from .measurer import Method

TIMER = VIRTUAL  # what readers know a replayed record by (``orchestrator.store.replayed``)
MISSING = "ReplayMissing: the replay source {path} has no record of this config"
SCREENED_ONLY = (
    "ReplayMissing: the replay source {path} only screened this config (one sample of a halving sweep), "
    "which stands for no full timing"
)


def device_block(source: ReplaySource) -> DeviceBlock:
    """The replayed device: the source's device block, its backend named ``replay`` (no jax runs
    here, so the sweep's environment is the source's, never this node's)."""
    device = source.device
    return {
        "jax": device.get("jax"),
        "devices": device.get("devices"),
        "python": device.get("python"),
        "device_kind": device.get("device_kind"),
        "jaxlib": device.get("jaxlib"),
        "backend": "replay",
    }


def quantile(u: np.ndarray, q1: float, median: float, q3: float) -> np.ndarray:
    """The piecewise-linear quantile function through (0.25, q1), (0.5, median), (0.75, q3)."""
    lo = max(2 * q1 - median, q1 / 2)
    hi = 2 * q3 - median
    return np.interp(u, [0.0, 0.25, 0.5, 0.75, 1.0], [lo, q1, median, q3, hi])


def draw(rec: dict[str, Any], n: int, rng: np.random.Generator, *, stratified: bool = True) -> np.ndarray:
    """``n`` per-call times (ms) from a source record's spread."""
    m = float(rec["median_ms"])
    q1, q3 = min(float(rec.get("q1_ms", m)), m), max(float(rec.get("q3_ms", m)), m)
    if not stratified:
        return quantile(rng.uniform(0.0, 1.0, n), q1, m, q3)
    lo, hi = (0.0, 1.0) if n >= 3 else (0.25, 0.75)
    u = lo + (hi - lo) * (np.arange(n) + rng.uniform(0.0, 1.0, n)) / n
    rng.shuffle(u)
    return quantile(u, q1, m, q3)


def _rng(seed: int, item_id: str, screened: bool) -> np.random.Generator:
    digest = hashlib.blake2b(f"{seed}|{item_id}|{int(screened)}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


class Replayer:
    """Records of a replayed sweep, one item at a time, and the virtual seconds they took."""

    def __init__(self, spec: SweepSpec, source: ReplaySource | None = None) -> None:
        self.spec = spec
        self.source = source if source is not None else load_source(spec)

    def record(self, item: WorkItem, how: Measurement) -> tuple[dict[str, Any], float, float]:
        """(record, virtual compile seconds, virtual timed seconds) of one runnable item."""
        rec = item.record_fields()
        src = self.source.find(rec)
        if src is None:
            rec["error"] = MISSING.format(path=self.source.path)
            rec.update(how.marks(error=True))
            return rec, 0.0, 0.0
        if "error" in src or not isinstance(src.get("median_ms"), (int, float)):
            rec["error"] = str(src.get("error", "ReplayMissing: the source record has no median_ms"))
            rec.update(how.marks(error=True))
            return rec, 0.0, 0.0
        if src.get("screened") is True and not how.screened:  # one screening sample is no full timing
            rec["error"] = SCREENED_ONLY.format(path=self.source.path)
            rec.update(how.marks(error=True))
            return rec, 0.0, 0.0
        timing = self.spec.timing
        samples = draw(src, how.repeats, _rng(timing.seed, item.id, how.screened), stratified=not how.screened)
        q1, median, q3 = np.percentile(samples, [25, 50, 75])
        inner, calls = timed_calls(
            float(src["median_ms"]),
            repeats=how.repeats,
            target_ms=how.target_ms,
            max_inner=timing.max_inner,
            warmup=timing.warmup,
        )
        compile_s = float(src.get("compile_s") or 0.0)
        rel_err = src.get("rel_err")
        rec.update(
            rel_err=float(rel_err) if isinstance(rel_err, (int, float)) else 0.0,
            compile_s=compile_s,
            inner=inner,
            median_ms=float(median),
            q1_ms=float(q1),
            q3_ms=float(q3),
            timer=TIMER,
            samples_ms=[float(x) for x in samples],
        )
        rec.update(how.marks())
        return rec, compile_s, calls * float(src["median_ms"]) / 1e3


SYNC_EVERY = 256  # replayed records per fsync: a replay is free to redo, the disk is not


class ReplayMeasurer:
    """The measurer of a replay: the runnable items in plan order, each recorded as the
    ``Replayer`` answers. Every line is written as it is made, fsynced a batch at a time
    (``PartialWriter``); at ``replay.pace: real`` each after the record's seconds are waited out.
    A stop signal ends the wait (``jobs.in_flight`` raises where no config is in flight): that
    record is left unwritten, for the rerun, resume or requeue to replay."""

    def __init__(self, spec: SweepSpec, source: ReplaySource | None = None) -> None:
        self._spec = spec
        self._replayer = Replayer(spec, source)
        self._device = device_block(self._replayer.source)
        self._method = Method(clock=VIRTUAL, records_timer=TIMER)

    @property
    def device(self) -> DeviceBlock:
        return self._device

    @property
    def method(self) -> Method:
        return self._method

    def run(self, attempt: Attempt, runnable: Sequence[WorkItem]) -> bool:
        spec = self._spec
        counts = attempt.counts
        real = spec.replay is not None and spec.replay.pace == "real"
        for n, it in enumerate(runnable, 1):
            if attempt.should_stop():
                return True
            rec, compile_s, timed_s = self._replayer.record(it, measurement(it.config, spec, attempt.round))
            if "error" not in rec:
                counts.compiled += 1
                counts.compile_sum_s += compile_s
                counts.timed_s += timed_s
                if real:
                    wait(compile_s + timed_s, attempt.should_stop)
                    if attempt.should_stop():  # a stop that ended the wait (a time-limit warning, a
                        return True  # cancel): the record's seconds were not waited out, it is not written
            attempt.record(it, rec, sync=n % SYNC_EVERY == 0)
        return False


def wait(seconds: float, should_stop: Callable[[], bool], tick: float = 0.1) -> None:
    """Sleep ``seconds``, or until ``should_stop()`` (checked every ``tick``, for a stop that
    does not raise: the unit's own ``stop_check``)."""
    end = time.monotonic() + seconds
    while not should_stop() and (left := end - time.monotonic()) > 0:
        time.sleep(min(tick, left))
