"""Print what sbatch and submitit do on submission errors (for docs/slurm-notes.md).

Usage: python slurm/probes/submit_errors.py FOLDER   (needs the local cluster; ~3 s)
Cases: unknown partition, --time over a partition's MaxTime (partition "short"), more GPUs than
a node has, an array over MaxArraySize, an unknown executor parameter, no srun / no sbatch on PATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import submitit


def echo(x: int) -> int:
    return x


def attempt(label: str, fn) -> None:
    print(f"=== {label}")
    try:
        print("no exception:", fn())
    except Exception as e:  # noqa: BLE001 - the point is to show what comes out
        print(f"  {type(e).__module__}.{type(e).__qualname__}: {str(e)[:400]!r}")
        if e.__cause__ is not None:
            print(f"  cause: {e.__cause__!r}")


def main(folder: Path) -> None:
    for args in (["-p", "nosuch"], ["-p", "short", "--time=5"], ["--array=0-100000"]):
        r = subprocess.run(["sbatch", *args, "--wrap", "true"], capture_output=True, text=True)
        print(f"$ sbatch {' '.join(args)} --wrap true -> exit {r.returncode}\n  {r.stderr.strip()!r}")
    ex = submitit.AutoExecutor(folder=folder / "errors", cluster="slurm")
    ex.update_parameters(slurm_partition="nosuch", timeout_min=1)
    attempt("unknown partition (submit)", lambda: ex.submit(echo, 1).job_id)
    attempt("unknown partition (map_array)", lambda: [j.job_id for j in ex.map_array(echo, [1, 2])])
    ex.update_parameters(slurm_partition="short", timeout_min=5)
    attempt("timeout_min over the partition's MaxTime", lambda: ex.submit(echo, 1).job_id)
    ex.update_parameters(slurm_partition="gpu", timeout_min=1, gpus_per_node=99)
    attempt("more GPUs than a node has", lambda: ex.submit(echo, 1).job_id)
    attempt("unknown parameter", lambda: ex.update_parameters(slurm_partitionn="gpu"))
    print("files left in the folder:", len(os.listdir(folder / "errors")))
    path = os.environ["PATH"]
    os.environ["PATH"] = "/nonexistent"
    attempt("no srun on PATH", lambda: submitit.AutoExecutor(folder=folder / "x", cluster="slurm"))
    attempt("no cluster given, none found", lambda: type(submitit.AutoExecutor(folder=folder / "y")._executor))
    srun_only = folder / "srun-only"
    srun_only.mkdir(parents=True, exist_ok=True)
    (srun_only / "srun").unlink(missing_ok=True)
    (srun_only / "srun").symlink_to(subprocess.check_output(["which", "srun"], env={"PATH": path}, text=True).strip())
    os.environ["PATH"] = str(srun_only)
    ex = submitit.AutoExecutor(folder=folder / "z", cluster="slurm")
    ex.update_parameters(timeout_min=1)
    attempt("srun but no sbatch on PATH", lambda: ex.submit(echo, 1).job_id)
    os.environ["PATH"] = path


if __name__ == "__main__":
    main(Path(sys.argv[1]))
