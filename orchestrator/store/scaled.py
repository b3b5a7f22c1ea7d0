"""A results document for every item of a spec, scaled from a document that measured fewer.

Replaying a full-size sweep needs a source with a record of every config; the reference run's
excerpt measured three problems. ``scaled_document`` fills the rest in, deterministically, so
benches and tests can replay sweeps of any size (this is how ``bench/halving.py`` builds the
832-record source of the reference config):

- a config the source measured is copied as it is;
- a config the shared-memory model predicts over the limit gets the error the reference run
  recorded for such configs (``RESOURCE_EXHAUSTED ... requested N``, N from the model, which
  matched all 72 of the reference run's failures), an invalid one its planner error;
- any other config takes the record of the same config (mode, tiles, stages, warps) in the
  measured problem closest to its own (of the same mode, a success first: the model says the
  config runs; then same dtype, same head_dim, nearest seq), with the times scaled by the ratio
  of FLOPs and of the cost model's throughput per dtype; its spread (q1/q3 relative to the median), rel_err and
  compile_s are the template's. ``auto`` likewise from the measured problems' auto records.

What it leaves out: how real tile rankings change with shape (a scaled problem ranks its configs
as its template problem does), and failures other than shared memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orchestrator.planning import INVALID, PRUNED, WorkItem, expand
from orchestrator.planning.costs import DEFAULT, flops
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import DEFAULT_IMPL, RESULT_FIELDS, config_fields
from orchestrator.store.document import ResultsDoc

SMEM_ERROR = (
    "JaxRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested {nbytes}, "
    "available: {limit}, context: []"
)

_Problem = tuple[str, int, int, str]  # dtype, head_dim, seq, mode


def _templates(results: Iterable[dict[str, Any]]) -> dict[_Problem, dict[tuple, dict[str, Any]]]:
    """Measured records per problem, by config (``()`` for auto)."""
    out: dict[_Problem, dict[tuple, dict[str, Any]]] = {}
    for rec in results:
        problem = (rec["dtype"], rec["head_dim"], rec["seq"], rec["mode"])
        fields = config_fields(rec["mode"], impl=rec.get("impl", DEFAULT_IMPL))
        params = () if rec["config"] == "auto" else tuple(rec.get(f) for f in fields)
        out.setdefault(problem, {})[params] = rec
    return out


def _closest(item: WorkItem, templates: dict[_Problem, dict[tuple, dict[str, Any]]]) -> tuple[_Problem, dict] | None:
    """The measured problem (and its record of the item's config) to scale the item from."""
    ranked = sorted(
        (p for p in templates if p[3] == item.mode and item.params in templates[p]),
        key=lambda p: (
            "error" in templates[p][item.params],
            p[0] != item.dtype,
            p[1] != item.head_dim,
            abs(p[2] - item.seq),
            p,
        ),
    )
    return (ranked[0], templates[ranked[0]][item.params]) if ranked else None


def _scaled(item: WorkItem, problem: _Problem, template: dict[str, Any], batch: int, heads: int) -> dict[str, Any]:
    rec = item.record_fields()
    if "error" in template:
        rec["error"] = template["error"]
        return rec
    dtype, head_dim, seq, mode = problem
    ratio = flops(item.mode, item.batch, item.heads, item.seq, item.head_dim) / flops(mode, batch, heads, seq, head_dim)
    ratio *= DEFAULT.throughput(dtype) / DEFAULT.throughput(item.dtype)
    for field in RESULT_FIELDS:
        if field in template:
            rec[field] = template[field] * ratio if field.endswith("_ms") else template[field]
    return rec


def scaled_document(spec: SweepSpec, measured: ResultsDoc) -> dict[str, Any]:
    """A results document (``{device, config, results}``) with one record per item of ``spec``."""
    batch = int(measured.config.get("batch", spec.batch))
    heads = int(measured.config.get("heads", spec.heads))
    templates = _templates(measured.results)
    limit = spec.smem_limit_bytes
    results = []
    for item in expand(spec.model_copy(update={"kernel": spec.kernel.model_copy(update={"prune_smem": "predict"})})):
        rec = item.record_fields()
        if item.kind == PRUNED:
            rec["error"] = SMEM_ERROR.format(nbytes=item.smem_bytes, limit=limit)
        elif item.kind == INVALID:
            rec["error"] = str(item.reason)
        else:
            found = _closest(item, templates)
            if found is None:
                rec["error"] = "ReplayMissing: no measured record of this config to scale from"
            else:
                rec = _scaled(item, found[0], found[1], batch, heads)
        results.append(rec)
    return {"device": dict(measured.device), "config": spec.reference_config(), "results": results}
