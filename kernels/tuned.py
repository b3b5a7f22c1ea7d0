"""Load the tuned table a sweep exported and pick a tile config for a call.

The table (written by ``tilesweep export``) is small, versioned JSON::

    {"format": "tilesweep-tuned", "version": 2, "device": {"device_kind": ..., "jax": ...},
     "entries": [{"impl", "dtype", "head_dim", "seq", "batch", "heads", "causal", "kv_heads",
                  "mode",
                  "config": {block_q, block_k, bwd_outer, bwd_inner, num_warps, num_stages} | null,
                  "median_ms", "auto_ms", "auto_config"?}]}

``impl`` is the kernel implementation measured (``kernels.impls``: "tilesweep", "jax" or
"mosaic"), ``kv_heads`` equals ``heads`` for multi-head attention. Version 1 tables (no impl,
causal or kv_heads: our kernel, non-causal, multi-head) still load. ``config`` holds exactly the
fields of ``kernels.config.AttentionConfig`` for the two Triton kernels, and the record's own
config fields for another implementation (jax's Mosaic GPU kernel: its ``TuningConfig``'s, as
``jax.experimental.pallas.ops.gpu.attention_mgpu.TuningConfig(**config, causal=...)`` takes
them). ``median_ms`` is the measured time of what the entry answers (its config, or auto where
the config is null), ``auto_ms`` auto's. ``wins`` (written by export, not required to load):
whether the entry's implementation is the fastest of the table's implementations for its
problem. ``config: null`` records a
measured problem where the implementation's auto beat every forced config (or every forced
config failed): the answer there is "use auto", and a neighbouring seq must not override it.
``auto_config`` (optional, beside a null ``config`` of our kernel or of jax's Mosaic GPU
kernel) is the config auto ran there, as ``config`` names its fields: ``config_for`` answers
our kernel's, because our kernel called with ``config=None`` runs ``AttentionConfig()``, which
is not auto (auto shrinks tiles and stages to fit shared memory and picks the backward's
warps); ``lookup`` answers the Mosaic GPU kernel's, which has no default config at all (its
auto is tilesweep's choice, ``kernels.mosaic``). The stock ``mha`` and tokamax's ops called
untuned run their auto, so their "use auto" entries need none.

Answers, for either implementation: ``config_for`` gives our kernel's ``AttentionConfig``
(``kernels.attention.flash_attention(q, k, v, cfg, causal=...)``), ``mha_kwargs`` the stock
kernel's keyword arguments, ``BlockSizes`` included
(``mha(q, k, v, None, causal=..., sm_scale=..., **kw)``), ``mosaic_config`` jax's Mosaic GPU
kernel's ``TuningConfig``, ``causal`` as the call asks
(``kernels.mosaic.mosaic_attention(q, k, v, fields, causal=...)`` runs it with the softmax scale
jax's kernel does not apply). Each looks only at entries of its own implementation: the kernels'
best tiles differ.

Lookup rule (``TunedTable.lookup``), so a kernel asked for an unmeasured shape degrades to
auto instead of to a config that would raise:

1. Candidates are the entries with the same implementation, dtype, head_dim, causal and mode.
   ``batch``, ``heads`` and ``kv_heads`` are soft: when given and some candidate has that
   value, only those are kept (they change the grid, not which tiles fit); when not given they
   match anything.
2. A candidate with the asked seq wins (ties: smaller batch, then smaller heads).
3. Otherwise the candidate with the nearest seq on a log scale (``|log(seq_e / seq)|``; ties go
   to the smaller seq) is taken, but only if its blocks divide the asked seq (block_q and
   block_k; for fwd_bwd also bwd_outer and bwd_inner): the kernel rejects a seq that is not a
   multiple of a block.
4. Anything else, a dtype the kernel does not run included, is ``None``: use auto.

An argument no call could mean (an unknown mode or implementation, a seq that is not a positive
integer, kv_heads not dividing heads, a causal that is not a bool, a dtype name numpy does not
know or no dtype at all; ``config_for``, ``mha_kwargs`` or ``mosaic_config`` asked for another implementation than
theirs) raises ``ValueError``; an entry no export writes (a config field the kernel refuses, a
head_dim no kernel runs, two entries for one problem) is refused at load
(``kernels.tuned_entries``).

The table is only as good as the device and stack it was measured on: loading a table
measured on another device kind or jax version warns (``TunedTableMismatchWarning``) and
still loads. This module imports nothing from the orchestrator.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

from kernels import tokamax_meta
from kernels.config import AttentionConfig
from kernels.impls import DEFAULT_IMPL
from kernels.smem import dtype_name
from kernels.spelling import as_json
from kernels.tuned_entries import (
    CONFIG_FIELDS,
    TunedEntry,
    TunedTableError,
    blocks_divide,
    check_call,
    read_entries,
)

log = logging.getLogger(__name__)

__all__ = [
    "CONFIG_FIELDS",
    "FORMAT",
    "VERSION",
    "Environment",
    "TunedEntry",
    "TunedTable",
    "TunedTableError",
    "TunedTableMismatchWarning",
    "config_for",
    "to_attention_config",
]

FORMAT = "tilesweep-tuned"
VERSION = 2
READS_VERSIONS = (1, 2)


class TunedTableMismatchWarning(UserWarning):
    """The table was measured on another device kind or jax version than the running one."""


@dataclass(frozen=True)
class Environment:
    """What a table is checked against; tests pass one in instead of asking jax."""

    device_kind: str | None
    jax_version: str | None

    @classmethod
    def current(cls) -> Environment | None:
        """The running device kind and jax version, or ``None`` when jax is unusable here."""
        try:
            import jax

            return cls(device_kind=jax.devices()[0].device_kind, jax_version=jax.__version__)
        except Exception as exc:  # no jax, no backend: nothing to compare against
            log.debug("cannot read the running environment: %s", exc)
            return None


class TunedTable:
    """An in-memory tuned table; build it with ``TunedTable.load``."""

    def __init__(self, device: dict[str, Any], entries: list[TunedEntry], path: str | None = None) -> None:
        self.device = dict(device)
        self.entries = list(entries)
        self.path = path
        self._by_problem: dict[tuple[str, str, int, bool, str], list[TunedEntry]] = {}
        for e in self.entries:
            self._by_problem.setdefault((e.impl, e.dtype, e.head_dim, e.causal, e.mode), []).append(e)

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"TunedTable({len(self.entries)} entries, device={self.device.get('device_kind')!r})"

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        env: Environment | None = None,
        check_env: bool = True,
    ) -> TunedTable:
        """Read a tuned table; warn if it was measured elsewhere.

        ``env`` is the environment to compare with (default: ask jax); ``check_env=False``
        skips the comparison, for tools that only inspect a table.
        """
        spath = os.fspath(path)
        try:
            with open(spath, "rb") as fh:
                obj = json.load(fh)
        except FileNotFoundError:
            raise TunedTableError(f"{spath}: no such file") from None
        except (OSError, ValueError) as exc:
            raise TunedTableError(f"{spath}: cannot read a tuned table ({exc})") from None
        table = cls.from_obj(obj, name=spath)
        if check_env:
            table.check_environment(env if env is not None else Environment.current())
        return table

    @classmethod
    def from_obj(cls, obj: Any, *, name: str = "<tuned table>") -> TunedTable:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise TunedTableError(f"{name}: {_what_else(obj, name)}")
        version = obj.get("version")
        if version not in READS_VERSIONS:
            raise TunedTableError(
                f"{name}: tuned table version {as_json(version)} is not supported "
                f"(this code reads versions {', '.join(map(str, READS_VERSIONS))}); re-export it with this tilesweep"
            )
        device = obj.get("device")
        entries = obj.get("entries")
        if not isinstance(device, dict) or not isinstance(entries, list):
            raise TunedTableError(f"{name}: tuned table needs a 'device' object and an 'entries' array")
        return cls(device, read_entries(entries, name, version), path=name)

    def check_environment(self, env: Environment | None) -> bool:
        """Warn when the table's device kind or jax version differ from ``env``; True if they match."""
        if env is None:
            return True
        diffs = []
        kind, jax_v = self.device.get("device_kind"), self.device.get("jax")
        if kind and env.device_kind and kind != env.device_kind:
            diffs.append(f"device kind {as_json(kind)} (running on {as_json(env.device_kind)})")
        if jax_v and env.jax_version and jax_v != env.jax_version:
            diffs.append(f"jax {jax_v} (running {env.jax_version})")
        if diffs:
            warnings.warn(
                f"tuned table {self.path or ''} was measured with {' and '.join(diffs)}; "
                "its configs may be slower here or fail to fit, re-tune on this stack",
                TunedTableMismatchWarning,
                stacklevel=3,
            )
            return False
        return True

    # ------------------------------------------------------------------ lookup

    def entry(
        self,
        *,
        dtype: Any,
        head_dim: int,
        seq: int,
        mode: str,
        causal: bool = False,
        batch: int | None = None,
        heads: int | None = None,
        kv_heads: int | None = None,
        impl: str = DEFAULT_IMPL,
    ) -> TunedEntry | None:
        """The entry the lookup rule (module docstring) picks, or ``None``; see ``lookup``.
        ``ValueError`` for an argument no call could mean (``tuned_entries.check_call``)."""
        check_call(impl, mode, seq, head_dim, dtype, causal, batch=batch, heads=heads, kv_heads=kv_heads)
        try:
            dtype = dtype_name(dtype)
        except ValueError:  # a dtype the kernel does not run has no tuned config
            return None
        cands = self._by_problem.get((impl, dtype, int(head_dim), bool(causal), mode), [])
        for name, want in (("batch", batch), ("heads", heads), ("kv_heads", kv_heads)):
            if want is not None and any(getattr(e, name) == want for e in cands):
                cands = [e for e in cands if getattr(e, name) == want]
        if not cands:
            return None
        exact = [e for e in cands if e.seq == seq]
        if exact:
            return min(exact, key=lambda e: (e.batch, e.heads, e.kv_heads))
        nearest = min(cands, key=lambda e: (abs(math.log(e.seq / seq)), e.seq, e.batch, e.heads, e.kv_heads))
        if nearest.config is not None and not blocks_divide(nearest.config, seq, mode, nearest.impl):
            log.debug("nearest tuned seq %d has blocks that do not divide seq=%d", nearest.seq, seq)
            return None
        return nearest

    def lookup(self, **kwargs: Any) -> dict[str, int] | None:
        """``AttentionConfig`` keyword arguments for this call, or ``None`` meaning "use auto".

        Keywords as ``entry``: ``dtype`` (a name such as "bfloat16", a numpy/jax dtype or
        scalar type), ``head_dim``, ``seq``, ``mode``, and optionally ``causal``, ``batch``,
        ``heads``, ``kv_heads`` and ``impl`` (default: our kernel).

        Where the entry says "use auto", an implementation whose kernel has no default config
        (jax's Mosaic GPU kernel: ``attention`` without one raises) gets the config auto ran
        there, its ``auto_config``: "use auto" is no call it can make. Our kernel's answer there
        is ``None`` (``config_for`` gives auto's config), as is that of an implementation whose
        untuned call runs its auto (jax's stock ``mha``, tokamax's ops).
        """
        e = self.entry(**kwargs)
        if e is None:
            return None
        if e.config is not None:
            return dict(e.config)
        auto = e.auto_config
        if e.impl == DEFAULT_IMPL or auto is None or not blocks_divide(auto, int(kwargs["seq"]), e.mode, e.impl):
            return None
        return dict(auto)

    def config_for(self, **kwargs: Any) -> AttentionConfig | None:
        """Our kernel's ``AttentionConfig`` for this call: the entry's config, or where the
        entry says "use auto", the config auto ran (its ``auto_config``), since the kernel
        called with ``None`` runs ``AttentionConfig()``, not auto. ``None`` where the table has
        no answer: no entry, or a "use auto" entry of a table that does not name auto's config
        (``kernels.config.auto_config`` computes it)."""
        e = self.entry(**_own(kwargs, DEFAULT_IMPL, "config_for"))
        if e is None:
            return None
        if e.config is not None:
            return to_attention_config(e.config)
        auto = e.auto_config
        if auto is None or not blocks_divide(auto, int(kwargs["seq"]), e.mode, e.impl):
            return None
        return to_attention_config(auto)

    def mha_kwargs(self, **kwargs: Any) -> dict[str, Any] | None:
        """Keyword arguments of jax's stock ``mha`` for this call, from the entries measured
        with ``kernel.impl: "jax"``: ``{"block_sizes": BlockSizes(...), "num_warps",
        "num_stages"}``; ``None``: call ``mha`` with its defaults. Imports jax."""
        cfg = self.lookup(**_own(kwargs, "jax", "mha_kwargs"))
        if cfg is None:
            return None
        from kernels.stock import mha_kwargs

        return mha_kwargs(to_attention_config(cfg))

    def mosaic_config(self, **kwargs: Any) -> Any | None:
        """jax's Mosaic GPU kernel's ``TuningConfig`` for this call, from the entries measured with
        ``kernel.impl: "mosaic"``, its ``causal`` as the call asks (the ``TuningConfig`` field that
        makes the kernel causal: built from ``lookup``'s tiles alone it is false); ``None``: no
        answer (the kernel has no default config: tune the shape, or pick one). Imports jax."""
        cfg = self.lookup(**_own(kwargs, "mosaic", "mosaic_config"))
        if cfg is None:
            return None
        from kernels.mosaic import tuning_config

        return tuning_config(cfg, causal=bool(kwargs.get("causal", False)))


def _own(kwargs: dict[str, Any], impl: str, method: str) -> dict[str, Any]:
    """``kwargs`` for the implementation ``method`` answers for; ValueError where they name another."""
    if kwargs.get("impl", impl) != impl:
        raise ValueError(
            f"{method} answers for impl={as_json(impl)}, not impl={as_json(kwargs['impl'])}: "
            f"use lookup(impl={as_json(kwargs['impl'])}, ...)"
        )
    return {**kwargs, "impl": impl}


def config_for(table: TunedTable | str | os.PathLike[str], **kwargs: Any) -> AttentionConfig | None:
    """One-call convenience: an ``AttentionConfig`` for a call, or ``None`` for auto.

    ``table`` is a loaded ``TunedTable`` or a path to load."""
    if not isinstance(table, TunedTable):
        table = TunedTable.load(table)
    return table.config_for(**kwargs)


def to_attention_config(cfg: dict[str, int]) -> AttentionConfig:
    return AttentionConfig(**cfg)


def _what_else(obj: Any, name: str) -> str:
    """What a file loaded as a tuned table is instead, in one line: a results document (the
    export's input: the command that makes its table), one of tokamax's tables (what reads it),
    or anything else (the format a table names)."""
    if isinstance(obj, dict) and "results" in obj and "format" not in obj:
        return (
            f"is a results document, not a tuned table: `tilesweep export {name} --out tuned.json` writes the tuned "
            "table of its best configs, which TunedTable.load reads"
        )
    if tokamax_meta.holds_table(obj):
        return (
            "is one of tokamax's tables, not a tuned table: kernels.tokamax_cache.overlay (or install) hands its "
            "folder to tokamax"
        )
    return f"not a tilesweep tuned table (want format {as_json(FORMAT)})"
