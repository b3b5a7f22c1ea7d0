"""A complete sweep whose results document was never written, or lacks records written after
its merge: ``status`` (text, ``--json``, exit code) and ``ls`` say so, and what writes it.

Real processes: ``tilesweep run`` killed with SIGKILL while its worker goes on and finishes its
unit, ``resume --no-wait`` leaving a worker that records after a merge; each step waits for an
event (a worker started, a marker, a lease let go), never a guessed time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import REPO, TINY_SPEC, fwd_replay_spec, replay_spec, run_cli, start_run, synthetic_source, until
from tests.test_local_lifecycle import SETTLE_S, SPEC, replay_source


def _settled(sweep: Path, units: int) -> bool:
    """``units`` markers written and no worker holding a unit's lease any more."""
    markers = len(list((sweep / "done").glob("*.json")))
    return markers == units and not any((sweep / "leases").glob("*.lease"))


def _killed_run(spec: Path, sweep: Path) -> None:
    """``tilesweep run`` (one worker at a time) killed outright once it started its first unit's
    worker, which goes on, takes its unit and finishes it."""
    run = start_run(spec, sweep, "--workers", "1")
    until(lambda: any("unit" in entry for entry in _jobs(sweep)), "the first unit's worker", run)
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=SETTLE_S)


def _jobs(sweep: Path) -> list[dict[str, object]]:
    history = sweep / "jobs.jsonl"
    text = history.read_text() if history.is_file() else ""
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _replay_spec(tmp_path: Path, units: int) -> Path:
    """``SPEC`` (four items) replayed, in ``units`` units: a worker takes moments to run one."""
    source, output = replay_source(tmp_path), tmp_path / "results.json"
    return replay_spec(tmp_path / "spec.json", {**TINY_SPEC, **SPEC}, source, output, sharding={"units": units})


def test_a_killed_runs_finished_sweep_is_complete_not_merged_until_merge(tmp_path: Path) -> None:
    spec = _replay_spec(tmp_path, 1)
    sweep, out = tmp_path / "sweep", tmp_path / "results.json"
    _killed_run(spec, sweep)
    until(lambda: _settled(sweep, 1), "the worker's marker")
    assert not out.exists()
    status = run_cli("status", str(sweep))
    head = status.stdout.splitlines()[0]
    assert status.returncode == 1, status.stdout
    assert head.endswith(f"complete, not merged: `tilesweep merge {sweep}` writes {out}"), head
    data = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert data["complete"] and data["merged"] is False and data["output"] == str(out), data
    listed = run_cli("ls", str(tmp_path))
    (line,) = listed.stdout.splitlines()
    assert line.split()[1:6] == ["4/4", "items", "complete,", "not", "merged"], line
    assert run_cli("merge", str(sweep)).returncode == 0
    status = run_cli("status", str(sweep))
    assert status.returncode == 0 and status.stdout.splitlines()[0].endswith(", complete"), status.stdout
    assert json.loads(run_cli("status", str(sweep), "--json").stdout)["merged"] is True


def test_records_written_after_a_merge_leave_the_sweep_not_merged_since(tmp_path: Path) -> None:
    """A merge of the killed run's first unit, then ``resume --no-wait`` runs the second unit
    and nothing merges its records: the document exists but lacks them."""
    spec = _replay_spec(tmp_path, 2)
    sweep, out = tmp_path / "sweep", tmp_path / "results.json"
    _killed_run(spec, sweep)
    until(lambda: _settled(sweep, 1), "the first unit's marker")
    assert run_cli("merge", str(sweep)).returncode == 0 and out.exists()
    assert run_cli("resume", str(sweep), "--no-wait").returncode == 0
    until(lambda: _settled(sweep, 2), "the second unit's marker")
    status = run_cli("status", str(sweep))
    head = status.stdout.splitlines()[0]
    assert status.returncode == 1, status.stdout
    assert head.endswith(f"complete, not merged since its last records: `tilesweep merge {sweep}` updates {out}")
    assert json.loads(run_cli("status", str(sweep), "--json").stdout)["merged"] is False
    assert run_cli("merge", str(sweep)).returncode == 0
    status = run_cli("status", str(sweep))
    assert status.returncode == 0 and status.stdout.splitlines()[0].endswith(", complete"), status.stdout


def test_status_text_and_json_say_whether_the_document_is_there_from_one_fact(tmp_path: Path) -> None:
    """Whether the results document of a complete sweep not merged since its last records is
    there is gathered once, with the status: its text renders that fact (a document removed
    after the status was taken changes neither), and ``--json`` says it too."""
    from orchestrator.control.status import format_status, sweep_status
    from orchestrator.store.synthetic import build_sweep, small_spec

    sweep, out = tmp_path / "sweep", tmp_path / "results.json"
    sd, _ = build_sweep(sweep, small_spec(1), 2, output=out)
    assert run_cli("merge", str(sweep)).returncode == 0
    shutil.rmtree(sweep / "merge-cache")  # no stamp of what the merge read: the partials' mtimes tell
    later = out.stat().st_mtime + 60
    for partial in (sweep / "partials").iterdir():
        os.utime(partial, (later, later))
    st = sweep_status(sd, query_slurm=False)
    since = f"complete, not merged since its last records: `tilesweep merge {sweep}` updates {out}"
    assert format_status(st).splitlines()[0].endswith(since)
    assert json.loads(run_cli("status", str(sweep), "--json").stdout)["output_exists"] is True
    out.unlink()
    assert format_status(st).splitlines()[0].endswith(since)  # the status as it was taken
    never = f"complete, not merged: `tilesweep merge {sweep}` writes {out}"
    assert run_cli("status", str(sweep)).stdout.splitlines()[0].endswith(never)
    assert json.loads(run_cli("status", str(sweep), "--json").stdout)["output_exists"] is False


def _recorded_by_hand(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """A replay sweep of two units for the ``kind`` executor, each unit run by hand
    (``python -m jobs.worker``): complete, its document never written."""
    grid = {**TINY_SPEC, "modes": ["fwd"], "seq_lens": [64, 128]}
    source = synthetic_source(tmp_path / "source.json", grid)
    out, sweep = tmp_path / f"{kind}-results.json", tmp_path / f"{kind}-sweep"
    spec = replay_spec(tmp_path / f"{kind}.json", grid, source, out, executor={"kind": kind}, sharding={"units": 2})
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    for unit in json.loads((sweep / "units.json").read_text()):
        done = subprocess.run([sys.executable, "-m", "jobs.worker", str(sweep), unit["id"]], cwd=REPO)
        assert done.returncode == 0
    return sweep, out


def test_a_resume_here_with_nothing_to_resubmit_says_it_merges_the_sweeps_document(tmp_path: Path) -> None:
    sweep, out = _recorded_by_hand(tmp_path, "local")
    nothing = f"all 6 items of {sweep} have a record; nothing to resubmit"
    left = run_cli("resume", str(sweep), "--no-wait")  # it merges nothing: it says what does
    assert left.returncode == 1 and not out.exists(), left.stdout + left.stderr
    never = f"complete, not merged: `tilesweep merge {sweep}` writes {out}"
    assert left.stdout.splitlines() == [nothing, f"nothing started; the sweep is {never}"], left.stdout
    merged = run_cli("resume", str(sweep))
    assert merged.returncode == 0 and out.exists(), merged.stdout + merged.stderr
    assert merged.stdout.splitlines()[0] == f"{nothing}; merging them into {out} (not merged yet)", merged.stdout
    again = run_cli("resume", str(sweep))
    assert again.returncode == 0 and again.stdout.splitlines()[0] == nothing, again.stdout


@pytest.mark.slurm
def test_a_resume_on_slurm_with_nothing_to_resubmit_names_the_merge_its_sweep_lacks(tmp_path: Path) -> None:
    from tests.slurm_cluster import require_cluster

    require_cluster()
    sweep, out = _recorded_by_hand(tmp_path, "slurm")
    nothing = f"all 6 items of {sweep} have a record; nothing to resubmit"
    left = run_cli("resume", str(sweep))
    assert left.returncode == 1 and not out.exists(), left.stdout + left.stderr
    never = f"complete, not merged: `tilesweep merge {sweep}` writes {out}"
    assert left.stdout.splitlines() == [f"{nothing}; the sweep is {never}"], left.stdout
    assert run_cli("merge", str(sweep)).returncode == 0
    done = run_cli("resume", str(sweep))
    assert done.returncode == 0 and done.stdout.splitlines() == [nothing], done.stdout


@pytest.mark.parametrize("append", [False, True])
def test_a_document_another_sweeps_merge_replaced_is_not_this_sweeps_merge(tmp_path: Path, append: bool) -> None:
    """Two sweeps whose specs name one output, merged one after the other: the second's merge
    replaced the document (the first's is not merged: status and ``ls`` say the document holds
    another sweep's records, and the command that writes this one's), or appended into it
    (append: true keeps the first's records, and the first is merged)."""
    out = tmp_path / "o.json"
    first, _ = build_sweep(tmp_path / "sweeps" / "first", small_spec(n_seqs=1), 2, output=out)
    second, _ = build_sweep(tmp_path / "sweeps" / "second", {**small_spec(n_seqs=2), "append": append}, 2, output=out)
    assert run_cli("merge", str(first.root)).returncode == 0
    assert json.loads(run_cli("status", str(first.root), "--json").stdout)["merged"] is True
    assert run_cli("merge", str(second.root)).returncode == 0
    said = run_cli("status", str(first.root))
    data = json.loads(run_cli("status", str(first.root), "--json").stdout)
    listed = run_cli("ls", str(tmp_path / "sweeps")).stdout.splitlines()[0]
    if append:
        assert data["merged"] is True and data["output_foreign"] is False, data
        assert said.returncode == 0 and "not merged" not in said.stdout, said
        return
    assert data["merged"] is False and data["output_foreign"] is True and said.returncode != 0, said
    assert f"not merged: {out} holds another sweep's records" in said.stdout, said.stdout
    assert f"tilesweep merge {first.root} --output FILE" in said.stdout, said.stdout
    assert f"{first.root}" in listed and "holds another sweep's records" in listed, listed


def test_a_sweep_that_carried_its_outputs_records_says_so_not_that_another_sweeps_replaced_it(tmp_path: Path) -> None:
    """A second sweep of a spec whose output document a first sweep wrote carries every record
    from it (the output is searched for reuse): complete, its document not merged yet. The output
    holds those records as the first sweep wrote them, which is no other sweep's merge in this
    one's place: status and ``ls`` say so and that ``merge`` writes this sweep's (not ``--output``),
    and it does; once another sweep's merge changed the document, it holds another sweep's records."""
    spec, first, second = fwd_replay_spec(tmp_path), tmp_path / "sweeps" / "first", tmp_path / "sweeps" / "second"
    out = tmp_path / "r.json"
    assert run_cli("run", str(spec), "--sweep-dir", str(first)).returncode == 0 and out.is_file()
    assert "every item is carried" in run_cli("plan", str(spec), "--sweep-dir", str(second)).stdout
    said, data = run_cli("status", str(second)), json.loads(run_cli("status", str(second), "--json").stdout)
    carried = f"complete, not merged: {out} is the document this sweep carried records from, as its sweep wrote it"
    assert said.returncode == 1 and f"{carried}; `tilesweep merge {second}` writes this sweep's" in said.stdout, said
    assert "another sweep's" not in said.stdout and "--output" not in said.stdout, said.stdout
    assert (data["output_carried"], data["output_foreign"], data["merged"]) == (True, False, False), data
    listed = [line for line in run_cli("ls", str(tmp_path / "sweeps")).stdout.splitlines() if str(second) in line]
    assert carried in listed[0], listed
    assert run_cli("merge", str(second)).returncode == 0
    assert run_cli("status", str(second)).returncode == 0
    assert f"{out} holds another sweep's records" in run_cli("status", str(first)).stdout
