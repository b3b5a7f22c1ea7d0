"""A sweep's identity: what of a spec it measures, as its fingerprint counts it (``fingerprinted``),
and the hash of that (``canonical_hash``), which unit ids hash too.

The rule may change from one release to the next (a field that comes to count only where it is
not its default); a sweep directory keeps the fingerprint it was planned with all the same. Its
``sweep.json`` stores it, and its partials' headers, unit ids, lowering verdicts and the documents
it merged name it, so the spec a sweep directory loads answers that stored fingerprint
(``SweepSpec.keep_fingerprint``) while it still measures what it measured when loaded. Whether a
spec file is the sweep's spec is asked of the two specs under this release's rule, each hashed
afresh (``SweepSpec.same_sweep``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from kernels.impls import DEFAULT_IMPL
from orchestrator.spec import grid as grid_rules
from orchestrator.spec.sections import CheckSettings, ReplaySettings, SpecModel, TimingSettings

# The reference config block, in the reference document's key order.
REFERENCE_CONFIG_FIELDS = (
    "output",
    "append",
    "dtypes",
    "head_dims",
    "seq_lens",
    "modes",
    "batch",
    "heads",
    "repeats",
    "auto_only",
    "tag",
    "fwd_block_q",
    "fwd_block_k",
    "fwd_stages",
    "fwd_warps",
    "bwd_outer",
    "bwd_inner",
    "bwd_stages",
    "bwd_warps",
    "bwd_fwd_config",
    "smem_limit_bytes",
)

# Measurement options whose default leaves the fingerprint as it is without them: a spec that
# leaves them at their defaults has the fingerprint of the same spec that does not name them.
_ADDED_FIELDS: dict[str, tuple[type[SpecModel], tuple[str, ...]]] = {
    "timing": (TimingSettings, ("strategy", "screen_ms", "keep", "noise", "timer", "flush_l2"))
}


class Identified(Protocol):
    """What the rule reads of a spec (``SweepSpec``, whose module imports this one)."""

    @property
    def grid(self) -> grid_rules.Grid | None: ...
    @property
    def check(self) -> CheckSettings: ...
    @property
    def timing(self) -> TimingSettings: ...
    @property
    def replay(self) -> ReplaySettings | None: ...
    @property
    def sweeps_causal(self) -> bool: ...
    @property
    def sweeps_kv_heads(self) -> bool: ...
    @property
    def measured_impl(self) -> str: ...
    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


def axes(spec: Identified, dumped: dict[str, Any]) -> dict[str, Any]:
    """The grouped-query and causal axes where they are not the default (``dumped``: the spec as JSON)."""
    swept = (("causal", spec.sweeps_causal), ("kv_heads", spec.sweeps_kv_heads))
    return {k: dumped[k] for k, on in swept if on}


def fingerprinted(spec: Identified) -> dict[str, Any]:
    """Identity of what is measured: the problem and grid fields plus timing and kernel options. Executor,
    sharding, output and merge settings may change between submit and resume without invalidating records, so
    they are left out. The causal and kv_heads axes, the kernel implementation, its target device kind, the
    check section and the grid's tunables count only where they are not the default (for a tunable: what it
    sweeps without the grid), so a config block that lacks them (the reference's) and the same spec naming
    their defaults have one fingerprint."""
    dumped = spec.model_dump(mode="json")
    measured = {k: dumped[k] for k in REFERENCE_CONFIG_FIELDS if k not in ("output", "append")}
    measured.update(axes(spec, dumped))
    for section, (model, added) in _ADDED_FIELDS.items():
        measured[section] = {
            k: v for k, v in dumped[section].items() if k not in added or v != model.model_fields[k].default
        }
    grid = grid_rules.fingerprinted(spec, spec.measured_impl, spec.grid)
    if grid is not None:
        measured["grid"] = grid
    measured["kernel"] = {
        k: v for k, v in dumped["kernel"].items() if (k, v) not in (("impl", DEFAULT_IMPL), ("device_kind", None))
    }
    if spec.check != CheckSettings():  # a limit of its own: other configs are wrong results
        measured["check"] = dumped["check"]
    if spec.timing.strategy == "search":  # which configs a search measures: only a search has them
        measured["search"] = dumped["search"]
    if spec.replay is not None:  # the pace changes no record
        measured["replay"] = {k: v for k, v in dumped["replay"].items() if (k, v) != ("impl", DEFAULT_IMPL)}
        measured["replay"].pop("pace")
    return measured


def canonical_hash(obj: Any, length: int = 16) -> str:  # of the canonical JSON: sorted keys, no spaces, ASCII
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    ).hexdigest()[:length]
