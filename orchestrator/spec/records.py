"""What one result record is: its identity, its config fields, its results and extras.

The one home of the record layout. Every other module (planner, partial validation, merge,
cost model, report, export) asks here which fields make a record's identity and config,
in which order, and how a record's config maps onto the kernel's ``AttentionConfig``.

Layout, in the reference document's key order::

    identity   dtype, head_dim, seq, batch, heads, tag, mode, config ("auto" | "forced")
    config     fwd:     block_q, block_k, num_stages, num_warps
               fwd_bwd: fwd_block_q, fwd_block_k, bwd_outer, bwd_inner, num_stages, num_warps
               (auto records have none: the kernel picks)
    results    rel_err, compile_s, inner, median_ms, q1_ms, q3_ms   or   error
    extras     timer, pruned, smem_bytes, compile_cached, unit, attempt (documented)

A record's id is a hash of its identity and config fields (``item_id``), so the same
measurement has the same id in every sweep; resume, merge and append key on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

IDENTITY_FIELDS: tuple[str, ...] = ("dtype", "head_dim", "seq", "batch", "heads", "tag", "mode", "config")
# A problem: what a best config is chosen for (the identity less the config kind).
PROBLEM_FIELDS: tuple[str, ...] = ("dtype", "head_dim", "seq", "batch", "heads", "mode", "tag")
CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "fwd": ("block_q", "block_k", "num_stages", "num_warps"),
    "fwd_bwd": ("fwd_block_q", "fwd_block_k", "bwd_outer", "bwd_inner", "num_stages", "num_warps"),
}
FWD_CONFIG_FIELDS = CONFIG_FIELDS["fwd"]
FWD_BWD_CONFIG_FIELDS = CONFIG_FIELDS["fwd_bwd"]
RESULT_FIELDS: tuple[str, ...] = ("rel_err", "compile_s", "inner", "median_ms", "q1_ms", "q3_ms")
# Documented extras tilesweep appends after the reference fields of a record.
EXTRA_RECORD_FIELDS: tuple[str, ...] = ("timer", "pruned", "smem_bytes", "compile_cached", "unit", "attempt")

_NUM = (float, int)
# Types a record field may hold (bool is not an int here: checks compare type() exactly).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "dtype": (str,), "head_dim": (int,), "seq": (int,), "batch": (int,), "heads": (int,),
    "tag": (str,), "mode": (str,), "config": (str,),
    **{k: (int,) for fields in CONFIG_FIELDS.values() for k in fields},
    "rel_err": _NUM, "compile_s": _NUM, "inner": (int,), "median_ms": _NUM, "q1_ms": _NUM, "q3_ms": _NUM,
    "error": (str,),
    "timer": (str,), "pruned": (bool,), "smem_bytes": (int, type(None)), "compile_cached": (bool,),
    "unit": (str,), "attempt": (int,),
}


def config_fields(mode: str, config: str = "forced") -> tuple[str, ...]:
    """The config fields a record of this mode and config kind carries (none for auto)."""
    if config == "auto":
        return ()
    return CONFIG_FIELDS["fwd" if mode == "fwd" else "fwd_bwd"]


def identity_fields(rec: Mapping[str, Any]) -> tuple[str, ...]:
    """Identity and config fields of a record, in record order."""
    return IDENTITY_FIELDS + config_fields(rec.get("mode", ""), rec.get("config", ""))


def config_of(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The config fields of a forced record, in record order."""
    return {f: rec.get(f) for f in config_fields(rec["mode"])}


# ---------------------------------------------------------------------------- ids


def _hash(key: bytes) -> str:
    return hashlib.blake2b(key, digest_size=8).hexdigest()


def id_prefix(dtype: str, head_dim: int, seq: int, batch: int, heads: int, tag: str, mode: str,
              config: str) -> bytes:
    """The identity part of the bytes an id hashes; ``id_suffix`` adds the config fields."""
    return f"dtype={dtype}|head_dim={head_dim}|seq={seq}|batch={batch}|heads={heads}|tag={tag}|mode={mode}|config={config}".encode()


def id_suffix(names: Sequence[str], values: Sequence[Any]) -> bytes:
    return "".join(f"|{n}={v}" for n, v in zip(names, values)).encode()


def item_id(rec: Mapping[str, Any]) -> str:
    """Stable id of a record's identity and config fields (computable from any record).

    Raises ``KeyError`` when the record lacks one of them."""
    prefix = id_prefix(*(rec[k] for k in IDENTITY_FIELDS))
    names = config_fields(rec["mode"], rec["config"])
    return _hash(prefix + id_suffix(names, [rec[n] for n in names]))


def id_of(prefix: bytes, suffix: bytes) -> str:
    """``item_id`` from precomputed parts (the planner shares them across millions of items)."""
    return _hash(prefix + suffix)


_KEY_FIELDS = tuple(k for k in IDENTITY_FIELDS if k != "tag")


def record_key(rec: Mapping[str, Any]) -> tuple[Any, ...]:
    """A record's identity without its tag (a tag is a label, not part of what is timed):
    the identity values less the tag, then the config values."""
    names = _KEY_FIELDS + config_fields(rec.get("mode", ""), rec.get("config", ""))
    return tuple(rec.get(n) for n in names)


def key_of(dtype: str, head_dim: int, seq: int, batch: int, heads: int, mode: str, config: str,
           params: tuple[Any, ...]) -> tuple[Any, ...]:
    """``record_key`` of a record with these values, without building the record."""
    return (dtype, head_dim, seq, batch, heads, mode, config, *params)


def problem_key(rec: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(rec[k] for k in PROBLEM_FIELDS)


# ---------------------------------------------------------------------------- to the kernel


def kernel_kwargs(mode: str, config: Mapping[str, Any] | Sequence[Any]) -> dict[str, int]:
    """A forced record's config (a mapping of its fields, or their values in record order)
    as keyword arguments of ``kernels.config.AttentionConfig``. A fwd_bwd record's
    fwd_block_q/fwd_block_k are the forward's block_q/block_k; fields a mode does not sweep
    (bwd tiles of a fwd record) are left to the kernel's defaults."""
    names = config_fields(mode)
    values = [config[n] for n in names] if isinstance(config, Mapping) else list(config)
    if len(values) != len(names):
        raise ValueError(f"a {mode} config has the fields {', '.join(names)}; got {values!r}")
    renamed = {"fwd_block_q": "block_q", "fwd_block_k": "block_k"}
    return {renamed.get(n, n): int(v) for n, v in zip(names, values)}
