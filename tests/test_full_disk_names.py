"""A disk that fills while a file is written says which file: a write, flush or close of an
open file raises an OSError that names none, and the one line the CLI makes of it must name
the file (not "cannot write a file"). The disk is a real 2 MiB tmpfs, filled with a real file
(``tests.test_full_disk``)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.store.files import atomic_write_json, cannot_write, create_once
from orchestrator.store.sweepdir import SweepDir
from tests.helpers import TINY_SPEC, assert_one_line_error, run_cli
from tests.test_full_disk import FREE_SPACE, SmallDisk, _replay_spec, tmpfs

PAGE = 4096


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with tmpfs(tmp_path / "disk", "size=2m") as root:
        yield SmallDisk(root)


def _named(exc: OSError, path: Path) -> None:
    """``exc`` names ``path`` (or its temp file), and so does the CLI's line of it."""
    assert exc.filename is not None, exc
    assert cannot_write(exc).startswith(f"cannot write {path} ("), cannot_write(exc)


def test_the_files_of_a_sweep_directory_written_onto_a_full_disk_are_named(disk: SmallDisk) -> None:
    sd = SweepDir(disk.root / "sweep")
    sd.root.mkdir()
    disk.fill()
    index = sd.root / "units.json"
    with pytest.raises(OSError) as raised:
        atomic_write_json(index, [{"id": "u" * 64, "n_items": 1}] * 64)
    _named(raised.value, index)
    with pytest.raises(OSError) as raised:
        sd.record_jobs([{"unit": "u" * 64, "job_id": "1", "executor": "local"}] * 64)
    _named(raised.value, sd.root / "jobs.jsonl")
    with pytest.raises(OSError) as raised:
        create_once(sd.root / "sweep.lock", b"x" * PAGE)
    _named(raised.value, sd.root / "sweep.lock")
    assert [p.name for p in sd.root.iterdir()] == ["jobs.jsonl"], "a temp file was left"


def test_planning_onto_a_disk_that_fills_names_the_file_and_plans_once_space_is_freed(
    disk: SmallDisk, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**TINY_SPEC, "output": str(tmp_path / "results.json")}))
    sweep = disk.root / "sweep"
    disk.fill()
    full = disk.filler.stat().st_size
    named = []
    for pages in range(1, 8):  # a sweep directory started, then a disk that fills as its units are written
        os.truncate(disk.filler, full - pages * PAGE)
        done = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
        if done.returncode == 0:
            break
        line = assert_one_line_error(done, FREE_SPACE)
        assert "cannot write a file" not in line
        if f"cannot write {sweep}{os.sep}" in line:
            named.append(line)
    assert named, "no write of the planning was cut short by the full disk after the sweep directory was made"
    disk.free()
    again = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
    assert again.returncode == 0, again.stderr
    index = json.loads((sweep / "units.json").read_text())
    assert index and all((sweep / "units" / f"{u['id']}.json").is_file() for u in index)


def test_a_planned_sweep_directory_on_a_read_only_mount_is_named_before_its_compile_cache(tmp_path: Path) -> None:
    """A sweep planned onto a real tmpfs that is then remounted read-only: ``plan --lower`` and
    ``run`` of it name the sweep directory and its read-only mount first (its compile cache, which
    is in it, cannot be written for that reason), and what it holds is kept."""
    spec = _replay_spec(tmp_path)
    with tmpfs(tmp_path / "ro", "size=1m") as root:
        sweep = root / "sweep"
        assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
        held = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
        remounted = subprocess.run(["mount", "-o", "remount,ro", str(root)], capture_output=True, text=True)
        if remounted.returncode != 0:
            pytest.skip(f"cannot remount a tmpfs read-only here: {remounted.stderr.strip()}")
        said = f"the sweep directory {sweep} takes no new files"
        fix = f"remount the filesystem at {root} read-write (it is mounted read-only)"
        for command in (["plan", "--lower"], ["run"]):
            r = run_cli(command[0], str(spec), *command[1:], "--sweep-dir", str(sweep))
            line = assert_one_line_error(r, f"error: {said}", fix)
            assert "compile.cache_dir" not in line, line
        assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == held
