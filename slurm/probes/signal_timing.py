"""Measure when Slurm's --signal warning, the time limit and requeues happen (docs/slurm-notes.md).

Usage: python slurm/probes/signal_timing.py FOLDER   (needs the local cluster; ~3 min, 5 CPUs
of partition "cpu"). Prints each state change seen by `sacct -D` with seconds since submission,
the time each task caught SIGUSR2 (from its log) and what .result() gave.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import submitit
from submitit.helpers import Checkpointable


def slow(seconds: int) -> str:
    t = time.time()
    while time.time() - t < seconds:
        time.sleep(1)
    return "done"


class Counter(Checkpointable):
    """Counts seconds of work; the count survives a checkpoint and requeue."""

    def __init__(self) -> None:
        self.done_s = 0
        self.starts = 0

    def __call__(self, total_s: int) -> dict:
        self.starts += 1
        while self.done_s < total_s:
            time.sleep(1)
            self.done_s += 1
        return {"done_s": self.done_s, "starts": self.starts}


VARIANTS = {  # name: (executor parameters, function, args)
    "plain_t1_delay90": (dict(timeout_min=1), slow, (400,)),
    "plain_t1_delay0": (dict(timeout_min=1, slurm_signal_delay_s=0), slow, (400,)),
    "plain_t3_delay20": (dict(timeout_min=3, slurm_signal_delay_s=20), slow, (400,)),
    "ckpt_t2_delay20": (dict(timeout_min=2, slurm_signal_delay_s=20), Counter(), (100,)),
    "ckpt_t5_interrupt": (dict(timeout_min=5), Counter(), (20,)),
}


def main(folder: Path) -> None:
    t0 = time.time()
    jobs = {}
    for name, (params, fn, args) in VARIANTS.items():
        ex = submitit.AutoExecutor(folder=folder / name, cluster="slurm")
        ex.update_parameters(slurm_partition="cpu", name=name, **params)
        jobs[name] = ex.submit(fn, *args)
    names = {j.job_id: n for n, j in jobs.items()}
    time.sleep(6)
    jobs["ckpt_t5_interrupt"]._interrupt()  # scancel --signal TERM, then USR2: a "preemption"
    print(f"{time.time() - t0:5.0f}s interrupted ckpt_t5_interrupt")
    seen: set[tuple[str, ...]] = set()
    while time.time() - t0 < 480:
        out = subprocess.run(
            ["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State,Start,End", "-j", ",".join(names)],
            capture_output=True,
            text=True,
        ).stdout
        for row in out.splitlines():
            jid, state, start, end = row.split("|")
            if (jid, state, start) not in seen:
                seen.add((jid, state, start))
                print(f"{time.time() - t0:5.0f}s {names[jid]:18} {state:16} start={start} end={end}")
        if not subprocess.run(["squeue", "-h", "-j", ",".join(names)], capture_output=True, text=True).stdout:
            break
        time.sleep(1)
    for name, job in jobs.items():
        log = "".join(p.read_text() for p in (job.paths.stdout, job.paths.stderr) if p.exists())
        caught = sorted(set(re.findall(r"\((\d{4}-\d\d-\d\d [\d:]+),\d+\) - Caught signal SIGUSR2", log)))
        starts = sorted(re.findall(r"\((\d{4}-\d\d-\d\d [\d:]+),\d+\) - Starting with JobEnvironment", log))
        start0 = datetime.fromisoformat(starts[0]) if starts else None
        rel = [f"+{(datetime.fromisoformat(c) - start0).total_seconds():.0f}s" for c in caught] if start0 else caught
        job._results_timeout_s = 2
        try:
            outcome = f"result {job.result()!r}"
        except Exception as e:  # noqa: BLE001
            why = re.search(r"Job not requeued because: [^\n]*|has not produced any output \(state: [^)]*\)", str(e))
            outcome = f"{type(e).__name__}: {why.group(0) if why else str(e)[:120]}"
        print(f"{name:18} USR2 after first start: {rel}; {outcome}")
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
