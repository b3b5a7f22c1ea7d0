"""What one result record is: its identity, its config fields, its results and extras.

The one home of the record layout. Every other module (planner, partial validation, merge,
cost model, report, export) asks here which fields make a record's identity and config,
in which order, and how a record's config maps onto the Triton kernels' ``AttentionConfig``.

Layout, in the reference document's key order::

    identity   dtype, head_dim, seq, batch, heads, [causal, kv_heads,] tag, mode, [impl,]
               config ("auto" | "forced")
    config     the implementation's own config fields (``kernels.impls``: ``tunables(mode)``);
               for the Triton kernels (the reference's):
               fwd:     block_q, block_k, num_stages, num_warps
               fwd_bwd: fwd_block_q, fwd_block_k, bwd_outer, bwd_inner, num_stages, num_warps
               (auto records have none: the kernel picks)
    results    rel_err, compile_s, inner, median_ms, q1_ms, q3_ms   or   error
    extras     timer, samples_ms, pruned, smem_bytes, compile_cached, screened, round, reused_from, device,
               unit, attempt (documented)

The bracketed identity fields are optional, so the reference's records keep exactly its
fields. ``causal`` (bool) and ``kv_heads`` (int; equal to heads for multi-head attention)
describe the problem, so they sit with the shape, right after ``heads``; each is in every
record of a sweep whose spec sweeps a non-default value of it, and absent otherwise. ``impl``
(``kernels.impls``) names the kernel whose tiles the config fields are, so it sits right
before ``config``, and only when it is not our kernel ("tilesweep"). The config fields are the
implementation's (both Triton kernels take ``kernels.config.AttentionConfig``, so theirs are the
reference's; jax's Mosaic GPU kernel has its ``TuningConfig``'s), so a record's ``impl`` says
which fields it has.

A record's id is a hash of its identity and config fields (``item_id``), so the same
measurement has the same id in every sweep; resume, merge and append key on it. Default values
of the optional fields (causal false, kv_heads equal to heads or absent, impl "tilesweep") are
left out of the hashed bytes, so a record that spells them has the id of one that does not,
and the reference's ids never change.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kernels import impl_triton, impls
from kernels.impls import DEFAULT_IMPL

IDENTITY_FIELDS: tuple[str, ...] = ("dtype", "head_dim", "seq", "batch", "heads", "tag", "mode", "config")
# Optional identity fields and the value their absence means (and that is never hashed).
OPTIONAL_DEFAULTS: dict[str, Any] = {"causal": False, "kv_heads": None, "impl": DEFAULT_IMPL}
# Every identity field a record may carry, in record order.
RECORD_IDENTITY_ORDER: tuple[str, ...] = (
    "dtype",
    "head_dim",
    "seq",
    "batch",
    "heads",
    "causal",
    "kv_heads",
    "tag",
    "mode",
    "impl",
    "config",
)
# A problem: what a best config is chosen for (the identity less the config kind); ``problem_key``
# adds the optional fields, normalised.
PROBLEM_FIELDS: tuple[str, ...] = ("dtype", "head_dim", "seq", "batch", "heads", "mode", "tag")
# The reference's config fields: those of the Triton kernels (``kernels.impl_triton``).
CONFIG_FIELDS: dict[str, tuple[str, ...]] = impl_triton.CONFIG_FIELDS
FWD_CONFIG_FIELDS = CONFIG_FIELDS["fwd"]
FWD_BWD_CONFIG_FIELDS = CONFIG_FIELDS["fwd_bwd"]
RESULT_FIELDS: tuple[str, ...] = ("rel_err", "compile_s", "inner", "median_ms", "q1_ms", "q3_ms")
# Documented extras tilesweep appends after the reference fields of a record.
# ``samples_ms``: every timed sample (per-call ms by the record's timer) that median_ms, q1_ms and
# q3_ms summarise, so an export hands them on (tokamax's tables keep raw samples).
# ``screened``: timed by one short screening sample only (the halving strategy's first round);
# such a record is never a best config. ``round``: the round of a search (``timing.strategy: search``)
# whose unit measured the record. ``reused_from``: the results document the record was
# carried from instead of being measured again (``store.reuse``); ``device``: the device kind of a
# record carried into a document of another device (``merge.mix_devices``).
EXTRA_RECORD_FIELDS: tuple[str, ...] = (
    "timer",
    "samples_ms",
    "pruned",
    "smem_bytes",
    "compile_cached",
    "screened",
    "round",
    "reused_from",
    "device",
    "unit",
    "attempt",
)

_NUM = (float, int)
# Types a record field may hold (bool is not an int here: checks compare type() exactly).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "dtype": (str,),
    "head_dim": (int,),
    "seq": (int,),
    "batch": (int,),
    "heads": (int,),
    "tag": (str,),
    "mode": (str,),
    "config": (str,),
    "causal": (bool,),
    "kv_heads": (int,),
    "impl": (str,),
    **impls.field_types(),
    "rel_err": _NUM,
    "compile_s": _NUM,
    "inner": (int,),
    "median_ms": _NUM,
    "q1_ms": _NUM,
    "q3_ms": _NUM,
    "error": (str,),
    "timer": (str,),
    "samples_ms": (list,),
    "pruned": (bool,),
    "smem_bytes": (int, type(None)),
    "compile_cached": (bool,),
    "screened": (bool,),
    "round": (int,),
    "reused_from": (str,),
    "device": (str,),
    "unit": (str,),
    "attempt": (int,),
}


def config_fields(mode: str, config: str = "forced", impl: str = DEFAULT_IMPL) -> tuple[str, ...]:
    """The config fields a record of this mode, config kind and implementation carries (none for
    auto): the implementation's tunables (``kernels.impls``). ValueError for an unknown ``impl``."""
    if config == "auto":
        return ()
    return _fields(impl, "fwd" if mode == "fwd" else "fwd_bwd")


@functools.cache
def _fields(impl: str, mode: str) -> tuple[str, ...]:
    return tuple(t.name for t in impls.get(impl).tunables(mode))


def identity_fields(rec: Mapping[str, Any]) -> tuple[str, ...]:
    """Identity and config fields of a record, in record order (optional ones it carries included)."""
    ident = tuple(k for k in RECORD_IDENTITY_ORDER if k in rec or k in IDENTITY_FIELDS)
    return ident + config_fields(rec.get("mode", ""), rec.get("config", ""), rec.get("impl", DEFAULT_IMPL))


def variant(rec: Mapping[str, Any]) -> tuple[bool, int | None, str]:
    """A record's (causal, kv_heads, impl), normalised: kv_heads ``None`` for multi-head
    attention (absent, null, or equal to heads), defaults for absent fields."""
    kv = rec.get("kv_heads")
    return bool(rec.get("causal", False)), (None if kv == rec.get("heads") else kv), rec.get("impl", DEFAULT_IMPL)


def config_of(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The config fields of a forced record, in record order."""
    return {f: rec.get(f) for f in config_fields(rec["mode"], impl=rec.get("impl", DEFAULT_IMPL))}


# ---------------------------------------------------------------------------- ids


_ID_BYTES = 8  # an id is the blake2b hash of its bytes in this many bytes (16 hex digits)


def _hash(key: bytes) -> str:
    return hashlib.blake2b(key, digest_size=_ID_BYTES).hexdigest()


def id_prefix(
    dtype: str,
    head_dim: int,
    seq: int,
    batch: int,
    heads: int,
    tag: str,
    mode: str,
    config: str,
    *,
    causal: bool = False,
    kv_heads: int | None = None,
    impl: str = DEFAULT_IMPL,
) -> bytes:
    """The identity part of the bytes an id hashes; ``id_suffix`` adds the config fields.
    Optional fields at their default (kv_heads ``None`` or ``heads``) add nothing."""
    extra = ("|causal=True" if causal else "") + (
        f"|kv_heads={kv_heads}" if kv_heads is not None and kv_heads != heads else ""
    )
    kernel = "" if impl == DEFAULT_IMPL else f"|impl={impl}"
    return (
        f"dtype={dtype}|head_dim={head_dim}|seq={seq}|batch={batch}|heads={heads}{extra}|tag={tag}"
        f"|mode={mode}{kernel}|config={config}"
    ).encode()


def id_suffix(names: Sequence[str], values: Sequence[Any]) -> bytes:
    return "".join(f"|{n}={v}" for n, v in zip(names, values, strict=True)).encode()


def item_id(rec: Mapping[str, Any]) -> str:
    """Stable id of a record's identity and config fields (computable from any record).

    Raises ``KeyError`` when the record lacks one of them."""
    causal, kv_heads, impl = variant(rec)
    prefix = id_prefix(*(rec[k] for k in IDENTITY_FIELDS), causal=causal, kv_heads=kv_heads, impl=impl)
    names = config_fields(rec["mode"], rec["config"], impl)
    return _hash(prefix + id_suffix(names, [rec[n] for n in names]))


def id_getter(mode: str, config: str, *, plain: bool = False) -> Callable[[Mapping[str, Any]], str]:
    """``item_id`` of records of one mode and config kind, fast (the merger checks a million
    ids): the fields read at C speed, spelled by one %-format (``%s`` spells ints and strings as
    ``id_prefix``'s f-string does), the identity part hashed once for all the configs of one
    problem (its hash state copied for each), the config part spelled once per config. Byte for
    byte ``item_id``'s for a record whose values are of the layout's types (``store.layouts``
    checks them first: a float 64.0 would share the prefix or the config part of 64 here); a
    record that carries an optional identity field takes ``item_id``'s own path, unless
    ``plain``: the caller knows its records carry none (their key tuple lacks them), and none is
    looked for. Raises ``KeyError`` for a record that lacks a field."""
    identity = operator.itemgetter(*IDENTITY_FIELDS)
    prefix = "|".join(f"{n}=%s" for n in IDENTITY_FIELDS)
    names = config_fields(mode, config)
    if not names:

        def get_auto(rec: Mapping[str, Any]) -> str:
            return _hash((prefix % identity(rec)).encode())

        return get_auto if plain else _optional_first(get_auto)
    fields = operator.itemgetter(*names)
    suffix = "".join(f"|{n}=%s" for n in names)
    states: dict[tuple[Any, ...], hashlib.blake2b] = {}  # identity values -> the hash state of their prefix
    suffixes: dict[tuple[Any, ...], bytes] = {}  # config values -> their bytes (a grid's configs recur per problem)

    def get(rec: Mapping[str, Any]) -> str:
        key = identity(rec)
        state = states.get(key)
        if state is None:
            if len(states) >= _STATES:
                states.clear()
            state = states[key] = hashlib.blake2b((prefix % key).encode(), digest_size=_ID_BYTES)
        config = fields(rec)
        tail = suffixes.get(config)
        if tail is None:
            if len(suffixes) >= _STATES:
                suffixes.clear()
            tail = suffixes[config] = (suffix % config).encode()
        h = state.copy()
        h.update(tail)
        return h.hexdigest()

    return get if plain else _optional_first(get)


def _optional_first(get: Callable[[Mapping[str, Any]], str]) -> Callable[[Mapping[str, Any]], str]:
    """``get`` for records without an optional identity field, ``item_id`` for the others."""

    def get_any(rec: Mapping[str, Any]) -> str:
        if "causal" in rec or "kv_heads" in rec or "impl" in rec:
            return item_id(rec)
        return get(rec)

    return get_any


_STATES = 1 << 16  # prefix hash states an id getter keeps (one per problem and mode)


_ID_GETTERS: dict[tuple[str, str], Callable[[Mapping[str, Any]], str]] = {}


def record_id(rec: Mapping[str, Any]) -> str:
    """``item_id`` through the ``id_getter`` of the record's mode and config kind (made once
    each): what checks a million records' ids. The record's fields must be of the layout's
    types (``store.layouts`` checks); raises ``KeyError`` for one that lacks a field."""
    if "causal" in rec or "kv_heads" in rec or "impl" in rec:
        return item_id(rec)
    kind = (rec["mode"], rec["config"])
    get = _ID_GETTERS.get(kind)
    if get is None:
        get = _ID_GETTERS[kind] = id_getter(*kind, plain=True)
    return get(rec)


def id_of(prefix: bytes, suffix: bytes) -> str:
    """``item_id`` from precomputed parts (the planner shares them across millions of items)."""
    return _hash(prefix + suffix)


def ids_of(prefix: bytes, suffixes: Sequence[bytes]) -> list[str]:
    """``id_of(prefix, suffix)`` of each suffix, the prefix hashed once (``_hash``'s hash, its
    state copied for each suffix: half the cost of hashing each whole)."""
    base = hashlib.blake2b(prefix, digest_size=_ID_BYTES)
    out: list[str] = []
    for suffix in suffixes:
        h = base.copy()
        h.update(suffix)
        out.append(h.hexdigest())
    return out


_KEY_FIELDS = tuple(k for k in IDENTITY_FIELDS if k != "tag")


def _extras(causal: bool, kv_heads: int | None, impl: str) -> tuple[tuple[str, Any], ...]:
    """Non-default optional identity values as (name, value) pairs, the tail of a key."""
    pairs = (("causal", causal), ("kv_heads", kv_heads), ("impl", impl))
    return tuple((n, v) for n, v in pairs if v != OPTIONAL_DEFAULTS[n])


def record_key(rec: Mapping[str, Any]) -> tuple[Any, ...]:
    """A record's identity without its tag (a tag is a label, not part of what is timed):
    the identity values less the tag, then the config values, then (name, value) pairs of the
    optional fields that are not at their default (none for the reference's records)."""
    impl = rec.get("impl", DEFAULT_IMPL)
    names = _KEY_FIELDS + config_fields(rec.get("mode", ""), rec.get("config", ""), impl)
    return tuple(rec.get(n) for n in names) + _extras(*variant(rec))


def key_getter(mode: str, config: str, impl: str = DEFAULT_IMPL) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``record_key`` of records of one mode and config kind, fast (reuse matches a million
    records): the fields every record has at C speed (``operator.itemgetter``; raises ``KeyError``
    for a record that lacks one), the optional identity fields' tail only for a record that
    carries one of them, so a causal, grouped-query or other-kernel record never has the key of
    a plain one (records of ``impl``: its config fields)."""
    base = operator.itemgetter(*(_KEY_FIELDS + config_fields(mode, config, impl)))

    def get(rec: Mapping[str, Any]) -> tuple[Any, ...]:
        key: tuple[Any, ...] = base(rec)
        if "causal" in rec or "kv_heads" in rec or "impl" in rec:
            return key + _extras(*variant(rec))
        return key

    return get


def key_head(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """The leading part of a ``record_key``: the identity less tag and config fields, which every
    record of a results document has (``head_getter`` reads it from one at C speed)."""
    return key[: len(_KEY_FIELDS)]


def head_getter() -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``key_head`` of a record's ``record_key``, read straight from the record (``operator.itemgetter``):
    reuse sets aside at C speed the records of a million whose problem the plan does not have."""
    return operator.itemgetter(*_KEY_FIELDS)


def key_of(
    dtype: str,
    head_dim: int,
    seq: int,
    batch: int,
    heads: int,
    mode: str,
    config: str,
    params: tuple[Any, ...],
    *,
    causal: bool = False,
    kv_heads: int | None = None,
    impl: str = DEFAULT_IMPL,
) -> tuple[Any, ...]:
    """``record_key`` of a record with these values, without building the record."""
    kv = None if kv_heads == heads else kv_heads
    key = (dtype, head_dim, seq, batch, heads, mode, config, *params)
    return key + _extras(causal, kv, impl) if causal or kv is not None or impl != DEFAULT_IMPL else key


def problem_key(rec: Mapping[str, Any]) -> tuple[Any, ...]:
    """The problem fields, then the record's normalised (causal, kv_heads, impl)."""
    return tuple(rec[k] for k in PROBLEM_FIELDS) + variant(rec)


# ---------------------------------------------------------------------------- to the kernel


def kernel_kwargs(mode: str, config: Mapping[str, Any] | Sequence[Any]) -> dict[str, int]:
    """A forced record of a Triton kernel (a mapping of its config fields, or their values in
    record order) as keyword arguments of ``kernels.config.AttentionConfig``
    (``kernels.impl_triton.kernel_kwargs``: a fwd_bwd record's fwd_block_q/fwd_block_k are the
    forward's block_q/block_k; the tiles a mode does not sweep are left to the kernel's defaults)."""
    return impl_triton.kernel_kwargs(mode, config)


def record_config(mode: str, kernel: Mapping[str, Any]) -> dict[str, Any]:
    """A kernel config (``AttentionConfig`` fields, as ``dataclasses.asdict`` gives them) as a
    forced record of ``mode`` names its config fields: ``kernel_kwargs`` the other way round."""
    renamed = {"fwd_block_q": "block_q", "fwd_block_k": "block_k"}
    return {n: kernel[renamed.get(n, n)] for n in config_fields(mode)}
