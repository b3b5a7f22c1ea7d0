"""The crash trials' stand-in worker: a jax-free process that writes a unit's partial exactly as
the worker does (``PartialWriter``: header, start line, record line, then the completion
marker), cheap enough to be killed often, also mid-line (oversized lines) and right after its
last record: ``python -m tests.crash_writer SWEEP UNIT DELAY BIG_EVERY SEED``.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time

from orchestrator.planning import RUN
from orchestrator.spec.compat import env_fingerprint
from orchestrator.store.lines import PartialWriter, record_line, start_line
from orchestrator.store.markers import UnitCounts, worker_summary, write_marker
from orchestrator.store.partials import read_partial
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import DEVICE, header, record_for
from tests.crash_oracle import PY, ROOT

BIG_LINE = 4 << 20  # bytes of an oversized record line, so kills land inside its write


def writer_main(sweep_dir: str, unit_key: str, delay: float, big_every: int, seed: int) -> int:
    """run_unit without jax: same partial protocol, same skip-what-is-recorded resume."""
    rng = random.Random(seed)
    started = time.perf_counter()
    sd = SweepDir.open(sweep_dir)
    unit_id = sd.resolve_unit(unit_key)
    items = sd.unit_items(unit_id)
    sd.check_env(env_fingerprint(DEVICE))
    path = sd.partial_path(unit_id)
    existing = read_partial(path)
    attempt = existing.attempts + 1
    todo = [it for it in items if it.id not in existing.records]
    recorded = {iid: "error" in rec for iid, (_, rec) in existing.records.items()}
    counts = UnitCounts()
    with PartialWriter(path) as w:
        w.write(header(sd, unit_id, attempt))
        for n, it in enumerate(todo):
            if it.kind == RUN:
                w.write(start_line(it.id, attempt))
            time.sleep(delay * rng.random())
            rec = record_for(it, rng)
            if big_every and n % big_every == big_every - 1 and it.kind == RUN:
                rec["timer"] = "x" * BIG_LINE  # a valid record, oversized
            w.write(record_line(it.id, attempt, rec))
            recorded[it.id] = "error" in rec
            counts.done += 1
            counts.errors += "error" in rec
    summary = worker_summary(
        unit=unit_id,
        attempt=attempt,
        unit_round=1,
        total=len(items),
        already=len(items) - len(todo),
        stopped=False,
        wall_s=time.perf_counter() - started,
        counts=counts,
        clock="real",
        compile_workers=0,
        compile_mode=None,
        timer=None,
        gpu=None,
        job=None,
    )
    write_marker(sd, summary, records=len(recorded), errors=sum(recorded.values()))
    return 0


def spawn_writer(
    sd: SweepDir, unit: str, *, delay: float = 0.01, big_every: int = 0, seed: int = 0
) -> subprocess.Popen[str]:
    """Start the writer process on ``unit`` of sweep ``sd``."""
    argv = [PY, "-m", "tests.crash_writer", str(sd.root), unit, str(delay), str(big_every), str(seed)]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


if __name__ == "__main__":
    _, sweep, unit, delay, big, seed = sys.argv
    sys.exit(writer_main(sweep, unit, float(delay), int(big), int(seed)))
