"""Specs and sweeps the SLURM tests share: the executor block for the local cluster, a spec
writer, the slow sweep that conftest's session fixture ``slow_slurm_sweep`` submits early, and
what the dispatch tests read of a sweep as a user would (a new ``tilesweep`` process per look,
its files). Outside the test modules, so that conftest imports no test module, and importing only
tests.helpers, so that nothing here leads back to conftest."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.store import synthetic
from tests.helpers import TINY_SPEC, replay_specs, run_cli

SLURM = {
    "kind": "slurm",
    "slurm_partition": "gpu",
    "gpus_per_node": 1,
    "timeout_min": 5,
    "slurm_array_parallelism": 4,
    "merge_partition": "cpu",
}
# One unit of 65 configs against a 2-minute limit, replayed at the real pace (replay.pace: real):
# the worker waits out each record's compile and timing seconds instead of computing, so the
# unit costs the suite no CPU. Each source record takes 0.3 s to compile and 1.9 s to time
# (probes and 5 repeats of 190 calls of 2 ms: kernels.config.timed_calls): 143 s of waiting
# whatever the machine, more than SLURM's warning allows (USR2, asked 20 s before the end,
# comes 72-93 s in: docs/slurm-notes.md), and the rest fits the next run or two (max_requeues 3).
SLOW_UNIT: dict[str, Any] = {
    "modes": ["fwd"],
    "seq_lens": [256],
    "fwd_block_q": [16, 32, 64, 128],
    "fwd_block_k": [16, 32, 64, 128],
    "fwd_stages": [1, 2],
    "fwd_warps": [4, 8],
    "repeats": 5,
    "timing": {"target_ms": 400, "max_inner": 100000, "warmup": 0},
}


def write_spec(folder: Path, name: str, executor: dict[str, Any] | None = None, **over: Any) -> Path:
    """Write a spec file (TINY_SPEC on the local cluster, ``executor`` and ``over`` on top) into
    ``folder``; its results document goes beside it."""
    data = {
        **TINY_SPEC,
        "output": str(folder / f"{Path(name).stem}.results.json"),
        "executor": {**SLURM, **(executor or {})},
        **over,
    }
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def slow_replay_spec(folder: Path, name: str, executor: dict[str, Any], pace: str = "real", **over: Any) -> Path:
    """A spec file ``name`` in ``folder`` replaying ``SLOW_UNIT`` at ``pace`` (real: 0.3 s to
    compile and 1.9 s to time a record, waited out, not computed) from a synthetic source
    document beside it, run by ``executor``."""
    source = folder / "source.json"
    if not source.exists():
        doc = synthetic.document({**TINY_SPEC, **SLOW_UNIT})
        for rec in doc["results"]:
            rec.update(compile_s=0.3, median_ms=2.0, q1_ms=2.0, q3_ms=2.0)
        source.write_text(json.dumps(doc))
    replay = {"source": str(source), "pace": pace}
    return write_spec(folder, name, executor, **SLOW_UNIT, kernel={"impl": "replay"}, replay=replay, **over)


def _submit(spec: Path, sweep: Path) -> None:
    r = run_cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1")
    assert r.returncode == 0, r.stderr


# the slow sweeps' tasks run on the cpu partition (or short), without a GPU, so that their minutes
# hold none of the 4 fake GPUs the other tests' arrays and whole-node tasks need
SLOW_EXECUTOR = {"timeout_min": 2, "slurm_signal_delay_s": 20, "slurm_partition": "cpu", "gpus_per_node": 0}


def submit_slow_sweep(folder: Path) -> tuple[Path, Path]:
    """Submit the slow sweep behind the requeue test (conftest's session fixture
    ``slow_slurm_sweep``): warned 20 s before its 2-minute limit, requeued, then done."""
    spec = slow_replay_spec(folder, "slow.json", SLOW_EXECUTOR, report={"html": True})
    _submit(spec, folder / "sweep")
    return spec, folder / "sweep"


def submit_time_limit_sweeps(folder: Path) -> dict[str, tuple[Path, Path]]:
    """Submit the sweeps behind the time-limit tests (conftest's session fixture
    ``time_limit_sweeps``), each (spec, sweep dir) by name: ``cpu`` and ``short``, ended TIMEOUT
    at their 1-minute limit without a warning (on the partition each is named after; ``short``
    allows no more), and ``requeues``, warned before its 2-minute limit with no requeue left."""
    timeout = {"timeout_min": 1, "slurm_signal_delay_s": 0, "max_requeues": 0, "gpus_per_node": 0}
    executors = {
        "cpu": {**timeout, "slurm_partition": "cpu"},
        "short": {**timeout, "slurm_partition": "short"},
        "requeues": {**SLOW_EXECUTOR, "max_requeues": 0, "merge_job": False},
    }
    sweeps = {}
    for name, executor in executors.items():
        (folder / name).mkdir()
        spec = slow_replay_spec(folder / name, "slow.json", executor)
        _submit(spec, folder / name / "sweep")
        sweeps[name] = (spec, folder / name / "sweep")
    return sweeps


# 8 items in 4 units: two shapes, auto and three fwd block sizes each; fwd only, the cheaper mode to
# compile (what these sweeps test, the dispatch around the items, is the same for both modes; TINY_SPEC
# sweeps run both on the cluster)
FOUR_UNITS: dict[str, Any] = {
    "seq_lens": [64, 128],
    "modes": ["fwd"],
    "fwd_block_q": [16, 32, 64],
    "compile": {"workers": 1},
}


def held_replay_spec(folder: Path) -> Path:
    """A replay of three configs on the cpu partition, its tasks submitted held (``sbatch --hold``
    through ``executor.slurm_additional_parameters``): nothing runs while a test looks."""
    spec = replay_specs(folder, lambda k: 0.0, "slurm")["instant"]
    held = {"kind": "slurm", "slurm_partition": "cpu", "gpus_per_node": 0}
    held["slurm_additional_parameters"] = {"hold": True}
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "executor": held}))
    return spec


@contextlib.contextmanager
def submitted(spec: Path, sweep: Path, units: int) -> Iterator[None]:
    """``submit`` of ``spec`` into ``sweep`` in ``units`` units, accepted, for the block; the
    sweep is cancelled after it, whatever the block did, so no job outlives the test."""
    r = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", str(units))
    try:
        assert r.returncode == 0, r.stderr
        yield
    finally:
        cli("cancel", str(sweep))


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli(*args, env=env, timeout=timeout)


def status(sweep: Path) -> dict[str, Any]:
    r = cli("status", str(sweep), "--json")
    doc = json.loads(r.stdout)
    # 1 when some unit ended without finishing, or was never submitted and nothing will, and nothing
    # took its items over
    ended = ("failed", "interrupted", "cancelled", "timed out")
    failed = [u for u in doc["units"] if u["state"] in ended and not u["resumed"]]
    idle = [u for u in doc["units"] if u["state"] == "pending"]
    never = [u for u in idle if not (u["submissions"] or u["resumed"] or u["leased"])]
    # or when every unit is done, its document is not merged and no final merge job will merge it
    unmerged = doc["complete"] and not doc["merged"] and doc["merging"] is None
    assert r.returncode == (1 if failed or never or unmerged else 0), r.stderr
    return doc


def lines(partial: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not partial.exists():
        return out
    for line in partial.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def jobs(sweep: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]


def unit_jobs(sweep: Path) -> dict[str, dict[str, Any]]:
    return {e["unit"]: e for e in jobs(sweep) if "event" not in e}


def check_document(sweep: Path, spec: Path) -> dict[str, Any]:
    """The merged document holds every planned item exactly once, in plan order."""
    plan = [json.loads(line) for line in cli("plan", str(spec), "--dry-run", "--json").stdout.splitlines()]
    doc = json.loads(Path(json.loads((sweep / "sweep.json").read_text())["output"]).read_text())
    config_fields = (
        "block_q",
        "block_k",
        "num_stages",
        "num_warps",
        "fwd_block_q",
        "fwd_block_k",
        "bwd_outer",
        "bwd_inner",
    )

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["dtype"], r["seq"], r["mode"], r["config"], tuple(v for k, v in r.items() if k in config_fields))

    assert [key(r) for r in doc["results"]] == [key(p) for p in plan]
    assert len({key(r) for r in doc["results"]}) == len(plan)
    return doc


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
