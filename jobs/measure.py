"""Measuring one work item: build, compile, check against the reference, time.

A bad config is a record, never an exception: compile failures, resource exhaustion and
wrong shapes come back as ``{"error": "Type: message"}``. Inputs and the reference
outputs are computed once per shape (``ShapeContext``) and shared by every config of it.

Compiling (``compile_item``) is apart from checking and timing (``finish_item``) so the
worker can compile upcoming configs on other threads: a compile needs only the inputs'
shapes and dtypes (``abstract_args``), never the arrays.
"""

from __future__ import annotations

import functools
import linecache
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernels import impl_triton, impls
from kernels.config import AttentionConfig
from orchestrator.errors import WorkerEnvironmentError
from orchestrator.planning import WorkItem
from orchestrator.planning.halving import Measurement
from orchestrator.spec import tolerance
from orchestrator.spec.errorkinds import CRASHED_ERROR, TIMEOUT_ERROR
from orchestrator.spec.model import SweepSpec
from orchestrator.store.lowering import Verdict

if TYPE_CHECKING:
    from kernels.timing import Timing

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2000


def error_string(exc: BaseException) -> str:
    """``"Type: message"`` as the reference run records failures, bounded in length. An
    exception with no message (a bare ``assert`` in a library) says where it was raised and
    the line there (``AssertionError at pallas_mosaic_gpu_kernel_sm90.py:316: assert ...``)."""
    msg = str(exc).strip() or _where(exc)
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _where(exc: BaseException) -> str:
    """``at FILE:LINE: SOURCE`` of the innermost frame that raised ``exc``; "" without one."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    line = linecache.getline(code.co_filename, tb.tb_lineno).strip()
    return f"at {os.path.basename(code.co_filename)}:{tb.tb_lineno}" + (f": {line}" if line else "")


def interpret_flag(spec: SweepSpec) -> bool | None:
    """Spec's kernel.interpret as the kernel takes it (None: decided by the backend)."""
    value = spec.kernel.interpret
    return None if value == "auto" else bool(value)


@dataclass
class ShapeContext:
    """Inputs and reference outputs of one shape and mode, made once, used by every config."""

    args: tuple
    refs: dict[tuple[str, bool], tuple]  # (mode, causal) -> reference outputs
    shape: tuple = ()  # WorkItem.shape it was made for

    @classmethod
    def make(cls, item: WorkItem, spec: SweepSpec) -> ShapeContext:
        from kernels import attention

        args = attention.make_inputs(
            batch=item.batch,
            seq=item.seq,
            heads=item.heads,
            head_dim=item.head_dim,
            dtype=item.dtype,
            seed=spec.timing.seed,
            kv_heads=item.kv_heads,
        )
        return cls(args=args, refs={}, shape=item.shape)

    def reference(self, mode: str, causal: bool = False) -> tuple:
        if (mode, causal) not in self.refs:
            import jax

            from kernels import attention

            ref_fn = jax.jit(attention.build_reference(mode, causal=causal))
            self.refs[(mode, causal)] = tuple(jax.block_until_ready(ref_fn(*self.args)))
        return self.refs[(mode, causal)]


@functools.lru_cache(maxsize=64)
def abstract_args(batch: int, seq: int, heads: int, head_dim: int, dtype: str, kv_heads: int | None = None) -> tuple:
    """Shapes and dtypes of a shape's inputs (what ``make_inputs`` returns), for lowering."""
    import jax

    from kernels import attention

    return tuple(
        jax.eval_shape(
            functools.partial(
                attention.make_inputs,
                batch=batch,
                seq=seq,
                heads=heads,
                head_dim=head_dim,
                dtype=dtype,
                kv_heads=kv_heads,
            )
        )
    )


def kernel_config(item: WorkItem, spec: SweepSpec) -> AttentionConfig:
    """The ``AttentionConfig`` an item of a Triton kernel runs: its forced fields, or what its
    implementation's ``auto`` picks for its shape (``kernels.impl_triton``)."""
    return impl_triton.get(item.impl).config(
        item.mode,
        item.fields(),
        dtype=item.dtype,
        head_dim=item.head_dim,
        seq=item.seq,
        smem_limit_bytes=spec.smem_limit_bytes,
    )


def build_item(item: WorkItem, spec: SweepSpec) -> Callable[..., tuple[Any, ...]]:
    """``f(q, k, v, do)`` running an item's config (its implementation's ``make``)."""
    return impls.get(item.impl).make(
        item.mode,
        item.fields(),
        dtype=item.dtype,
        head_dim=item.head_dim,
        seq=item.seq,
        smem_limit_bytes=spec.smem_limit_bytes,
        causal=item.causal,
        interpret=interpret_flag(spec),
    )


@dataclass
class Compiled:
    """One config's compile: the executable, or the error that stopped it.

    A compile process hands the executable over serialized (``blob``); the worker loads it
    (``jobs.compile_procs.load``) only when it is about to time it. ``died``: every compile
    process given this config died on it (``executor.max_config_attempts`` times)."""

    executable: Any = None
    compile_s: float = 0.0  # this config's own lower + compile wall time
    cached: bool = False  # the persistent compilation cache supplied the executable
    error: str | None = None
    blob: Any = None  # (bytes, in_tree, out_tree) of jax.experimental.serialize_executable
    died: bool = False
    verdict: Verdict | None = None  # a lower-only job's (``jobs.lowering``): what lowering said


def compile_item(item: WorkItem, spec: SweepSpec) -> Compiled:
    """Lower and compile one runnable item; safe to call from several threads at once."""
    from kernels import timing

    from .compile_cache import cache_hits

    try:
        fn = build_item(item, spec)
        args = abstract_args(item.batch, item.seq, item.heads, item.head_dim, item.dtype, item.kv_heads)
        with cache_hits() as hits:
            executable, compile_s = timing.compile_fn(fn, args)
    except Exception as exc:  # a bad config is a record (a wrong output too: ``tolerance.WrongResult``)
        log.info("item %s failed to compile: %s", item.id, error_string(exc))
        return Compiled(error=error_string(exc))
    return Compiled(executable, compile_s, hits.cached)


def finish_item(
    item: WorkItem,
    compiled: Compiled,
    ctx: ShapeContext,
    spec: SweepSpec,
    how: Measurement | None = None,
    *,
    flush: Callable[[], None] | None = None,
    timer: str | None = None,
) -> tuple[dict[str, Any], float]:
    """The record of a compiled item (its outputs checked against the reference, an error where
    they are wrong: ``spec.tolerance``; then timed as ``how`` says: by default ``repeats``
    samples of ``target_ms``) and the seconds its timing took. ``flush`` (``kernels.l2``) runs
    before each sample; ``timer``: the unit's timer (default: ``SweepSpec.timer_on`` this
    backend)."""
    import jax

    from kernels import attention, devicetime, timing

    how = how or Measurement(spec.repeats, spec.timing.target_ms)
    rec = item.record_fields()
    if compiled.error is not None:
        rec["error"] = compiled.error
        rec.update(how.marks(error=True))
        return rec, 0.0
    try:
        outs = jax.block_until_ready(compiled.executable(*ctx.args))
        err = attention.rel_err(outs, ctx.reference(item.mode, item.causal))
        del outs
        tolerance.check(float(err), item.dtype, spec.check.max_rel_err)  # a wrong kernel is not timed
        t = timing.measure(
            compiled.executable,
            ctx.args,
            repeats=how.repeats,
            target_ms=how.target_ms,
            max_inner=spec.timing.max_inner,
            warmup=spec.timing.warmup,
            flush=flush,
            timer=timer or spec.timer_on(jax.default_backend()),
        )
    except devicetime.NoDeviceEvents as exc:  # a broken environment, not a bad config
        raise WorkerEnvironmentError(f"timing.timer is device, but {exc}") from None
    except Exception as exc:  # a bad config is a record
        log.info("item %s failed: %s", item.id, error_string(exc))
        rec["error"] = error_string(exc)
        rec["compile_cached"] = compiled.cached
        rec.update(how.marks(error=True))
        return rec, 0.0
    rec.update(_measured_fields(float(err), compiled, t))
    rec.update(how.marks())
    return rec, t.timed_s


def _measured_fields(rel_err: float, compiled: Compiled, t: Timing) -> dict[str, Any]:
    """What a record of a config checked and timed holds, in the reference's order."""
    return {
        "rel_err": rel_err,
        "compile_s": float(compiled.compile_s),
        "inner": int(t.inner),
        "median_ms": float(t.median_ms),
        "q1_ms": float(t.q1_ms),
        "q3_ms": float(t.q3_ms),
        "timer": t.timer,
        "samples_ms": [float(x) for x in t.samples_ms],
        "compile_cached": compiled.cached,
    }


def skipped_record(item: WorkItem) -> dict[str, Any]:
    """Record of an item the plan marked invalid or pruned (never compiled)."""
    rec = item.record_fields()
    rec["error"] = item.reason
    if item.kind == "pruned":
        rec["pruned"] = True
        rec["smem_bytes"] = item.smem_bytes
    return rec


def crashed_record(item: WorkItem, deaths: int, hangs: int = 0) -> dict[str, Any]:
    """The error record of a config given up on: its worker died ``deaths`` times while it was
    the only config in flight (``hangs`` of them: the time limit found it hung)."""
    rec = item.record_fields()
    if hangs >= deaths:
        rec["error"] = (
            f"{TIMEOUT_ERROR}: this config was the only one in flight {deaths} times when the time limit came and "
            f"it did not finish; not retried (`tilesweep resume --retry-errors timeout` retries it)"
        )
    else:
        rec["error"] = (
            f"{CRASHED_ERROR}: this config was the only one in flight {deaths} times when its worker died "
            "(crashed the process, killed from outside, or hung past the time limit); not retried "
            "(`tilesweep resume --retry-errors crashed` retries it)"
        )
    return rec


def l2_flush(spec: SweepSpec, backend: str) -> Callable[[], None] | None:
    """The L2 flush before each sample where ``timing.flush_l2`` wants one (``kernels.l2``)."""
    from kernels import l2

    return l2.L2Flush() if l2.wanted(spec.timing.flush_l2, backend) else None
