"""Run one unit of a sweep on this node: ``python -m jobs.worker SWEEP_DIR UNIT_ID``.

Knows nothing of SLURM: dispatch calls ``run_unit`` (through submitit) or a user runs it
by hand. Each finished config is appended to the unit's partial file at once (flushed and
fsynced), so a kill loses at most the config in flight; a rerun skips what is recorded.
The completion marker is written atomically at the end.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import logging
import os
import platform
import socket
import sys
import time
from typing import Any

from orchestrator.errors import TilesweepError
from orchestrator.partials import PartialWriter, read_partial
from orchestrator.plan import RUN
from orchestrator.schema import SCHEMA_VERSION, env_fingerprint
from orchestrator.sweepdir import SweepDir, atomic_write_json, now_iso

from . import measure

log = logging.getLogger(__name__)

# The config in flight, so a preemption handler can mark it abandoned (not a crash).
_IN_FLIGHT: dict[str, Any] = {}


def abandon_in_flight() -> str | None:
    """Record that the config in flight is given up on purpose (preemption, time-limit
    warning), so it is not counted as a config that killed its worker. Returns its id."""
    writer, item, attempt = (_IN_FLIGHT.get(k) for k in ("writer", "item", "attempt"))
    if writer is None or item is None:
        return None
    writer.write({"abandon": item, "attempt": attempt})
    _IN_FLIGHT["item"] = None
    return item


def device_block() -> dict[str, Any]:
    """The reference document's ``device`` block, plus jaxlib (part of the fingerprint)."""
    import jax

    devices = jax.devices()
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in devices],
        "python": platform.python_version(),
        "device_kind": devices[0].device_kind,
        "jaxlib": importlib.metadata.version("jaxlib"),
    }


def run_unit(sweep_dir: str, unit_key: str, *, stop_check: Any = None) -> dict[str, Any]:
    """Run every item of the unit that has no record yet; return a summary.

    ``stop_check()`` (optional) is polled between configs; when it returns True the worker
    stops cleanly after the config in flight (used on preemption warnings).
    """
    sd = SweepDir.open(sweep_dir)
    unit_id = sd.resolve_unit(unit_key)
    items = sd.unit_items(unit_id)
    spec = sd.spec
    device = device_block()
    sd.check_env(env_fingerprint(device))

    path = sd.partial_path(unit_id)
    existing = read_partial(path)
    attempt = existing.attempts + 1
    todo = [it for it in items if it.id not in existing.records]
    log.info("unit %s attempt %d: %d of %d items to do", unit_id, attempt, len(todo), len(items))
    started = time.perf_counter()
    done = errors = 0
    stopped = False
    with PartialWriter(path) as w:
        w.write({"header": {
            "schema": SCHEMA_VERSION, "unit": unit_id, "sweep": spec.fingerprint(), "attempt": attempt,
            "device": device, "env": env_fingerprint(device), "host": socket.gethostname(), "pid": os.getpid(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "started": now_iso(),
        }})
        for _, group in itertools.groupby(todo, key=lambda it: it.shape):
            ctx: measure.ShapeContext | None = None
            for it in group:
                if stop_check is not None and stop_check():
                    stopped = True
                    break
                if it.kind != RUN:
                    rec = measure.skipped_record(it)
                elif existing.starts[it.id] >= spec.executor.max_config_attempts:
                    rec = measure.crashed_record(it, existing.starts[it.id])
                else:
                    w.write({"start": it.id, "attempt": attempt})
                    _IN_FLIGHT.update(writer=w, item=it.id, attempt=attempt)
                    if ctx is None:
                        ctx = measure.ShapeContext.make(it, spec)
                    rec = measure.measure_item(it, ctx, spec)
                    _IN_FLIGHT["item"] = None
                w.write({"id": it.id, "attempt": attempt, "record": rec})
                done += 1
                errors += "error" in rec
                log.info("unit %s: %d/%d %s", unit_id, done, len(todo), "error" if "error" in rec else "ok")
            if stopped:
                break
    _IN_FLIGHT.clear()
    summary = {
        "unit": unit_id, "attempt": attempt, "done": done, "errors": errors,
        "total": len(items), "already": len(items) - len(todo), "stopped": stopped,
        "wall_s": round(time.perf_counter() - started, 3),
    }
    if not stopped:
        atomic_write_json(sd.marker_path(unit_id), {**summary, "finished": now_iso()})
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.worker", description="Run one unit of a tilesweep sweep.")
    parser.add_argument("sweep_dir")
    parser.add_argument("unit", help="unit id, id prefix, or position in the sweep's unit index")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    try:
        summary = run_unit(args.sweep_dir, args.unit)
    except TilesweepError as exc:
        print(f"tilesweep worker: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    print(f"unit {summary['unit']}: {summary['done']} records written ({summary['errors']} errors), "
          f"{summary['already']} already done, {summary['wall_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
