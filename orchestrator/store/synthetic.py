"""Synthetic results, for benchmarks and tests: records a worker would write, and whole documents.

Why it lives in the store: it is made of the store's and the planner's own parts (the real
planner expands the spec, records carry the reference fields and the planner's error text for
pruned and invalid items), so a change to any of them changes what it builds. ``bench/`` and
``tests/`` both use it and may not import each other; one copy here keeps their data alike.

``document`` builds a results document in memory, as the merger would write it for a finished
sweep (the ``tilesweep`` block included), optionally with some items left out (missing) and
some runnable ones failed, for the report page at thousands of problems.
"""

from __future__ import annotations

import random
from typing import Any

from orchestrator.planning import RUN, WorkItem, expand
from orchestrator.spec.model import SweepSpec, env_fingerprint

DEVICE = {
    "jax": "0.11.2",
    "backend": "gpu",
    "devices": ["cuda:0"],
    "python": "3.13.18",
    "device_kind": "NVIDIA H100",
    "jaxlib": "0.11.2",
}
TIMER = "wall_clock+block_until_ready"
RUNTIME_ERROR = "JaxRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 344064"


def record_for(item: WorkItem, rng: random.Random) -> dict[str, Any]:
    """The record a worker would write for ``item``: made-up timings for a runnable item, the
    planner's reason (and shared-memory bytes) for a pruned or invalid one."""
    rec = item.record_fields()
    if item.kind != RUN:
        rec["error"] = item.reason
        if item.kind == "pruned":
            rec["pruned"] = True
            rec["smem_bytes"] = item.smem_bytes
        return rec
    flops = 4.0 * item.batch * item.heads * item.seq * item.seq * item.head_dim
    med = flops / 300e12 * 1e3 * rng.uniform(0.8, 3.0) * (3.5 if item.mode == "fwd_bwd" else 1.0)
    rec.update(
        rel_err=rng.uniform(5e-4, 4e-3),
        compile_s=rng.uniform(0.1, 1.5),
        inner=max(1, min(200, int(50 / (med + 0.1)))),
        median_ms=med,
        q1_ms=med * rng.uniform(0.97, 1.0),
        q3_ms=med * rng.uniform(1.0, 1.05),
        timer=TIMER,
    )
    return rec


def problems_spec(n_seqs: int = 50, **over: Any) -> dict[str, Any]:
    """A spec of ``2 dtypes x 10 head_dims x n_seqs seqs x 2 modes`` problems (2,000 by default)
    with the reference grids: 54 fwd and 48 fwd_bwd configs per shape, the large head_dims
    partly pruned by the shared-memory model."""
    spec: dict[str, Any] = {
        "output": "attention_tiles.json",
        "tag": "h100_nvl",
        "dtypes": ["bfloat16", "float32"],
        "head_dims": [16, 32, 48, 64, 80, 96, 112, 128, 192, 256],
        "seq_lens": [256 * k for k in range(1, n_seqs + 1)],
        "modes": ["fwd", "fwd_bwd"],
    }
    spec.update(over)
    return spec


def document(
    spec_data: dict[str, Any],
    *,
    seed: int = 0,
    missing: float = 0.0,
    failed: float = 0.0,
    merged: str = "2026-01-02T03:04:05+00:00",
) -> dict[str, Any]:
    """The results document of a finished sweep of ``spec_data``: a record per item, in plan
    order, except a ``missing`` share of the forced items (dropped at random), with a ``failed``
    share of the runnable ones recorded as a runtime error instead of a timing."""
    spec = SweepSpec.model_validate(spec_data)
    rng = random.Random(seed)
    items = expand(spec)
    results = []
    for it in items:
        if it.config == "forced" and missing and rng.random() < missing:
            continue
        if it.kind == RUN and it.config == "forced" and failed and rng.random() < failed:
            results.append({**it.record_fields(), "error": RUNTIME_ERROR})
            continue
        results.append(record_for(it, rng))
    block = {
        "sweep_dir": "sweeps/synthetic",
        "fingerprint": spec.fingerprint(),
        "env": env_fingerprint(DEVICE),
        "merged": merged,
        "planned": len(items),
        "spec": spec.model_dump(mode="json"),
        "attempts": {
            "u0": [
                {
                    "attempt": 1,
                    "host": "gpu-node-17",
                    "pid": 4242,
                    "slurm_job_id": "1234567_0",
                    "started": "2026-01-01T22:00:00+00:00",
                }
            ]
        },
    }
    device = {k: DEVICE[k] for k in ("jax", "backend", "devices", "python", "device_kind")}
    return {"device": device, "config": spec.reference_config(), "results": results, "tilesweep": block}
