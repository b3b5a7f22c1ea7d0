"""Crash safety, proven by SIGKILL on real processes: writers that use ``PartialWriter`` as
the worker does, the real ``jobs.worker``, and the real ``tilesweep merge``. After resume and
merge: no finished record lost, none twice, the document valid JSON every time, torn lines
reported by file and line. ``python -m tests.crash_trials`` runs the same trials 200 times."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.crash_trials import make_merger_sweep, run_trials, trial_merger, trial_worker, trial_writer


def _ok(res: dict) -> None:
    assert res["problems"] == [], res["problems"]


def test_writers_killed_at_random_points(tmp_path: Path):
    stats = run_trials(tmp_path, n_writer=12, n_worker=0, n_merger=0, seed=11)["writer"]
    assert stats["failed"] == 0, stats["problems"]
    assert stats["trials"] == 12 and stats["kills"] >= 6  # most kills land before the unit ends


@pytest.mark.parametrize("how", ["mid-line", "after-last"])
def test_writer_killed_while_appending_or_around_the_marker(tmp_path: Path, how: str):
    rng = random.Random(3)
    for attempt in range(5):  # a kill that lands mid-line leaves a torn line; retry until one does
        res = trial_writer(tmp_path / f"t{attempt}", rng, how=how)
        _ok(res)
        if res["kills"] and (res["torn"] or how != "mid-line"):
            return
    pytest.fail(f"no {how} kill landed in 5 tries")


def test_real_worker_killed_and_resumed(tmp_path: Path):
    rng = random.Random(7)
    for k in range(2):
        res = trial_worker(tmp_path / f"k{k}", rng)
        _ok(res)
        assert res["kills"]  # the kill landed while the worker ran


def test_real_merger_killed_leaves_a_valid_document(tmp_path: Path):
    rng = random.Random(5)
    sd = make_merger_sweep(tmp_path / "m")
    kills = 0
    for _ in range(5):
        res = trial_merger(sd, rng)
        _ok(res)
        kills += res["kills"]
    assert kills >= 2
