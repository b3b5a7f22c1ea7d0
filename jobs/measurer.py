"""What the worker needs of a way to measure a unit's configs: one protocol, a measurer per kind.

Kernel Tuner's split is the model: its runners (the one that compiles and benchmarks, the
simulation one that answers from a cache) share one interface, and the tuner that drives them
never asks which it has. Here the worker's unit loop records what needs no measuring, then
hands the rest to its measurer and writes the summary from the measurer's ``method``; it has no
branch per kind. Each kind lives in its own module:

- ``jobs.compiled``: compile on a pool of threads or processes, check against the reference,
  time on the device (the real kernels);
- ``jobs.replay``: answer from a results document, times on a virtual clock (``kernel.impl:
  replay``).

A new kind (lowering only, another kernel family's compile and launch) is one more class with
``device``, ``method`` and ``run``, and one more case in ``jobs.worker.measurer_for``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.planning import WorkItem
from orchestrator.store.lines import DeviceBlock

from .attempt import Attempt


@dataclass(frozen=True)
class Method:
    """How a measurer measures, as the attempt's header (``measure``) and summary say it."""

    clock: str  # "real", or "virtual" where its seconds are a virtual clock's (a replay)
    records_timer: str  # what its records' ``timer`` says (kernels.timing.TIMERS, or "virtual")
    timer: str | None = None  # kernels.timing's name of the unit's timer; None: nothing is timed
    flush_l2: bool = False  # an L2 flush before each sample (kernels.l2)
    compile_mode: str | None = None  # compile.mode; None: nothing is compiled
    compile_workers: int = 0


class Measurer(Protocol):
    """One kind of measuring, for one unit's attempt."""

    @property
    def device(self) -> DeviceBlock:
        """The device the records are measured on (a replay's: its source's), checked usable."""
        ...

    @property
    def method(self) -> Method: ...

    def run(self, attempt: Attempt, runnable: Sequence[WorkItem]) -> bool:
        """Measure ``runnable`` in plan order, each record written through ``attempt`` and counted
        in ``attempt.counts``; return whether the attempt stopped early (``attempt.should_stop``:
        the configs in flight are then abandoned, never counted against them)."""
        ...
