"""A sweep directory on a disk that fills up, as a user meets it: a worker and a merge each say
in one line that the disk is full and what to do, leave no half-written file behind, and once
space is freed the same commands finish the work. The disk is a real filesystem of 2 MiB (a
tmpfs mounted for the test), filled with a real file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import SweepDirError
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import (
    REPO,
    SAMPLE,
    TINY_SPEC,
    assert_one_line_error,
    records_written,
    replay_spec,
    run_cli,
    start_run,
    synthetic_source,
    until,
)

FREE_SPACE = "free space on its disk"


class SmallDisk:
    """A 2 MiB tmpfs at ``root``; ``fill()`` takes all of its space, ``free()`` gives it back."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / f"filler-{uuid.uuid4().hex[:6]}"

    def fill(self) -> None:
        with self.filler.open("ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass

    def free(self) -> None:
        self.filler.unlink()


@contextmanager
def tmpfs(root: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``root`` (made here) for the block; the test is skipped where this
    machine lets no tmpfs be mounted."""
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(root)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with tmpfs(tmp_path / "disk", "size=2m") as root:
        yield SmallDisk(root)


def _replay_spec(tmp_path: Path, replay: dict[str, Any] | None = None, **more: Any) -> Path:
    """A replay spec (``more``: its fields over the tiny one's, the source's too; ``replay``:
    its replay section's, over the source): its units take no compile and no GPU."""
    grid = {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [16, 32, 64], "fwd_block_k": [32], **more}
    source = synthetic_source(tmp_path / "source.json", grid)
    return replay_spec(tmp_path / "spec.json", grid, source, tmp_path / "results.json", replay=replay)


def _replay_sweep(tmp_path: Path, root: Path) -> Path:
    """The replay spec planned in ``root``."""
    sweep = root / "sweep"
    planned = run_cli("plan", str(_replay_spec(tmp_path)), "--sweep-dir", str(sweep))
    assert planned.returncode == 0, planned.stderr
    return sweep


def _worker(sweep: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "jobs.worker", str(sweep), "0"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_a_worker_on_a_full_disk_says_so_in_one_line_and_runs_once_space_is_freed(
    disk: SmallDisk, tmp_path: Path
) -> None:
    sweep = _replay_sweep(tmp_path, disk.root)
    disk.fill()
    full = _worker(sweep)
    assert_one_line_error(full, FREE_SPACE)
    assert not list((sweep / "leases").iterdir()), "a half-written lease was left"
    disk.free()
    again = _worker(sweep)
    assert again.returncode == 0, again.stderr
    assert "4 records written" in again.stdout


def test_a_run_whose_disk_fills_starts_no_further_unit_and_says_to_free_space_then_resume(
    disk: SmallDisk, tmp_path: Path
) -> None:
    """The disk fills once the first of four units (run one at a time) is done: the next
    unit's worker fails with no room for its reason, the run starts no other and ends in one
    line; status says so too (while the disk is full and once it is freed), not that a worker
    crashed; once space is freed, resume runs only the units not done."""
    spec = _replay_spec(tmp_path, seq_lens=[64, 128], sharding={"units": 4}, executor={"local_workers": 1})
    sweep = disk.root / "sweep"
    run = start_run(spec, sweep)
    until(lambda: any((sweep / "done").glob("*.json")), "the first unit's marker", run)
    disk.fill()
    _, err = run.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert run.returncode == 2 and "Traceback" not in err, err
    assert lines[-1] == (
        f"tilesweep: error: the disk of {sweep} (the filesystem at {disk.root}) is full (No space left on device): "
        f"the run started no further unit (2 units not started) and every record written is kept; free space on "
        f"it (or raise the quota), then `tilesweep resume {sweep}` runs what is missing"
    ), err
    (failed,) = [line for line in lines if "failed (process" in line]  # its own word, or the run's on the disk
    assert "No space left on device" in failed and "the worker exited with code" not in failed, err
    (done,) = (sweep / "done").glob("*.json")
    kept = (sweep / "partials" / f"{done.stem}.jsonl").read_bytes()
    assert len((sweep / "jobs.jsonl").read_text().splitlines()) == 2  # the unit done and the one that failed
    stopped = (
        f"the last run stopped: the disk of {sweep} (the filesystem at {disk.root}) was full (No space left on "
        f"device); free space on it (or raise the quota), then `tilesweep resume {sweep}` runs what is missing"
    )
    for full in (True, False):  # the same while the disk is full and once space is freed
        status = run_cli("status", str(sweep))
        assert status.returncode == 1 and status.stdout.splitlines()[-1] == stopped, status.stdout
        assert "process is gone" not in status.stdout, status.stdout
        (unit_line,) = [line for line in status.stdout.splitlines() if " failed " in line]
        assert "No space left on device" in unit_line, status.stdout  # its worker's word, or the run's note
        assert status.stdout.count("not started: the run stopped on the full disk") == 2, status.stdout
        listed = run_cli("ls", str(disk.root))
        assert "stopped on a full disk, 3 units to resume" in listed.stdout, listed.stdout
        if full:
            disk.free()
    assert run_cli("resume", str(sweep)).returncode == 0
    assert not (sweep / "run-stop.json").exists()
    assert (sweep / "partials" / f"{done.stem}.jsonl").read_bytes() == kept  # not run again
    status = run_cli("status", str(sweep))
    head = status.stdout.splitlines()[0]
    assert status.returncode == 0 and head.endswith("8/8 items done (0 error records), complete"), status.stdout


def test_a_debug_run_whose_disk_fills_starts_no_further_unit_and_says_to_free_space_then_resume(
    disk: SmallDisk, tmp_path: Path
) -> None:
    """The debug executor runs the units one after another in the command's process, each
    replayed at the real pace (its records' seconds waited out): the disk fills once the first
    is done, the next fails on it, and the run starts no other and ends in one line."""
    spec = _replay_spec(
        tmp_path, {"pace": "real"}, seq_lens=[64, 128], sharding={"units": 4}, executor={"kind": "debug"}
    )
    sweep = disk.root / "sweep"
    run = start_run(spec, sweep)
    until(lambda: any((sweep / "done").glob("*.json")), "the first unit's marker", run)
    disk.fill()
    out, err = run.communicate(timeout=300)
    done = len(list((sweep / "done").glob("*.json")))  # the first, or the second too where it beat the fill
    left = 4 - done - 1
    assert run.returncode == 2 and "Traceback" not in err and "Errno" not in out + err, out + err
    assert err.strip().splitlines()[-1] == (
        f"tilesweep: error: the disk of {sweep} (the filesystem at {disk.root}) is full (No space left on device): "
        f"the run started no further unit ({left} unit{'s' if left != 1 else ''} not started) and every record "
        f"written is kept; free space on it (or raise the quota), then `tilesweep resume {sweep}` runs what is missing"
    ), err
    assert len((sweep / "jobs.jsonl").read_text().splitlines()) == done + 1  # the units done and the one that failed
    disk.free()
    assert run_cli("resume", str(sweep)).returncode == 0
    status = run_cli("status", str(sweep))
    head = status.stdout.splitlines()[0]
    assert status.returncode == 0 and head.endswith("8/8 items done (0 error records), complete"), status.stdout


def test_a_unit_left_running_whose_disk_fills_says_which_file_and_filesystem_not_python_s_oserror(
    disk: SmallDisk, tmp_path: Path
) -> None:
    """A unit ``resume --no-wait`` left running, replayed at the real pace: the disk fills
    once its first record is written, so a later write of its worker finds no room (its partial
    grows past the page it has, or its marker). Its log's last line, which ``wait`` and
    ``status`` show, names the file, the filesystem and what to do, not Python's
    "[Errno 28] No space left on device: '...'"."""
    grid = {"seq_lens": [128], "fwd_block_q": [16, 32, 64, 128], "fwd_block_k": [16, 32, 64]}
    spec = _replay_spec(tmp_path, {"pace": "real"}, **grid)
    source = tmp_path / "source.json"  # each record half a second of compile, waited out before it is written
    data = json.loads(source.read_text())
    source.write_text(json.dumps({**data, "results": [{**r, "compile_s": 0.5} for r in data["results"]]}))
    sweep = disk.root / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    started = run_cli("resume", str(sweep), "--no-wait")
    assert started.returncode == 0 and "started 1 unit here" in started.stdout, started.stderr
    until(lambda: records_written(sweep) > 0, "the unit's first record")
    disk.fill()
    waited = run_cli("wait", str(sweep))
    (unit,) = [u["id"] for u in json.loads((sweep / "units.json").read_text())]  # the plan's, which resume ran
    said = (
        re.escape(f"unit {unit} failed (cannot write {sweep}{os.sep}")
        + r"\S+"
        + re.escape(
            f" (No space left on device): free space on its disk, the filesystem at {disk.root} (or raise the quota))"
        )
    )
    assert waited.returncode == 1 and re.search(said, waited.stderr), waited.stderr
    assert "Errno" not in waited.stderr + run_cli("status", str(sweep)).stdout
    disk.free()
    assert run_cli("resume", str(sweep)).returncode == 0
    status = run_cli("status", str(sweep))
    assert status.stdout.splitlines()[0].endswith("13/13 items done (0 error records), complete"), status.stdout


def test_a_worker_that_left_an_empty_log_on_a_full_disk_is_said_to_have_had_no_room(
    disk: SmallDisk, tmp_path: Path
) -> None:
    """A worker that failed on the full disk with no room for its reason (its log empty, exit
    code 1): the run says what it knows, the full disk, not a bare exit code."""
    from orchestrator.control.dispatch.local import _Disk, _ended
    from orchestrator.control.dispatch.local_procs import LocalWorker

    sd = SweepDir.open(_replay_sweep(tmp_path, disk.root))
    unit = sd.unit_index()[0]["id"]
    log = sd.logs / f"{unit}.1_0_log.err"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.touch()
    disk.fill()
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    worker = LocalWorker(unit, proc, log, sd.marker_path(unit), 60, None, time.monotonic())
    ended = _ended(sd, worker, _Disk(sd.root))
    assert not ended.ok and ended.error == (
        "its worker could not write to the sweep directory, whose disk is full (No space left on device); "
        "its log is empty (exit code 1)"
    )
    disk.free()
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    worker = LocalWorker(unit, proc, log, sd.marker_path(unit), 60, None, time.monotonic())
    assert _ended(sd, worker, _Disk(sd.root)).error == "the worker exited with code 1"  # room left: nothing known


def test_the_environment_is_recorded_whole_or_not_at_all(disk: SmallDisk) -> None:
    sd = SweepDir(disk.root / "sweep")
    sd.root.mkdir()
    env = {"device_kind": "NVIDIA H100", "jax": "0.12.0"}
    disk.fill()
    with pytest.raises(SweepDirError, match=FREE_SPACE):
        sd.check_env(env)
    assert not (sd.root / "env.json").exists()
    assert sd.recorded_env() is None
    disk.free()
    sd.check_env(env)  # the first worker after the disk was freed records it
    assert sd.recorded_env() == env
    assert [p.name for p in sd.root.iterdir()] == ["env.json"], "a temp file was left"


def test_a_merge_onto_a_full_disk_says_to_free_space_and_keeps_the_document(disk: SmallDisk, tmp_path: Path) -> None:
    out = disk.root / "results.json"
    build_sweep(tmp_path / "sweep", small_spec(1), 1, output=out)
    first = run_cli("merge", str(tmp_path / "sweep"))
    assert first.returncode == 0, first.stderr
    before = out.read_bytes()
    disk.fill()
    full = run_cli("merge", str(tmp_path / "sweep"), "--output", str(disk.root / "other.json"))
    assert full.returncode == 2
    assert_one_line_error(full, FREE_SPACE)
    assert "chmod" not in full.stderr
    assert out.read_bytes() == before
    assert not list(disk.root.glob("*.tmp")) and not (disk.root / "other.json").exists()


def test_a_merge_that_finds_its_disk_full_names_the_merge_cache_it_may_delete(disk: SmallDisk) -> None:
    sweep = disk.root / "sweep"
    build_sweep(sweep, small_spec(1), 1, output=disk.root / "results.json")
    assert run_cli("merge", str(sweep)).returncode == 0  # its merge cache is on the same disk
    disk.fill()
    other = disk.root / "other.json"
    full = run_cli("merge", str(sweep), "--output", str(other))
    assert_one_line_error(full, f"cannot write {other}", "nothing was written", FREE_SPACE, "merge cache")
    assert f"{sweep / 'merge-cache'} takes" in full.stderr and "safe to delete" in full.stderr
    shutil.rmtree(sweep / "merge-cache")
    disk.free()
    assert run_cli("merge", str(sweep), "--output", str(other)).returncode == 0


def test_a_final_merge_job_on_a_full_disk_says_why_it_refused_not_python_s_oserror(disk: SmallDisk) -> None:
    """The final merge job's task, run as a SLURM node runs it (its stderr is its log): the
    document's disk is full, and so is the sweep directory's, where the job records what it did.
    Its log says why the merge refused and that the record was not written, each naming the file,
    its filesystem and what to do; it ends in the merge's refusal, not in an OSError of its own."""
    sweep, out = disk.root / "sweep", disk.root / "results.json"
    build_sweep(sweep, small_spec(1), 1, output=out)
    disk.fill()
    task = "import sys; from orchestrator.control.dispatch.tasks import MergeTask; MergeTask()(sys.argv[1])"
    job = subprocess.run([sys.executable, "-c", task, str(sweep)], cwd=REPO, capture_output=True, text=True)
    fix = f"(No space left on device); nothing was written: free space on its disk, the filesystem at {disk.root}"
    assert job.returncode == 1 and f"final merge refused: cannot write {out} {fix}" in job.stderr, job.stderr
    unrecorded = (
        f"what the final merge did was not recorded: cannot write {sweep / 'final-merge.json'} (No space left on "
        f"device): free space on its disk, the filesystem at {disk.root} (or raise the quota)"
    )
    assert unrecorded in job.stderr and "Errno" not in job.stderr, job.stderr
    assert job.stderr.strip().splitlines()[-1].startswith("orchestrator.errors.ResultsError: cannot write"), job.stderr


@pytest.mark.parametrize("command", ["plan", "run", "submit"])
def test_planning_onto_a_full_disk_says_so_and_leaves_no_half_made_sweep(
    disk: SmallDisk, tmp_path: Path, command: str
) -> None:
    spec = _replay_spec(tmp_path)
    disk.fill()
    sweep = disk.root / "sweep"
    done = run_cli(command, str(spec), "--sweep-dir", str(sweep))
    assert_one_line_error(done, f"cannot make the sweep directory {sweep}", FREE_SPACE)
    assert not sweep.exists()
    disk.free()
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    assert (sweep / "sweep.json").is_file()


def test_a_sweep_directory_or_output_on_a_read_only_mount_is_one_line(tmp_path: Path) -> None:
    spec = _replay_spec(tmp_path)
    with tmpfs(tmp_path / "ro", "size=1m,ro") as root:
        done = run_cli("plan", str(spec), "--sweep-dir", str(root / "sweep"))
        assert_one_line_error(done, "Read-only file system", "mounted read-only", "pick another --sweep-dir")
        # an output there is refused before anything is measured, not by the merge at the end
        sweep = tmp_path / "sweep"
        done = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--output", str(root / "results.json"))
        assert_one_line_error(done, f"the folder {root} takes no new files", "name another output")
        assert not sweep.exists()


def test_an_output_in_a_folder_where_no_file_can_be_made_is_one_line_at_once(tmp_path: Path) -> None:
    """/proc takes no new file, even from root, whom access() lets write there: the plan refuses
    it, and a merge into it says so at once (its lock file could not be made: it waited out the
    lock's ten-minute timeout and then blamed another merge)."""
    spec = _replay_spec(tmp_path)
    sweep = tmp_path / "sweep"
    done = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--output", "/proc/tilesweep-results.json")
    assert_one_line_error(done, "the folder /proc takes no new files", "name another output")
    assert not sweep.exists()
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    done = run_cli("merge", str(sweep), "--output", "/proc/tilesweep-results.json", timeout=60)
    assert_one_line_error(done, "cannot create the lock file /proc/", "merge into another folder")


def test_plots_onto_a_full_disk_are_one_line(disk: SmallDisk, tmp_path: Path, sample_doc: dict[str, object]) -> None:
    pytest.importorskip("matplotlib")
    results = tmp_path / "results.json"
    results.write_text(json.dumps(sample_doc))
    disk.fill()
    done = run_cli("report", str(results), "--plots", str(disk.root / "plots"))
    assert_one_line_error(done, "--plots", "cannot write the plots", FREE_SPACE)


def test_a_report_or_compare_page_onto_a_full_disk_says_to_free_space_and_keeps_the_page_there(
    disk: SmallDisk, tmp_path: Path, sample_doc: dict[str, object]
) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps(sample_doc))
    page = disk.root / "report.html"
    assert run_cli("report", str(results), "--html", str(page)).returncode == 0
    before = page.read_bytes()
    disk.fill()
    results.write_text(json.dumps({**sample_doc, "results": json.loads(SAMPLE.read_text())["results"][:3]}))
    for args in (["report", str(results)], ["compare", str(results), str(SAMPLE)]):  # a page of other numbers
        done = run_cli(*args, "--html", str(page))
        assert_one_line_error(
            done, f"{page}: cannot write the page (No space left on device)", FREE_SPACE, str(disk.root)
        )
        assert page.read_bytes() == before and sorted(p.name for p in disk.root.iterdir()) == sorted(
            ["report.html", disk.filler.name]
        )
