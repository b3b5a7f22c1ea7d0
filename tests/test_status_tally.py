"""Status asked again and again while workers append: it reads only what each partial gained
since its last count (``store.tally``) and counts what a fresh read of the whole file counts."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

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
    assert done == 0 and detail is not None and f'written for unit "{second}"' in detail
    path.write_text("\n".join(lines[:4]) + "\n")  # truncated to the invalid record and the first item
    assert counted()[:2] == fresh() == (1, 0)
    os.replace(_write_beside(path, "\n".join(lines) + "\n"), path)  # replaced: another inode
    assert counted()[:2] == fresh() == (len(items), 0)


def _write_beside(path: Path, text: str) -> Path:
    other = path.with_suffix(".new")
    other.write_text(text)
    return other


def _lines(sd: SweepDir, unit: str) -> list[str]:
    """A worker's partial of ``unit``: its header, then a start and a record line per item, the
    second item's record an error."""
    rng = random.Random(1)
    lines = [json.dumps(header(sd, unit, 1))]
    for k, it in enumerate(sd.unit_items(unit)):
        rec = {**it.record_fields(), "error": "RuntimeError: boom"} if k == 1 else record_for(it, rng)
        lines += [json.dumps({"start": it.id, "attempt": 1}), json.dumps({"id": it.id, "attempt": 1, "record": rec})]
    return lines


def _cli_count(sd: SweepDir, unit: str) -> tuple[int, int | None, str]:
    """``tilesweep status --json`` in a new process: the unit's records and errors, and stderr."""
    r = run_cli("status", str(sd.root), "--json", env={"TILESWEEP_SLURM_QUERIES": "0"})
    assert r.returncode == 1, r.stderr  # read, and its units, never started, are left to `tilesweep resume`
    assert r.stdout == json.dumps(json.loads(r.stdout), indent=1) + "\n"  # --json's layout: indent=1
    counted = next(u for u in json.loads(r.stdout)["units"] if u["id"] == unit)
    return counted["done"], counted["errors"], r.stderr


def _fresh(path: Path) -> tuple[int, int]:
    content = read_partial(path, warn=False)
    return len(content.records), sum("error" in rec for _, rec in content.records.values())


def test_status_in_a_new_process_starts_from_the_tally_file_and_counts_as_a_fresh_read(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """Each status command is a new process: it starts from what the last one left in the sweep
    directory and reads only what the partial gained; a partial grown, rewritten in place
    without growing, shrunk or replaced since is counted as a fresh read of it counts."""
    sd = _sweep(tmp_path, write_spec)
    unit = sd.unit_index()[0]["id"]
    lines, path = _lines(sd, unit), sd.partial_path(unit)
    half = len(lines) // 2
    path.write_text("\n".join(lines[:half]) + "\n" + lines[half][:20])  # the last line torn mid-write
    assert _cli_count(sd, unit) == (*_fresh(path), "")
    assert (sd.root / "status-tally.json").is_file()
    with open(path, "a") as f:
        f.write(lines[half][20:] + "\n" + "\n".join(lines[half + 1 :]) + "\n")
    assert _cli_count(sd, unit) == (*_fresh(path), "") == (len(sd.unit_items(unit)), 1, "")
    record = 2  # the first item's record, a line in the middle of the file
    iid = json.loads(lines[record])["id"]
    rewritten = [*lines[:record], lines[record].replace(iid, iid[::-1]), *lines[record + 1 :]]  # same length
    st = path.stat()
    path.write_text("\n".join(rewritten) + "\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # rewritten in place, later
    assert path.stat().st_size == st.st_size and path.stat().st_ino == st.st_ino
    assert _cli_count(sd, unit) == (*_fresh(path), "") == (len(sd.unit_items(unit)) - 1, 1, "")
    path.write_text("\n".join(lines[:5]) + "\n")  # shrunk
    assert _cli_count(sd, unit) == (*_fresh(path), "") == (2, 1, "")
    os.replace(_write_beside(path, "\n".join(rewritten[:7]) + "\n"), path)  # replaced: another inode
    assert _cli_count(sd, unit) == (*_fresh(path), "") == (2, 1, "")


def test_a_damaged_tally_file_is_ignored_with_one_warning_and_rewritten(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    sd = _sweep(tmp_path, write_spec)
    unit = sd.unit_index()[0]["id"]
    lines, path = _lines(sd, unit), sd.partial_path(unit)
    path.write_text("\n".join(lines) + "\n")
    tally = sd.root / "status-tally.json"
    assert _cli_count(sd, unit) == (len(sd.unit_items(unit)), 1, "")
    whole = tally.read_bytes()
    entry = json.loads(whole)["partials"][unit]
    for damaged in (
        whole[: len(whole) // 2],  # cut short
        json.dumps({"format": "tilesweep-status-tally", "version": 1, "partials": {unit: {**entry, "offset": "x"}}}),
    ):
        tally.write_bytes(damaged.encode() if isinstance(damaged, str) else damaged)
        done, errors, stderr = _cli_count(sd, unit)
        assert (done, errors) == (len(sd.unit_items(unit)), 1)
        assert stderr.count("\n") == 1 and f"{tally} is damaged" in stderr and "recounts" in stderr
        assert tally.read_bytes() == whole  # rewritten: the next status starts from it again


def test_status_of_a_read_only_sweep_directory_counts_without_its_tally_file(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    sd = _sweep(tmp_path, write_spec)
    unit = sd.unit_index()[0]["id"]
    lines, path = _lines(sd, unit), sd.partial_path(unit)
    path.write_text("\n".join(lines[:5]) + "\n")
    with _read_only(sd.root):
        assert _cli_count(sd, unit) == (*_fresh(path), "") == (2, 1, "")
    assert not (sd.root / "status-tally.json").exists()
    with open(path, "a") as f:
        f.write("\n".join(lines[5:]) + "\n")
    assert _cli_count(sd, unit) == (*_fresh(path), "") == (len(sd.unit_items(unit)), 1, "")


@contextmanager
def _read_only(directory: Path) -> Iterator[None]:
    """``directory`` made read-only for the status command: by its mode for a user, by the
    immutable attribute for root (whom modes do not stop)."""
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)
        return
    if shutil.which("chattr") is None:
        pytest.skip("root cannot make a directory read-only here: chattr (e2fsprogs) is not installed")
    made = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"root cannot make {directory} read-only here (chattr: {made.stderr.strip()})")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
