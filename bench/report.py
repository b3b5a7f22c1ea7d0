"""How long `tilesweep report` takes on a 1,000,000-record results document.

Synthesises a document shaped like the reference run (same record fields and key order, auto
record then forced grid per problem, ~9% failed configs with the real error text, indent=1 as
the merger writes), but with many problems: 2 dtypes x 4 head_dims x 8 seqs x 4 batches x
4 head counts x 2 modes x 4 tags, fwd grid 4x4x4x2 and fwd_bwd grid 4x5x3x2, cut at exactly
N records. Times ``load`` and ``load + best_table`` (best of --repeat, in a fresh process)
and prints:

    records=1000000 problems=8000 file_mb=... parser=orjson|json
    load_1m_records_s=X
    report_1m_records_s=X
    (and, with orjson installed, the stdlib-only times and the ratio that justifies it)

Run: ``.venv/bin/python -m bench.report [--records N] [--repeat R] [--doc RESULTS]``
(``--doc`` times an existing document instead; the names of the printed keys stay the same).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.analysis import report
from orchestrator.store import document as results_doc

DTYPES = ("bfloat16", "float32")
HEAD_DIMS = (32, 64, 128, 256)
SEQS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
BATCHES = (1, 2, 4, 8)
HEADS = (4, 8, 16, 32)
MODES = ("fwd", "fwd_bwd")
TAGS = ("h100_nvl", "a100_80g", "h200_sxm", "l40s")
FWD_GRID = dict(block_q=(32, 64, 128, 256), block_k=(32, 64, 128, 256), num_stages=(1, 2, 3, 4), num_warps=(4, 8))
BWD_GRID = dict(bwd_outer=(32, 64, 128, 256), bwd_inner=(16, 32, 64, 128, 256), num_stages=(1, 2, 3), num_warps=(4, 8))
SMEM_ERROR = "JaxRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested {n}, available: 232448"


def _timing(rng: random.Random, base: float) -> dict[str, Any]:
    med = base * rng.uniform(0.8, 3.0)
    inner = max(1, min(200, int(50 / (med + 0.1))))
    return {
        "rel_err": rng.uniform(5e-4, 4e-3),
        "compile_s": rng.uniform(0.1, 1.5),
        "inner": inner,
        "median_ms": med,
        "q1_ms": med * rng.uniform(0.97, 1.0),
        "q3_ms": med * rng.uniform(1.0, 1.05),
    }


def synth_records(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    made = 0
    for tag, dtype, d, s, b, h in itertools.product(TAGS, DTYPES, HEAD_DIMS, SEQS, BATCHES, HEADS):
        base_fwd = 4.0 * b * h * s * s * d / 300e12 * 1e3  # ms at ~300 TFLOP/s
        ident = {"dtype": dtype, "head_dim": d, "seq": s, "batch": b, "heads": h, "tag": tag}
        for mode in MODES:
            base = base_fwd * (3.5 if mode == "fwd_bwd" else 1.0)
            yield {**ident, "mode": mode, "config": "auto", **_timing(rng, base * 1.1)}
            made += 1
            if made >= n:
                return
            grid = FWD_GRID if mode == "fwd" else BWD_GRID
            for values in itertools.product(*grid.values()):
                cfg = dict(zip(grid, values, strict=True))
                if mode == "fwd_bwd":
                    cfg = {"fwd_block_q": 128, "fwd_block_k": 128, **cfg}
                rec = {**ident, "mode": mode, "config": "forced", **cfg}
                if rng.random() < 0.09:
                    rec["error"] = SMEM_ERROR.format(n=rng.randrange(232449, 400000))
                else:
                    rec.update(_timing(rng, base))
                yield rec
                made += 1
                if made >= n:
                    return
    if made < n:
        raise ValueError(f"grid too small for {n=} records (made {made})")


def write_doc(path: str, n: int) -> None:
    doc = {
        "device": {
            "jax": "0.11.2",
            "backend": "gpu",
            "devices": ["cuda:0"],
            "python": "3.13.18",
            "device_kind": "NVIDIA H100",
        },
        "config": {"batch": 4, "heads": 8, "repeats": 5, "tag": "synthetic"},
        "results": list(synth_records(n)),
    }
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)


def _best_of(repeat: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        del out  # freeing a million dicts is not part of the work (a CLI exits instead)
    return best


def time_doc(path: str, repeat: int) -> None:
    """Time one document in this process and print the result lines."""
    parser = "orjson" if results_doc._orjson is not None else "json"
    doc = results_doc.load(path)
    n_records, n_problems = len(doc.results), len(report.best_table(doc))
    del doc
    mb = os.path.getsize(path) / 1e6
    print(f"records={n_records} problems={n_problems} file_mb={mb:.0f} parser={parser}")

    def load_and_report() -> object:
        doc = results_doc.load(path)
        return doc, report.best_table(doc)

    load_s = _best_of(repeat, lambda: results_doc.load(path))
    total_s = _best_of(repeat, load_and_report)
    print(f"load_1m_records_s={load_s:.2f}")
    print(f"report_1m_records_s={total_s:.2f}")

    if results_doc._orjson is not None:
        saved, results_doc._orjson = results_doc._orjson, None
        try:
            std_load = _best_of(repeat, lambda: results_doc.load(path))
            std_total = _best_of(repeat, load_and_report)
        finally:
            results_doc._orjson = saved
        print(f"stdlib_load_1m_records_s={std_load:.2f}")
        print(f"stdlib_report_1m_records_s={std_total:.2f}")
        print(f"orjson_speedup_load={std_load / load_s:.2f}x orjson_speedup_report={std_total / total_s:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--doc", help="time this results document instead of synthesising one")
    args = ap.parse_args()
    if args.doc:
        time_doc(args.doc, args.repeat)
        return
    with tempfile.TemporaryDirectory(prefix="tilesweep-bench-") as tmp:
        path = os.path.join(tmp, "results.json")
        t0 = time.perf_counter()
        write_doc(path, args.records)
        print(f"synth_s={time.perf_counter() - t0:.1f}", flush=True)
        # Time in a fresh process: the synthesis leaves a fragmented heap that slows the
        # first load by a third, which a user running `tilesweep report` never sees.
        subprocess.run([sys.executable, "-m", "bench.report", "--doc", path, "--repeat", str(args.repeat)], check=True)


if __name__ == "__main__":
    main()
