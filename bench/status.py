"""How fast `tilesweep status` reads a sweep of 10,000 units.

Builds a real sweep directory of 10,000 units of 100 items (``orchestrator/store/synthetic.py``:
the spec expands to 1,000,000 items) in the middle of its run: 6,000 units done (full partial and a
completion marker stamped with it, as the worker writes it), 500 running (half a partial), 300
ended unfinished (a quarter), 3,200 not started (no partial); ``jobs.jsonl`` holds one SLURM job
per unit (arrays of 1,000) and a final merge job. SLURM is not asked (``TILESWEEP_SLURM_QUERIES=0``):
the figure is the sweep directory's share, which is what grows with the sweep (the scheduler is
asked once per call, by array id, whatever the number of units).

Times (each a median of ``--runs``, but for the first):

- ``status_10k_units_s``: ``sweep_status`` plus the text rendering, in this process, asked
  again and again as ``wait`` and ``run``'s progress line ask (and as the command does, leaving
  the tally file): a running unit's partial is read from where the last count stopped
  (``store.tally``), here nothing was appended since;
- ``status_10k_units_first_s``: the first of those, with no tally file in the sweep directory,
  which reads the 800 unfinished partials whole (and leaves the tally file);
- ``status_10k_units_cli_s``: the whole ``tilesweep status DIR`` command in a new process
  (interpreter start and imports included), with the tally file the status before it left
  (``store.tally_file``), here nothing appended since: what a user asking again sees;
- ``status_10k_units_json_cli_s``: the same with ``--json`` (every unit listed);
- ``status_10k_units_cold_cli_s``: the command with the tally file deleted before each run: the
  first status of a sweep from any process, which reads the unfinished partials whole.

Status counts what merge would accept: a done unit costs a stat and its small marker, the 800
unfinished units' partials are parsed with the merger's classifier (what the cold figures
mostly are), or only what they gained since the tally file was written (nothing here: the
figures leave out the lines a live sweep appends between two statuses, each read once).

Run: ``.venv/bin/python -m bench.status [--units 10000] [--runs 5] [--dir DIR]``. The first
run reads the partials from disk if the page cache lost them; the median is the warm figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.control.status import format_status, sweep_status
from orchestrator.planning import RUN
from orchestrator.store.sweepdir import SweepDir, now_iso
from orchestrator.store.synthetic import build_sweep, million_spec, partial_lines
from orchestrator.store.tally_file import tally_path

ROOT = Path(__file__).resolve().parent.parent
ITEMS_PER_UNIT = 100


def build(root: Path, n_units: int, seed: int = 0) -> SweepDir:
    """The sweep directory described in the module docstring (n_units units of 100 items)."""
    n_seqs = max(1, n_units // 100)
    spec = million_spec(seq_lens=[128 * k for k in range(1, n_seqs + 1)])
    sd, units = build_sweep(root, spec, n_units, seed=seed, write_partials=False)
    rng = random.Random(seed)
    kinds = ["done"] * 60 + ["running"] * 5 + ["ended"] * 3 + ["pending"] * 32
    t0 = time.time() - 3600
    entries = []
    for k, unit in enumerate(units):
        kind = kinds[k % len(kinds)]
        array, task = 1000 + k // 1000, k % 1000
        entries.append(
            {
                "unit": unit.id,
                "executor": "slurm",
                "job_id": f"{array}_{task}",
                "array_id": str(array),
                "task": task,
                "attempt": 1,
                "origin": "submit",
                "submitted": now_iso(),
                "submitted_ts": t0,
                "stdout": str(sd.logs / f"{array}_{task}_0_log.out"),
                "stderr": str(sd.logs / f"{array}_{task}_0_log.err"),
            }
        )
        if kind == "pending":
            continue
        lines = partial_lines(sd, unit, rng)
        keep = {"done": len(lines), "running": len(lines) // 2, "ended": len(lines) // 4}[kind]
        sd.partial_path(unit.id).write_text("\n".join(lines[:keep]) + "\n")
        if kind == "done":  # the marker as the worker writes it: stamped with the partial it vouches for
            errors = sum(it.kind != RUN for it in unit.items)  # pruned and invalid items are error records
            st = sd.partial_path(unit.id).stat()
            partial = {"stat": [st.st_ino, st.st_size, st.st_mtime_ns], "records": len(unit.items), "errors": errors}
            marker = {
                "unit": unit.id,
                "attempt": 1,
                "done": len(unit.items),
                "errors": errors,
                "total": len(unit.items),
                "already": 0,
                "stopped": False,
                "wall_s": 600.0,
                "partial": partial,
                "finished": now_iso(),
            }
            sd.marker_path(unit.id).write_text(json.dumps(marker))
    entries.append(
        {
            "event": "merge_job",
            "job_id": str(1000 + n_units // 1000 + 1),
            "after": [],
            "submitted": now_iso(),
            "submitted_ts": t0,
        }
    )
    sd.record_jobs(entries)
    return sd


def _in_process(sd_root: Path, runs: int) -> tuple[list[float], str]:
    """The seconds of each of ``runs`` statuses in this process, in order (the first with no tally
    file), and the last text."""
    times, text = [], ""
    tally_path(sd_root).unlink(missing_ok=True)
    for _ in range(runs):
        t = time.perf_counter()
        st = sweep_status(SweepDir.open(sd_root), query_slurm=False, keep_tally=True)
        text = format_status(st)
        times.append(time.perf_counter() - t)
    return times, text


def _median_cli(sd_root: Path, runs: int, *extra: str, cold: bool = False) -> float:
    """The median seconds of ``runs`` status commands (``cold``: each with no tally file)."""
    env = {**os.environ, "TILESWEEP_SLURM_QUERIES": "0"}
    times = []
    for _ in range(runs):
        if cold:
            tally_path(sd_root).unlink(missing_ok=True)
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "orchestrator", "status", str(sd_root), *extra],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--units", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--dir", help="build the sweep here (kept); default: a temp dir, removed")
    args = p.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tilesweep-bench-status-"))
    try:
        root = base / "sweep"
        if not (root / "sweep.json").exists():
            t = time.perf_counter()
            build(root, args.units)
            print(f"# built {args.units} units in {time.perf_counter() - t:.1f} s: {root}", file=sys.stderr)
        in_process, text = _in_process(root, args.runs)
        head = text.splitlines()[:2]
        print("# " + "\n# ".join(head), file=sys.stderr)
        label = "10k" if args.units == 10_000 else str(args.units)
        print(f"status_{label}_units_s={statistics.median(in_process):.3f}")
        print(f"status_{label}_units_first_s={in_process[0]:.3f}")
        print(f"status_{label}_units_cli_s={_median_cli(root, args.runs):.3f}")
        print(f"status_{label}_units_json_cli_s={_median_cli(root, args.runs, '--json'):.3f}")
        print(f"status_{label}_units_cold_cli_s={_median_cli(root, args.runs, cold=True):.3f}")
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
