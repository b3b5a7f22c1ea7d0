"""tokamax's flash-attention ops with a fixed config, and their search spaces, from jax's side
(``kernels.tokamax_meta`` names the ops and their config fields without importing either).

- ``build``: ``f(q, k, v, do)`` running one config: the op with its config fixed
  (``op.replace(config=...)``), for fwd_bwd with its vjp op's config fixed too
  (``vjp=op.vjp.replace(config=...)``), so the backward ``jax.vjp`` takes runs the vjp op's config.
- ``refusal``: a config checked by tokamax's own config classes (their pydantic validation), in one line.
- ``search_space``: per problem, exactly the configs tokamax's autotuner would try on a device
  kind (``BoundArguments.autotuning_configs``: its heuristics' config and ``_get_autotuning_configs``),
  enumerated with that device standing in as the default device (``kernels.standin``), so a CPU
  gets the lists an H100, H200 or B200 would.
- ``lower``: the program of one config lowered for a device kind on a CPU (the stand-in, plus an
  abstract mesh of the kind, which jax lowers CUDA programs under).

tokamax tunes forward+backward as two searches, each timing one op: the forward bound with
``return_residuals=True`` (the forward that a backward needs; another cache key than the
forward alone) and the vjp op. ``search_space`` for fwd_bwd is the same two lists as configs of
the whole program: every forward config with the vjp op's heuristic config, then every vjp config
with the forward's heuristic config (the heuristics' pair once), so each config tokamax tries is
measured once, beside what an untuned call would run with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import logging
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp

from kernels import devices, standin
from kernels import tokamax_meta as meta
from kernels.reference import ModeFn, mode_fn
from kernels.spelling import CHOICE_ERRORS, json_choices

ATTENTION = "tokamax._src.ops.attention"
_CACHE_MISS = "Autotuning cache miss for %s on %s with key %s"  # tokamax's warning (its ops/op.py), through absl


class _CacheMissInOurWords(logging.Filter):
    """tokamax warns "Autotuning cache miss for <the op's repr> on <GPU> with key <the key's JSON>"
    (hundreds of characters) whenever its tables lack a shape, which for ``auto`` is what
    tilesweep means to run: tokamax's own choice, its heuristics where it has no table entry. The
    warning is said instead as one short line at info level, in tilesweep's words."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _CACHE_MISS and isinstance(record.args, tuple) and len(record.args) == 3:
            op, kind, _ = record.args
            record.msg = "tokamax's tables have no %s config for this shape on %s: it runs its heuristics' config"
            record.args = (type(op).__name__, kind)
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)  # shown where info is
        return True


logging.getLogger("absl").addFilter(_CacheMissInOurWords())


def _module(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"{ATTENTION}.{name}")
    except ImportError as exc:
        if meta.version() is None:
            raise meta.TokamaxMissing(meta.missing("a tokamax kernel")) from None
        raise meta.TokamaxMissing(
            f"tokamax {meta.version()} has no {ATTENTION}.{name} ({exc}); {meta.INSTALL}"
        ) from None


def stock_op(impl: str) -> Any:
    """tokamax's own instance of the op (its vjp op attached), as ``tokamax.dot_product_attention``
    uses it: one per op, whichever of its records' names ``impl`` is."""
    return _stock_op(meta.kernel(impl).impl)


@functools.cache
def _stock_op(impl: str) -> Any:
    k = meta.kernel(impl)
    return getattr(_module(k.module), k.op_class)()


def config_class(impl: str, half: str, fam: str) -> type:
    """tokamax's config class of the forward ("fwd") or vjp ("vjp") op of a config family."""
    k = meta.kernel(impl)
    c = (k.fwd if half == "fwd" else k.vjp)[fam]
    cls: type = getattr(_module(c.module), c.name)
    return cls


def one_line(exc: Exception, prefix: str = "", whole: str = "(config)") -> str:
    """A pydantic ValidationError's errors as one line (``block_q: Input should be a multiple of 64``;
    ``prefix`` before each field's name, ``whole`` for an error of the whole object)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc).splitlines()[0]
    parts = []
    for e in errors():
        loc = ".".join(map(str, e.get("loc", ())))
        msg = str(e.get("msg"))
        if e.get("type") in CHOICE_ERRORS:  # a literal's values in JSON's spelling, as the spec's errors name them
            msg = json_choices(msg)
        parts.append(f"{prefix + loc if loc else whole}: {msg}")
    return "; ".join(parts)


def _checked(impl: str, half: str, fam: str, kwargs: Mapping[str, Any]) -> Any:
    """The config object of ``kwargs``, or ValueError with tokamax's refusal in one line."""
    import pydantic

    cls = config_class(impl, half, fam)
    prefix = meta.VJP_PREFIX if half == "vjp" else ""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [n for n in kwargs if n not in names]
    if unknown:
        listed = ", ".join(prefix + n for n in names)
        raise ValueError(
            f"{prefix}{unknown[0]} is not a field of tokamax's {cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}; "
            f"its fields: {listed}"
        )
    try:
        pydantic.TypeAdapter(cls).validate_python(dict(kwargs))
    except pydantic.ValidationError as exc:
        raise ValueError(one_line(exc, prefix)) from None
    return cls(**kwargs)


def configs_of(impl: str, mode: str, fields: Mapping[str, Any]) -> tuple[Any, Any | None]:
    """(forward config, vjp config or None) of a record's config fields, as tokamax's classes
    make them; ValueError with tokamax's refusal in one line."""
    k = meta.kernel(impl)
    fam = k.family_of(fields)
    fwd, vjp = meta.split(impl, mode, fields)
    return _checked(impl, "fwd", fam, fwd), (_checked(impl, "vjp", fam, vjp) if mode == "fwd_bwd" else None)


def refusal(impl: str, mode: str, fields: Mapping[str, Any]) -> str | None:
    """Why tokamax's config classes refuse these config fields (one line), or None."""
    try:
        configs_of(impl, mode, fields)
    except ValueError as exc:
        return str(exc)
    return None


def fixed_op(impl: str, mode: str, fields: Mapping[str, Any]) -> Any:
    """The op with this config (and, for fwd_bwd, its vjp op with the vjp half of it)."""
    op = stock_op(impl)
    fwd, vjp = configs_of(impl, mode, fields)
    if vjp is None:
        return op.replace(config=fwd)
    return op.replace(config=fwd, vjp=op.vjp.replace(config=vjp))


def build(
    impl: str, mode: str, fields: Mapping[str, Any] | None, *, causal: bool = False, sm_scale: float | None = None
) -> ModeFn:
    """``f(q, k, v, do)`` as ``kernels.attention.build`` makes it, running tokamax's op with this
    config (None: tokamax's own choice, its cache or heuristics, as an untuned call gets)."""
    op = stock_op(impl) if fields is None else fixed_op(impl, mode, fields)
    kwargs: dict[str, Any] = {"is_causal": causal}
    if sm_scale is not None:
        kwargs["logits_scale"] = float(sm_scale)

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out: jax.Array = op(q, k, v, **kwargs)
        return out

    return mode_fn(mode, attend)


def build_for_target(
    impl: str, mode: str, fields: Mapping[str, Any] | None, *, causal: bool = False, sm_scale: float | None = None
) -> ModeFn:
    """``build``, for the GPU the program is made for: on a GPU the local one; on a machine
    without one, under an abstract mesh of a CUDA device kind (``kernels.preflight.target``), that
    kind standing in as the default device while the program is traced (``kernels.standin``), so
    tokamax picks the kernel module, heuristics and persistent grid that GPU would get."""
    fn = build(impl, mode, fields, causal=causal, sm_scale=sm_scale)
    device = _abstract_target()
    if device is None:
        return fn

    def traced_for_target(*args: jax.Array) -> tuple[jax.Array, ...]:
        with target(device):
            return fn(*args)

    return traced_for_target


def _abstract_target() -> devices.DeviceKind | None:
    """The known device kind of the abstract CUDA mesh in force, where jax has no GPU here; else None."""
    if jax.default_backend() == "gpu":
        return None
    abstract = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    kind = getattr(abstract, "device_kind", None)
    if getattr(abstract, "platform", None) != "cuda" or kind not in devices.KINDS:
        return None
    return devices.KINDS[kind]


# ---------------------------------------------------------------------------- per problem, for a device kind


def shapes(p: meta.Problem) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """(q, k) of a problem as tokamax binds them (v is like k), layout (batch, seq, heads, head_dim)."""
    dtype = jnp.dtype(p.dtype)
    q = jax.ShapeDtypeStruct((p.batch, p.seq, p.heads, p.head_dim), dtype)
    return q, jax.ShapeDtypeStruct((p.batch, p.seq, p.k_heads, p.head_dim), dtype)


def bound(impl: str, half: str, p: meta.Problem, device: devices.DeviceKind, *, residuals: bool) -> Any:
    """tokamax's bound arguments of one op for a problem on ``device``: the forward ("fwd";
    ``residuals``: as the forward of fwd_bwd binds it) or the vjp ("vjp", whose arguments tokamax
    derives by tracing the forward with residuals, which needs the device). Bound outside any
    abstract mesh: tokamax's keys are then those of a real call."""
    op = stock_op(impl)
    q, k = shapes(p)
    fwd = op.bind(q, k, k, is_causal=p.causal, return_residuals=residuals or half == "vjp")
    if half == "fwd":
        return fwd
    with target(device):  # the forward's heuristics fixed: its shapes without a cache lookup (and its warning)
        fixed = op.replace(config=op._get_heuristics_config(fwd))
        spec = fixed.bind(q, k, k, is_causal=p.causal, return_residuals=True).vjp_arg_spec
        return op.vjp.bind(**spec)


@contextlib.contextmanager
def target(device: devices.DeviceKind) -> Iterator[None]:
    """Inside the block tokamax sees ``device`` as the default device (``kernels.standin``)."""
    with standin.default_device(device.name, device.arch, device.cores):
        yield


def fields_of(config: Any) -> dict[str, Any]:
    """A tokamax config object's fields as a tilesweep config has them (``tokamax_meta``: all but
    those tokamax's autotuner leaves at None; RuntimeError where one of those is set, which
    tilesweep would not record)."""
    out = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    untuned = meta.untuned_of(type(config).__module__.rsplit(".", 1)[-1], type(config).__name__)
    set_ = [f for f in untuned if out[f] is not None]
    if set_:
        raise RuntimeError(f"tokamax's config {config} sets {', '.join(set_)}, which tilesweep does not sweep")
    return {k: v for k, v in out.items() if k not in untuned}


def _sorted(configs: Any, first: Any) -> list[dict[str, Any]]:
    """The configs as field dicts: ``first`` (the heuristics' choice), then the rest in a fixed order."""
    rest = sorted((c for c in configs if c != first), key=lambda c: json.dumps(list(fields_of(c).values())))
    return [fields_of(first), *(fields_of(c) for c in rest)]


def half_space(
    impl: str, half: str, p: meta.Problem, device: devices.DeviceKind, *, residuals: bool
) -> list[dict[str, Any]]:
    """The configs tokamax's autotuner tries for one op of a problem on ``device``, its
    heuristics' choice first (the class's field names, unprefixed)."""
    ba = bound(impl, half, p, device, residuals=residuals)
    with target(device):
        return _sorted(ba.autotuning_configs, ba.op._get_heuristics_config(ba))


def search_space(impl: str, mode: str, p: meta.Problem, device: devices.DeviceKind) -> list[dict[str, Any]]:
    """Every config tokamax's autotuner tries for this problem on ``device``, as record config
    fields (the module docstring says how fwd_bwd's two searches become configs of the program)."""
    if mode == "fwd":
        return half_space(impl, "fwd", p, device, residuals=False)
    fwd = half_space(impl, "fwd", p, device, residuals=True)
    vjp = half_space(impl, "vjp", p, device, residuals=True)
    return [meta.join(f, vjp[0]) for f in fwd] + [meta.join(fwd[0], v) for v in vjp[1:]]


def chosen(impl: str, mode: str, p: meta.Problem, device: devices.DeviceKind) -> dict[str, Any]:
    """The config an untuned call of tokamax runs for this problem on ``device``: each op's
    ``default_config`` (the overlays, then its cache, then its heuristics), as record config fields."""
    fwd = bound(impl, "fwd", p, device, residuals=mode == "fwd_bwd")
    vjp = bound(impl, "vjp", p, device, residuals=True) if mode == "fwd_bwd" else None
    with target(device), _mesh(device):
        f = fields_of(fwd.default_config)
        return f if vjp is None else meta.join(f, fields_of(vjp.default_config))


def in_tables(impl: str, mode: str, p: meta.Problem, device: devices.DeviceKind) -> bool:
    """Whether tokamax's tables (its shipped ones, and the overlays in force) hold this problem on
    ``device`` for each op ``mode`` runs, so that an untuned call runs their winners (``chosen``)."""
    halves = [bound(impl, "fwd", p, device, residuals=mode == "fwd_bwd")]
    halves += [bound(impl, "vjp", p, device, residuals=True)] if mode == "fwd_bwd" else []
    with target(device), _mesh(device):
        return all(ba.cached_autotuning_data is not None for ba in halves)


@contextlib.contextmanager
def _mesh(device: devices.DeviceKind) -> Iterator[None]:
    """An abstract mesh of one device of the kind: jax lowers CUDA programs under it on a CPU,
    and tokamax's cache lookups read their device kind from it."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    abstract = AbstractDevice(device_kind=device.name, num_cores=device.cores, platform="cuda")
    with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=abstract)):
        yield


def lower(impl: str, mode: str, fields: Mapping[str, Any] | None, p: meta.Problem, device: devices.DeviceKind) -> Any:
    """One config's program lowered for ``device`` on this machine (jax's ``Lowered``); raises
    what the lowering raises (tokamax's refusals, the Mosaic GPU compiler's shared-memory one)."""
    fn = build(impl, mode, fields, causal=p.causal)
    q, k = shapes(p)
    with target(device), _mesh(device):
        return jax.jit(fn).trace(q, k, k, q).lower(lowering_platforms=("cuda",))
