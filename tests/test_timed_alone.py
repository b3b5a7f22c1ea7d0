"""No compile runs while a config is timed (``jobs.compile_pool``: Why timing never overlaps a
compile): a compile beside the timing loop takes CPU cores (and, on threads, the GIL) from the
thread that dispatches the timed calls, so whichever config is timed while others compile (the
first of a unit: its ``auto``) would read slower than the same program timed alone, and every
config of the report is compared with ``auto``.

Each mode's pool really compiles ahead (two workers, windows of several configs), on this CPU in
interpret mode; the spies only watch: which configs the pool was handed and has not handed back
when a timing starts or ends, and, on threads, when each compile and each timing ran."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from jobs import compile_pool, compile_procs, worker
from kernels import timing
from orchestrator.control.sweeps import prepare_sweep
from orchestrator.planning import RUN, WorkItem

WriteSpec = Callable[..., Path]
Span = tuple[float, float]
PoolClass = type[compile_pool.ThreadPool] | type[compile_procs.ProcessPool]


class Ledger:
    """What the spies saw: the configs handed to the pool and not handed back yet, each timing's
    outstanding configs at its start and end, and the spans of compiles and timings."""

    def __init__(self) -> None:
        self.outstanding: set[str] = set()
        self.windows: list[int] = []  # sizes of the batches handed to the pool
        self.at_timing: list[set[str]] = []
        self.compiles: list[Span] = []
        self.timings: list[Span] = []


def _watch(monkeypatch: pytest.MonkeyPatch, pool: PoolClass, ledger: Ledger) -> None:
    submit, collect = pool.submit, pool.collect

    def submitted(self: Any, items: Sequence[WorkItem]) -> None:
        ledger.windows.append(len(items))
        ledger.outstanding.update(it.id for it in items)
        submit(self, items)

    def collected(self: Any, items: Sequence[WorkItem], *args: Any, **kwargs: Any) -> Any:
        ledger.outstanding.update(it.id for it in items)  # a pool of one compiles in collect alone
        out = collect(self, items, *args, **kwargs)
        ledger.outstanding.difference_update(it.id for it in items)
        return out

    monkeypatch.setattr(pool, "submit", submitted)
    monkeypatch.setattr(pool, "collect", collected)


def _spy(monkeypatch: pytest.MonkeyPatch) -> Ledger:
    ledger = Ledger()
    for pool in (compile_pool.ThreadPool, compile_procs.ProcessPool):
        _watch(monkeypatch, pool, ledger)
    compile_fn, measure = timing.compile_fn, timing.measure

    def compiling(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return compile_fn(*args, **kwargs)
        finally:
            ledger.compiles.append((start, time.perf_counter()))

    def timed(*args: Any, **kwargs: Any) -> Any:
        ledger.at_timing.append(set(ledger.outstanding))
        start = time.perf_counter()
        try:
            return measure(*args, **kwargs)
        finally:
            ledger.timings.append((start, time.perf_counter()))
            ledger.at_timing.append(set(ledger.outstanding))

    monkeypatch.setattr(timing, "compile_fn", compiling)
    monkeypatch.setattr(timing, "measure", timed)
    return ledger


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_no_config_is_timed_while_the_pool_compiles_others(
    write_spec: WriteSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # windows of two configs, so a unit has several and the pool compiles one while another could be timed
    monkeypatch.setattr(compile_pool, "WINDOW_PER_WORKER", 1)
    spec = write_spec(
        "spec.json", sharding={"units": 1}, compile={"mode": mode, "workers": 2, "cache_dir": "off"}, repeats=3
    )
    sd, (unit,), _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    runnable = [it for it in sd.unit_items(unit) if it.kind == RUN]
    ledger = _spy(monkeypatch)

    summary = worker.run_unit(str(sd.root), unit)

    assert summary["errors"] == 0 and summary["compile_workers"] == 2
    assert len(ledger.timings) == len(runnable) >= 4
    assert max(ledger.windows) == 2 and len(ledger.windows) >= 2  # compiled ahead, a window at a time
    assert ledger.at_timing == [set()] * (2 * len(runnable))  # nothing in the pool's hands while timed
    overlaps = [(c, t) for c in ledger.compiles for t in ledger.timings if c[0] < t[1] and t[0] < c[1]]
    assert overlaps == []  # on threads the compiles ran here: none of them ran beside a timing
    if mode == "threads":
        assert len(ledger.compiles) == len(runnable)
