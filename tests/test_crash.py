"""Crash safety, proven by killing real processes: the real ``jobs.worker`` (SIGKILL, SIGTERM,
SIGINT), a jax-free writer that uses ``PartialWriter`` as the worker does, and the real
``tilesweep merge``. After resume and merge an oracle that shares no code with tilesweep
(``tests.crash_trials.judge``: the plan as ``tilesweep plan --json`` prints it, the document parsed with
the stdlib) finds nothing lost, nothing twice, no false error, and no torn-line warning for an
item that was redone. ``python -m tests.crash_trials`` runs the same trials many times."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.crash_trials import make_merger_sweep, run_trials, trial_merger, trial_worker, trial_writer


def _ok(res: dict) -> None:
    assert res["problems"] == [], res["problems"]
    assert (res["lost"], res["duplicated"], res["foreign"], res["false_errors"]) == (0, 0, 0, 0), res


def test_writers_killed_at_random_points(tmp_path: Path) -> None:
    stats = run_trials(tmp_path, n_worker=0, n_writer=8, n_merger=0, seed=11)["writer"]
    assert stats["failed"] == 0, stats["problems"]
    assert stats["trials"] == 8 and stats["kills"] >= 8  # every writer's kill lands on a record it has to write


@pytest.mark.parametrize("how", ["mid-line", "after-last"])
def test_writer_killed_while_appending_or_around_the_marker(tmp_path: Path, how: str) -> None:
    rng = random.Random(3)
    for attempt in range(5):  # a kill that lands mid-line leaves a torn line; retry until one does
        res = trial_writer(tmp_path / f"t{attempt}", rng, how=how)
        _ok(res)
        if res["kills"] and (res["torn"] or how != "mid-line"):
            return
    pytest.fail(f"no {how} kill landed in 5 tries")


def test_real_worker_stopped_and_resumed(tmp_path: Path) -> None:
    rng = random.Random(7)
    res = trial_worker(tmp_path / "k", rng)
    _ok(res)
    # each stop waited for its event (the attempt's start, or its n-th record), so each landed
    # while the worker ran, however fast or slow this machine is
    assert res["stops"] and res["kills"] == len(res["stops"]), res["stops"]


def test_real_merger_killed_leaves_a_valid_document(tmp_path: Path) -> None:
    rng = random.Random(5)
    sweep = make_merger_sweep(tmp_path / "m")
    kills = 0
    for _ in range(4):
        res = trial_merger(sweep, rng)
        _ok(res)
        kills += res["kills"]
    assert kills == 4  # each kill waits until the merger has parsed some partials: it is still merging
