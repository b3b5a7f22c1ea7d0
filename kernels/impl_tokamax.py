"""tokamax's flash-attention ops as implementations a sweep can tune (``kernel.impl:
"tokamax-mosaic"`` and ``"tokamax-triton"``), without jax or tokamax at import.

Their tunables are the fields of tokamax's config classes, named as the classes name them
(``kernels.tokamax_meta``; a fwd_bwd config adds the vjp op's config, each field prefixed
``vjp_``). tokamax's Mosaic GPU op takes other classes on each architecture, so it is two
implementations here: ``tokamax-mosaic`` with the sm90 classes (H100, H200) and
``tokamax-mosaic-sm100`` with the sm100 ones (B200: ``num_tma_splits``, ``collective``,
``persistent`` true, false or ``"static"``, the vjp's ``residual_stages``); a spec's
``kernel.impl: "tokamax-mosaic"`` runs as the one of its ``kernel.device_kind`` (``for_device``,
the one place that says which), and its records carry that name, so their fields are known by it.

The rules are those of tokamax's pydantic validation (multiples of 64, positive, powers of two),
and a refusal is worded as pydantic words it (``Input should be a multiple of 64``), so a spec is
checked without importing tokamax; ``tests/test_tokamax_sweep.py`` holds these words against
tokamax's own. The worker and pre-flight lowering build every config through tokamax's classes
(``kernels.tokamax_ops``), so what these rules miss is refused there, with tokamax's message.

``"grid": "tokamax"`` sweeps, per problem, exactly the configs tokamax's autotuner would try
for the spec's ``kernel.device_kind`` (``orchestrator.planning.tokamax_grid``); an explicit
``grid`` sweeps its product, as for any implementation. There is no shared-memory model
(``pruning = "lowering"``): ``tilesweep plan SPEC --lower`` lowers each config for the target on a
CPU, with the target GPU standing in as jax's default device (``kernels.standin``), which is where
tokamax reads its kernel module, heuristics and persistent grid from.

``auto`` is what an untuned call of tokamax runs: the op's ``default_config`` (tokamax's shipped
table for the device kind where it has the shape, else its heuristics).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernels import tokamax_meta as meta
from kernels.devices import DeviceKind
from kernels.impl_base import Capabilities, Fields, ModeFn, Tunable, Value
from kernels.spelling import as_json

RULES = "tokamax's config class"


@dataclass(frozen=True)
class TokamaxTunable(Tunable):
    """A tunable of a tokamax config class: its refusal in pydantic's words, as tokamax gives it
    (a bool tunable takes true or false only, where pydantic would also take 0 and 1: a record
    holds the bool)."""

    def refusal(self, value: Any) -> str | None:
        if Tunable.refusal(self, value) is None:
            return None
        if self.kind is bool:
            return f"{self.name}: Input should be a valid boolean (got {as_json(value)}; {RULES})"
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{self.name}: Input should be a valid integer (got {as_json(value)}; {RULES})"
        if self.multiple_of and value % self.multiple_of:  # pydantic's order: multiple_of before gt
            return f"{self.name}: Input should be a multiple of {self.multiple_of} (got {value}; {RULES})"
        if self.minimum is not None and value < self.minimum:
            return f"{self.name}: Input should be greater than {self.minimum - 1} (got {value}; {RULES})"
        return f"{self.name}: Value error, Integer is not a power of two: {value} ({RULES})"


def _int(
    name: str, doc: str, default: tuple[int, ...], *, multiple_of: int | None = None, pow2: bool = False
) -> Tunable:
    return TokamaxTunable(name, doc, default, minimum=1, multiple_of=multiple_of, power_of_two=pow2, rule_source=RULES)


def _bool(name: str, doc: str, default: tuple[Value, ...] = (False,), also: tuple[Value, ...] = ()) -> Tunable:
    return TokamaxTunable(name, doc, default, kind=bool, rule_source=RULES, also=also)


_V = meta.VJP_PREFIX
MOSAIC_FWD = (
    _int("block_q", "query rows per program", (64, 128), multiple_of=64),
    _int("block_kv", "key/value rows per pipeline step", (64, 128, 256), multiple_of=64),
    _int("num_stages", "K/V pipeline depth", (2, 3, 4)),
    _bool("fold_q_sequence_heads", "fold the query heads into its sequence"),
    _int("split_k", "splits of the key/value sequence", (1,)),
    _bool("persistent", "a persistent kernel (one program per SM)", (True, False)),
)
MOSAIC_VJP = (
    _int(_V + "block_q_dkv", "query rows per step of the dK/dV kernel", (64,), multiple_of=64),
    _int(_V + "block_kv_dkv", "key/value rows per program of the dK/dV kernel", (64,), multiple_of=64),
    _int(_V + "block_q_dq", "query rows per program of the dQ kernel", (64,)),
    _int(_V + "block_kv_dq", "key/value rows per step of the dQ kernel", (64,)),
    _int(_V + "num_stages", "pipeline depth of the backward", (2,)),
    _int(_V + "compute_wgs", "compute warpgroups per backward program", (2,)),
)
# sm100 (B200): tokamax's pallas_mosaic_gpu_kernel_sm100.Config and pallas_mosaic_gpu_vjp_kernel_sm100.Config
MOSAIC_SM100_FWD = (
    _int("block_q", "query rows per program (per CTA pair when collective)", (128,), multiple_of=64),
    _int("block_kv", "key/value rows per pipeline step", (64, 128), multiple_of=64),
    _int("num_stages", "K/V pipeline depth", (2, 3, 4)),
    _bool("fold_q_sequence_heads", "fold the query heads into its sequence"),
    _int("split_k", "splits of the key/value sequence", (1,)),
    _int("num_tma_splits", "chunks each K/V tile is loaded in", (1,)),
    _bool("collective", "two CTAs run one MMA of 256 rows"),
    _bool("persistent", "a persistent kernel (true: dynamically scheduled; static)", (True, False), also=("static",)),
)
MOSAIC_SM100_VJP = (
    _int(_V + "block_q_dkv", "query rows per step of the dK/dV kernel", (128,), multiple_of=64),
    _int(_V + "block_kv_dkv", "key/value rows per program of the dK/dV kernel", (128,), multiple_of=64),
    _int(_V + "block_q_dq", "query rows per program of the dQ kernel", (128,)),
    _int(_V + "block_kv_dq", "key/value rows per step of the dQ kernel", (128,)),
    _int(_V + "num_stages", "pipeline depth of the backward", (2,)),
    _int(_V + "compute_wgs", "compute warpgroups per backward program", (2,)),
    _int(_V + "residual_stages", "pipeline depth of the residuals (m, l, delta)", (2,)),
)
# tokamax's Triton kernel takes any positive tile: it neither pads nor refuses one below tl.dot's 16
# (tokamax's pallas_triton_test runs block_q 1 and 2 on a GPU), so a spec, export and the tuned
# table take them, where the Triton kernels (``kernels.impl_triton``) start at 16
TRITON_FWD = (
    _int("block_q", "query rows per program", (16, 32, 64, 128)),
    _int("block_k", "key/value rows per step", (16, 32, 64, 128)),
    _int("num_stages", "software-pipelining stages", (1, 2, 3, 4)),
    _int("num_warps", "warps per program", (1, 2, 4, 8), pow2=True),
    _int("split_k", "splits of the key/value sequence", (1,)),
    _bool("pack_mask", "pack the mask into bits"),
)
TRITON_VJP = (
    _int(_V + "block_m1", "rows of the dK/dV kernel's outer tile", (32,)),
    _int(_V + "block_n1", "rows of the dK/dV kernel's inner tile", (64,)),
    _int(_V + "block_m2", "rows of the dQ kernel's outer tile", (64,)),
    _int(_V + "block_n2", "rows of the dQ kernel's inner tile", (32,)),
    _int(_V + "num_stages", "software-pipelining stages of the backward", (2,)),
    _int(_V + "num_warps", "warps per backward program", (4,), pow2=True),
)


def _why(kernel_name: str) -> dict[str, str]:
    return {
        "dtype": f"tokamax's {kernel_name} takes float32 only with a bf16/f16 dot precision, which tilesweep does "
        "not set ('NotImplementedError: Unsupported precision: F32_F32_F32')",
        "arch": f"tokamax's {kernel_name} takes another config class on each architecture, and "
        f"kernel.impl {{name}} is that of {{archs}}",
        "interpret": "tokamax's GPU kernels do not run on a CPU; check configs here with `tilesweep plan --lower`, "
        "or rehearse with kernel.impl replay",
    }


MOSAIC_CAPS = Capabilities(
    dtypes=("bfloat16", "float16"),
    modes=("fwd", "fwd_bwd"),
    causal_modes=("fwd", "fwd_bwd"),
    grouped_query=True,
    head_dim_multiple=1,
    interpret=False,
    archs=((9, 0),),
    why=_why("Mosaic GPU attention"),
)
MOSAIC_SM100_CAPS = dataclasses.replace(MOSAIC_CAPS, archs=((10, 0),))
TRITON_CAPS = Capabilities(
    dtypes=("bfloat16", "float16", "float32"),
    modes=("fwd", "fwd_bwd"),
    causal_modes=("fwd", "fwd_bwd"),
    grouped_query=True,
    head_dim_multiple=1,
    interpret=False,
    why=_why("Triton attention"),
)


@dataclass(frozen=True)
class TokamaxImpl:
    """One tokamax flash-attention op and its vjp op (module docstring)."""

    name: str
    title: str
    capabilities: Capabilities
    fwd: tuple[Tunable, ...]
    vjp: tuple[Tunable, ...]
    module: str = "kernels.tokamax_ops"
    pruning: str = "lowering"
    lowering_sizes_smem: bool = True  # Mosaic GPU; tokamax's Triton op: False
    causal_loops: int = 1
    auto_rule: str = (
        "tokamax's own choice, what an untuned call runs: the op's default_config (tokamax's shipped table for the "
        "device kind where it has the shape, else its heuristics)"
    )
    auto_choice: str = "tokamax's own choice"
    fwd_tiles: tuple[str, str] = field(default=("block_q", "block_kv"))

    def tunables(self, mode: str) -> tuple[Tunable, ...]:
        return self.fwd if mode == "fwd" else self.fwd + self.vjp

    def reference_grid(self, mode: str) -> Mapping[str, str]:
        del mode
        return {}

    def pinned(self, mode: str) -> tuple[Mapping[str, Value], str]:
        del mode
        return {}, ""

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
        del modes, causal, grouped_query, head_dims  # what else tokamax refuses, lowering says
        caps, why = self.capabilities, self.capabilities.why
        if device is not None and caps.archs is not None and device.arch not in caps.archs:
            archs = " and ".join(f"sm_{a}{b}" for a, b in caps.archs)
            arch = why["arch"].format(name=as_json(self.name), archs=archs)
            use = f"use kernel.impl {as_json(meta.MOSAIC)}"
            return f"kernel.device_kind {as_json(device.name)} is {device.sm}: {arch}; {use}"
        bad = [d for d in dtypes if d not in caps.dtypes]
        if bad:
            return f"dtypes {as_json(bad)} cannot be planned: {why['dtype']}; use dtypes {as_json(list(caps.dtypes))}"
        return None

    def runs_as(self, mode: str, seq: int, params: tuple[Value, ...]) -> tuple[Value, ...]:
        del mode, seq
        return params

    def invalid(self, mode: str, seq: int, params: tuple[Value, ...]) -> str | None:
        """What tokamax's config classes refuse of the config as a whole (a rule across its fields:
        sm100's ``block_q`` per CTA at least 128 without ``collective``), which a field's own rule
        (``TokamaxTunable``, at spec time) cannot see; None where tokamax is not installed here (its
        lowering or worker refuses it then)."""
        del seq
        return _refused(self.name, mode, tuple(t.name for t in self.tunables(mode)), params)

    def predict(
        self, mode: str, dtype: str, head_dim: int, params: tuple[Value, ...], seq: int
    ) -> list[tuple[str, int]]:
        del mode, dtype, head_dim, params, seq
        return []  # no model: the compiler's verdict at lowering prunes

    def cost_fields(
        self, mode: str, fields: Fields | None, *, dtype: str, head_dim: int, seq: int, smem_limit_bytes: int | None
    ) -> dict[str, int]:
        """The cost model's Triton-shaped reading: the forward's tiles and warps (Mosaic: two
        compute warpgroups, 8 warps; auto: 64 x 128)."""
        del mode, dtype, head_dim, seq, smem_limit_bytes
        f = dict(fields) if fields is not None else {}
        q, k = self.fwd_tiles
        return {"block_q": int(f.get(q, 64)), "block_k": int(f.get(k, 128)), "num_warps": int(f.get("num_warps", 8))}

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
        del dtype, head_dim, seq, smem_limit_bytes, interpret  # tokamax holds its kernels to the device's limits
        module = importlib.import_module(self.module)
        fn: ModeFn = module.build_for_target(self.name, mode, fields, causal=causal, sm_scale=sm_scale)
        return fn

    def label(self, mode: str, fields: Mapping[str, Any]) -> str | None:
        """The config's values in field order, the forward's then the vjp's (``128/64/num_stages=2/persistent``;
        fields at tokamax's default left out)."""

        def part(vjp: bool) -> str:
            kept = [(k, v) for k, v in fields.items() if k.startswith(_V) == vjp and not _default_flag(k, v)]
            return "/".join(_short(k, v) for k, v in kept)

        return part(False) if mode == "fwd" else f"{part(False)} | vjp {part(True)}"

    def refusal_kind(self, exc: BaseException) -> str:
        """tokamax's checks and the Mosaic GPU compiler refuse with a ValueError or
        NotImplementedError (a pydantic ValidationError is a ValueError), Pallas's verifier with a
        ``VerificationError``, Triton lowering with a ``LoweringError``; anything else crashed."""
        refusals = ("ValueError", "NotImplementedError", "VerificationError", "LoweringError", "ValidationError")
        return "refused" if type(exc).__name__ in refusals else "crashed"


@functools.lru_cache(maxsize=4096)
def _refused(impl: str, mode: str, names: tuple[str, ...], params: tuple[Value, ...]) -> str | None:
    try:
        from kernels import tokamax_ops
    except ImportError:  # tokamax (or jax) is not installed where this plans
        return None
    try:
        return tokamax_ops.refusal(impl, mode, dict(zip(names, params, strict=True)))
    except meta.TokamaxMissing:
        return None


def _default_flag(name: str, value: Any) -> bool:
    return (name in ("fold_q_sequence_heads", "pack_mask") and value is False) or (
        name in ("split_k", "num_tma_splits") and value == 1
    )


def _short(name: str, value: Any) -> str:
    if isinstance(value, str):
        return f"{name.removeprefix(_V)}={value}"
    if isinstance(value, bool):
        return name.removeprefix(_V) if value else f"no-{name.removeprefix(_V)}"
    return f"{name.removeprefix(_V)}={value}" if "stages" in name or "warps" in name or "wgs" in name else str(value)


TOKAMAX_MOSAIC = TokamaxImpl(
    name=meta.MOSAIC, title=meta.kernel(meta.MOSAIC).title, capabilities=MOSAIC_CAPS, fwd=MOSAIC_FWD, vjp=MOSAIC_VJP
)
TOKAMAX_MOSAIC_SM100 = TokamaxImpl(
    name=meta.MOSAIC_SM100,
    title=meta.kernel(meta.MOSAIC).title + " on sm_100 (B200), with its sm100 config classes",
    capabilities=MOSAIC_SM100_CAPS,
    fwd=MOSAIC_SM100_FWD,
    vjp=MOSAIC_SM100_VJP,
)
TOKAMAX_TRITON = TokamaxImpl(
    name=meta.TRITON,
    title=meta.kernel(meta.TRITON).title,
    capabilities=TRITON_CAPS,
    fwd=TRITON_FWD,
    vjp=TRITON_VJP,
    fwd_tiles=("block_q", "block_k"),
    lowering_sizes_smem=False,
)


def for_device(name: str, arch: tuple[int, int]) -> str:
    """The implementation that runs ``kernel.impl: name`` on a GPU of compute capability ``arch``:
    tokamax's Mosaic GPU op takes its sm100 config classes on sm_100 (``tokamax-mosaic-sm100``,
    whose records carry their fields), its sm90 ones elsewhere; any other name runs as it is."""
    if name == meta.MOSAIC:
        return meta.kernel(name).impl_for(meta.family(arch))
    return name
