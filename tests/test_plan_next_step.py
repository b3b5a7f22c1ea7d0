"""What ``plan`` says once it wrote a sweep directory: where, how many units, and what runs
them next (``resume``, or one unit by hand), or, where every item is carried from earlier
documents, that nothing is to measure and ``merge`` writes the document."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers import assert_one_line_error, fwd_replay_spec, run_cli


def test_plan_into_a_sweep_directory_says_where_and_how_many_units(tmp_path: Path) -> None:
    spec, sweep, again = fwd_replay_spec(tmp_path, sharding={"units": 1}), tmp_path / "sweep", tmp_path / "again"
    r = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
    said = f"planned into {sweep} (1 unit); `tilesweep resume {sweep}` runs them"
    assert r.returncode == 0 and said in r.stdout and "run one with: python -m jobs.worker" in r.stdout, r.stdout
    # once its document holds every record, a new plan carries them all: no worker to run, merge writes it
    assert run_cli("resume", str(sweep)).returncode == 0
    r = run_cli("plan", str(spec), "--sweep-dir", str(again))
    assert r.returncode == 0 and "nothing to measure; `tilesweep merge" in r.stdout and "jobs.worker" not in r.stdout
    assert run_cli("merge", str(again)).returncode == 0


def test_plan_json_with_a_sweep_directory_and_no_dry_run_is_refused_not_silently_unwritten(tmp_path: Path) -> None:
    """--json shows the plan and writes nothing: with --sweep-dir, where plan writes the plan,
    it is refused in one line naming both ways out, and no directory is made; --dry-run shows it."""
    spec, sweep = fwd_replay_spec(tmp_path, sharding={"units": 1}), tmp_path / "sweep"
    r = run_cli("plan", str(spec), "--json", "--sweep-dir", str(sweep))
    assert_one_line_error(r, f"--json prints the plan and writes nothing into {sweep}", "add --dry-run", "drop --json")
    assert not sweep.exists()
    shown = run_cli("plan", str(spec), "--json", "--sweep-dir", str(sweep), "--dry-run")
    assert shown.returncode == 0 and all(json.loads(line)["unit"] == 0 for line in shown.stdout.splitlines())
    assert not sweep.exists()
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0 and (sweep / "units.json").is_file()


def test_a_plan_whose_disk_fills_says_to_free_space_then_plan_again_which_writes_the_rest(tmp_path: Path) -> None:
    """A real 2 MiB tmpfs filled but for two pages: the sweep's first files fit, a unit's does not.
    The one line names the file, the filesystem and the plan to run again, which writes the rest."""
    from tests.test_full_disk import SmallDisk, tmpfs

    spec = fwd_replay_spec(tmp_path, sharding={"units": 1})
    with tmpfs(tmp_path / "disk", "size=2m") as root:
        disk, sweep = SmallDisk(root), root / "sweep"
        disk.fill()
        page = os.sysconf("SC_PAGE_SIZE")
        os.truncate(disk.filler, disk.filler.stat().st_size // page * page - 2 * page)
        full = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
        line = assert_one_line_error(full, f"cannot write {sweep}/", f"the filesystem at {root} (or raise the quota)")
        again = f"; then `tilesweep plan {spec} --sweep-dir {sweep}` again writes the plan it left unwritten"
        assert line.endswith(again), line
        disk.free()
        assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
        status = run_cli("status", str(sweep))
        assert "1 pending" in status.stdout and "not submitted" in status.stdout, status.stdout


def test_a_dry_run_of_a_sweep_planned_before_shows_the_units_it_keeps(tmp_path: Path) -> None:
    """``plan --dry-run --sweep-dir D`` of a planned sweep shows the units D keeps, which its
    ``resume`` runs, not a plan made anew (which, its document written, would carry every item in a
    unit of its own); it writes nothing, and ``--json`` shows the same units. A spec of another
    sweep is refused as ``plan`` refuses it."""
    spec, sweep = fwd_replay_spec(tmp_path, sharding={"units": 2}), tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    assert run_cli("resume", str(sweep)).returncode == 0  # its document holds every record now
    kept = [entry["id"] for entry in json.loads((sweep / "units.json").read_text())]
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    dry = run_cli("plan", str(spec), "--dry-run", "--sweep-dir", str(sweep))
    assert dry.returncode == 0 and dry.stdout == run_cli("plan", str(spec), "--sweep-dir", str(sweep)).stdout
    head = f"{sweep} was planned before: 3 items (0 pruned by the shared-memory model, 0 invalid) in the {len(kept)}"
    assert dry.stdout.startswith(head), dry.stdout
    assert [line.split()[2].rstrip(":") for line in dry.stdout.splitlines()[1:]] == kept, dry.stdout
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before
    # --json shows the same kept plan: each item in the kept unit that holds it, none carried anew
    shown = run_cli("plan", str(spec), "--dry-run", "--json", "--sweep-dir", str(sweep))
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    held = {
        i: k
        for k, uid in enumerate(kept)
        for i, _ in json.loads((sweep / "units" / f"{uid}.json").read_text())["items"]
    }
    assert shown.returncode == 0 and [line.get("unit") for line in lines] == [held[i] for i in range(3)], shown
    assert not any("reused_from" in line for line in lines) and "planned anew" not in shown.stderr, shown
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before
    (tmp_path / "other").mkdir()
    other = fwd_replay_spec(tmp_path / "other", repeats=4)
    r = run_cli("plan", str(other), "--dry-run", "--sweep-dir", str(sweep))
    assert_one_line_error(r, f"{sweep} already holds a sweep of another spec (repeats 4 in this spec")
