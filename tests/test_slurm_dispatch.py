"""tilesweep submit / status / resume / cancel / wait against the real local SLURM cluster.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
Every command runs as a user would run it: a new process per command, the sweep directory
the only thing they share. The slow sweep behind the time-limit test is submitted by this
module's first test and checked by the last test of the whole session (``pytest.mark.last``),
so its ~3 minutes of SLURM time overlap the rest of the suite instead of being waited for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.store import synthetic
from tests.helpers import TINY_SPEC, assert_one_line_error
from tests.slurm_cluster import poll, require_cluster
from tests.slurm_sweeps import FOUR_UNITS, check_document, cli, jobs, lines, status, unit_jobs, write_spec

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def test_submit_returns_at_once_then_status_wait_and_merge_from_new_processes(
    slow_slurm_sweep: tuple[Path, Path], time_limit_sweeps: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """(The first SLURM test: it has the slow sweeps the ``last`` tests check submitted first.)
    Its array is submitted held, so that its units are still pending when ``status`` and ``resume``
    look, however fast the machine, and released once they have looked."""
    spec = write_spec(tmp_path, "four.json", {"slurm_additional_parameters": {"hold": True}}, **FOUR_UNITS)
    sweep = tmp_path / "sweep"
    t0 = time.monotonic()
    r = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "4")
    submit_s = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert not any((sweep / "done").iterdir()), "submit waited for a job"
    entries = unit_jobs(sweep)
    assert len(entries) == 4 and len({e["array_id"] for e in entries.values()}) == 1
    array = next(iter(entries.values()))["array_id"]
    assert sorted(e["job_id"] for e in entries.values()) == [f"{array}_{i}" for i in range(4)]
    assert all(e["attempt"] == 1 and e["stderr"].endswith("_0_log.err") for e in entries.values())
    assert f"{array}: {array}_0 .. {array}_3" in r.stdout and "final merge: job" in r.stdout
    assert "#SBATCH --array=0-3%4" in (sweep / "logs" / f"{array}_submission.sh").read_text()
    st = status(sweep)
    assert not st["complete"] and st["planned"] == 8 and len(st["units"]) == 4
    assert {u["state"] for u in st["units"]} <= {"pending", "running", "done"}
    # resume while the units run: says so, submits nothing
    n = len(jobs(sweep))
    r = cli("resume", str(sweep))
    assert r.returncode == 0 and "still pending or running" in r.stdout and len(jobs(sweep)) == n, r.stdout
    subprocess.run(["scontrol", "release", str(array)], check=True)
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert w.returncode == 0, w.stderr
    assert "speedup" in w.stdout and "merged 8 records" in w.stderr
    st = status(sweep)
    assert st["complete"] and st["done"] == 8 and all(u["state"] == "done" for u in st["units"])
    assert cli("merge", str(sweep)).returncode == 0
    check_document(sweep, spec)
    # the dependent merge job ran once the array ended
    merge_state = poll(
        lambda: (status(sweep)["merge_jobs"] or [{}])[-1].get("state") in ("COMPLETED",),
        300,  # queued after the array, then a Python process on a busy machine
        "the final merge job to complete",
    )
    assert merge_state
    # nothing left to resume
    r = cli("resume", str(sweep))
    assert r.returncode == 0 and "nothing to resubmit" in r.stdout, r.stdout + r.stderr
    print(f"submit returned in {submit_s:.2f} s")


def test_arrays_split_at_max_array_size_and_cancel_cancels_whole_arrays(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "split.json", {"merge_job": False}, **FOUR_UNITS)
    sweep = tmp_path / "sweep"
    r = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "3", "--max-array-size", "2")
    assert r.returncode == 0, r.stderr
    entries = list(unit_jobs(sweep).values())
    arrays = list(dict.fromkeys(e["array_id"] for e in entries))
    assert len(arrays) == 2 and [e["job_id"] for e in entries] == [f"{arrays[0]}_0", f"{arrays[0]}_1", arrays[1]]
    c = cli("cancel", str(sweep))
    assert c.returncode == 0 and all(a in c.stdout for a in arrays), c.stdout + c.stderr
    st = poll(
        lambda: (s := status(sweep)) and all(u["state"] in ("cancelled", "done") for u in s["units"]) and s,
        30,
        "every unit to show cancelled",
    )
    assert any(u["state"] == "cancelled" for u in st["units"])
    assert cli("cancel", str(sweep)).stdout.startswith("nothing")


def test_scancel_one_task_mid_run_then_resume_submits_only_its_missing_items(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        "cancel.json",
        {"merge_job": False},
        **{**FOUR_UNITS, "timing": {"target_ms": 100, "max_inner": 1000, "warmup": 0}},
    )
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "2").returncode == 0
    entries = unit_jobs(sweep)
    victim = max(entries, key=lambda u: json.loads((sweep / "units" / f"{u}.json").read_text())["items"].__len__())
    partial = sweep / "partials" / f"{victim}.jsonl"
    poll(lambda: sum("record" in o for o in lines(partial)) >= 1, 120, "the victim's first record", 0.1)
    subprocess.run(["scancel", entries[victim]["job_id"]], check=True)
    st = poll(
        lambda: (s := status(sweep)) and next(u for u in s["units"] if u["id"] == victim)["state"] == "cancelled" and s,
        60,
        "status to show the cancelled task",
    )
    unit = next(u for u in st["units"] if u["id"] == victim)
    assert unit["done"] < unit["total"] and unit["log"], unit
    recorded = {o["id"] for o in lines(partial) if "record" in o}
    r = cli("resume", str(sweep))
    assert r.returncode == 0, r.stderr
    new = [e for e in jobs(sweep) if e.get("origin") == "resume"]
    assert new, r.stdout
    items = [iid for e in new for _, iid in json.loads((sweep / "units" / f"{e['unit']}.json").read_text())["items"]]
    victim_items = [iid for _, iid in json.loads((sweep / "units" / f"{victim}.json").read_text())["items"]]
    assert sorted(items) == sorted(set(victim_items) - recorded)
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert w.returncode == 0, w.stderr
    st = status(sweep)
    assert st["complete"], st
    assert next(u for u in st["units"] if u["id"] == victim)["resumed"]
    check_document(sweep, spec)


def test_worker_killed_with_sigkill_shows_failed_with_its_log_and_resume_completes_it(tmp_path: Path) -> None:
    # max_config_attempts 1: the configs the worker died on are recorded as errors on resume,
    # which needs the deaths counted across units (the resumed unit has a new partial)
    spec = write_spec(
        tmp_path,
        "kill.json",
        {"max_config_attempts": 1, "merge_job": False},
        **{**FOUR_UNITS, "timing": {"target_ms": 100, "max_inner": 1000, "warmup": 0}},
    )
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    ((victim, entry),) = unit_jobs(sweep).items()
    partial = sweep / "partials" / f"{victim}.jsonl"

    def mid_config() -> int | None:
        """The worker's pid once it has recorded a config and started one it has not finished."""
        objs = lines(partial)
        done = {o["id"] for o in objs if "record" in o}
        started = [o["start"] for o in objs if "start" in o and o["start"] not in done]
        return next(o["header"]["pid"] for o in objs if "header" in o) if done and started else None

    pid = poll(mid_config, 120, "the worker to be in the middle of a config", 0.05)
    os.kill(pid, signal.SIGKILL)
    st = poll(lambda: (s := status(sweep)) and s["units"][0]["state"] == "failed" and s, 60, "status to show failed")
    assert st["units"][0]["log"] == entry["log"] and Path(entry["log"]).exists()
    assert st["units"][0]["detail"] == "killed by signal 9 (SIGKILL)"  # not an exit code, not a log line
    text = cli("status", str(sweep)).stdout
    assert "killed by signal 9" in text and f"log: {entry['log']}" in text and "tilesweep resume" in text
    objs = lines(partial)
    done = {o["id"] for o in objs if "record" in o}
    died = {o["start"] for o in objs if "start" in o} - done - {o["abandon"] for o in objs if "abandon" in o}
    assert died
    r = cli("resume", str(sweep))
    assert r.returncode == 0, r.stderr
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert w.returncode == 0, w.stderr
    doc = check_document(sweep, spec)
    crashed = [r for r in doc["results"] if "WorkerCrashed" in r.get("error", "")]
    assert len(crashed) == len(died)
    assert sum("error" not in r for r in doc["results"]) == 8 - len(died)


def test_run_with_the_slurm_executor_is_submit_then_wait(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "run.json", compile={"workers": 1})
    sweep = tmp_path / "sweep"
    r = cli("run", str(spec), "--sweep-dir", str(sweep), "--units", "2")
    assert r.returncode == 0, r.stderr
    assert "speedup" in r.stdout and len(unit_jobs(sweep)) == 2
    check_document(sweep, spec)
    # again: every item has a record, so nothing is submitted
    n = len(jobs(sweep))
    r = cli("run", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0 and len(jobs(sweep)) == n, r.stderr
    assert_one_line_error(cli("submit", str(spec), "--sweep-dir", str(sweep)), "submitted already", "resume")


@pytest.mark.last
def test_task_past_its_time_limit_is_requeued_and_skips_finished_configs(slow_slurm_sweep: tuple[Path, Path]) -> None:
    spec, sweep = slow_slurm_sweep
    w = cli("wait", str(sweep), "--interval", "1", "--slurm-interval", "3", timeout=420)
    assert w.returncode == 0, w.stderr
    page = spec.parent / "slow.results.html"  # report.html: true puts the page beside the document
    assert w.stdout.splitlines()[-1] == f"report page: {page}" and "<table" in page.read_text()
    ((unit, entry),) = unit_jobs(sweep).items()
    objs = lines(sweep / "partials" / f"{unit}.jsonl")
    headers = [o["header"] for o in objs if "header" in o]
    assert len(headers) >= 2, "the task was not requeued"
    assert {h["slurm_job_id"] for h in headers} == {entry["job_id"]}  # the same job, requeued
    records = [o for o in objs if "record" in o]
    ids = [o["id"] for o in records]
    assert len(ids) == len(set(ids)) == 65  # nothing redone, nothing lost
    first = {o["id"] for o in records if o["attempt"] == 1}
    assert first and len(first) < 65 and all(o["attempt"] > 1 for o in records if o["id"] not in first)
    assert not any("error" in o["record"] for o in records)  # an abandoned config is not a crash
    assert {o["record"]["timer"] for o in records} == {"virtual"}  # replayed, at the real pace
    sacct = subprocess.run(
        ["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State", "-j", entry["array_id"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "REQUEUED" in sacct, sacct
    check_document(sweep, spec)
    # the dependent merge job waited for the requeued task: it merged every record
    merge = poll(lambda: (m := status(sweep)["merge_jobs"][-1])["state"] == "COMPLETED" and m, 300, "the merge job")
    assert "(0 of 65 planned missing)" in Path(merge["log"]).read_text()
    assert f"wrote the report page {page}" in Path(merge["log"]).read_text()  # the merge job writes it too


def _submit_stopped_once(spec: Path, sweep: Path, written: str) -> tuple[subprocess.Popen[str], str]:
    """``tilesweep submit`` as at a terminal, given Ctrl-C the moment ``sweep/written`` exists:
    the process once ended, and its stderr."""
    import sys

    from tests.helpers import LAUNCH

    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "submit", str(spec), "--sweep-dir", str(sweep)],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    poll(lambda: (sweep / written).exists() or proc.poll() is not None, 120, written, interval=0.001)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc, err


def test_a_ctrl_c_once_sbatch_took_an_array_still_submits_its_final_merge_job(tmp_path: Path) -> None:
    """Ctrl-C of ``submit`` as the first array is recorded: the merge job that follows it is
    submitted too (else status said complete and no document was ever written), and the
    warning names the array and the merge job (or, where sbatch refused that job, why, and
    what merges instead); ``wait`` then ends with the merged document."""
    spec = write_spec(tmp_path, "spec.json", modes=["fwd"])
    sweep = tmp_path / "sweep"
    proc, err = _submit_stopped_once(spec, sweep, "jobs.jsonl")
    assert proc.returncode in (0, 130) and "Traceback" not in err, err
    (array,) = {e["array_id"] for e in unit_jobs(sweep).values()}
    merge_jobs = [e["job_id"] for e in jobs(sweep) if e.get("event") == "merge_job"]
    if proc.returncode == 130:  # the stop came before submit had said what it submitted: the warning says it
        accepted = re.search(
            r"SIGINT came while sbatch ran; sbatch accepted job array (\d+) \(\d+ units?\), which runs on", err
        )
        assert accepted is not None and accepted[1] == array, err
        if merge_jobs:
            assert f"and the final merge job {merge_jobs[0]}" in err, err
        else:  # sbatch refused it (a busy controller): said, with what merges instead
            assert "the final merge job was not submitted (" in err and f"tilesweep wait {sweep}" in err, err
    else:
        assert merge_jobs, (jobs(sweep), err)
    r = cli("wait", str(sweep), "--interval", "0.5")
    assert r.returncode == 0, r.stderr
    check_document(sweep, spec)


def test_a_ctrl_c_while_submit_plans_leaves_no_half_made_sweep_directory(tmp_path: Path) -> None:
    """Stopped as it writes the plan: the directory it made is removed (else a later
    ``submit --dry-run`` there said "nothing to submit"), unless sbatch took jobs first."""
    spec = write_spec(tmp_path, "spec.json", modes=["fwd"])
    sweep = tmp_path / "sweep"
    proc, err = _submit_stopped_once(spec, sweep, "sweep.json")
    assert "Traceback" not in err, err
    if (sweep / "jobs.jsonl").exists():  # the stop came after sbatch took the jobs: they run on
        assert cli("wait", str(sweep), "--interval", "0.5").returncode == 0
    else:
        assert proc.returncode == 130 and not sweep.exists(), err
        dry = cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run")
        assert dry.returncode == 0 and "nothing to submit" not in dry.stdout, dry.stdout


def test_more_units_than_items_is_said_once_by_submit_its_dry_run_resume_and_run(tmp_path: Path) -> None:
    held = {"slurm_additional_parameters": {"hold": True}, "merge_job": False}  # nothing needs to run: cancelled below
    spec = write_spec(tmp_path, "three.json", held, modes=["fwd"])
    sweep = tmp_path / "sweep"
    note = "tilesweep: note: 20 units asked for, 3 made: a unit holds at least one item to measure"
    dry = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "20", "--dry-run")
    assert dry.returncode == 0 and dry.stderr.count(note) == 1 and "3 items in 3 units" in dry.stdout, dry.stderr
    r = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "20")
    try:
        assert r.returncode == 0 and r.stderr.count(note) == 1, r.stderr
        assert "3 items in 3 units" in r.stdout and len(unit_jobs(sweep)) == 3
        assert cli("cancel", str(sweep)).returncode == 0
        again = cli("resume", str(sweep), "--units", "20")
        assert again.returncode == 0 and again.stderr.count(note) == 1 and "3 new units" in again.stdout, again.stderr
    finally:
        cli("cancel", str(sweep))
    # run on SLURM plans, submits and waits: a replay of the three items, drawn, not computed
    source = tmp_path / "source.json"
    source.write_text(json.dumps(synthetic.document({**TINY_SPEC, "modes": ["fwd"], "output": str(source)})))
    replayed = write_spec(
        tmp_path, "replay.json", modes=["fwd"], kernel={"impl": "replay"}, replay={"source": str(source)}
    )
    run = cli("run", str(replayed), "--sweep-dir", str(tmp_path / "run"), "--units", "20")
    assert run.returncode == 0 and run.stderr.count(note) == 1 and "3 items in 3 units" in run.stderr, run.stderr


def test_a_task_that_cannot_write_into_the_sweep_directory_is_said_to_have_written_no_log(tmp_path: Path) -> None:
    """A sweep directory the nodes cannot write (here: its logs folder a file when the held task
    is let go) ends the task before anything runs; status and logs say that, not "see its log"
    and "has not started"; the sweep, moved where the task can write, resumes there."""
    held = {"slurm_additional_parameters": {"hold": True}, "merge_job": False}
    spec = write_spec(tmp_path, "spec.json", held, modes=["fwd"])
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    (job,) = unit_jobs(sweep).values()
    (sweep / "logs").rename(tmp_path / "logs.away")
    (sweep / "logs").write_text("")
    subprocess.run(["scontrol", "release", job["array_id"]], check=True)
    poll(lambda: status(sweep)["units"][0]["state"] == "failed", 60, "the task ended")
    r = cli("status", str(sweep))
    assert "its node could not write into the sweep directory" in r.stdout, r.stdout
    assert "see its log" not in r.stdout
    line = assert_one_line_error(
        cli("logs", str(sweep), job["unit"]), "has no log: failed (job ", "could not write into the sweep directory"
    )
    assert "not started" not in line
    (sweep / "logs").unlink()
    (tmp_path / "logs.away").rename(sweep / "logs")
    moved = sweep.rename(tmp_path / "moved")
    assert cli("resume", str(moved)).returncode == 0
    (resumed,) = [e for e in unit_jobs(moved).values() if e.get("origin") == "resume"]
    subprocess.run(["scontrol", "release", resumed["array_id"]], check=True)

    def done() -> bool:
        return next(u for u in status(moved)["units"] if u["id"] == resumed["unit"])["state"] == "done"

    poll(done, 120, "the resumed unit done")


def test_logs_of_a_unit_whose_pending_job_was_scancelled_says_it_was_cancelled(tmp_path: Path) -> None:
    """A pending job cancelled with ``scancel`` (not ``tilesweep cancel``) never ran: ``logs``
    says it was cancelled and that resume redoes its items, not that it has not started yet."""
    held = {"slurm_additional_parameters": {"hold": True}, "merge_job": False}
    spec = write_spec(tmp_path, "spec.json", held, modes=["fwd"])
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    (job,) = unit_jobs(sweep).values()
    subprocess.run(["scancel", job["job_id"]], check=True)
    poll(lambda: status(sweep)["units"][0]["state"] == "cancelled", 90, "status saying cancelled")
    line = assert_one_line_error(cli("logs", str(sweep), job["unit"]), "was cancelled before it started", "resume")
    assert "not started" not in line


def test_logs_takes_the_job_id_status_shows_for_an_array_of_one_task(tmp_path: Path) -> None:
    """sbatch gives an array of one task no index: status's job column shows its job id alone,
    and ``logs`` takes that id as it takes ``A_i``, for the unit the task runs or the task itself."""
    held = {"slurm_additional_parameters": {"hold": True}, "merge_job": False}
    spec = write_spec(tmp_path, "spec.json", held, modes=["fwd"])
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    try:
        ((unit, job),) = unit_jobs(sweep).items()
        jid = job["job_id"]
        assert jid.isdigit() and status(sweep)["units"][0]["job_id"] == jid, job
        assert_one_line_error(cli("logs", str(sweep), jid), f"unit {unit} of {sweep} has no log yet: its job {jid}")
        assert_one_line_error(cli("logs", str(sweep), jid, "--task"), f"task {jid} of {sweep} ran unit {unit}")
    finally:
        cli("cancel", str(sweep))
