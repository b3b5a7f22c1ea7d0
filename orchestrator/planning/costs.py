"""What a work item costs a worker, in seconds: a model, or an earlier sweep's measurements.

Sharding needs relative costs, not exact ones, but it needs them right across classes of
items (fwd vs fwd_bwd, bfloat16 vs float32, big vs small tiles): a unit that collects the
class the model underestimates ends last. So the model is built from what drives each part
of a worker's time, not fitted per class:

- compile: a fixed part (tracing, lowering, the XLA pipeline) plus a part that grows with
  the code Triton generates, which is dominated by the unrolled MMA instructions of one loop
  iteration per warp; it grows faster once the per-thread float32 accumulators no longer
  fit in registers (spilling). The three constants were set on the reference H100 run's
  excerpt (bfloat16 d64 fwd and fwd_bwd, float32 d128 fwd: 151 records, log rms error
  0.09-0.19 per class); over the whole reference plan the model gives 450 s of compile
  against the 427 s the run measured.
- timed work: what ``kernels.timing.measure`` does (warm-up, a probe, ``repeats`` samples
  of ``inner`` calls, ``inner`` sized from the probe), with the per-call time from FLOPs and
  an assumed sustained throughput per dtype, plus the correctness call and its check.
- setup, once per shape per unit: inputs and each mode's reference (compile and run).

The added axes, by the same reasoning and not fitted (no GPU run has measured them yet):
float16 costs what bfloat16 does (same MMA shape, same element size); causal attention does
half the timed work (``attention_flops``) and compiles each scan's loop body once per copy the
implementation has (``kernels.impls``: ours runs the diagonal in a second, masked loop);
grouped-query attention changes neither (the same matmuls, fewer K/V reads); the stock kernel
is modelled like ours (its kernels are the ones ours was modelled on).

Items pruned by the shared-memory model or invalid are nearly free (one record line).
A results document can replace the model where it has a record (``cost_table``): cost =
compile_s + (warmup + probe + check + repeats * inner) * median_ms; the model, scaled to
agree with the document on the items both know, fills in the rest.

Pure arithmetic: no jax import, no I/O (the CLI reads the document).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernels import impls, smem
from kernels.config import attention_flops, default_num_warps, inner_for
from kernels.impl_base import Value
from orchestrator.errors import ResultsError
from orchestrator.planning.classify import RUN
from orchestrator.planning.grids import mode_grid
from orchestrator.planning.halving import Measurement, measurement
from orchestrator.planning.items import WorkItem
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import DEFAULT_IMPL, record_key


@dataclass(frozen=True)
class Assumptions:
    """The device and worker the model assumes (an H100-class GPU node)."""

    # Sustained TFLOP/s of a typical tile config (the reference run's medians: bf16 fwd
    # ~170, bf16 fwd_bwd ~135, float32-as-tf32 fwd ~65 TFLOP/s).
    tflops: tuple[tuple[str, float], ...] = (("bfloat16", 150.0), ("float16", 150.0), ("float32", 60.0))
    call_overhead_s: float = 2e-5
    compile_base_s: float = 0.14  # per config: trace, lower, XLA pipeline
    compile_per_mma_s: float = 1.0e-3  # per MMA instruction in a warp's loop body
    spill_regs: float = 256.0  # float32 accumulator registers/thread where spilling starts
    check_s_per_element: float = 2e-9  # host-side rel_err per output element
    record_s: float = 0.002  # one fsynced partial line
    setup_base_s: float = 0.2  # inputs of a shape
    reference_compile_s: float = 0.3  # per mode
    reference_tflops: float = 30.0  # float32 HIGHEST einsums
    item_floor_s: float = 0.002  # pruned/invalid items: a record line

    def throughput(self, dtype: str) -> float:
        return dict(self.tflops).get(dtype, 60.0) * 1e12


DEFAULT = Assumptions()


# ---------------------------------------------------------------------------- compile


def _mma_volume(dtype: str) -> int:
    # mma.m16n8k16 for bfloat16 and float16, m16n8k8 for tf32 (float32 inputs).
    return 16 * 8 * (8 if dtype == "float32" else 16)


def _kernel_compile(a: Assumptions, mma_per_warp: float, regs: float) -> float:
    spill = max(0.0, regs / a.spill_regs - 1.0)
    return a.compile_per_mma_s * mma_per_warp * (1.0 + spill * spill)


def compile_estimate(
    mode: str, dtype: str, head_dim: int, seq: int, cfg: Mapping[str, int], a: Assumptions = DEFAULT, loops: int = 1
) -> float:
    """Seconds to lower and compile one config (``cfg``: AttentionConfig fields); ``loops``:
    copies of each scan's loop body (``Impl.causal_loops`` for a causal problem)."""
    d = smem.padded_head_dim(head_dim)
    e = 4 if dtype == "float32" else 2
    warps = cfg.get("num_warps") or default_num_warps(head_dim)
    threads = 32 * warps
    vol = _mma_volume(dtype)
    bq, bk = min(cfg.get("block_q", 128), seq), min(cfg.get("block_k", 128), seq)
    # Forward: S = Q K^T and O += P V per K/V step; accumulators S, O plus the Q tile.
    total = a.compile_base_s + loops * _kernel_compile(
        a, 2 * bq * bk * d / (warps * vol), (bq * bk + bq * d + bq * d * e / 4) / threads
    )
    if mode == "fwd_bwd":
        o, i = min(cfg.get("bwd_outer", 128), seq), min(cfg.get("bwd_inner", 128), seq)
        # dK/dV scan (4 dots) then dQ scan (3 dots), each o x i x d per step.
        regs = max((2 * o * d + 2 * o * i + 2 * o * d * e / 4) / threads, (o * d + 2 * o * i + o * d * e / 4) / threads)
        total += loops * _kernel_compile(a, 7 * o * i * d / (warps * vol), regs)
    return total


def auto_estimate(
    mode: str, dtype: str, head_dim: int, seq: int, smem_limit: int | None, impl: str = DEFAULT_IMPL
) -> dict[str, Any]:
    """What the cost model reads of the config the implementation's ``auto`` runs
    (``kernels.impls``, jax-free: ``cost_fields``)."""
    return impls.get(impl).cost_fields(mode, None, dtype=dtype, head_dim=head_dim, seq=seq, smem_limit_bytes=smem_limit)


# ---------------------------------------------------------------------------- timed work


def flops(mode: str, batch: int, heads: int, seq: int, head_dim: int, causal: bool = False) -> float:
    """FLOPs of one call (``kernels.config.attention_flops``)."""
    return attention_flops(mode, batch, heads, seq, head_dim, causal=causal) or 0.0


def call_estimate(
    mode: str,
    dtype: str,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    a: Assumptions = DEFAULT,
    causal: bool = False,
) -> float:
    """Seconds per kernel call."""
    return flops(mode, batch, heads, seq, head_dim, causal) / a.throughput(dtype) + a.call_overhead_s


def timed_estimate(
    mode: str,
    dtype: str,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    spec: SweepSpec,
    a: Assumptions = DEFAULT,
    causal: bool = False,
    how: Measurement | None = None,
) -> float:
    """Seconds of calls, check and record of one runnable config (everything but compile),
    timed as ``how`` says (default: ``repeats`` samples of ``target_ms``)."""
    t = call_estimate(mode, dtype, batch, heads, seq, head_dim, a, causal)
    tm = spec.timing
    how = how or Measurement(spec.repeats, tm.target_ms)
    inner = inner_for(t * 1e3, target_ms=how.target_ms, max_inner=tm.max_inner)
    calls = tm.warmup + 2 + how.repeats * inner  # warm-up, probe, correctness call, samples
    outputs = batch * seq * heads * head_dim * (4 if mode == "fwd_bwd" else 1)
    return calls * t + outputs * a.check_s_per_element + a.record_s


def setup_estimate(
    shape: tuple, modes: Iterable[str], causal: Iterable[bool] = (False,), a: Assumptions = DEFAULT
) -> float:
    """Seconds to make a shape's inputs (``WorkItem.shape``) and the reference of each mode and
    causal value, once per unit."""
    _, head_dim, seq, batch, heads, _ = shape
    total = a.setup_base_s
    n_causal = len(tuple(causal))  # the reference masks the full score matrix: causal costs it as much
    for mode in modes:
        run_s = flops(mode, batch, heads, seq, head_dim) / (a.reference_tflops * 1e12)
        total += n_causal * (a.reference_compile_s + run_s)
    return total


# ---------------------------------------------------------------------------- measured costs


def measured_cost(rec: Mapping[str, Any], *, repeats: int, warmup: int) -> float | None:
    """Seconds a record's config took, from its own fields; None for a record without them
    (a failure: its cost in a new sweep is unknown, or nil when it gets pruned), or with values
    no measurement has (negative, not finite: a hand edit), which would price a unit at nothing
    or at NaN."""
    try:
        compile_s, inner, median_ms = float(rec["compile_s"]), int(rec["inner"]), float(rec["median_ms"])
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    cost = compile_s + (warmup + 2 + repeats * inner) * median_ms / 1e3
    return cost if compile_s >= 0 and inner >= 1 and median_ms > 0 and math.isfinite(cost) else None


@dataclass
class CostTable:
    """Measured seconds per record identity (``record_key``), from one results document."""

    costs: dict[tuple, float]
    source: str = ""

    def __len__(self) -> int:
        return len(self.costs)

    def get(self, rec: Mapping[str, Any]) -> float | None:
        return self.costs.get(record_key(rec))


def cost_table(results: Iterable[Any], config: Mapping[str, Any], source: str) -> CostTable:
    """Per-config costs from the records and config block of a results document."""
    repeats = int(config.get("repeats") or 5)
    section = config.get("timing")
    timing = section if isinstance(section, dict) else {}
    warmup = int(timing.get("warmup", 1))
    costs: dict[tuple, float] = {}
    for rec in results:
        if isinstance(rec, dict):
            c = measured_cost(rec, repeats=repeats, warmup=warmup)
            if c is not None:
                costs[record_key(rec)] = c
    if not costs:
        raise ResultsError(f"{source}: no record with compile_s, inner and median_ms")
    return CostTable(costs, source=source)


# ---------------------------------------------------------------------------- per item


def item_costs(
    items: Sequence[WorkItem],
    spec: SweepSpec,
    table: CostTable | None = None,
    a: Assumptions = DEFAULT,
    round_: int = 1,
) -> tuple[list[float], float]:
    """Seconds per item (model, or ``table`` where it has the item) and the factor the model
    was scaled by to agree with the table on the items both know (1.0 without a table).
    ``round_``: the round the items are timed in (``planning.halving.measurement``)."""
    model = _model_costs(items, spec, a, round_)
    if table is None:
        return [c if c >= 0 else a.item_floor_s for c in model], 1.0
    return _with_measured(model, items, table, a)


def unit_cost(items: Sequence[WorkItem], spec: SweepSpec, round_: int = 1) -> float:
    """Seconds the model says a unit of ``items`` takes a worker: its items, and each of its
    shapes' inputs and references once (what ``shard`` balances units by)."""
    costs, _ = item_costs(items, spec, round_=round_)
    modes: dict[tuple, set[str]] = {}
    for it in items:
        modes.setdefault(it.shape, set()).add(it.mode)
    return sum(costs) + sum(setup_estimate(shape, m, spec.causal) for shape, m in modes.items())


def _unclamped_seq(spec: SweepSpec) -> int:
    """A seq at which no value of the spec's grids is clamped: a config compiles alike at every seq from it on."""
    values = {v for mode in spec.modes for p in mode_grid(spec, mode) for v in p if type(v) is int}
    return max([128, *values])


def _compiled_config(it: WorkItem, spec: SweepSpec, impl: impls.Implementation) -> Mapping[str, int]:
    """What the cost model reads of the config an item compiles: its own, or the one its
    implementation's ``auto`` picks (``cost_fields``)."""
    return impl.cost_fields(
        it.mode, it.fields(), dtype=it.dtype, head_dim=it.head_dim, seq=it.seq, smem_limit_bytes=spec.smem_limit_bytes
    )


def _model_costs(items: Sequence[WorkItem], spec: SweepSpec, a: Assumptions, round_: int) -> list[float]:
    """The model's seconds per item; -1.0 for an item that does not run.

    The model depends on a few fields only, and items come in runs of one problem, mode and
    config kind, whose timed work is one figure and whose compile depends on the config alone:
    so a run costs one look-up of its compile figures, an item one look-up of its config's."""
    big = _unclamped_seq(spec)
    compile_cache: dict[tuple[Any, ...], dict[tuple[Value, ...], float]] = {}
    model: list[float] = []
    append = model.append
    last: WorkItem | None = None
    compiles: dict[tuple[Value, ...], float] = {}
    t = 0.0
    impl = impls.get(spec.measured_impl)
    for it in items:
        if it.kind != RUN:
            append(-1.0)
            continue
        if last is None or not _same_run(it, last):
            compiles = compile_cache.setdefault(
                (it.mode, it.dtype, it.head_dim, min(it.seq, big), it.config, it.causal), {}
            )
            how = measurement(it.config, spec, round_)
            t = timed_estimate(it.mode, it.dtype, it.batch, it.heads, it.seq, it.head_dim, spec, a, it.causal, how)
            last = it
        c = compiles.get(it.params)
        if c is None:
            loops = impl.causal_loops if it.causal else 1
            cfg = _compiled_config(it, spec, impl)
            c = compiles[it.params] = compile_estimate(it.mode, it.dtype, it.head_dim, it.seq, cfg, a, loops)
        append(c + t)
    return model


def _same_run(it: WorkItem, last: WorkItem) -> bool:
    """Whether ``it`` is of ``last``'s problem, mode and config kind (the model's run)."""
    return (
        it.config == last.config
        and it.mode == last.mode
        and it.seq == last.seq
        and it.head_dim == last.head_dim
        and it.dtype == last.dtype
        and it.causal == last.causal
        and it.batch == last.batch
        and it.heads == last.heads
    )


def _with_measured(
    model: list[float], items: Sequence[WorkItem], table: CostTable, a: Assumptions
) -> tuple[list[float], float]:
    """The table's seconds where it has an item, elsewhere the model's scaled to agree with the
    table on the items both know; and that scale."""
    measured: list[float | None] = [None] * len(items)
    both_measured = both_model = 0.0
    for k, it in enumerate(items):
        if model[k] < 0:
            continue
        m = table.costs.get(it.record_key())
        if m is not None:
            measured[k] = m
            both_measured += m
            both_model += model[k]
    scale = both_measured / both_model if both_model > 0 else 1.0
    out = []
    for c, m in zip(model, measured, strict=True):
        out.append(a.item_floor_s if c < 0 else m if m is not None else c * scale)
    return out, scale
