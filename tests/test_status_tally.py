"""Status asked again and again while workers append: it reads only what each partial gained
since its last count (``store.tally``) and counts what a fresh read of the whole file counts."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path

from orchestrator.control.status import sweep_status
from orchestrator.store.partials import read_partial
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import header, record_for

from .conftest import run_cli


def _sweep(tmp_path: Path, write_spec: Callable[..., Path]) -> SweepDir:
    r = run_cli("plan", str(write_spec()), "--units", "2", "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    return SweepDir.open(tmp_path / "sweep")


def test_status_asked_again_and_again_counts_a_partial_as_a_fresh_read_does(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """A status asked while a worker appends reads only the new lines (``store.tally``): its
    counts stay those of a fresh read of the whole partial as the worker appends a line at a
    time (one torn mid-write, an invalid record, an error redone), and after the file is
    copied over in place, truncated, or replaced."""
    sd = _sweep(tmp_path, write_spec)
    first, second = (u["id"] for u in sd.unit_index())
    items = sd.unit_items(first)
    assert len(items) >= 3
    rng = random.Random(0)
    bad = {**record_for(items[0], rng), "median_ms": "slow"}
    lines = [json.dumps(header(sd, first, 1))]
    lines += [json.dumps({"id": items[0].id, "attempt": 1, "record": bad})]  # invalid: skipped
    for k, it in enumerate(items):
        rec = {**it.record_fields(), "error": "RuntimeError: boom"} if k == 1 else record_for(it, rng)
        lines += [json.dumps({"start": it.id, "attempt": 1}), json.dumps({"id": it.id, "attempt": 1, "record": rec})]
    lines += [
        json.dumps(header(sd, first, 2)),
        json.dumps({"id": items[1].id, "attempt": 2, "record": record_for(items[1], rng)}),
    ]
    path = sd.partial_path(first)

    def counted() -> tuple[int, int | None, str | None]:
        unit = next(u for u in sweep_status(sd, query_slurm=False).units if u.id == first)
        return unit.done, unit.errors, unit.detail

    def fresh() -> tuple[int, int]:
        content = read_partial(path, warn=False)
        return len(content.records), sum("error" in rec for _, rec in content.records.values())

    ino = None
    for line in lines:
        cut = len(line) // 2
        for piece in (line[:cut], line[cut:] + "\n"):  # the line torn mid-write, then whole
            with open(path, "a") as f:
                f.write(piece)
            done, errors, _ = counted()
            assert (done, errors) == fresh()
        ino = ino or path.stat().st_ino
    assert path.stat().st_ino == ino and counted()[:2] == (len(items), 0)
    with open(path, "w") as f:  # another unit's partial copied over this one, in place
        f.write("\n".join([json.dumps(header(sd, second, 1)), *lines[1:]]) + "\n")
    assert path.stat().st_ino == ino
    done, _, detail = counted()
    assert done == 0 and detail is not None and f"written for unit '{second}'" in detail
    path.write_text("\n".join(lines[:4]) + "\n")  # truncated to the invalid record and the first item
    assert counted()[:2] == fresh() == (1, 0)
    os.replace(_write_beside(path, "\n".join(lines) + "\n"), path)  # replaced: another inode
    assert counted()[:2] == fresh() == (len(items), 0)


def _write_beside(path: Path, text: str) -> Path:
    other = path.with_suffix(".new")
    other.write_text(text)
    return other
