"""A sweep directory with synthetic partials written through the real protocol, for
benchmarks and tests.

Why it lives in the store: it is made of the store's own parts (``SweepDir`` writes the
sweep directory, ``lines`` builds and encodes the lines, the header carries the schema version
and environment fingerprint the readers check), so a change to any of them changes what it
writes, in the same package and under the same type check. ``bench/`` and ``tests/`` both
build sweeps with it and may not import each other; one copy here keeps their data alike.

``build_sweep`` plans a real spec with the real planner, writes the sweep directory (sweep.json,
units, env.json) and fills each unit's partial the way the worker does: a header, then per
item a ``start`` line (runnable items) and a record line. Records have the reference fields,
realistic values (times, rel_err, inner as the reference run sized it) and the real error text
of pruned and invalid items, so a merge of them takes the real path. Units group whole shapes,
several per unit, in shuffled order, as the planner's packing does, so the merger has to
interleave units to reach plan order. Lines are written in one go without fsync (a worker
fsyncs each): what is tested is what the files hold, not how they got there.

``document`` builds a results document in memory, as the merger would write it for a finished
sweep (the ``tilesweep`` block included), optionally with some items left out (missing) and
some runnable ones failed: the report page's tests and bench at thousands of problems
(``problems_spec``: 2,000 problems).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from orchestrator.planning import RUN, Unit, WorkItem, expand
from orchestrator.spec.compat import env_fingerprint
from orchestrator.spec.model import SweepSpec
from orchestrator.store.files import now_iso
from orchestrator.store.lines import (
    DeviceBlock,
    HeaderLine,
    document_device,
    encode_line,
    header_line,
    partial_header,
    record_line,
    start_line,
)
from orchestrator.store.provenance import AttemptEntry, MergedDocument, tilesweep_block
from orchestrator.store.sweepdir import SweepDir

DEVICE: DeviceBlock = {
    "jax": "0.11.2",
    "backend": "gpu",
    "devices": ["cuda:0"],
    "python": "3.13.18",
    "device_kind": "NVIDIA H100",
    "jaxlib": "0.11.2",
}
TIMER = "wall_clock+block_until_ready"
RUNTIME_ERROR = "JaxRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 344064"


def million_spec(**over: Any) -> dict[str, Any]:
    """A spec of exactly 1,000,000 items: 2 dtypes x 50 head_dims x 100 seqs = 10,000 shapes,
    each 2 auto + 90 fwd (3x3x5x2) + 8 fwd_bwd (2x2x2x1) configs (stages stay within the 1..8 a
    spec allows)."""
    spec: dict[str, Any] = {
        "output": "attention_tiles.json",
        "tag": "h100_nvl",
        "dtypes": ["bfloat16", "float32"],
        "head_dims": list(range(16, 116, 2)),
        "seq_lens": [128 * k for k in range(1, 101)],
        "modes": ["fwd", "fwd_bwd"],
        "fwd_block_q": [32, 64, 128],
        "fwd_block_k": [32, 64, 128],
        "fwd_stages": [1, 2, 3, 4, 5],
        "fwd_warps": [4, 8],
        "bwd_outer": [32, 64],
        "bwd_inner": [16, 32],
        "bwd_stages": [1, 2],
        "bwd_warps": [4],
    }
    spec.update(over)
    return spec


def small_spec(n_seqs: int = 4, **over: Any) -> dict[str, Any]:
    """The same shape of spec, small: 2 x 2 x n_seqs shapes of 100 items."""
    return million_spec(head_dims=[32, 64], seq_lens=[128 * k for k in range(1, n_seqs + 1)], **over)


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
) -> MergedDocument:
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
    attempt: AttemptEntry = {
        "attempt": 1,
        "host": "gpu-node-17",
        "pid": 4242,
        "slurm_job_id": "1234567_0",
        "started": "2026-01-01T22:00:00+00:00",
    }
    block = tilesweep_block(
        sweep_dir="sweeps/synthetic",
        spec=spec,
        env=env_fingerprint(DEVICE),
        merged=merged,
        planned=len(items),
        attempts={"u0": [attempt]},
    )
    return {
        "device": document_device(DEVICE),
        "config": spec.reference_config(),
        "results": results,
        "tilesweep": block,
    }


def header(
    sd: SweepDir,
    unit: str,
    attempt: int,
    device: DeviceBlock = DEVICE,
    *,
    host: str = "gpu-node-17",
    pid: int = 4242,
    slurm_job_id: str | None = "1234567_3",
) -> HeaderLine:
    """An attempt's header line, as the worker writes it (host, pid and job as given)."""
    return header_line(
        partial_header(
            unit=unit,
            sweep=sd.spec.fingerprint(),
            attempt=attempt,
            device=device,
            env=env_fingerprint(device),
            host=host,
            pid=pid,
            slurm_job_id=slurm_job_id,
            started=now_iso(),
        )
    )


def partial_lines(sd: SweepDir, unit: Unit, rng: random.Random, attempt: int = 1) -> list[str]:
    """The lines a worker writes for a whole unit in one attempt."""
    lines = [encode_line(header(sd, unit.id, attempt))]
    for it in unit.items:
        if it.kind == RUN:
            lines.append(encode_line(start_line(it.id, attempt)))
        lines.append(encode_line(record_line(it.id, attempt, record_for(it, rng))))
    return lines


def shape_units(items: list[WorkItem], n_units: int, rng: random.Random, sweep: str = "") -> list[Unit]:
    """``n_units`` units of whole shapes, shapes dealt in shuffled order, items in plan order."""
    shapes: dict[tuple[Any, ...], list[WorkItem]] = {}
    for it in items:
        shapes.setdefault(it.shape, []).append(it)
    groups = list(shapes.values())
    rng.shuffle(groups)
    per = -(-len(groups) // n_units)
    units = []
    for k in range(n_units):
        chunk = sorted((it for g in groups[k * per : (k + 1) * per] for it in g), key=lambda it: it.index)
        if chunk:
            units.append(Unit(k, chunk))
    units.sort(key=lambda u: u.items[0].index)
    for k, u in enumerate(units):
        u.index = k
        u.finalize(sweep)
    return units


def build_sweep(
    root: Path,
    spec_data: dict[str, Any],
    n_units: int,
    *,
    seed: int = 0,
    write_partials: bool | list[int] = True,
    output: Path | None = None,
) -> tuple[SweepDir, list[Unit]]:
    """Plan ``spec_data`` into ``n_units`` units of whole shapes and write the sweep
    directory; fill the partials of all units (True) or of the listed unit positions."""
    spec = SweepSpec.model_validate(spec_data)
    items = expand(spec)
    rng = random.Random(seed)
    units = shape_units(items, n_units, rng, spec.fingerprint())
    out = output or (root.parent / f"{root.name}.results.json")
    sd = SweepDir.create(root, spec, output=out, spec_source=None, planned=len(items))
    sd.add_units(units, origin="synthetic")
    sd.check_env(env_fingerprint(DEVICE))
    todo = range(len(units)) if write_partials is True else (write_partials or [])
    for k in todo:
        sd.partial_path(units[k].id).write_text("\n".join(partial_lines(sd, units[k], rng)) + "\n")
    return sd, units
