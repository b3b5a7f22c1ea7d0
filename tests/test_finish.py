"""What a finished sweep prints and exits with (``cli.finish.finish_sweep``), whichever command
saw it finish: a ``run`` that followed another one ends as a ``run`` here does."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli.finish import finish_sweep
from orchestrator.control import dispatch
from orchestrator.control.sweeps import prepare_sweep
from orchestrator.store.leases import run_lease
from tests.conftest import REPO, run_cli
from tests.helpers import EXCERPT_BF16_D64, LAUNCH, assert_one_line_error, sample_replay_spec


def _replay_spec(tmp_path: Path, *, html: bool, **over: object) -> Path:
    """bf16 d64 s2048, fwd and fwd_bwd (104 items) in 3 units, replayed from the excerpt."""
    data = {**EXCERPT_BF16_D64, "sharding": {"units": 3}, "report": {"html": html}, **over}
    return sample_replay_spec(tmp_path / "finish.json", tmp_path / "results.json", **data)


def test_a_run_that_follows_another_ends_as_a_run_here_does(tmp_path: Path) -> None:
    """The follower names what is missing and the command that redoes it, exits 1, and writes
    the page the spec file asks for (its report.html is not part of the sweep's fingerprint)."""
    sweep = tmp_path / "sweep"
    sd, unit_ids, _ = prepare_sweep(str(_replay_spec(tmp_path, html=False)), str(sweep), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids[:1], kind="debug"))
    done = sd.unit_index()[0]["n_items"]
    spec = _replay_spec(tmp_path, html=True)
    args = [sys.executable, "-m", "orchestrator", "run", str(spec), "--sweep-dir", str(sweep)]
    with run_lease(sd.root, "run"):  # another `run` holds the sweep
        follower = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert follower.stderr is not None
        seen: list[str] = []
        while "following its progress" not in (line := follower.stderr.readline()):
            assert line, "".join(seen)  # the follower ended before it said it follows
            seen.append(line)
    out, err = follower.communicate(timeout=600)  # the other run has ended: the follower finishes
    redo = f"`tilesweep run {spec} --sweep-dir {sweep}` redoes only those"
    assert follower.returncode == 1, err
    assert f"tilesweep: {sd.planned - done} items have no record; {redo}" in err.splitlines()
    assert "speedup" in out and out.splitlines()[-1] == f"report page: {tmp_path / 'results.html'}"
    # the command it names redoes only what is missing, and ends the same way with nothing left
    rerun = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    assert rerun.returncode == 0, rerun.stderr
    assert "have no record" not in rerun.stderr and f"{done} already recorded" in rerun.stderr
    assert rerun.stdout.splitlines()[-1] == f"report page: {tmp_path / 'results.html'}"


def test_finish_shows_no_table_without_records_and_exits_1_while_units_are_unfinished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sd, unit_ids, _ = prepare_sweep(str(_replay_spec(tmp_path, html=True)), str(tmp_path / "sweep"), None, None)
    failed = ["unit u1 failed: boom"]
    assert finish_sweep(sd, overwrite=False, html=True, failed=failed, redo="`again`") == 1
    out, err = capsys.readouterr()
    assert out == ""  # nothing recorded: no table, no page
    assert err.splitlines()[1:] == [
        "tilesweep: unit u1 failed: boom",
        f"tilesweep: {sd.planned} items have no record; `again` redoes only those",
    ]
    # nothing recorded: no document of no record is written
    assert err.startswith(f"nothing was measured: no unit wrote a record, so {sd.output} is not written"), err
    assert not sd.output.exists()
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    # every item recorded, but a unit ended unfinished (a later round's, say): still 1, and said
    assert finish_sweep(sd, overwrite=False, html=True, failed=failed, redo="`again`") == 1
    out, err = capsys.readouterr()
    assert "tilesweep: 1 unit ended unfinished; `again` redoes only those" in err.splitlines()
    assert "speedup" in out and out.splitlines()[-1] == f"report page: {tmp_path / 'results.html'}"
    assert finish_sweep(sd, overwrite=False, html=False, failed=[], redo="`again`") == 0
    out, err = capsys.readouterr()
    assert "redoes" not in err and "report page" not in out and "speedup" in out


def test_survivors_of_round_2_not_timed_in_full_are_told_as_what_resume_redoes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A halving sweep stopped in round 2: every item has its screen's record, so the merge
    misses none, but the survivors not timed in full yet are what resume redoes: said, exit 1."""
    from orchestrator.control.rounds import advance

    spec = _replay_spec(tmp_path, html=False, timing={"strategy": "halving", "keep": 3})
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    second = advance(sd, sd.spec.executor)
    assert second is not None and len(second.units) >= 2
    assert all(o.ok for o in dispatch.run_units_locally(sd, [second.units[0].id], kind="debug"))
    untimed = sum(len(u.items) for u in second.units[1:])
    assert finish_sweep(sd, overwrite=False, html=False, failed=[], redo="`again`") == 1
    err = capsys.readouterr().err
    assert err.startswith(f"merged {sd.planned} records (0 errors, 0 of {sd.planned} planned missing)"), err
    assert f"tilesweep: {untimed} survivors of round 2 not timed in full yet; `again` redoes only those" in err


def test_a_ctrl_c_of_a_run_that_follows_another_says_that_run_goes_on(tmp_path: Path) -> None:
    """Ctrl-C stops following, not the run followed: the line says so, and how to follow again."""
    sweep = tmp_path / "sweep"
    sd, _, _ = prepare_sweep(str(_replay_spec(tmp_path, html=False)), str(sweep), None, None)
    # SIGINT at its default, as at a terminal (a test started in the background has it ignored)
    args = [sys.executable, "-c", LAUNCH, "run", str(_replay_spec(tmp_path, html=False)), "--sweep-dir"]
    with run_lease(sd.root, "run"):  # another `run` holds the sweep
        follower = subprocess.Popen(
            [*args, str(sweep)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert follower.stderr is not None
        seen: list[str] = []
        while "following its progress" not in (line := follower.stderr.readline()):
            assert line, "".join(seen)
            seen.append(line)
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=120)
    assert follower.returncode == 130, err
    assert f"tilesweep: interrupted; stopped following; what runs the sweep goes on: `tilesweep wait {sweep}`" in err
    assert "finished records are kept" not in err


def test_a_second_run_naming_another_output_while_a_run_runs_the_sweep_is_refused(tmp_path: Path) -> None:
    """The running run merges into the sweep's output when it ends, whatever a second run says:
    moving the output under it would write both documents. Refused in one line, nothing moved."""
    sweep = tmp_path / "sweep"
    spec = _replay_spec(tmp_path, html=False)
    sd, _, _ = prepare_sweep(str(spec), str(sweep), None, None)
    frozen = (sweep / "sweep.json").read_bytes()
    other = tmp_path / "other.json"
    with run_lease(sd.root, "run"):  # another `run` holds the sweep
        r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--output", str(other))
    assert_one_line_error(r, "is being run by another `tilesweep run`", f"merges into {sd.output} when it ends")
    assert (sweep / "sweep.json").read_bytes() == frozen and not other.exists()


def test_the_merge_line_counts_one_record_or_error_in_the_singular(write_spec: Callable[..., Path]) -> None:
    """A sweep of auto and one config the shared-memory model prunes (an error record): the merge
    line says "1 error", not "1 errors"."""
    spec = write_spec(modes=["fwd"], fwd_block_q=[64], fwd_block_k=[64], smem_limit_bytes=4096)
    r = run_cli("run", str(spec), "--sweep-dir", str(spec.parent / "sweep"), "--executor", "debug")
    assert r.returncode == 0, r.stderr
    assert f"merged 2 records (1 error, 0 of 2 planned missing) into {spec.parent / 'results.json'}" in r.stderr
