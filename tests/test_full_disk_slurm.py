"""A whole-node SLURM task whose sweep directory's disk is full, on the real local cluster: its
GPUs take no further unit once a worker failed on the full disk, the task says so in its log
and in the log of each unit it did not start, and ``status`` names the full disk for every
unit, also where no log could take a word; once space is freed, ``resume`` runs them all. The
disk is a real tmpfs (``tests.test_full_disk``), filled with a real file while the task is
held, then the task is let go.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.store import synthetic
from tests.helpers import TINY_SPEC
from tests.slurm_cluster import poll, require_cluster
from tests.slurm_sweeps import cli, status, unit_jobs, write_spec
from tests.test_full_disk import SmallDisk, tmpfs

pytestmark = pytest.mark.slurm

UNITS = 8  # one task of 2 GPUs holds them all (4 units a GPU), taken in turn


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with tmpfs(tmp_path / "disk", "size=4m") as root:
        yield SmallDisk(root)


def _submit_held(tmp_path: Path, sweep: Path) -> str:
    """A replay of 8 items in 8 units, one held task of 2 GPUs; its array's id."""
    source = tmp_path / "source.json"
    fwd = {"modes": ["fwd"], "seq_lens": [64, 128], "fwd_block_q": [16, 32, 64], "fwd_block_k": [32]}
    source.write_text(json.dumps(synthetic.document({**TINY_SPEC, **fwd, "output": str(source)})))
    held = {"gpus_per_node": 2, "merge_job": False, "slurm_additional_parameters": {"hold": True}}
    replay = {"kernel": {"impl": "replay"}, "replay": {"source": str(source)}, "sharding": {"units": UNITS}}
    spec = write_spec(tmp_path, "spec.json", held, **fwd, **replay)
    r = cli("submit", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    (array,) = {e["array_id"] for e in unit_jobs(sweep).values()}
    return str(array)


def _release_and_wait(sweep: Path, array: str) -> dict[str, Any]:
    """Let the held task go; the sweep's status once it has ended (no unit left pending or running)."""
    subprocess.run(["scontrol", "release", array], check=True)

    def ended() -> dict[str, Any] | None:
        doc = status(sweep)
        return doc if all(u["state"] in ("failed", "done") for u in doc["units"]) else None

    return poll(ended, 120, "the task's end")


def _resume_runs_every_unit(disk: SmallDisk, sweep: Path) -> None:
    disk.free()
    assert cli("resume", str(sweep)).returncode == 0
    (array,) = {e["array_id"] for e in unit_jobs(sweep).values() if e.get("origin") == "resume"}
    doc = _release_and_wait(sweep, array)
    assert doc["complete"] and doc["done"] == UNITS, doc["units"]


def test_a_task_on_a_full_disk_starts_no_further_unit_and_says_so_in_its_log_and_each_units(
    disk: SmallDisk, tmp_path: Path
) -> None:
    """The logs on a filesystem of their own, with room: the sweep directory's disk is full, so
    each GPU's first unit fails (its lease takes no write), and no other unit starts."""
    sweep = disk.root / "sweep"
    array = _submit_held(tmp_path, sweep)
    saved = shutil.copytree(sweep / "logs", tmp_path / "logs.saved")
    shutil.rmtree(sweep / "logs")
    with tmpfs(sweep / "logs", "size=4m") as logs:
        shutil.copytree(saved, logs, dirs_exist_ok=True)
        disk.fill()
        units = _release_and_wait(sweep, array)["units"]
        full = f"the disk of {sweep} (the filesystem at {disk.root}) is full (No space left on device)"
        fix = f"free space on it (or raise the quota), then `tilesweep resume {sweep}` runs what is missing"
        said = (logs / f"{array}_0_log.err").read_text()
        task_line = f"{full}: the task started no further unit (6 units not started) and every record written is kept"
        assert f"{task_line}; {fix}" in said, said
        started = {p.stem for p in (logs / "units").glob("*.log") if "tilesweep: starting unit" in p.read_text()}
        assert len(started) == 2, started  # each GPU's first, no other
        unit_line = f"{full}: its task started no further unit, this one included, and every record written is kept"
        for u in units:
            assert u["state"] == "failed" and "No space left on device" in str(u["detail"]), u
            if u["id"] not in started:
                assert u["detail"] == f"{unit_line}; {fix}", u
                last = (logs / "units" / f"{u['id']}.log").read_text().splitlines()[-1]
                assert last.endswith(f"tilesweep: unit {u['id']} failed: {unit_line}; {fix}"), last


def test_status_names_the_full_disk_for_the_units_of_a_task_whose_logs_took_no_word(
    disk: SmallDisk, tmp_path: Path
) -> None:
    """The whole sweep directory on the full disk, its logs too: the task can write no word,
    and ``status`` says the disk is full rather than a bare exit code."""
    sweep = disk.root / "sweep"
    array = _submit_held(tmp_path, sweep)
    disk.fill()
    units = _release_and_wait(sweep, array)["units"]
    full = (
        f"with no word in its logs, and the disk of {sweep} (the filesystem at {disk.root}) is full (No space left "
        f"on device): free space on it (or raise the quota), then `tilesweep resume {sweep}` runs what is missing"
    )
    assert all(u["state"] == "failed" and str(u["detail"]).endswith(full) for u in units), units
    text = cli("status", str(sweep)).stdout
    assert text.count(full) == UNITS, text
    _resume_runs_every_unit(disk, sweep)
