"""``tilesweep run`` with several local workers that time the kernels in interpret mode on this
machine's CPUs: they share its cores, so each one's timings are disturbed by the others'. The
run, and a resume that runs its units here, says so once, and names the worker count that times
alone; a replay, which times nothing, says nothing of it. Real runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.helpers import run_cli

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # no GPU to pin a worker to: every worker times on the CPU
NOTE = "side by side on this machine's CPUs"


def test_several_workers_timing_on_the_cpu_are_said_once(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], sharding={"units": 2})  # two items: one a worker
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"), "--workers", "2", env=NO_GPU)
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if NOTE in line]
    assert notes == [
        "tilesweep: note: 2 workers time the kernels side by side on this machine's CPUs (interpret mode), which "
        "they share, so each one's timings are disturbed by the others'; for timings to compare, run with --workers 1"
    ], r.stderr


def test_a_replay_with_several_workers_says_nothing_of_them(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    from orchestrator.store import synthetic

    fields = {"modes": ["fwd"], "fwd_block_q": [32, 64], "sharding": {"units": 2}}
    source = tmp_path / "source.json"
    source.write_text(json.dumps(synthetic.document({**json.loads(write_spec(**fields).read_text())})))
    spec = write_spec("replay.json", **fields, kernel={"impl": "replay"}, replay={"source": str(source)})
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"), "--workers", "2", env=NO_GPU)
    assert r.returncode == 0 and NOTE not in r.stderr, r.stderr


def test_a_waiting_resume_with_several_workers_timing_on_the_cpu_says_so_once(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """A resume here runs its units as ``run`` does, ``executor.local_workers`` at a time: it says
    the same note once, naming how a resume times with one worker."""
    spec = write_spec(
        modes=["fwd"], fwd_block_q=[32], sharding={"units": 2}, executor={"kind": "local", "local_workers": 2}
    )
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    r = run_cli("resume", str(sweep), env=NO_GPU)
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if NOTE in line]
    assert notes == [
        "tilesweep: note: 2 workers time the kernels side by side on this machine's CPUs (interpret mode), which "
        "they share, so each one's timings are disturbed by the others'; for timings to compare, set "
        "executor.local_workers to 1 in the sweep's spec file and resume with --spec FILE"
    ], r.stderr
