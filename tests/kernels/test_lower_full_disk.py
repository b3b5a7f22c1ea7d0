"""``tilesweep plan --lower --sweep-dir`` on a disk with room for its lowering lease but not for
a verdict: one line naming the verdicts' file and its filesystem, what it kept, and the command
that lowers the rest, which lowers every config once space is freed. The disk is a real tmpfs
of 2 MiB, filled by a real file but for the one page the lease takes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.store import lowering
from tests.helpers import run_cli
from tests.kernels.test_lower_reruns import SPEC, _lower, _verdict_lines
from tests.test_full_disk import SmallDisk, tmpfs

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with tmpfs(tmp_path / "disk", "size=2m") as root:
        yield SmallDisk(root)


def _leave_one_page(disk: SmallDisk) -> None:
    """Fill the disk, then give back one page: room for the lowering lease, none for a verdict."""
    disk.fill()
    page = os.sysconf("SC_PAGE_SIZE")
    os.truncate(disk.filler, disk.filler.stat().st_size // page * page - page)


def test_a_lowering_whose_disk_fills_names_the_verdicts_file_and_the_rerun(disk: SmallDisk, tmp_path: Path) -> None:
    spec, sweep = tmp_path / "spec.json", disk.root / "sweep"
    spec.write_text(json.dumps({**SPEC, "output": str(tmp_path / "out.json")}))
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    _leave_one_page(disk)
    full = run_cli(*_lower(spec, sweep))
    rerun = f"`tilesweep plan {spec} --lower --sweep-dir {sweep}` lowers only the 3 configs left without one"
    *bar, line = full.stderr.strip().splitlines()  # on a pipe the bar is lines of a log, drawn at 0
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr
    assert all(b.startswith("lowering for NVIDIA H100:") for b in bar), full.stderr
    assert line == (
        f"tilesweep: error: cannot write {sweep / lowering.FILE} (No space left on device): free space on its "
        f"disk, the filesystem at {disk.root} (or raise the quota); no verdict was written to "
        f"{sweep / lowering.FILE}; {rerun}"
    ), line
    assert (sweep / "units.json").is_file() and (sweep / "sweep.json").is_file()  # the plan is kept
    disk.free()
    again = run_cli(*_lower(spec, sweep))
    assert again.returncode == 0 and "lowered 3 configs" in again.stdout, again.stderr
    headers, verdicts = _verdict_lines(sweep)
    assert len(headers) == 1 and len(verdicts) == 3
