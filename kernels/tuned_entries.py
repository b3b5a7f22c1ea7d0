"""A tuned table's entries, read and checked (``kernels.tuned`` loads the table and looks up).

Each entry is refused in one line naming ``entries[i]`` where it holds what no export writes
and no kernel takes: a mode or dtype the kernels do not have, a config field the kernel's
rule refuses (``kernels.impls``' tunables: a ``block_q`` of 48), or the same problem as an
earlier entry (which of the two would win is a guess). The arguments of a lookup are checked
the same way: a typo is an error, not a silent "use auto".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels import impl_triton, impls
from kernels.config import AttentionConfig
from kernels.impl_base import Tunable
from kernels.impls import DEFAULT_IMPL, IMPL_NAMES
from kernels.smem import DTYPES, MAX_HEAD_DIM, MIN_HEAD_DIM, MODES
from kernels.spelling import as_json, one_of

# Exactly the fields of ``AttentionConfig``, in its order.
CONFIG_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AttentionConfig))
ENTRY_FIELDS: tuple[str, ...] = (
    "impl",
    "dtype",
    "head_dim",
    "seq",
    "batch",
    "heads",
    "causal",
    "kv_heads",
    "mode",
    "config",
    "median_ms",
    "auto_ms",
)
# The fields that say which problem an entry is for: two entries may not share them.
KEY_FIELDS: tuple[str, ...] = ENTRY_FIELDS[:9]
# Fields a version 1 entry lacks, and what they meant there.
_V1_DEFAULTS: dict[str, Any] = {"impl": DEFAULT_IMPL, "causal": False, "kv_heads": None}
_INT_FIELDS = ("head_dim", "seq", "batch", "heads", "kv_heads")


class TunedTableError(ValueError):
    """A tuned-table file is missing, unreadable, or not a tilesweep tuned table."""


@dataclass(frozen=True)
class TunedEntry:
    dtype: str
    head_dim: int
    seq: int
    batch: int
    heads: int
    mode: str
    config: dict[str, int] | None
    median_ms: float | None
    auto_ms: float | None
    impl: str
    causal: bool
    kv_heads: int  # equals heads for multi-head attention
    # where ``config`` is null (use auto): the config auto ran, as ``config`` names its fields;
    # written by export for our kernel, whose untuned call (``AttentionConfig()``) is not auto
    auto_config: dict[str, int] | None = None


def blocks_divide(cfg: dict[str, int], seq: int, mode: str, impl: str = DEFAULT_IMPL) -> bool:
    """Whether the kernel takes this config at ``seq`` (another implementation: its own checks)."""
    if impl not in impl_triton.BY_NAME:
        mode = "fwd" if mode == "fwd" else "fwd_bwd"
        return impls.get(impl).invalid(mode, seq, tuple(cfg[n] for n in entry_config_fields(impl, mode))) is None
    names = ("block_q", "block_k") + (("bwd_outer", "bwd_inner") if mode == "fwd_bwd" else ())
    return all(seq % int(cfg[n]) == 0 for n in names)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def entry_config_fields(impl: str, mode: str) -> tuple[str, ...]:
    """The fields of an entry's config: every field of ``AttentionConfig`` for the Triton
    kernels, the record's own config fields of its mode for another implementation
    (``kernels.impls``: jax's Mosaic GPU kernel's TuningConfig fields)."""
    if impl in impl_triton.BY_NAME:
        return CONFIG_FIELDS
    return tuple(t.name for t in impls.get(impl).tunables("fwd" if mode == "fwd" else "fwd_bwd"))


def _rules(impl: str) -> dict[str, Tunable]:
    """The implementation's tunables by name, over both modes (a Triton entry's config names
    its tiles as ``AttentionConfig`` does, which are the tunables' names)."""
    return {t.name: t for mode in MODES for t in impls.get(impl).tunables(mode)}


def _config(raw: dict[str, Any], where: str, key: str = "config") -> dict[str, Any] | None:
    cfg = raw.get(key)
    if cfg is None:
        return None
    impl = raw["impl"]
    fields = entry_config_fields(impl, raw["mode"])
    if not isinstance(cfg, dict) or set(cfg) != set(fields):
        raise TunedTableError(f"{where}: {key} must be null or an object with exactly {', '.join(fields)}")
    flags = impl not in impl_triton.BY_NAME  # another implementation's flags (use_schedule_barrier)
    bad = [k for k in fields if not (flags and isinstance(cfg[k], bool)) and not _positive_int(cfg[k])]
    if bad:
        raise TunedTableError(f"{where}: {key}.{bad[0]}={as_json(cfg[bad[0]])} must be a positive integer")
    rules = _rules(impl)
    for k in fields:
        why = rules[k].refusal(cfg[k]) if k in rules else None
        if why is not None:
            shown = f"{key}.{k}={as_json(cfg[k])}"
            raise TunedTableError(f"{where}: {shown} is not a value the {impl} kernel takes: {why}")
    return {k: cfg[k] for k in fields}


def read_entry(raw: Any, i: int, name: str, version: int) -> TunedEntry:
    """Entry ``i`` of the table ``name``, checked (module docstring)."""
    where = f"{name}: entries[{i}]"
    if not isinstance(raw, dict):
        raise TunedTableError(f"{where} is not an object")
    if version == 1:
        raw = {**_V1_DEFAULTS, **raw}
    missing = [f for f in ENTRY_FIELDS if f not in raw]
    if missing:
        raise TunedTableError(f"{where} lacks {', '.join(missing)}")
    if raw["impl"] not in IMPL_NAMES:
        raise TunedTableError(f"{where}: impl={as_json(raw['impl'])} is not one of {one_of(IMPL_NAMES)}")
    for k, allowed in (("mode", MODES), ("dtype", DTYPES)):
        if raw[k] not in allowed:
            raise TunedTableError(f"{where}: {k}={as_json(raw[k])} is not one of {one_of(allowed)}")
    cfg = _config(raw, where)
    auto = _config(raw, where, "auto_config") if cfg is None else None
    if raw["kv_heads"] is None:  # version 1: multi-head attention
        raw = {**raw, "kv_heads": raw["heads"]}
    for k in _INT_FIELDS:
        if not _positive_int(raw[k]):
            raise TunedTableError(f"{where}: {k}={as_json(raw[k])} must be a positive integer")
    if not isinstance(raw["causal"], bool):
        raise TunedTableError(f"{where}: causal={as_json(raw['causal'])} must be true or false")
    _check_problem(raw, {"config": cfg, "auto_config": auto}, where)
    return TunedEntry(
        dtype=str(raw["dtype"]),
        head_dim=raw["head_dim"],
        seq=raw["seq"],
        batch=raw["batch"],
        heads=raw["heads"],
        mode=str(raw["mode"]),
        config=cfg,
        median_ms=raw["median_ms"],
        auto_ms=raw["auto_ms"],
        impl=raw["impl"],
        causal=raw["causal"],
        kv_heads=raw["kv_heads"],
        auto_config=auto,
    )


def _check_problem(raw: dict[str, Any], configs: dict[str, dict[str, Any] | None], where: str) -> None:
    """What the entry's problem allows: kv_heads dividing heads, configs (``config``,
    ``auto_config``) the kernel takes at the entry's seq, timings that are positive numbers (or null)."""
    if raw["heads"] % raw["kv_heads"]:
        raise TunedTableError(f"{where}: kv_heads={raw['kv_heads']} does not divide heads={raw['heads']}")
    if not MIN_HEAD_DIM <= raw["head_dim"] <= MAX_HEAD_DIM:
        raise TunedTableError(
            f"{where}: head_dim={raw['head_dim']} is not one the kernels run ({MIN_HEAD_DIM} to {MAX_HEAD_DIM})"
        )
    for key, cfg in configs.items():
        if cfg is not None and not blocks_divide(cfg, raw["seq"], raw["mode"], raw["impl"]):
            runs = f"is not one the {raw['impl']} kernel runs at seq={raw['seq']}"
            raise TunedTableError(f"{where}: {key} {as_json(cfg)} {runs}")
    for k in ("median_ms", "auto_ms"):
        v = raw[k]
        ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0)
        if not ok:
            raise TunedTableError(f"{where}: {k}={as_json(v)} must be a positive number of milliseconds, or null")


def read_entries(raws: list[Any], name: str, version: int) -> list[TunedEntry]:
    """Every entry of the table ``name``, checked, none for a problem an earlier one is for."""
    out: list[TunedEntry] = []
    first: dict[tuple[Any, ...], int] = {}
    for i, raw in enumerate(raws):
        e = read_entry(raw, i, name, version)
        key = tuple(getattr(e, f) for f in KEY_FIELDS)
        if key in first:
            raise TunedTableError(
                f"{name}: entries[{i}] is for the same problem as entries[{first[key]}] ("
                + ", ".join(f"{f}={as_json(v)}" for f, v in zip(KEY_FIELDS, key, strict=True))
                + "); keep one of them (export writes one per problem)"
            )
        first[key] = i
        out.append(e)
    return out


def check_call(impl: str, mode: str, seq: Any, head_dim: Any, dtype: Any, causal: Any = False, **sizes: Any) -> None:
    """Refuse a lookup's argument no call could mean (a typo reads as "use auto" otherwise):
    an unknown implementation or mode, a seq or head_dim (or a ``sizes`` value given: batch,
    heads, kv_heads) that is not a positive integer, kv_heads not dividing heads, a causal that
    is not a bool (``"false"`` is true), a dtype that is neither a name numpy knows nor a dtype
    (None, a number). A real dtype the kernels do not run is no error: auto."""
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal={as_json(causal)} must be true or false")
    if impl not in IMPL_NAMES:
        raise ValueError(f"impl={as_json(impl)} is not one of {one_of(IMPL_NAMES)}")
    if mode not in MODES:
        raise ValueError(f"mode={as_json(mode)} is not one of {one_of(MODES)}")
    for k, v in (("seq", seq), ("head_dim", head_dim), *sizes.items()):
        if v is not None and not _positive_int(v) and not (isinstance(v, np.integer) and v > 0):
            raise ValueError(f"{k}={as_json(v)} must be a positive integer")
    heads, kv_heads = sizes.get("heads"), sizes.get("kv_heads")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise ValueError(f"kv_heads={as_json(kv_heads)} does not divide heads={as_json(heads)}")
    if dtype is None or isinstance(dtype, (bool, int, float)):
        raise ValueError(f"dtype={as_json(dtype)} is not a dtype (the kernels run {one_of(DTYPES)})")
    if isinstance(dtype, str):
        try:
            np.dtype(dtype)
        except TypeError:
            if dtype not in DTYPES:
                raise ValueError(
                    f"dtype={as_json(dtype)} is not a dtype name (the kernels run {one_of(DTYPES)})"
                ) from None
