"""The results document a replayed sweep takes its measurements from (``replay.source``).

A replay source must be a results document (read by ``document.load``, the one reader) that
measured this spec's problems: its config block is a sweep spec with the same batch, heads and
forward tiles of fwd_bwd configs, the kernel implementation the replay names (``replay.impl``),
and every axis value of the replayed spec (dtypes, head_dims, seq_lens, modes, causal, kv_heads,
the tile grids) among its own. A subset is fine (replay the excerpt's problems
of a larger run); another spec is refused in one line, before anything is planned or run.

Records are looked up by ``spec.records.record_key``: identity and config fields without the
tag, which labels a sweep and is not part of what was timed. Of several records of one
config, the last in the document wins (a merged document holds one per config).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernels import impls
from kernels.spelling import as_json
from orchestrator.errors import ResultsError, SpecError
from orchestrator.planning.grids import axis_values
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import record_key
from orchestrator.store.document import load

ROLE = "replay.source"
# Axes whose every value in the replayed spec must be one the source measured.
AXES = (
    "dtypes",
    "head_dims",
    "seq_lens",
    "modes",
    "causal",
    "fwd_block_q",
    "fwd_block_k",
    "fwd_stages",
    "fwd_warps",
    "bwd_outer",
    "bwd_inner",
    "bwd_stages",
    "bwd_warps",
)


@dataclass
class ReplaySource:
    """A loaded and checked replay source: its device block and its records by identity."""

    path: str
    device: dict[str, Any]
    records: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)

    def find(self, rec: Mapping[str, Any]) -> dict[str, Any] | None:
        """The source's record of the config that ``rec`` (identity and config fields) names."""
        return self.records.get(record_key(rec))


def mismatch(spec: SweepSpec, source: SweepSpec) -> str | None:
    """What makes ``source`` (a source document's config block) another spec than ``spec``."""
    for name in ("batch", "heads"):
        mine, theirs = getattr(spec, name), getattr(source, name)
        if mine != theirs:
            return f"its {name}={theirs}, this spec's {name}={mine}"
    if "fwd_bwd" in spec.modes and spec.forward_blocks != source.forward_blocks:
        fb = spec.forward_blocks
        sb = source.forward_blocks
        return (
            f"its fwd_bwd configs use forward tiles {sb.block_q}/{sb.block_k}, this spec's "
            f"{fb.block_q}/{fb.block_k} (bwd_fwd_config)"
        )
    if spec.measured_impl != source.measured_impl:
        return (
            f"it measured the {source.measured_impl} kernel, this replay's replay.impl is {spec.measured_impl}: "
            f'set "replay": {{"impl": "{source.measured_impl}"}}'
        )
    for axis in AXES:
        extra = [v for v in getattr(spec, axis) if v not in getattr(source, axis)]
        if extra:
            return f"this spec's {axis} {extra} were not measured by it (its {axis}: {getattr(source, axis)})"
    why = _grid_mismatch(spec, source)
    if why is not None:
        return why
    kv_mine, kv_theirs = _group_counts(spec), _group_counts(source)
    if kv_mine - kv_theirs:
        return (
            f"this spec's kv_heads {sorted(kv_mine - kv_theirs)} were not measured by it "
            f"(its kv_heads: {sorted(kv_theirs)})"
        )
    return None


def _grid_mismatch(spec: SweepSpec, source: SweepSpec) -> str | None:
    """A tunable value this spec sweeps that the source's grid did not (its ``grid`` section, or
    the implementation's defaults: ``planning.grids.axis_values``)."""
    for mode in spec.modes:
        for t in impls.get(spec.measured_impl).tunables(mode):
            mine, where = axis_values(spec, mode, t.name)
            theirs, _ = axis_values(source, mode, t.name)
            extra = [v for v in mine if v not in theirs]
            if extra:
                return f"this spec's {mode} {t.name} {extra} ({where}) were not measured by it (its values: {theirs})"
    return None


def _group_counts(spec: SweepSpec) -> set[int]:
    """The spec's kv_heads values, multi-head attention (null, or equal to heads) as ``heads``."""
    return {spec.heads if v is None else v for v in spec.kv_heads}


def load_source(spec: SweepSpec) -> ReplaySource:
    """Read and check ``spec.replay.source``; ``ResultsError`` (one line) when it is not a
    results document or is one of another spec."""
    from orchestrator.spec.files import spec_from_data

    if spec.replay is None:
        raise ResultsError("kernel.impl is not replay: there is no replay source to load")
    path = os.fspath(spec.replay.source)
    doc = load(path, role=ROLE)
    try:
        measured = spec_from_data(dict(doc.config), source=f"{ROLE} {path}")
    except SpecError as exc:
        raise ResultsError(
            f"{exc.message}: its config block is not a sweep spec, so what it measured is "
            "unknown; replay a results document of tilesweep or of the reference run"
        ) from None
    why = mismatch(spec, measured)
    held = {r.get("impl", impls.DEFAULT_IMPL) for r in doc.results if isinstance(r, dict)}
    if why is not None and "kernel" not in doc.config and held == {spec.measured_impl} != {measured.measured_impl}:
        why = (  # a hand-made or another tool's block: its records say what they measured, its block does not
            f"its records are of kernel.impl {as_json(spec.measured_impl)}, but its config block names no "
            "kernel.impl (so "
            f'tilesweep\'s kernel): add "kernel": {{"impl": "{spec.named_impl}"}} to its config block'
        )
    if why is not None:
        raise ResultsError(
            f"{ROLE} {path} is a results document of another spec: {why}; replay a document "
            "that measured this spec's problems and configs"
        )
    out = ReplaySource(path, dict(doc.device))
    for rec in doc.results:
        try:
            out.records[record_key(rec)] = rec
        except TypeError:  # an unhashable value in an identity field: not a record to replay
            continue
    return out
