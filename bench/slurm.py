"""What SLURM dispatch costs and gains on the local cluster: 1 unit vs 2 units of the same
work, a whole 4-GPU node kept busy, and how fast a cancelled pending task is seen.

Each run plans the same sweep (one shape, ``--configs`` fwd configs whose timing takes ~0.5 s
each, in interpret mode) into 1 or 2 units, and times, as a user would run them, each a new
process: ``tilesweep submit`` then ``tilesweep wait`` (which merges when every unit has
settled). The clock runs from the start of ``submit`` to the end of ``wait``: a merged
document. Runs alternate 1 and 2 units, ``--runs`` of each, each in a fresh sweep directory
(fresh compilation cache). Prints medians, one figure a line::

    slurm_makespan_2_vs_1=X     wall time of 2 units over that of 1 unit (1.0 = no gain)
    slurm_overhead_s=X          wall time minus the slowest unit's own time (its marker's
                                wall_s): sbatch, scheduling, interpreter and jax start in the
                                task, wait's polling, the merge; median over every run

    node4_busy_share=X          one task given 4 GPUs runs the sweep in the planner's default
                                units (4 per GPU, taken in turn; ``--node-units`` to force a
                                count): the units' summed busy seconds (each unit's marker
                                wall_s: from its first config to its last) over 4 x the task's
                                wall time (sacct ElapsedRaw, whole seconds). 1.0 = no GPU ever
                                waits; before whole-node tasks a 4-GPU task ran 1 unit: <= 0.25.
                                Leaves out: the task's start before python runs (scheduling)
    node4_worker_share=X        the same, counting each unit from its launch by the task (its
                                worker forked, jax's backend started) to its end: what is left,
                                1 - X, is the task's own start (its imports) and end, when no
                                worker runs; busy < worker share is each worker's start-up
    node4_busy_share_ms=X       the same busy seconds over 4 x the task's allocation to the
                                millisecond (slurmctld's log: its "Allocate" line to its
                                "_job_complete ... done" line), free of sacct's whole seconds
    node4_start_s=X             seconds from the allocation (slurmctld's log) to the task's
                                first worker (the task's log): SLURM's launch, Python,
                                submitit, the imports every worker needs
    node4_start_interpreter_s=X the part of that start spent importing Pallas's interpreter
                                (the task's log): interpret mode's alone, a run on GPUs never
                                loads it
    node4_share_bound=X         the share the task would reach were no GPU ever idle from its
                                first worker to its last unit's end: 1 - (start + exit) over
                                the allocation; what no scheduling of units can pass
    node4_gpu_s=X               the GPU-seconds the 4-GPU task was charged (4 x sacct elapsed;
                                divide by 3600 for GPU-hours)
    node4_vs_4x1_makespan=X     submit to merged document, the same sweep as one 4-GPU task
                                over four 1-GPU tasks of a unit each (the honest baseline: one
                                array task per GPU), the two in alternating order; 1.0 = a whole node costs
                                nothing extra. Leaves out: here the node task's 4 workers
                                share the task's 2 real cores (each compiling on one) while
                                each 1-GPU task's worker has both to itself, so on this
                                shared, loaded machine the figure mixes in the load
    cancel_seen_s=X             from `scancel` of one pending array task to `tilesweep status`
                                (a new process each poll, as a user runs it) saying cancelled;
                                before: a task in neither squeue nor sacct was called pending
                                for 60 s after its submission

and the per-case figures as ``#`` comments. The machine has 2 real cores for 8 declared CPUs
and 4 fake GPUs: units side by side share the 2 cores (interpret mode times on the CPU).

Run: ``.venv/bin/python -m bench.slurm [--runs 3] [--configs 32] [--only makespan,node,cancel]
[--node-units N] [--dir DIR]`` (needs the local cluster: ``bash slurm/start-local-slurm.sh``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def spec_data(configs: int, output: Path, gpus: int = 1, strategy: str = "shape") -> dict[str, Any]:
    """One fwd shape with ``configs`` forced configs (plus auto): block_q x block_k x stages x warps."""
    grid = {
        "fwd_block_q": [16, 32, 64, 128],
        "fwd_block_k": [16, 32, 64, 128],
        "fwd_stages": [1, 2, 3, 4],
        "fwd_warps": [4, 8, 16, 32],
    }
    need = configs
    axes: dict[str, list[int]] = {}
    for name in ("fwd_block_q", "fwd_block_k", "fwd_stages", "fwd_warps"):
        total = 1
        for v in axes.values():
            total *= len(v)
        k = min(len(grid[name]), max(1, -(-need // total)))
        axes[name] = grid[name][:k]
    return {
        "output": str(output),
        "dtypes": ["float32"],
        "head_dims": [16],
        "seq_lens": [256],
        "modes": ["fwd"],
        "batch": 1,
        "heads": 1,
        "repeats": 5,
        "tag": "bench",
        **axes,
        "timing": {"target_ms": 100, "max_inner": 100000, "warmup": 0},
        "kernel": {"interpret": True},
        "compile": {"workers": 1},
        "executor": {
            "kind": "slurm",
            "slurm_partition": "gpu",
            "gpus_per_node": gpus,
            "timeout_min": 10,
            "slurm_array_parallelism": 4,
            "merge_partition": "cpu",
        },
        "sharding": {"strategy": strategy},
    }


def cli(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"tilesweep {' '.join(args)} failed ({out.returncode}):\n{out.stderr}")
    return out


def one_run(
    base: Path, configs: int, units: int | None, k: int, gpus: int = 1, strategy: str = "shape"
) -> tuple[float, float]:
    """(seconds from submit to a merged document, slowest unit's own wall time); ``units``
    None: as many as the planner makes by default."""
    folder = base / f"u{units or 'default'}-g{gpus}-{k}"
    folder.mkdir(parents=True)
    spec = folder / "spec.json"
    spec.write_text(json.dumps(spec_data(configs, folder / "results.json", gpus, strategy)))
    sweep = folder / "sweep"
    t0 = time.perf_counter()
    cli("submit", str(spec), "--sweep-dir", str(sweep), *(("--units", str(units)) if units else ()))
    cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    wall = time.perf_counter() - t0
    markers = [json.loads(p.read_text()) for p in (sweep / "done").glob("*.json")]
    planned = len(json.loads((sweep / "units.json").read_text()))
    if len(markers) != planned or not (folder / "results.json").exists():
        raise SystemExit(f"{sweep}: {len(markers)} of {planned} units finished; see its logs")
    return wall, max(m["wall_s"] for m in markers)


def sacct_elapsed(job_id: str) -> int:
    """A job's ElapsedRaw (seconds) from sacct, once accounting has caught up."""
    for _ in range(40):
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,State,ElapsedRaw", "-j", job_id], capture_output=True, text=True
        ).stdout
        for line in out.splitlines():
            jid, state, elapsed = line.split("|")
            if jid == job_id and state == "COMPLETED" and elapsed.isdigit():
                return int(elapsed)
        time.sleep(0.5)
    raise SystemExit(f"sacct has no COMPLETED row for {job_id}")


def allocation(job_id: str) -> tuple[datetime, datetime] | None:
    """When the job's allocation began and ended, to the millisecond: slurmctld's own log lines
    allocating it (the main scheduler's, or the backfill scheduler's start) and completing it.
    sacct keeps both ends in whole seconds, each cut down, which moves a 12-s task's share by up
    to a twelfth. None where the log has no such pair (another log format, or the log is
    elsewhere)."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    found = re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", config, re.M)
    if found is None or not Path(found[1]).is_file():
        return None
    job = re.escape(job_id)
    ends: dict[str, datetime] = {}
    for line in Path(found[1]).read_text(errors="replace").splitlines():
        hit = re.match(
            rf"\[([^]]+)\] (?:sched: Allocate JobId={job} |sched/backfill: _start_job: Started JobId={job} "
            rf"|_job_complete: JobId={job} done$)",
            line,
        )
        if hit:
            ends["done" if line.endswith(" done") else "start"] = datetime.fromisoformat(hit[1])
    if len(ends) < 2:
        return None
    return ends["start"], ends["done"]


# the task's log line on its imports: how much of them was Pallas's interpreter (interpret mode)
INTERPRETER = re.compile(r"([0-9.]+) s of it Pallas's interpreter")


def log_time(line: str) -> datetime:
    """The stamp of a line of a task's or a unit's log (``logging``'s asctime, milliseconds)."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def idle_parts(
    sweep: Path, task: str, markers: dict[str, dict[str, Any]], held: tuple[datetime, datetime]
) -> dict[str, float]:
    """Where the task's GPUs did not run a unit, to the millisecond (slurmctld's log, the task's
    log, the units' logs): ``start`` s from the allocation to the task's first worker (SLURM's
    launch, Python, submitit, the imports), ``tail`` GPU-s from each GPU's last unit to the
    task's last, ``exit`` s from that to the allocation's end, and ``bound``: the share the
    task would reach were no GPU ever idle between its first worker and its last unit's end."""
    task_log = (sweep / "logs" / f"{task}_0_log.err").read_text().splitlines()
    first = min(log_time(line) for line in task_log if " worker pid " in line)
    said = next((m for line in task_log if (m := INTERPRETER.search(line))), None)
    ends: dict[str, datetime] = {}
    for unit, marker in markers.items():
        end = log_time((sweep / "logs" / "units" / f"{unit}.log").read_text().splitlines()[-1])
        ends[marker["gpu"]] = max(ends.get(marker["gpu"], end), end)
    last = max(ends.values())
    span = (held[1] - held[0]).total_seconds()
    start, done = (first - held[0]).total_seconds(), (held[1] - last).total_seconds()
    return {
        "start": start,
        "tail": sum((last - end).total_seconds() for end in ends.values()),
        "exit": done,
        "bound": (span - start - done) / span,
        "interpreter": float(said.group(1)) if said else 0.0,
    }


def worker_alive_s(sweep: Path, unit: str, marker: dict[str, Any]) -> float:
    """Seconds from the task launching the unit's worker (the first line of the unit's log,
    written by the task) to the unit's end (its marker); whole seconds, as both are stamped."""
    first = (sweep / "logs" / "units" / f"{unit}.log").read_text().split(" ", 1)[0]
    return (datetime.fromisoformat(marker["finished"]) - datetime.fromisoformat(first)).total_seconds()


def node_run(base: Path, configs: int, k: int, node_units: int | None) -> dict[str, float]:
    """One 4-GPU task of ``node_units`` units (None: the planner's default): its busy share, worker
    share, submit-to-document wall, the same as four 1-GPU tasks of a unit each, the task's
    GPU-seconds, the busy share over its allocation's milliseconds, its start and the share's bound."""
    order = (1, 4) if k % 2 else (4, 1)  # alternate which goes first: a shared machine's load drifts
    walls = {
        gpus: one_run(base, configs, node_units if gpus == 4 else 4, k, gpus=gpus, strategy="balanced")[0]
        for gpus in order
    }
    wall4, wall1 = walls[4], walls[1]
    sweep = base / f"u{node_units or 'default'}-g4-{k}" / "sweep"
    jobs = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    (task,) = {e["job_id"] for e in jobs if "unit" in e}
    markers = {p.stem: json.loads(p.read_text()) for p in (sweep / "done").glob("*.json")}
    busy = sum(m["wall_s"] for m in markers.values())
    alive = sum(worker_alive_s(sweep, u, m) for u, m in markers.items())
    elapsed = sacct_elapsed(task)
    held = allocation(task)
    span = None if held is None else (held[1] - held[0]).total_seconds()
    parts = None if held is None else idle_parts(sweep, task, markers, held)
    print(
        f"# node run {k}: {len(markers)} units busy {busy:.1f} s, alive {alive:.0f} s, in a task of {elapsed} s "
        f"({4 * elapsed} GPU-s; {span if span is None else f'{span:.2f}'} s allocated, by slurmctld's log"
        + (
            ""
            if parts is None
            else ", {start:.2f} s to the first worker, tail {tail:.2f} GPU-s, exit {exit:.2f} s".format(**parts)
        )
        + f"); submit to document {wall4:.1f} s (four 1-GPU tasks: {wall1:.1f} s)",
        file=sys.stderr,
    )
    nan = float("nan")
    return {
        "share": busy / (4 * elapsed),
        "worker_share": alive / (4 * elapsed),
        "wall4": wall4,
        "wall1": wall1,
        "gpu_s": 4 * elapsed,
        "share_ms": nan if span is None else busy / (4 * span),
        "start_s": nan if parts is None else parts["start"],
        "interpreter_s": nan if parts is None else parts["interpreter"],
        "bound": nan if parts is None else parts["bound"],
    }


def cancel_run(base: Path, k: int) -> float:
    """Seconds from `scancel` of a pending array task to `tilesweep status` saying cancelled."""
    folder = base / f"cancel-{k}"
    folder.mkdir(parents=True)
    spec = folder / "spec.json"
    data = spec_data(8, folder / "results.json")
    data["executor"]["slurm_array_parallelism"] = 1
    spec.write_text(json.dumps(data))
    sweep = folder / "sweep"
    cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "3")
    jobs = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    victim = next(e for e in jobs if e.get("task") == 2)
    while (
        "PENDING"
        not in subprocess.run(
            ["squeue", "-h", "-r", "-o", "%T", "-j", victim["job_id"]], capture_output=True, text=True
        ).stdout
    ):
        time.sleep(0.1)
    subprocess.run(["scancel", victim["job_id"]], check=True)
    t0 = time.perf_counter()
    while True:
        out = subprocess.run(
            [sys.executable, "-m", "orchestrator", "status", str(sweep), "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout
        if next(u for u in json.loads(out)["units"] if u["id"] == victim["unit"])["state"] == "cancelled":
            seen = time.perf_counter() - t0
            break
        if time.perf_counter() - t0 > 120:
            subprocess.run(["scancel", victim["array_id"]])
            raise SystemExit(f"status never said cancelled within 120 s of scancel {victim['job_id']}")
    subprocess.run(["scancel", victim["array_id"]], check=True)
    print(f"# cancel run {k}: status said cancelled {seen:.2f} s after scancel", file=sys.stderr)
    return seen


def makespan(base: Path, runs: int, configs: int) -> None:
    walls: dict[int, list[float]] = {1: [], 2: []}
    overheads: dict[int, list[float]] = {1: [], 2: []}
    for k in range(runs):
        for units in (1, 2):
            wall, slowest = one_run(base, configs, units, k)
            walls[units].append(wall)
            overheads[units].append(wall - slowest)
            print(
                f"# run {k} units={units}: {wall:.1f} s to a merged document, slowest unit {slowest:.1f} s",
                file=sys.stderr,
            )
    m1, m2 = statistics.median(walls[1]), statistics.median(walls[2])
    print(
        f"# 1 unit: median {m1:.1f} s, overhead {statistics.median(overheads[1]):.1f} s; "
        f"2 units: median {m2:.1f} s, overhead {statistics.median(overheads[2]):.1f} s"
    )
    print(f"slurm_makespan_2_vs_1={m2 / m1:.3f}")
    print(f"slurm_overhead_s={statistics.median(overheads[1] + overheads[2]):.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--configs", type=int, default=32)
    p.add_argument("--only", default="makespan,node,cancel", help="comma-separated: makespan, node, cancel")
    p.add_argument("--node-units", type=int, help="units of the 4-GPU task; default: the planner's")
    p.add_argument("--dir", help="keep the sweeps here; default: a temp dir, removed")
    args = p.parse_args()
    only = set(args.only.split(","))
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tilesweep-bench-slurm-"))
    try:
        if "makespan" in only:
            makespan(base, args.runs, args.configs)
        if "node" in only:
            node = [node_run(base, args.configs, k, args.node_units) for k in range(args.runs)]
            for name, key in (
                ("node4_busy_share", "share"),
                ("node4_worker_share", "worker_share"),
                ("node4_busy_share_ms", "share_ms"),
                ("node4_start_s", "start_s"),
                ("node4_start_interpreter_s", "interpreter_s"),
                ("node4_share_bound", "bound"),
            ):
                known = [n[key] for n in node if math.isfinite(n[key])]  # runs whose slurmctld log had both ends
                print(f"{name}={statistics.median(known) if known else float('nan'):.3f}")
            print(f"node4_vs_4x1_makespan={statistics.median(n['wall4'] / n['wall1'] for n in node):.3f}")
            print(f"node4_gpu_s={statistics.median(n['gpu_s'] for n in node):.0f}")
        if "cancel" in only:
            print(f"cancel_seen_s={statistics.median(cancel_run(base, k) for k in range(args.runs)):.2f}")
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
