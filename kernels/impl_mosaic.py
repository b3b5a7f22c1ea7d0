"""jax's Mosaic GPU flash attention (``jax.experimental.pallas.ops.gpu.attention_mgpu``) as an
implementation a sweep can tune (``kernel.impl: "mosaic"``), without jax at import.

Its tunables are the fields of jax's ``TuningConfig``, named as it names them: fwd records carry
``block_q, block_kv, max_concurrent_steps, use_schedule_barrier``; fwd_bwd records add
``compute_wgs_bwd, block_q_dkv, block_kv_dkv, block_q_dq, block_kv_dq`` (the backward also runs
the forward, with residuals, so it has the forward's fields too). ``causal`` is the problem's.
The constraints are ``TuningConfig``'s own (``block_q``/``block_kv`` multiples of 64,
``max_concurrent_steps`` at least 2); ``compute_wgs_bwd`` 0 is refused because it divides by zero
in jax's backward. The backward blocks are not checked by ``TuningConfig``: lowering says which
it takes (32 is refused there).

What it cannot do is refused at plan time with jax's reasons (``capabilities``): dtypes other
than float16 (jax 0.12's kernel keeps its shared-memory buffers in float16), causal backward,
head_dim not a multiple of 64, GPUs other than sm_90 (its matmuls are Hopper's wgmma). Per
config, jax's own divisibility checks on seq are made at plan time with jax's messages
(``invalid``). Everything else, shared memory first, is the compiler's verdict at lowering
(``pruning = "lowering"``: there is no model): ``tilesweep plan --lower``.

``use_schedule_barrier`` is read only by jax's pipeline-emitter variant, not by ``attention``
(both values lower to the same program), so it is pinned to its default. ``max_concurrent_steps``
is clamped by jax to the number of K/V tiles (and in the backward to the dq and dkv pipelines'
tiles); a config is recorded with the value that runs (``runs_as``), so grid points that run the
same program are one item.

``auto``: jax has no default config (``attention`` without one raises a TypeError), so the
``auto`` record runs tilesweep's choice, taken from jax itself: the forward policy of
``attention_mgpu.py``'s ``main()`` (block_q 64, 2 steps, the first block_kv of 256, 128, 64
that lowers within shared memory) and, for fwd_bwd, the backward of jax's
``mgpu_attention_test`` (blocks 64, ``compute_wgs_bwd`` 2 if head_dim <= 128 else 1).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernels.devices import DeviceKind
from kernels.impl_base import Capabilities, Fields, ModeFn, Tunable, Value
from kernels.smem import MAX_HEAD_DIM
from kernels.spelling import as_json

RULES = "jax's TuningConfig"
AUTO_BLOCK_Q = 64
AUTO_STEPS = 2
AUTO_BLOCK_KV = (256, 128, 64)  # tried in this order: the first that lowers within shared memory
AUTO_BWD_BLOCK = 64
FWD_FIELDS = ("block_q", "block_kv", "max_concurrent_steps", "use_schedule_barrier")
BWD_FIELDS = ("compute_wgs_bwd", "block_q_dkv", "block_kv_dkv", "block_q_dq", "block_kv_dq")
CONFIG_FIELDS: dict[str, tuple[str, ...]] = {"fwd": FWD_FIELDS, "fwd_bwd": FWD_FIELDS + BWD_FIELDS}
PINNED_WHY = (
    "jax's attention ignores use_schedule_barrier (only attention_with_pipeline_emitter reads it; both "
    "values lower to the same program)"
)


def _block(name: str, doc: str, default: tuple[int, ...]) -> Tunable:
    return Tunable(name, doc, default, minimum=64, multiple_of=64, rule_source=RULES)


def _bwd_block(name: str, doc: str, default: tuple[int, ...]) -> Tunable:
    return Tunable(name, doc, default, minimum=1, rule_source="positive; lowering refuses what the kernel cannot take")


def _tunables(fwd_bwd: bool) -> tuple[Tunable, ...]:
    fwd = (
        _block("block_q", "query rows per program (each of its two compute warpgroups takes one block)", (64, 128)),
        _block("block_kv", "key/value rows per pipeline step", (64, 128) if fwd_bwd else (64, 128, 256)),
        Tunable(
            "max_concurrent_steps",
            "K/V pipeline depth (clamped by jax to the number of K/V tiles)",
            (2, 3) if fwd_bwd else (2, 3, 4),
            minimum=2,
            rule_source=RULES,
        ),
        Tunable("use_schedule_barrier", "a barrier between the compute warpgroups' steps", (True,), kind=bool),
    )
    if not fwd_bwd:
        return fwd
    return fwd + (
        Tunable(
            "compute_wgs_bwd",
            "compute warpgroups per backward program",
            (1, 2),
            minimum=1,
            rule_source="0 divides by zero in jax's backward",
        ),
        _bwd_block("block_q_dkv", "query rows per step of the dK/dV kernel", (64,)),
        _bwd_block("block_kv_dkv", "key/value rows per program of the dK/dV kernel", (64, 128)),
        _bwd_block("block_q_dq", "query rows per program of the dQ kernel", (64, 128)),
        _bwd_block("block_kv_dq", "key/value rows per step of the dQ kernel", (64,)),
    )


TUNABLES: dict[str, tuple[Tunable, ...]] = {"fwd": _tunables(False), "fwd_bwd": _tunables(True)}
CAPABILITIES = Capabilities(
    dtypes=("float16",),
    modes=("fwd", "fwd_bwd"),
    causal_modes=("fwd",),
    grouped_query=True,
    head_dim_multiple=64,
    interpret=False,
    archs=((9, 0),),
    why={
        "dtype": "jax's attention_mgpu keeps its shared-memory buffers in float16 (jax 0.11/0.12): bfloat16 fails "
        "when traced ('Expected dtypes to match but src had type bfloat16 and dst had type float16') and float32 "
        "is refused ('Only f16 and bf16 are supported')",
        "causal": "jax: 'Causal attention not supported in the backwards pass yet.'",
        "head_dim": "jax: 'head_dim must be divisible by 64'",
        "arch": "jax's attention_mgpu is a Hopper kernel (wgmma, sm_90a; jax's own test runs it on sm_90a only)",
        "interpret": "Pallas interpret mode does not run this kernel on a CPU (jax 0.12); "
        "check configs here with `tilesweep plan --lower`, or rehearse with kernel.impl replay",
    },
)


def steps_limit(mode: str, seq: int, f: Mapping[str, Value]) -> int:
    """The most K/V pipeline steps any kernel of the mode can use at ``seq`` (jax clamps
    ``max_concurrent_steps`` to each kernel's tiles: the forward's K/V tiles, the dq and dkv
    pipelines' q and kv tiles of ``block * compute_wgs_bwd``)."""
    limit = seq // int(f["block_kv"])
    if mode == "fwd_bwd":
        w = int(f["compute_wgs_bwd"])
        limit = max(limit, seq // (int(f["block_q_dq"]) * w), seq // (int(f["block_kv_dkv"]) * w))
    return limit


@dataclass(frozen=True)
class MosaicImpl:
    """jax's attention_mgpu (module docstring)."""

    name: str = "mosaic"
    title: str = "jax's Mosaic GPU attention (jax.experimental.pallas.ops.gpu.attention_mgpu)"
    module: str = "kernels.mosaic"  # the jax side: build, auto
    capabilities: Capabilities = CAPABILITIES
    pruning: str = "lowering"
    lowering_sizes_smem: bool = True
    causal_loops: int = 1
    auto_rule: str = (
        "tilesweep's choice (jax has no default config): block_q 64, max_concurrent_steps 2, block_kv the first "
        "of 256, 128, 64 whose program lowers within shared memory (attention_mgpu.py's main()); fwd_bwd: backward "
        "blocks 64, compute_wgs_bwd 2 if head_dim <= 128 else 1 (jax's mgpu_attention_test)"
    )
    auto_choice: str = "tilesweep's pick by lowering on the GPU"

    def tunables(self, mode: str) -> tuple[Tunable, ...]:
        return TUNABLES[mode]

    def reference_grid(self, mode: str) -> Mapping[str, str]:
        del mode
        return {}

    def pinned(self, mode: str) -> tuple[Mapping[str, Value], str]:
        del mode
        return {"use_schedule_barrier": True}, PINNED_WHY

    def unsupported(
        self,
        *,
        dtypes: Sequence[str],
        modes: Sequence[str],
        causal: Sequence[bool],
        grouped_query: bool,
        head_dims: Sequence[int],
        device: DeviceKind | None,
    ) -> str | None:
        del grouped_query  # it lowers grouped-query attention forward and backward
        caps, why = self.capabilities, self.capabilities.why
        if device is not None and caps.archs is not None and device.arch not in caps.archs:
            return f"kernel.device_kind {as_json(device.name)} is {device.sm}: {why['arch']}; use an sm_90 kind"
        bad = [d for d in dtypes if d not in caps.dtypes]
        if bad:
            return f"dtypes {as_json(bad)} cannot be planned: {why['dtype']}; use dtypes {as_json(list(caps.dtypes))}"
        if True in causal and any(m not in caps.causal_modes for m in modes):
            split = " (or causal [false] here, and the causal forward in a spec of its own)" if False in causal else ""
            return (
                f"causal true with modes {as_json(list(modes))} cannot be planned ({why['causal']}); "
                f'use modes ["fwd"] for it{split}'
            )
        odd = [d for d in head_dims if d % caps.head_dim_multiple]
        if odd:
            fits = list(range(caps.head_dim_multiple, MAX_HEAD_DIM + 1, caps.head_dim_multiple))
            return f"head_dims {odd} cannot be planned ({why['head_dim']}); use head_dims of {as_json(fits)}"
        return None

    def runs_as(self, mode: str, seq: int, params: tuple[Value, ...]) -> tuple[Value, ...]:
        f = dict(zip(CONFIG_FIELDS[mode], params, strict=True))
        if self.invalid(mode, seq, params) is None:
            f["max_concurrent_steps"] = min(int(f["max_concurrent_steps"]), max(2, steps_limit(mode, seq, f)))
        return tuple(f[n] for n in CONFIG_FIELDS[mode])

    def invalid(self, mode: str, seq: int, params: tuple[Value, ...]) -> str | None:
        """jax's own checks on seq, in the order jax makes them, with its messages."""
        f = {n: int(v) for n, v in zip(CONFIG_FIELDS[mode], params, strict=True)}
        for divisor, message in seq_checks(mode, f):
            if seq % divisor:
                return f"{message.format(seq=seq)} (jax's check, made at plan time; not lowered)"
        return None

    def predict(
        self, mode: str, dtype: str, head_dim: int, params: tuple[Value, ...], seq: int
    ) -> list[tuple[str, int]]:
        del mode, dtype, head_dim, params, seq
        return []  # no model: the compiler's verdict at lowering prunes

    def cost_fields(
        self, mode: str, fields: Fields | None, *, dtype: str, head_dim: int, seq: int, smem_limit_bytes: int | None
    ) -> dict[str, int]:
        """The cost model's Triton-shaped reading: forward tiles block_q x block_kv, backward tiles
        block_kv_dkv x block_q_dkv, two compute warpgroups (8 warps)."""
        del dtype, head_dim, seq, smem_limit_bytes
        f = dict(fields) if fields is not None else auto_guess(mode)
        out = {"block_q": int(f["block_q"]), "block_k": int(f["block_kv"]), "num_warps": 8}
        if mode == "fwd_bwd":
            out.update(bwd_outer=int(f["block_kv_dkv"]), bwd_inner=int(f["block_q_dkv"]))
        return out

    def make(
        self,
        mode: str,
        fields: Fields | None,
        *,
        dtype: str,
        head_dim: int,
        seq: int,
        smem_limit_bytes: int | None,
        causal: bool = False,
        sm_scale: float | None = None,
        interpret: bool | None = None,
    ) -> ModeFn:
        del smem_limit_bytes  # the compiler holds it to the device's (kernels.preflight: the target's)
        module = importlib.import_module(self.module)
        if fields is None:
            fields = module.auto_fields(mode, dtype=dtype, head_dim=head_dim, seq=seq, causal=causal)
        fn: ModeFn = module.build(mode, fields, causal=causal, sm_scale=sm_scale, interpret=interpret)
        return fn

    def label(self, mode: str, fields: Mapping[str, Any]) -> str | None:
        """``bq64 bkv128 c2`` (c: max_concurrent_steps; ``nosb`` without the schedule barrier);
        fwd_bwd adds ``w2 dkv64x128 dq128x64`` (compute_wgs_bwd; each backward kernel's q x kv blocks)."""
        g = fields.get
        out = f"bq{g('block_q')} bkv{g('block_kv')} c{g('max_concurrent_steps')}"
        if g("use_schedule_barrier") is False:
            out += " nosb"
        if mode == "fwd_bwd":
            out += (
                f" w{g('compute_wgs_bwd')} dkv{g('block_q_dkv')}x{g('block_kv_dkv')} "
                f"dq{g('block_q_dq')}x{g('block_kv_dq')}"
            )
        return out

    def refusal_kind(self, exc: BaseException) -> str:
        """jax's checks raise ValueError or NotImplementedError, Pallas's verifier a
        ``VerificationError``; anything else (a ZeroDivisionError, an empty AssertionError) crashed."""
        refusals = ("ValueError", "NotImplementedError", "VerificationError")
        return "refused" if type(exc).__name__ in refusals else "crashed"


def seq_checks(mode: str, f: Mapping[str, int]) -> list[tuple[int, str]]:
    """(what seq must be a multiple of, jax's message with ``{seq}`` for it) of each of jax's
    checks on seq for this config, in the order jax makes them (the forward's, then the backward's)."""
    checks = [
        (f["block_kv"], f"ValueError: kv_seq_len={{seq}} must be a multiple of block_kv={f['block_kv']}"),
        (
            2 * f["block_q"],
            f"NotImplementedError: q_seq_len={{seq}} must be a multiple of block_q * 2={2 * f['block_q']}",
        ),
    ]
    if mode != "fwd_bwd":
        return checks
    w = f["compute_wgs_bwd"]
    bwd = "NotImplementedError: {side}_seq_len={{seq}} must be a multiple of config.{name}={value}"
    return checks + [
        (f["block_q_dq"] * w, bwd.format(side="q", name="block_q_dq", value=f["block_q_dq"]) + f" * compute_wgs={w}"),
        (
            f["block_kv_dkv"] * w,
            bwd.format(side="kv", name="block_kv_dkv", value=f["block_kv_dkv"]) + f" * compute_wgs={w}",
        ),
        (f["block_q_dkv"], bwd.format(side="q", name="block_q_dkv", value=f["block_q_dkv"])),
        (f["block_kv_dq"], bwd.format(side="kv", name="block_kv_dq", value=f["block_kv_dq"])),
    ]


def auto_backward(head_dim: int) -> dict[str, Value]:
    """The backward fields of ``auto`` (jax's mgpu_attention_test)."""
    b = AUTO_BWD_BLOCK
    wgs = 2 if head_dim <= 128 else 1
    return {"compute_wgs_bwd": wgs, "block_q_dkv": b, "block_kv_dkv": b, "block_q_dq": b, "block_kv_dq": b}


def auto_guess(mode: str) -> dict[str, Value]:
    """What the cost model takes ``auto`` to run (the real choice needs lowering: ``kernels.mosaic``)."""
    f: dict[str, Value] = {"block_q": AUTO_BLOCK_Q, "block_kv": 128, "max_concurrent_steps": AUTO_STEPS}
    if mode == "fwd_bwd":
        f.update(auto_backward(128))
    return f


MOSAIC = MosaicImpl()
