"""Crash trials: kill real workers, a stand-in writer and real mergers at random points, resume,
merge, and let an oracle that shares no code with tilesweep count what was lost.

Kinds of trial, each on a real sweep directory:

- ``worker`` (at least half the trials): the real ``python -m jobs.worker`` on a tiny
  interpret-mode spec, stopped 1 to 3 times, each time with SIGKILL (a crash, an OOM kill),
  SIGTERM (scancel) or SIGINT (Ctrl-C), then resumed by the real worker until the unit
  completes, and merged by the real CLI;
- ``writer``: a jax-free process that writes a unit's partial exactly as the worker does
  (``tests.crash_writer``), killed at a random record, mid-line and right after its last
  record, beside a merger killed too;
- ``merger``: the real ``tilesweep merge`` killed while it merges 30,000 records.

Every stop lands on an event the trial watches for, drawn at random: a worker once its attempt
has started (its header is written) or after its n-th record, a writer after its n-th record, a
merger after it has parsed its k-th partial (``merge-cache``). So a stop always finds its process
at work, however fast or slow the machine, and the same seed stops at the same places; only the
mid-line kill races the write it aims at (a kill that misses is retried by its test).

The oracle (``tests.crash_oracle.judge``) parses with the standard library only, sharing no
code with tilesweep. It counts:

- ``lost``: planned identities without a record, plus records complete before a kill that the
  document lacks or changed;
- ``duplicated``: identities recorded more than once; ``foreign``: records the plan lacks;
- ``false_errors``: error records of configs the plan says run (every config of these specs
  runs in interpret mode, so any error, ``WorkerCrashed`` included, is false).

What it leaves out: GPU kernels (interpret mode only), SLURM (killed processes stand for killed
tasks), and a config that really crashes its worker (the rule that gives up on one is tested in
tests/test_worker.py). A SIGKILL that lands twice while the same config is alone in flight is
by the rule a config that killed its worker; the figure shows how often random kills do that.

Run: ``.venv/bin/python -m tests.crash_trials [--trials 40] [--seed S]``; prints one line per
kind and ``crash_trials=N lost=0 duplicated=0 false_errors=0``. ``tests/test_crash.py`` runs a
few; ``tests/test_concurrency.py`` uses the writer process and ``check_document``. This is a
soak test, not a benchmark (it prints no ratio), so it lives with the tests; the sweeps it kills
are built by ``orchestrator.store.synthetic``, as the benchmarks' are.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.store.segments import CACHE_DIR
from orchestrator.store.sweepdir import SweepDir
from tests.crash_events import (
    mid_line,
    read_bytes,
    record_lines,
    records_at_least,
    wait_for,
    wait_until,
    worker_moment,
)
from tests.crash_oracle import PY, ROOT, check_document, complete_records, judge, plan_of
from tests.crash_writer import spawn_writer

# tests/test_concurrency.py drives the writer process and checks the document with these
__all__ = ["check_document", "finished_records", "run_trials", "spawn_writer", "trial_merger", "trial_worker"]

TINY_SPEC = {
    "dtypes": ["float32"],
    "head_dims": [16],
    "seq_lens": [64],
    "modes": ["fwd"],
    "batch": 1,
    "heads": 1,
    "repeats": 1,
    "fwd_block_q": [16, 32, 64],
    "fwd_block_k": [16, 32, 64],
    "fwd_stages": [1],
    "fwd_warps": [4],
    "timing": {"target_ms": 1, "max_inner": 2},
    "sharding": {"units": 1},
    "kernel": {"interpret": True},
}
_PLANS: dict[str, list[dict[str, Any]]] = {}  # the worker's and the writer's spec's plans, each asked of the CLI once
MergerSweep = tuple[SweepDir, list[dict[str, Any]]]  # the merger trials' sweep and its plan


# ---------------------------------------------------------------------------- processes


def spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([PY, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished_records(sd: SweepDir) -> dict[str, dict[str, Any]]:
    """Every complete, valid record line now in the sweep's partials, by the project's item id
    (``tests/test_concurrency.py`` checks the document against it; the oracle uses ``key``)."""
    import logging

    from orchestrator.store.partials import read_partial

    logging.disable(logging.WARNING)
    try:
        out = {}
        for u in sd.unit_index():
            out.update({iid: rec for iid, (_, rec) in read_partial(sd.partial_path(u["id"])).records.items()})
        return out
    finally:
        logging.disable(logging.NOTSET)


def stop(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> tuple[bool, str]:
    """Send ``sig``; (whether the process was still running, so the signal landed; its stderr)."""
    alive = proc.poll() is None
    if alive:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return alive, err or ""


def cli_merge(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "orchestrator", "merge", str(root)], cwd=ROOT, capture_output=True, text=True)


def _finish(res: dict[str, Any], plan: list[dict[str, Any]], root: Path, out: Path, finished: dict) -> dict:
    merged = cli_merge(root)
    if merged.returncode != 0:
        res["problems"].append(f"merge failed: {merged.stderr.strip()[-300:]}")
        return res
    for k, v in judge(plan, out, finished).items():
        res[k] = res.get(k, 0) + v if k != "problems" else res["problems"] + v
    if "incomplete" in merged.stderr:  # every item was redone: a torn-line warning would be a false alarm
        res["problems"].append("merge warned of a torn line whose item was redone")
    return res


# ---------------------------------------------------------------------------- trials


def trial_worker(root: Path, rng: random.Random, plan: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Stop the real jobs.worker 1-3 times (SIGKILL, SIGTERM or SIGINT at a random moment),
    resume it with the real worker until the unit completes, merge, judge."""
    from orchestrator.planning import plan as make_plan
    from orchestrator.spec.files import spec_from_data

    data = {
        **TINY_SPEC,
        "output": str(root / "results.json"),
        "compile": {"workers": rng.choice([1, 2]), "cache_dir": "off"},
    }
    root.mkdir(parents=True, exist_ok=True)
    plan = plan or _PLANS.get("worker") or _PLANS.setdefault("worker", plan_of(data, root))
    spec = spec_from_data(data, source="crash trial")
    items, units = make_plan(spec)
    sd = SweepDir.create(root / "sweep", spec, output=root / "results.json", spec_source=None, planned=len(items))
    sd.add_units(units, origin="crash trial")
    res: dict[str, Any] = {"kills": 0, "torn": 0, "signals": Counter(), "stops": [], "problems": []}
    finished: dict = {}
    path = sd.partial_path(units[0].id)
    for _ in range(rng.randint(1, 3)):
        sig = rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
        moment = worker_moment(path, len(items), rng)
        if moment is None:
            break
        proc = spawn(["-m", "jobs.worker", str(sd.root), units[0].id])
        if not wait_for(proc, path, moment[1]):
            res["problems"].append(f"the worker never reached its {moment[0]}: {stop(proc)[1].strip()[-300:]}")
            return res
        landed, err = stop(proc, sig)
        res["stops"].append(f"{signal.Signals(sig).name} at {moment[0]}")
        res["kills"] += landed
        res["signals"][signal.Signals(sig).name] += landed
        if landed and sig != signal.SIGKILL and "Traceback" in err:
            res["problems"].append(f"a traceback on {signal.Signals(sig).name}: {err.strip()[-200:]}")
        finished.update(complete_records(sd.partials))
    for _ in range(3):  # resume until the unit is complete (a stop may land before the marker)
        r = subprocess.run(
            [PY, "-m", "jobs.worker", str(sd.root), units[0].id], cwd=ROOT, capture_output=True, text=True
        )
        if r.returncode != 0:
            res["problems"].append(f"resume failed: {r.stderr.strip()[-300:]}")
            return res
        if sd.marker_path(units[0].id).exists():
            break
    return _finish(res, plan, sd.root, root / "results.json", finished)


def trial_writer(root: Path, rng: random.Random, how: str | None = None) -> dict[str, Any]:
    """Kill one unit's writer 1-3 times (random moment, mid-line, or right after its last record)
    with a merger killed beside it at times; rerun every unit's writer; merge; judge."""
    from orchestrator.store.synthetic import build_sweep, small_spec

    data = small_spec(n_seqs=1)
    sd, _ = build_sweep(root / "sweep", data, 4, write_partials=False, output=root / "results.json")
    plan = _PLANS.get("writer") or _PLANS.setdefault("writer", plan_of(data, root))
    units = [u["id"] for u in sd.unit_index()]
    res: dict[str, Any] = {"kills": 0, "torn": 0, "problems": []}
    finished: dict = {}
    for _ in range(1 if how else rng.randint(1, 3)):
        unit = rng.choice(units)
        kind = how or rng.choice(["random", "random", "mid-line", "after-last"])
        big = 7 if kind == "mid-line" else rng.choice([0, 0, 25])
        proc = spawn_writer(sd, unit, big_every=big, seed=rng.randrange(1 << 30))
        merger = spawn(["-m", "orchestrator", "merge", str(sd.root)]) if rng.random() < 0.5 else None
        path = sd.partial_path(unit)
        n_items = len(sd.unit_items(unit))
        if kind == "mid-line":
            wait_for(proc, path, mid_line)
        elif kind == "after-last":
            wait_for(proc, path, records_at_least(n_items))
        else:  # after a random record of those it still has to write (the first: at its start)
            done = record_lines(read_bytes(path))
            wait_for(proc, path, records_at_least(done + rng.randint(0, max(n_items - done - 1, 0))))
        res["kills"] += stop(proc)[0]
        if merger is not None:  # once it has parsed some partial (or ended: then the kill misses)
            wait_until(merger, lambda: any((sd.root / CACHE_DIR).glob("*.seg")))
            res["kills"] += stop(merger)[0]
        finished.update(complete_records(sd.partials))
        res["torn"] += sum(1 for p in sd.partials.glob("*.jsonl") if not p.read_bytes().endswith(b"\n"))
    for p in [spawn_writer(sd, u, delay=0) for u in units]:
        _, err = p.communicate()
        if p.returncode != 0:
            res["problems"].append(f"resume failed: {err.strip()[-300:]}")
            return res
    return _finish(res, plan, sd.root, sd.output, finished)


def make_merger_sweep(root: Path) -> MergerSweep:
    from orchestrator.store.synthetic import build_sweep, small_spec

    data = small_spec(n_seqs=75)
    sd, _ = build_sweep(root, data, 20, output=root.parent / "merger-results.json")
    return sd, plan_of(data, root)


def trial_merger(sweep: MergerSweep, rng: random.Random) -> dict[str, Any]:
    """Kill the real CLI merger at a random moment; the document left (if any) must parse as a
    whole; the next merge must be complete. ``sweep``: 30,000 records, made once."""
    import shutil

    sd, plan = sweep
    shutil.rmtree(sd.root / "merge-cache", ignore_errors=True)  # a cold merge: the longest window
    if rng.random() < 0.5:
        sd.output.unlink(missing_ok=True)
    res: dict[str, Any] = {"kills": 0, "torn": 0, "problems": []}
    proc = spawn(["-m", "orchestrator", "merge", str(sd.root)])
    parsed = rng.randint(1, len(sd.unit_index()))  # killed once it has parsed this many partials
    wait_until(proc, lambda: len(list((sd.root / CACHE_DIR).glob("*.seg"))) >= parsed)
    res["kills"] += stop(proc)[0]
    if sd.output.exists():
        try:
            json.loads(sd.output.read_text(encoding="utf-8"))
        except ValueError as exc:
            res["problems"].append(f"document invalid after the merger was killed: {exc}")
    for tmp in sd.output.parent.glob(f".{sd.output.name}.*.tmp"):  # a killed merger's temp file: aged
        os.utime(tmp, (time.time() - 3600, time.time() - 3600))
    res = _finish(res, plan, sd.root, sd.output, complete_records(sd.partials))
    if list(sd.output.parent.glob(f".{sd.output.name}.*.tmp")):
        res["problems"].append("temp files of killed mergers left behind")
    return res


def run_trials(
    base: Path, n_worker: int, n_writer: int, n_merger: int, seed: int = 0, log: Callable[[str], object] | None = None
) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed)
    stats: dict[str, dict[str, Any]] = {}
    worker_plan = None
    for kind, n in (("worker", n_worker), ("writer", n_writer), ("merger", n_merger)):
        s = stats[kind] = {
            "trials": 0,
            "kills": 0,
            "torn": 0,
            "lost": 0,
            "duplicated": 0,
            "foreign": 0,
            "false_errors": 0,
            "failed": 0,
            "signals": Counter(),
            "problems": [],
        }
        merger_sweep = make_merger_sweep(base / "merger") if kind == "merger" and n else None
        for t in range(n):
            if kind == "worker":
                res = trial_worker(base / f"k{t}", rng, worker_plan)
            elif kind == "writer" or merger_sweep is None:
                res = trial_writer(base / f"w{t}", rng)
            else:
                res = trial_merger(merger_sweep, rng)
            s["trials"] += 1
            for k in ("kills", "torn", "lost", "duplicated", "foreign", "false_errors"):
                s[k] += res.get(k, 0)
            s["signals"].update(res.get("signals", {}))
            bad = res["problems"] or any(res.get(k) for k in ("lost", "duplicated", "foreign", "false_errors"))
            s["failed"] += bool(bad)
            s["problems"] += res["problems"]
            if log:
                log(f"{kind} trial {t}: { ({k: v for k, v in res.items() if k != 'problems'}) } {res['problems']}")
    return stats


def main() -> int:
    import shutil
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40, help="total trials: half real worker, 35%% writer, 15%% merger")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    n_worker = (args.trials + 1) // 2
    n_merger = max(1, args.trials * 15 // 100)
    n_writer = args.trials - n_worker - n_merger
    base = Path(tempfile.mkdtemp(prefix="tilesweep-crash-"))
    t0 = time.perf_counter()
    try:
        stats = run_trials(base, n_worker, n_writer, n_merger, args.seed, log=print if args.verbose else None)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for kind, s in stats.items():
        sigs = " ".join(f"{k}={v}" for k, v in sorted(s["signals"].items()))
        sigs = sigs + " " if sigs else ""
        print(
            f"{kind}: trials={s['trials']} stops_landed={s['kills']} {sigs}torn_lines={s['torn']} "
            f"lost={s['lost']} duplicated={s['duplicated']} foreign={s['foreign']} false_errors={s['false_errors']} "
            f"failed={s['failed']}"
        )
        for p in s["problems"][:5]:
            print(f"  {p}")
    total = {k: sum(s[k] for s in stats.values()) for k in ("trials", "lost", "duplicated", "false_errors", "failed")}
    print(f"real_worker_trials={stats['worker']['trials']}")
    print(
        f"crash_trials={total['trials']} lost={total['lost']} duplicated={total['duplicated']} "
        f"false_errors={total['false_errors']} failed={total['failed']} wall_s={time.perf_counter() - t0:.0f}"
    )
    return 1 if total["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
