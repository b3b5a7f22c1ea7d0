"""Crash trials: SIGKILL real writers, real workers and real mergers at random points, resume,
merge, and check that no finished record was lost or doubled and the document always parses.

Three kinds of trial, each on a real sweep directory:

- ``writer``: a real process (``python -m tests.crash_trials writer SWEEP UNIT``) that runs a unit
  exactly as ``jobs.worker.run_unit`` does (``read_partial`` to skip recorded items, a header
  per attempt, ``start`` then record line per item through ``PartialWriter``, the marker by
  atomic replace) but with made-up timings instead of jax, so it is cheap to kill often. Each
  trial kills one unit's writer one to three times at random times (some right as the unit's
  last record lands, i.e. around the marker; some while a large line is being appended, which
  leaves a torn line), a merger is started concurrently and killed too, then every unit is
  resumed to completion and merged;
- ``worker``: the real ``python -m jobs.worker`` on a tiny interpret-mode spec, killed at a
  random time, resumed by the real worker, merged;
- ``merger``: the real ``python -m orchestrator merge DIR`` killed at a random time while it
  merges a sweep of 30,000 records; the document it leaves (if any) must parse, and the next
  merge must be complete.

After each trial: every record that was complete in a partial at any kill is in the document
with the same values (not lost, not redone), every planned item is there exactly once, every
unit has its marker, the document is byte-identical to ``json.dumps(json.loads(doc), indent=1)``
and every torn line was reported by the merge naming the file and line.

Run: ``.venv/bin/python -m tests.crash_trials [--trials 200] [--seed S]`` (prints one line per
kind and ``crash_trials=N failed=0``). ``tests/test_crash.py`` runs a few dozen of the same
trials; ``tests/test_concurrency.py`` uses the writer process and the checks. This is a soak
test, not a benchmark (it prints no ratio), so it lives with the tests; the sweeps it kills
are built by ``orchestrator.store.synthetic``, as the benchmarks' are.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.planning import RUN, plan
from orchestrator.spec.files import spec_from_data
from orchestrator.spec.model import env_fingerprint
from orchestrator.spec.records import item_id
from orchestrator.store.partials import PartialWriter, count_records, read_partial
from orchestrator.store.sweepdir import SweepDir, atomic_write_json, now_iso
from orchestrator.store.synthetic import DEVICE, build_sweep, header, record_for, small_spec

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
BIG_LINE = 4 << 20  # bytes of an oversized record line, so kills land inside its write


# ---------------------------------------------------------------------------- the writer process


def writer_main(sweep_dir: str, unit_key: str, delay: float, big_every: int, seed: int) -> int:
    """run_unit without jax: same partial protocol, same skip-what-is-recorded resume."""
    rng = random.Random(seed)
    sd = SweepDir.open(sweep_dir)
    unit_id = sd.resolve_unit(unit_key)
    items = sd.unit_items(unit_id)
    sd.check_env(env_fingerprint(DEVICE))
    path = sd.partial_path(unit_id)
    existing = read_partial(path)
    attempt = existing.attempts + 1
    todo = [it for it in items if it.id not in existing.records]
    with PartialWriter(path) as w:
        w.write(header(sd, unit_id, attempt, host=socket.gethostname(), pid=os.getpid(), slurm_job_id=None))
        for n, it in enumerate(todo):
            if it.kind == RUN:
                w.write({"start": it.id, "attempt": attempt})
            time.sleep(delay * rng.random())
            rec = record_for(it, rng)
            if big_every and n % big_every == big_every - 1:
                rec = {**it.record_fields(), "error": "RuntimeError: " + "x" * BIG_LINE}
            w.write({"id": it.id, "attempt": attempt, "record": rec})
    atomic_write_json(sd.marker_path(unit_id), {"unit": unit_id, "attempt": attempt, "done": len(todo),
                                                "total": len(items), "finished": now_iso()})
    return 0


# ---------------------------------------------------------------------------- helpers


def spawn(args: list[str], **kw: Any) -> subprocess.Popen:
    return subprocess.Popen([PY, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def kill(proc: subprocess.Popen) -> bool:
    """SIGKILL; True if the process was still running (the kill landed)."""
    alive = proc.poll() is None
    if alive:
        proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return alive


def spawn_writer(sd: Any, unit: str, *, delay: float = 0.01, big_every: int = 0, seed: int = 0) -> subprocess.Popen:
    """Start the jax-free writer process on ``unit`` of sweep ``sd``."""
    return spawn(["-m", "tests.crash_trials", "writer", str(sd.root), unit, str(delay), str(big_every), str(seed)])


def kill_mid_line(proc: subprocess.Popen, path: Path, timeout: float = 10.0) -> bool:
    """Kill when the partial's last byte is not a newline (a line is being appended)."""
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        try:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    return kill(proc)
        except OSError:
            pass
    return kill(proc)


def kill_after_last_record(proc: subprocess.Popen, path: Path, n_items: int, timeout: float = 10.0) -> bool:
    """Kill as soon as the unit's last record is in its partial (around the marker write)."""
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        if count_records(path) >= n_items:
            return kill(proc)
        time.sleep(0.0005)
    return kill(proc)


def finished_records(sd: Any) -> dict[str, dict[str, Any]]:
    """Every complete, valid record line now in the sweep's partials: id -> record."""
    logging.disable(logging.WARNING)
    try:
        out = {}
        for u in sd.unit_index():
            out.update({iid: rec for iid, (_, rec) in read_partial(sd.partial_path(u["id"])).records.items()})
        return out
    finally:
        logging.disable(logging.NOTSET)


def torn_lines(sd: Any) -> list[tuple[Path, int]]:
    """(partial, line) of every line that does not parse."""
    out = []
    for u in sd.unit_index():
        path = sd.partial_path(u["id"])
        if path.exists():
            for n, line in enumerate(path.read_bytes().split(b"\n"), 1):
                if line.strip():
                    try:
                        json.loads(line)
                    except ValueError:
                        out.append((path, n))
    return out


def cli_merge(sd: Any, output: Path | None = None) -> subprocess.CompletedProcess:
    args = [PY, "-m", "orchestrator", "merge", str(sd.root)] + (["--output", str(output)] if output else [])
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)


def check_document(path: Path) -> dict[str, Any]:
    """The document must parse and be exactly what json.dumps(indent=1) writes."""
    text = path.read_text(encoding="utf-8")
    doc = json.loads(text)
    if json.dumps(doc, indent=1) != text:
        raise AssertionError(f"{path} is not byte-identical to json.dumps(doc, indent=1)")
    return doc


def verify(sd: Any, finished: dict[str, dict[str, Any]], doc_path: Path, merge_stderr: str,
           torn: list[tuple[Path, int]], markers: bool = True) -> list[str]:
    """What a user would check after the trial; returns the problems found."""
    problems = []
    doc = check_document(doc_path)
    ids = [item_id(r) for r in doc["results"]]
    planned = {it.id for it in sd.items()}
    if len(ids) != len(set(ids)):
        problems.append(f"{len(ids) - len(set(ids))} duplicate records")
    if set(ids) != planned:
        problems.append(f"{len(planned - set(ids))} planned items missing, {len(set(ids) - planned)} foreign")
    by_id = dict(zip(ids, doc["results"], strict=True))
    lost = [iid for iid, rec in finished.items()
            if {k: v for k, v in by_id.get(iid, {}).items() if k not in ("unit", "attempt")} != rec]
    if lost:
        problems.append(f"{len(lost)} finished records lost or changed")
    attempts = doc["tilesweep"]["attempts"]
    untraced = [r for r in doc["results"] if r["attempt"] not in {a["attempt"] for a in attempts.get(r["unit"], [])}]
    if untraced:
        problems.append(f"{len(untraced)} records whose unit/attempt is not in tilesweep.attempts")
    for u in sd.unit_index() if markers else []:
        try:
            json.loads(sd.marker_path(u["id"]).read_text())
        except (OSError, ValueError):
            problems.append(f"unit {u['id']} has no valid marker after resume")
    for path, line in torn:
        if f"{path} line {line}" not in merge_stderr:
            problems.append(f"torn line {path}:{line} was not reported by the merge")
    return problems


# ---------------------------------------------------------------------------- trials


def make_writer_sweep(root: Path, units: int = 4) -> Any:
    sd, _ = build_sweep(root, small_spec(n_seqs=1), units, write_partials=False, output=root / "results.json")
    return sd


def trial_writer(root: Path, rng: random.Random, how: str | None = None) -> dict[str, Any]:
    """Kill one unit's writer 1-3 times (random time, mid-line, or after its last record;
    ``how`` forces one) and a concurrent merger at times; resume every unit; merge; verify."""
    sd = make_writer_sweep(root)
    units = [u["id"] for u in sd.unit_index()]
    finished: dict[str, dict[str, Any]] = {}
    kills = 0
    forced = how
    for _ in range(1 if forced else rng.randint(1, 3)):
        unit = rng.choice(units)
        n_items = len(sd.unit_items(unit))
        how = forced or rng.choice(["random", "random", "mid-line", "after-last"])
        big = 7 if how == "mid-line" else rng.choice([0, 0, 25])
        proc = spawn_writer(sd, unit, big_every=big, seed=rng.randrange(1 << 30))
        merger = spawn(["-m", "orchestrator", "merge", str(sd.root)]) if rng.random() < 0.5 else None
        if how == "random":
            time.sleep(rng.uniform(0.05, 1.0))
            kills += kill(proc)
        elif how == "mid-line":
            kills += kill_mid_line(proc, sd.partial_path(unit))
        else:
            kills += kill_after_last_record(proc, sd.partial_path(unit), n_items)
        if merger is not None:
            time.sleep(rng.uniform(0.0, 0.3))
            kills += kill(merger)
            if sd.output.exists():
                check_document(sd.output)
        finished.update(finished_records(sd))
    torn = torn_lines(sd)
    resume = [spawn_writer(sd, unit, delay=0.0) for unit in units]  # resume: rerun every unit's worker
    for p in resume:
        _, err = p.communicate()
        if p.returncode != 0:
            return {"kills": kills, "torn": len(torn), "problems": [f"resume failed: {err}"]}
    merged = cli_merge(sd)
    if merged.returncode != 0:
        return {"kills": kills, "torn": len(torn), "problems": [f"merge failed: {merged.stderr}"]}
    return {"kills": kills, "torn": len(torn), "problems": verify(sd, finished, sd.output, merged.stderr, torn)}


TINY_SPEC = {
    "dtypes": ["float32"], "head_dims": [16], "seq_lens": [32], "modes": ["fwd"], "batch": 1, "heads": 1,
    "repeats": 1, "fwd_block_q": [8, 16, 32], "fwd_block_k": [8, 16, 32], "fwd_stages": [1], "fwd_warps": [4],
    "timing": {"target_ms": 1, "max_inner": 2}, "sharding": {"units": 1},
    "compile": {"workers": 1, "cache_dir": "off"},  # one config at a time: records land over seconds
}


def trial_worker(root: Path, rng: random.Random) -> dict[str, Any]:
    """Kill the real jobs.worker at a random time, resume it with the real worker, merge."""
    spec = spec_from_data({**TINY_SPEC, "output": str(root / "results.json")}, source="crash trial")
    items, units = plan(spec)
    sd = SweepDir.create(root / "sweep", spec, output=root / "results.json", spec_source=None, planned=len(items))
    sd.add_units(units, origin="crash trial")
    unit = units[0].id
    proc = spawn(["-m", "jobs.worker", str(sd.root), unit])
    time.sleep(rng.uniform(1.5, 4.5))  # here: ~1 s of imports, then a record every ~0.25 s until ~4.5 s
    kills = kill(proc)
    finished = finished_records(sd)
    torn = torn_lines(sd)
    resumed = subprocess.run([PY, "-m", "jobs.worker", str(sd.root), unit], cwd=ROOT, capture_output=True, text=True)
    if resumed.returncode != 0:
        return {"kills": kills, "torn": len(torn), "problems": [f"resume failed: {resumed.stderr}"]}
    merged = cli_merge(sd)
    if merged.returncode != 0:
        return {"kills": kills, "torn": len(torn), "problems": [f"merge failed: {merged.stderr}"]}
    problems = verify(sd, finished, sd.output, merged.stderr, torn)
    if "already done" not in resumed.stdout:
        problems.append(f"resume did not report skipped items: {resumed.stdout!r}")
    return {"kills": kills, "torn": len(torn), "finished": len(finished), "problems": problems}


def make_merger_sweep(root: Path) -> Any:
    sd, _ = build_sweep(root, small_spec(n_seqs=75), 20, output=root / "results.json")
    return sd


def trial_merger(sd: Any, rng: random.Random) -> dict[str, Any]:
    """Kill the real CLI merger at a random time; the document left must parse; the next
    merge must be complete. ``sd``: a sweep of 30,000 records (made once, reused)."""
    shutil.rmtree(sd.root / "merge-cache", ignore_errors=True)  # a cold merge: longest window
    if rng.random() < 0.5:
        sd.output.unlink(missing_ok=True)
    before = sd.output.read_bytes() if sd.output.exists() else None
    proc = spawn(["-m", "orchestrator", "merge", str(sd.root)])
    time.sleep(rng.uniform(0.1, 1.0))
    kills = kill(proc)
    problems = []
    if sd.output.exists():
        try:
            doc = check_document(sd.output)
        except (ValueError, AssertionError) as exc:
            problems.append(f"document invalid after the merger was killed: {exc}")
        else:
            if sd.output.read_bytes() != before and len(doc["results"]) != sd.planned:
                problems.append("a new but incomplete document was left")
    for tmp in sd.output.parent.glob(f".{sd.output.name}.*.tmp"):  # a killed merger's temp file
        os.utime(tmp, (time.time() - 3600, time.time() - 3600))
    merged = cli_merge(sd)
    if merged.returncode != 0:
        return {"kills": kills, "torn": 0, "problems": [f"merge failed: {merged.stderr}"]}
    problems += verify(sd, finished_records(sd), sd.output, merged.stderr, [], markers=False)
    left = list(sd.output.parent.glob(f".{sd.output.name}.*.tmp"))
    if left:
        problems.append(f"temp files of killed mergers left behind: {left}")
    return {"kills": kills, "torn": 0, "problems": problems}


def run_trials(base: Path, n_writer: int, n_worker: int, n_merger: int, seed: int = 0,
               log: Any = None) -> dict[str, dict[str, int]]:
    """Run the trials; returns per kind {trials, kills, torn, failed} and collects problems."""
    rng = random.Random(seed)
    stats: dict[str, dict[str, Any]] = {k: {"trials": 0, "kills": 0, "torn": 0, "failed": 0, "problems": []}
                                        for k in ("writer", "worker", "merger")}
    counter = itertools.count()

    def record(kind: str, res: dict[str, Any]) -> None:
        s = stats[kind]
        s["trials"] += 1
        s["kills"] += res["kills"]
        s["torn"] += res["torn"]
        s["finished_at_kill"] = s.get("finished_at_kill", 0) + res.get("finished", 0)
        if res["problems"]:
            s["failed"] += 1
            s["problems"].append(res["problems"])
        if log:
            log(f"{kind} trial {s['trials']}: kills={res['kills']} torn={res['torn']} problems={res['problems']}")

    for _ in range(n_writer):
        record("writer", trial_writer(base / f"w{next(counter)}", rng))
    for _ in range(n_worker):
        record("worker", trial_worker(base / f"k{next(counter)}", rng))
    if n_merger:
        msd = make_merger_sweep(base / "merger")
        for _ in range(n_merger):
            record("merger", trial_merger(msd, rng))
    return stats


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "writer":
        _, _, sweep, unit, delay, big, seed = sys.argv
        return writer_main(sweep, unit, float(delay), int(big), int(seed))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200, help="total trials (80%% writer, 5%% worker, 15%% merger)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    n_worker = max(1, args.trials // 20)
    n_merger = max(1, args.trials * 3 // 20)
    n_writer = args.trials - n_worker - n_merger
    base = Path(tempfile.mkdtemp(prefix="tilesweep-crash-"))
    t0 = time.perf_counter()
    try:
        stats = run_trials(base, n_writer, n_worker, n_merger, args.seed, log=print if args.verbose else None)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for kind, s in stats.items():
        extra = f" records_finished_before_kills={s['finished_at_kill']}" if kind == "worker" else ""
        print(f"{kind}: trials={s['trials']} kills_landed={s['kills']} torn_lines={s['torn']} "
              f"failed={s['failed']}{extra}")
        for p in s["problems"][:5]:
            print(f"  {p}")
    failed = sum(s["failed"] for s in stats.values())
    print(f"crash_trials={sum(s['trials'] for s in stats.values())} failed={failed} "
          f"wall_s={time.perf_counter() - t0:.0f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
