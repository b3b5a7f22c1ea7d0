"""Lower-only measuring: pre-flight lowering of a sweep's configs on this machine's CPUs.

Each config is lowered for the spec's target GPU (``kernel.device_kind``; ``kernels.preflight``)
exactly as the worker's compile would lower it on that GPU, and what the compiler said becomes a
verdict (``store.lowering.Verdict``): ``lowered`` with each kernel's shared-memory bytes where
the module holds them, ``refused`` with the kernel's or compiler's message and, for shared
memory, its byte count (``Implementation.refusal_kind`` says which exceptions are refusals),
or ``crashed``. It runs on the pools the worker compiles on (``jobs.compile_pool``), lowering
instead of compiling: threads, which hold the GIL while they lower (Python), or processes,
which do not share it (``bench/lowering.py`` measures both). A lowering process that dies is
given its config once more; a second death is that config's ``crashed`` verdict.

There are no units yet when this runs (``tilesweep plan --lower`` lowers before anything is
submitted), so it writes verdicts, not records; the sweep's items take them in
(``store.lowering.apply``) and the workers record what lowering refused without compiling it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence

from kernels import impls
from kernels.spelling import as_json
from orchestrator.planning import RUN, WorkItem
from orchestrator.spec.model import SweepSpec
from orchestrator.store.lowering import Kind, Verdict

from . import compile_pool, compile_procs
from .measure import Compiled, error_string

log = logging.getLogger(__name__)

RETRIES = 1  # a lowering process that dies is given its config once more


def check_available(spec: SweepSpec) -> None:
    """Raise RuntimeError naming the package to install when this machine cannot lower the
    spec's implementation (before any config is blamed for it)."""
    if spec.measured_impl == "mosaic":
        from kernels import mosaic

        mosaic.check_available()
    from kernels import tokamax_meta

    if spec.measured_impl in tokamax_meta.IMPL_NAMES and tokamax_meta.version() is None:
        raise tokamax_meta.TokamaxMissing(tokamax_meta.missing(f"kernel.impl {as_json(spec.measured_impl)}"))


def lower_item(item: WorkItem, spec: SweepSpec) -> Compiled:
    """Lower one item for the spec's target; its verdict rides in ``Compiled.verdict``."""
    from kernels import preflight

    device = spec.kernel.target
    t0 = time.perf_counter()
    try:
        kernels = preflight.lower(
            item.impl,
            item.mode,
            item.fields(),
            batch=item.batch,
            seq=item.seq,
            heads=item.heads,
            head_dim=item.head_dim,
            dtype=item.dtype,
            kv_heads=item.kv_heads,
            causal=item.causal,
            device=device,
        )
    except Exception as exc:  # a refused or crashed lowering is a verdict, never a stop
        kind: Kind = "refused" if impls.get(item.impl).refusal_kind(exc) == "refused" else "crashed"
        smem = preflight.smem_refusal(str(exc))
        verdict = Verdict(
            item.id,
            kind,
            smem_bytes=smem[0] if smem else None,
            limit=device.smem_limit_bytes,
            error=error_string(exc),
            lower_s=time.perf_counter() - t0,
        )
        log.info("item %s: lowering %s: %s", item.id, kind, verdict.error)
    else:
        sizes = [b for _, b in kernels if b is not None]
        verdict = Verdict(
            item.id,
            "lowered",
            kernels,
            smem_bytes=max(sizes) if sizes else None,
            limit=device.smem_limit_bytes,
            lower_s=time.perf_counter() - t0,
        )
    return Compiled(compile_s=verdict.lower_s, verdict=verdict)


def _died(item: WorkItem, deaths: int) -> Verdict:
    return Verdict(
        item.id,
        "crashed",
        error=f"LoweringProcessDied: the lowering process died {deaths} times on this config",
    )


@contextlib.contextmanager
def _pool(mode: str, workers: int, spec: SweepSpec) -> Iterator[compile_pool.Pool]:
    """The worker's pool kinds, lowering instead of compiling."""
    if mode == "processes":
        with compile_procs.ProcessPool(workers, spec, None, job="lower") as procs:
            yield procs
        return
    threads = compile_pool.ThreadPool(workers, spec, job=lower_item)
    try:
        yield threads
    finally:
        threads.close()


def lower_items(
    spec: SweepSpec,
    items: Sequence[WorkItem],
    *,
    on_verdict: Callable[[Verdict], None],
    mode: str = "processes",
    workers: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> int:
    """Lower the runnable ``items`` in plan order on a pool of ``workers`` processes or threads
    (default: this machine's CPUs), calling ``on_verdict`` for each as it is known. Returns how
    many were lowered (fewer when ``should_stop`` said so). The pool is never larger than the
    configs (each process imports jax, seconds of CPU and hundreds of MB before its first one);
    none is started for no config."""
    runnable = [it for it in items if it.kind == RUN]
    if not runnable:
        return 0
    size = min(compile_pool.pool_size(workers if workers is not None else spec.compile.workers), len(runnable))
    deaths: dict[str, int] = {}

    def again(it: WorkItem) -> bool:
        deaths[it.id] = deaths.get(it.id, 0) + 1
        return deaths[it.id] <= RETRIES

    done = 0
    with _pool(mode, size, spec) as pool:
        window = compile_pool.window_size(size)
        for start in range(0, len(runnable), window):
            if should_stop is not None and should_stop():
                break
            chunk = runnable[start : start + window]
            pool.submit(chunk)
            for it, comp in zip(chunk, pool.collect(chunk, should_stop=should_stop, on_death=again), strict=True):
                if comp is None:
                    return done
                on_verdict(comp.verdict if comp.verdict is not None else _died(it, deaths.get(it.id, 0)))
                done += 1
    return done
