"""``tilesweep resume`` as its plan decides: only the items without a record are redone, in
one new unit per unit that ended unfinished (not one an earlier resume replaced), a config that
killed workers counted across units, another spec refused, and the settings a resume was given
kept; status then shows the units replaced as resumed, and a unit a resume planned but never
submitted, whose items other units recorded, as replaced."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.control.resume import plan_resume
from orchestrator.control.scheduler import TaskState
from orchestrator.control.status import format_status, sweep_status
from orchestrator.store.sweepdir import SweepDir
from tests.helpers import REPO, TINY_SPEC, assert_one_line_error, scheduler_view, until
from tests.test_status import _fake_partial, _sweep, _three_units_on_slurm

from .conftest import run_cli


def _sweep_whose_worker_died_on_a_config(tmp_path: Path, write_spec: Callable[..., Path]) -> tuple[SweepDir, set[str]]:
    """A sweep of two units (debug executor, a config that killed one worker given up on:
    max_config_attempts 1) whose second unit recorded at least one item and then died with the
    next one alone in flight; and the ids recorded."""
    from jobs.worker import run_unit

    # fwd alone: 6 configs and auto, at least 3 items in each unit
    sd = _sweep(
        tmp_path,
        write_spec,
        units=2,
        executor={"kind": "debug", "max_config_attempts": 1},
        compile={"workers": 1},
        modes=["fwd"],
        fwd_block_q=[16, 32, 64],
        fwd_block_k=[16, 32],
    )
    second = sd.unit_index()[1]["id"]
    items = [it.id for it in sd.unit_items(second)]
    assert len(items) >= 3
    partial = sd.partial_path(second)
    summary = run_unit(str(sd.root), second, stop_check=lambda: partial.read_text().count('"record"') >= 1)
    assert summary["stopped"] and summary["done"] >= 1
    recorded = {json.loads(line)["id"] for line in partial.read_text().splitlines() if '"record"' in line}
    dead = next(i for i in items if i not in recorded)
    with open(partial, "a") as f:  # a worker that died with `dead` alone in flight
        f.write(json.dumps({"start": dead, "attempt": 1, "alone": True}) + "\n")
    return sd, recorded


def test_resume_submits_only_missing_items_and_counts_deaths_across_units(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    # debug executor: resume runs the new units in its own process; a config that killed
    # one worker is given up on even though it moves to a new unit
    sd, recorded = _sweep_whose_worker_died_on_a_config(tmp_path, write_spec)
    first, second = [u["id"] for u in sd.unit_index()]
    # a partial of another environment is refused, naming the file
    foreign = tmp_path / "foreign"
    shutil.copytree(sd.root, foreign)
    header = json.loads(sd.partial_path(second).read_text().splitlines()[0])
    header["header"]["env"] = {**header["header"]["env"], "jax": "0.0.1"}
    (foreign / "partials" / f"{first}.jsonl").write_text(json.dumps(header) + "\n")
    r = run_cli("resume", str(foreign))
    assert_one_line_error(r, "another environment", f"{first}.jsonl", 'jax "0.0.1" vs "')
    # the real resume
    r = run_cli("resume", str(sd.root))
    assert r.returncode == 0, r.stderr
    events = [e for e in sd.job_history() if e.get("event") == "resume"]
    assert len(events) == 1 and second in events[0]["replaces"]
    resubmitted = [it.id for u in events[0]["units"] for it in sd.unit_items(u)]
    missing = {it.id for u in (first, second) for it in sd.unit_items(u)} - recorded
    assert sorted(resubmitted) == sorted(missing)  # every missing item once, nothing recorded again
    st = sweep_status(sd)
    assert st.complete and st.done == st.planned, format_status(st)
    assert run_cli("merge", str(sd.root)).returncode == 0
    doc = json.loads(sd.output.read_text())
    crashed = [r for r in doc["results"] if "WorkerCrashed" in r.get("error", "")]
    assert len(crashed) == 1 and len(doc["results"]) == st.planned
    r = run_cli("resume", str(sd.root))
    assert r.returncode == 0 and "nothing to resubmit" in r.stdout
    # --retry-errors crashed redoes it afresh (it was no killer): the new record supersedes the error
    errors_before = st.errors
    r = run_cli("resume", str(sd.root), "--retry-errors", "crashed")
    assert r.returncode == 0 and "1 crashed error record is redone; 1 new unit" in r.stdout, r.stdout + r.stderr
    st = sweep_status(sd)
    assert st.complete and st.done == st.planned and st.errors == errors_before - 1, format_status(st)
    assert run_cli("merge", str(sd.root)).returncode == 0
    doc = json.loads(sd.output.read_text())
    assert len(doc["results"]) == st.planned and not any("WorkerCrashed" in r.get("error", "") for r in doc["results"])
    r = run_cli("resume", str(sd.root), "--retry-errors", "crashed")
    assert r.returncode == 0 and "no crashed error record to retry; nothing to resubmit" in r.stdout
    r = run_cli("resume", str(sd.root), "--retry-errors", "all")
    assert r.returncode == 0 and "and no error record to retry; nothing to resubmit" in r.stdout, r.stdout


def test_resume_refuses_another_spec(tmp_path: Path, write_spec: Callable[..., Path]) -> None:
    sd = _sweep(tmp_path, write_spec)
    other = write_spec("other.json", repeats=7)
    r = run_cli("resume", str(sd.root), "--spec", str(other))
    assert_one_line_error(r, "not the spec", "(repeats 7 in this spec, 2 in the sweep's)")
    # a search's own section, left at its defaults, is no difference: the strategy is
    search = write_spec("search.json", timing={**TINY_SPEC["timing"], "strategy": "search"})
    line = assert_one_line_error(run_cli("resume", str(sd.root), "--spec", str(search)), "not the spec")
    assert '(timing.strategy "search" in this spec, "full" in the sweep\'s);' in line, line


def test_resume_given_a_sweep_directory_as_its_spec_says_what_spec_takes(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """``resume D --spec D`` (or the plan file D/sweep.json): the line says what --spec takes (a
    spec file of the sweep, the one it was planned from named), not ``resume D``, the command
    just typed; nothing is run or written."""
    sd = _sweep(tmp_path, write_spec)
    jobs_before = (sd.root / "jobs.jsonl").exists()
    for given, what in ((sd.root, "the sweep directory"), (sd.root / "sweep.json", "the plan of the sweep directory")):
        line = assert_one_line_error(
            run_cli("resume", str(sd.root), "--spec", str(given)),
            f"--spec {given} is {what} {sd.root}, not a spec file; --spec takes a spec file of the sweep in "
            f"{sd.root} (it was planned from {tmp_path / 'spec.json'}), whose executor settings resume uses, or "
            "resume without --spec",
        )
        assert f"`tilesweep resume {sd.root}`" not in line, line
    assert (sd.root / "jobs.jsonl").exists() == jobs_before
    assert not list((sd.root / "partials").glob("*.jsonl"))


def test_the_executor_settings_a_resume_was_given_stay_the_sweeps(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """``resume --spec`` with other executor settings (a fix for a task that could not start):
    a later plain resume keeps them, not the broken ones it was fixing. An output the spec names
    that is not the sweep's is said to be unused."""
    sd = _sweep(tmp_path, write_spec, executor={"kind": "debug"}, modes=["fwd"], fwd_block_q=[32])
    fixed = write_spec("fixed.json", executor={"kind": "debug", "max_config_attempts": 5}, modes=["fwd"])
    data = json.loads(fixed.read_text())
    fixed.write_text(json.dumps({**data, "fwd_block_q": [32], "output": str(tmp_path / "other.json")}))
    r = run_cli("resume", str(sd.root), "--spec", str(fixed))
    assert r.returncode == 0, r.stderr
    assert f"{sd.root} runs with the executor settings of {fixed} from now on" in r.stdout, r.stdout
    assert f"names {tmp_path / 'other.json'}, which resume does not use" in r.stderr, r.stderr
    assert SweepDir.open(sd.root).spec.executor.max_config_attempts == 5
    again = run_cli("resume", str(sd.root), "--spec", str(fixed))
    assert again.returncode == 0 and "from now on" not in again.stdout, again.stdout


def test_a_unit_never_submitted_whose_items_others_recorded_is_settled_by_resume(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """A retry unit stopped before it started, its items recorded by a later one: status reads
    it as replaced, not as a unit to start, and ``resume``, with nothing to resubmit, settles it."""
    from orchestrator.planning import Unit

    sd = _sweep(tmp_path, write_spec, units=1, modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug"})
    assert run_cli("resume", str(sd.root)).returncode == 0  # runs the unit here: every item recorded
    retry = Unit(0, sd.unit_items(sd.unit_index()[0]["id"])[:2], round=1)
    retry.finalize()
    sd.add_units([retry], origin="retry")  # planned, never started: its items have records already
    before = sweep_status(sd, query_slurm=False)
    assert before.never_started() == [] and before.complete, format_status(before)
    assert {u.id: u.state for u in before.units}[retry.id] == "replaced"
    r = run_cli("resume", str(sd.root))
    assert r.returncode == 0 and "nothing to resubmit" in r.stdout, r.stdout + r.stderr
    st = sweep_status(SweepDir.open(sd.root), query_slurm=False)
    assert st.never_started() == [] and st.complete, format_status(st)
    assert run_cli("wait", str(sd.root), "--timeout", "60").returncode == 0


def test_a_second_resume_makes_one_unit_per_unit_that_ended_unfinished_since(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """Unit 0 failed and a resume gave its missing items to a new unit, which failed too: the
    next resume makes one unit (the new one's), not two (the replaced unit counted again)."""
    from orchestrator.control.resume import Resumed, _new_units
    from orchestrator.planning import shard

    sd, units, _ = _three_units_on_slurm(tmp_path, write_spec)
    first = units[0]
    for uid in units[1:]:  # the others recorded every item
        _fake_partial(sd, uid, len(sd.unit_items(uid)))
    _fake_partial(sd, first, 0)  # it recorded nothing
    missing = sd.unit_items(first)
    assert len(missing) >= 2
    (new,) = shard(missing, 1, sweep=sd.spec.fingerprint())
    new.finalize(sd.spec.fingerprint(), tag="resume-3")
    sd.add_units([new], origin="resume")
    now = time.time()
    sd.record_jobs(
        [
            {"event": "resume", "replaces": [first], "units": [new.id], "time": "", "ts": now - 300},
            {"unit": new.id, "executor": "slurm", "job_id": "52_0", "array_id": "52", "task": 0}
            | {"submitted_ts": now - 300},
        ]
    )
    view = scheduler_view(
        j50_0=TaskState("FAILED", "sacct", exit_code="1:0"),
        j50_1=TaskState("COMPLETED", "sacct"),
        j50_2=TaskState("COMPLETED", "sacct"),
        j52_0=TaskState("FAILED", "sacct", exit_code="1:0"),
        j51=TaskState("PENDING", "squeue", "Dependency"),
    )
    plan = plan_resume(sd, sweep_status(sd, view=view))
    assert sorted(plan.missing_of) == sorted([first, new.id]) and plan.unreplaced == [new.id]
    result = Resumed(plan=plan)
    _new_units(sd, result, None, sd.spec.executor)
    (again,) = result.new_units
    assert sorted(it.id for it in again.items) == sorted(it.id for it in missing)


def _worker(sweep: Path, unit: str) -> None:
    """The unit's worker, run by hand as ``python -m jobs.worker SWEEP UNIT``."""
    done = subprocess.run([sys.executable, "-m", "jobs.worker", str(sweep), unit], cwd=REPO, capture_output=True)
    assert done.returncode == 0, done.stderr


def _replay_sweep(tmp_path: Path, write_spec: Callable[..., Path]) -> tuple[SweepDir, Path]:
    """A replay sweep (no jax: its workers are quick) of two shapes in two units, and its spec."""
    from orchestrator.store import synthetic

    fwd = {"modes": ["fwd"], "seq_lens": [64, 128]}
    source = tmp_path / "source.json"
    source.write_text(json.dumps(synthetic.document({**TINY_SPEC, **fwd, "output": str(source)})))
    spec = write_spec(**fwd, kernel={"impl": "replay"}, replay={"source": str(source)}, executor={"kind": "local"})
    return _sweep(tmp_path, lambda: spec), spec


def _resume_cut_short(tmp_path: Path, write_spec: Callable[..., Path]) -> tuple[SweepDir, str, str, str]:
    """The replay sweep with its first unit run by hand, and the new unit of a ``resume --units 1``
    (which regroups the items of the unit never started) cut short once it wrote that unit into
    the index (what ``resume_sweep`` writes first), before it recorded the resume: the sweep, its
    two planned units and the new one."""
    from orchestrator.control.resume import Resumed, _add_units, _new_units

    sd, _ = _replay_sweep(tmp_path, write_spec)
    first, second = [u["id"] for u in sd.unit_index()]
    _worker(sd.root, first)
    result = Resumed(plan=plan_resume(sd, sweep_status(sd), force=False, keep_planned=False))
    _new_units(sd, result, None, sd.spec.executor)
    _add_units(sd, result)
    (new,) = [u.id for u in result.new_units]
    return sd, first, second, new


def test_resume_of_a_plan_never_run_runs_the_plans_own_units(tmp_path: Path, write_spec: Callable[..., Path]) -> None:
    """``plan`` then ``resume``: the units the plan made run as it made them (status and their
    logs name them), no new unit; ``--units`` asks for new units of the missing items instead."""
    sd, _ = _replay_sweep(tmp_path, write_spec)
    planned = [u["id"] for u in sd.unit_index()]
    regrouped = tmp_path / "regrouped"
    shutil.copytree(sd.root, regrouped)
    r = run_cli("resume", str(sd.root))
    assert r.returncode == 0, r.stderr
    line = r.stdout.splitlines()[0]
    assert line == f"resuming {sd.root}: 6 of 6 items have no record; 2 units never started, taken as planned: " + (
        ", ".join(planned)
    ), r.stdout
    assert [u["id"] for u in SweepDir.open(sd.root).unit_index()] == planned
    status = run_cli("status", str(sd.root)).stdout.splitlines()
    assert status[0] == f"{sd.root}: 6/6 items done (0 error records), complete" and status[2] == "units: 2 (2 done)"
    assert sorted(e["unit"] for e in sd.job_history() if "unit" in e) == sorted(planned)
    for uid in planned:
        logged = run_cli("logs", str(sd.root), uid)
        assert logged.returncode == 0 and uid in logged.stdout, logged.stdout + logged.stderr
    again = run_cli("resume", str(regrouped), "--units", "1")
    assert again.returncode == 0 and "; 1 new unit: " in again.stdout, again.stdout
    (new,) = [u["id"] for u in SweepDir.open(regrouped).unit_index() if u["id"] not in planned]
    assert [e["unit"] for e in SweepDir.open(regrouped).job_history() if "unit" in e] == [new]


def test_a_logs_folder_that_is_a_file_is_refused_in_one_line_before_resume_writes_anything(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    sd, spec = _replay_sweep(tmp_path, write_spec)
    logs = sd.root / "logs"
    if logs.exists():
        logs.rename(tmp_path / "logs")
    logs.write_text("")  # a file where the workers write their logs
    index, history = (sd.root / "units.json").read_bytes(), sd.job_history()
    for args in (["resume", str(sd.root)], ["resume", str(sd.root), "--no-wait"]):
        r = run_cli(*args)
        assert_one_line_error(r, f"{logs} is a file, where the sweep keeps its workers' logs: move it away")
        assert (sd.root / "units.json").read_bytes() == index and sd.job_history() == history  # nothing written
    r = run_cli("run", str(spec), "--sweep-dir", str(sd.root))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"tilesweep: error: {logs} is a file, where the sweep keeps its workers' logs: move it away (or put the "
        "folder back) and run the command again"
    )
    assert sd.job_history() == history  # no worker started
    logs.unlink()
    done = run_cli("resume", str(sd.root))
    assert done.returncode == 0 and "0 of 6 planned missing" in done.stderr, done.stderr


def test_a_unit_a_resume_planned_but_never_submitted_is_replaced_once_other_units_recorded_its_items(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """A resume that planned a new unit for a unit never started, and was cut short before it
    recorded the resume and started the new unit's worker; the new unit then ran by hand,
    recording every item: the sweep is complete, the unit it replaced reads as replaced, and
    neither status nor ls counts pending work."""
    sd, first, second, new = _resume_cut_short(tmp_path, write_spec)
    _worker(sd.root, new)
    unmerged = f"complete, not merged: `tilesweep merge {sd.root}` writes {tmp_path / 'results.json'}"
    for state in (unmerged, "complete"):  # the resume after the first look merges, and records the unit replaced
        status = run_cli("status", str(sd.root))
        lines = status.stdout.splitlines()
        assert lines[0] == f"{sd.root}: 6/6 items done (0 error records), {state}", status.stdout
        assert lines[2] == "units: 3 (2 done, 1 replaced)", status.stdout
        (line,) = [x for x in lines if x.startswith(f"  {second}")]
        assert line.split()[1] == "replaced" and line.endswith("never submitted; other units recorded every item of it")
        assert "pending" not in status.stdout and "to redo the missing items" not in status.stdout, status.stdout
        listed = run_cli("ls", str(tmp_path)).stdout
        assert "units: 2 done, 1 replaced" in listed and "to resume" not in listed, listed
        assert run_cli("resume", str(sd.root)).returncode == 0


def test_a_run_starts_no_worker_for_a_unit_whose_items_other_units_recorded(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """The unit a resume cut short left never submitted, whose every item its new unit then
    recorded: a `run` of the sweep measures none of them again (no worker of it in the sweep's
    history), and exits 0 with the sweep complete and that unit replaced."""
    sd, _, second, new = _resume_cut_short(tmp_path, write_spec)
    _worker(sd.root, new)
    spec = tmp_path / "spec.json"
    r = run_cli("run", str(spec), "--sweep-dir", str(sd.root))
    assert r.returncode == 0 and "0 of 6 planned missing" in r.stderr, r.stderr
    assert [e for e in sd.job_history() if e.get("unit") == second] == []  # no worker started for it
    lines = run_cli("status", str(sd.root)).stdout.splitlines()
    assert lines[0] == f"{sd.root}: 6/6 items done (0 error records), complete", lines
    (line,) = [x for x in lines if x.startswith(f"  {second}")]
    assert line.split()[1] == "replaced" and line.endswith("never submitted; other units recorded every item of it")


def test_resume_no_wait_starts_no_more_units_than_run_runs_at_a_time(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """``resume --no-wait`` starts its new units at once. Where they need more units than run
    here at a time (executor.local_workers: the missing items and the error records to retry
    are units of their own), it is refused in one line naming the resume that runs them in
    turn, nothing written: a second shell's status is as before. With room for them, it starts
    no more than that, and status shows them running."""
    sd = _sweep(tmp_path, write_spec, executor={"local_workers": 1}, modes=["fwd"])
    done, never = [u["id"] for u in sd.unit_index()]
    _fake_partial(sd, done, len(sd.unit_items(done)), n_errors=1)
    index, before = (sd.root / "units.json").read_bytes(), run_cli("status", str(sd.root), "--json").stdout
    r = run_cli("resume", str(sd.root), "--no-wait", "--retry-errors", "all")
    assert_one_line_error(
        r,
        "1 runs here at a time",
        "(round 1's missing items, the error records to retry)",
        f"`tilesweep resume {sd.root}`",
    )
    assert (sd.root / "units.json").read_bytes() == index and not (sd.root / "jobs.jsonl").exists()
    assert run_cli("status", str(sd.root), "--json").stdout == before
    # the executor section is not fingerprinted
    wider = write_spec("wider.json", executor={"local_workers": 2}, modes=["fwd"])
    r = run_cli("resume", str(sd.root), "--spec", str(wider), "--no-wait", "--retry-errors", "all", "--units", "4")
    assert r.returncode == 0 and "2 new units" in r.stdout and "started 2 units here" in r.stdout, r.stdout + r.stderr
    st = json.loads(run_cli("status", str(sd.root), "--json").stdout)
    new = [u for u in st["units"] if u["id"] not in (done, never)]
    assert len(new) == 2 and all(u["state"] in ("running", "done") for u in new), st["units"]

    def new_units() -> list[dict]:
        units = json.loads(run_cli("status", str(sd.root), "--json").stdout)["units"]
        return [u for u in units if u["id"] not in (done, never)]

    until(lambda: all(u["state"] != "running" for u in new_units()), "the new units' end")
    assert [u["state"] for u in new_units()] == ["done", "done"]


def test_a_partial_whose_header_names_no_spec_is_refused_in_words(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """A header without the spec's fingerprint (a partial another tool wrote, or edited) is of
    another spec: the refusal says it names none, not Python's ``None``, and plans nothing."""
    sd = _sweep(tmp_path, write_spec, units=2, executor={"kind": "debug"})
    first = sd.unit_index()[0]["id"]
    _fake_partial(sd, first, 1)
    lines = sd.partial_path(first).read_text().splitlines()
    head = json.loads(lines[0])
    del head["header"]["sweep"]
    sd.partial_path(first).write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    index = (sd.root / "units.json").read_bytes()
    said = assert_one_line_error(
        run_cli("resume", str(sd.root)),
        f"{first}.jsonl holds records of another spec (its header names no spec fingerprint; "
        f"the sweep's is {sd.spec.fingerprint()}); resume refuses to mix them",
    )
    assert "None" not in said and (sd.root / "units.json").read_bytes() == index
