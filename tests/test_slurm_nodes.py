"""Whole GPU nodes and a scheduler view that never misleads, on the real local SLURM cluster.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
Every command runs as a user would run it, a new process each. The cluster's 4 GPUs are
fake (character devices), so the specs time interpret mode on purpose (TINY_SPEC), except
the one that checks the refusal to do that by accident.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import assert_one_line_error, second_run_follows
from tests.slurm_cluster import poll, require_cluster
from tests.slurm_sweeps import FOUR_UNITS, check_document, cli, jobs, lines, status, unit_jobs, write_spec

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def _started(sweep: Path, unit: str) -> float:
    """When the unit's worker took it up: its log's first line of the attempt (epoch seconds)."""
    for line in (sweep / "logs" / "units" / f"{unit}.log").read_text().splitlines():
        m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) jobs\.worker: unit \S+ attempt", line)
        if m:
            return datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"no attempt line in the log of unit {unit}")


def _ended(sweep: Path, unit: str) -> float:
    """When the unit's last record was written: its partial's mtime as its marker recorded it."""
    return json.loads((sweep / "done" / f"{unit}.json").read_text())["partial"]["stat"][2] / 1e9


def test_a_4_gpu_task_runs_4_units_at_once_each_on_its_own_gpu_and_the_rest_in_turn(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "node.json", {"gpus_per_node": 4}, compile={"workers": 1})
    sweep = tmp_path / "sweep"
    # 4 units per GPU by default, here as many as the 6 items allow: 4 at once, 2 queued
    dry = cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run")
    assert dry.returncode == 0 and not sweep.exists(), dry.stderr
    assert "in 6 units, 1 task of up to 6 units (taken in turn by its 4 GPUs)" in dry.stdout, dry.stdout
    assert "GPU slot 3" in dry.stdout and "queue #2" in dry.stdout
    assert "idle" not in dry.stdout
    half = cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run", "--units", "2")
    idle = (
        "note: 2 GPUs of these tasks would sit idle; "
        "plan a multiple of 4 units, no more than its 6 items (--units 4), to use them all"
    )
    assert idle in half.stdout, half.stdout
    assert "1 task of up to 2 units (one per GPU)" in half.stdout, half.stdout
    r = cli("submit", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    entries = unit_jobs(sweep)
    (task,) = {e["job_id"] for e in entries.values()}  # one task holds the 6 units, in turn
    assert sorted(e["slot"] for e in entries.values()) == [0, 1, 2, 3, 4, 5]
    # the script shown by --dry-run is the one submitit wrote for the real submission
    script = dry.stdout.split("--- sbatch script of array 1", 1)[1].split("\n", 1)[1].split("\n--- ", 1)[0]
    assert script == (sweep / "logs" / f"{task}_submission.sh").read_text().rstrip()
    assert "#SBATCH --gpus-per-node=4" in script
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert w.returncode == 0, w.stderr
    doc = check_document(sweep, spec)
    every = {u: [o["header"] for o in lines(sweep / "partials" / f"{u}.jsonl") if "header" in o] for u in entries}
    assert all(len(h) == 1 for h in every.values()), every  # every unit ran once
    headers = {u: h[0] for u, h in every.items()}
    assert {h["gpu"] for h in headers.values()} == {"0", "1", "2", "3"}  # each unit on one GPU, every GPU used
    assert {h["slurm_job_id"] for h in headers.values()} == {task}
    # each GPU's units ran in its one worker, one after another (no process started per unit)
    assert len({h["pid"] for h in headers.values()}) == 4 and len({(h["gpu"], h["pid"]) for h in headers.values()}) == 4
    # when each unit started (its log's first line, to the millisecond) and ended (its partial's
    # last write, as its marker records it, to the nanosecond): events, whatever the machine's speed
    spans = {u: (_started(sweep, u), _ended(sweep, u)) for u in entries}
    first = sorted(entries, key=lambda u: entries[u]["slot"])[:4]
    assert max(spans[u][0] for u in first) < min(end for _, end in spans.values()), spans  # at once
    for gpu in "0123":  # a GPU runs one unit at a time (a log time is cut to the millisecond)
        turns = sorted(spans[u] for u in entries if headers[u]["gpu"] == gpu)
        assert all(a_end <= b_start + 0.001 for (_, a_end), (b_start, _) in itertools.pairwise(turns)), (gpu, turns)
    st = status(sweep)
    assert {u["gpu"] for u in st["units"]} == {"0", "1", "2", "3"} and st["gpu_hours"] > 0
    # wait's merge carries what sacct said then (its database may not have the task yet); once
    # status shows the GPU-hours, a merge writes them into the document
    assert cli("merge", str(sweep)).returncode == 0
    assert check_document(sweep, spec)["tilesweep"]["gpu_hours"] > 0
    assert {a[0]["gpu"] for a in doc["tilesweep"]["attempts"].values()} == {"0", "1", "2", "3"}
    unit = next(iter(entries))
    log = cli("logs", str(sweep), unit)
    assert log.returncode == 0 and f"starting unit {unit}" in log.stdout and f"unit {unit} done" in log.stdout
    listed = cli("ls", str(tmp_path))
    assert listed.returncode == 0 and str(sweep) in listed.stdout and "complete" in listed.stdout, listed.stdout


def test_the_idle_gpu_note_of_a_sweep_with_fewer_items_than_a_task_has_gpus_asks_for_fewer_gpus(
    tmp_path: Path,
) -> None:
    """3 items on tasks of 4 GPUs: no count of units fills them (a unit holds at least one item),
    so the note of the dry run and of the submission asks for 3 GPUs a task instead."""
    spec = write_spec(tmp_path, "three.json", {"gpus_per_node": 4, "merge_job": False}, modes=["fwd"])
    sweep = tmp_path / "sweep"
    advice = (
        "there are only 3 items to run, one a GPU at most: set executor.gpus_per_node to 3 in the spec, "
        "with 3 units (--units 3)"
    )
    dry = cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run")
    assert dry.returncode == 0 and "3 items in 3 units" in dry.stdout, dry.stderr
    assert f"note: 1 GPU of these tasks would sit idle; {advice}" in dry.stdout, dry.stdout
    r = cli("submit", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    (task,) = {e["job_id"] for e in unit_jobs(sweep).values()}
    assert r.stderr.count("idle") == 1, r.stderr
    assert f"tilesweep: note: task {task} runs 3 units on its 4 GPUs: 1 idle; {advice}" in r.stderr, r.stderr
    assert cli("cancel", str(sweep)).returncode == 0


def test_a_gpu_worker_killed_mid_unit_costs_only_that_unit_and_resume_completes_it(tmp_path: Path) -> None:
    """8 units on a 4-GPU task, 2 per GPU, each GPU's run by one worker: the worker of one GPU's
    first unit, killed in the middle of a config, fails that unit alone (its reason in its log and
    in status); the GPU's next unit runs in a new worker, every other unit finishes once, and
    `resume` then completes the killed one."""
    timing = {"target_ms": 100, "max_inner": 1000, "warmup": 0}
    spec = write_spec(
        tmp_path, "kill.json", {"gpus_per_node": 4, "merge_job": False}, **{**FOUR_UNITS, "timing": timing}
    )
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "8").returncode == 0
    entries = unit_jobs(sweep)
    assert len(entries) == 8 and len({e["job_id"] for e in entries.values()}) == 1
    victim = next(u for u, e in entries.items() if e["slot"] == 0)  # a GPU's first unit
    partial = sweep / "partials" / f"{victim}.jsonl"

    def mid_config() -> int | None:
        """The victim's worker's pid once it has started a config it has not finished."""
        objs = lines(partial)
        done = {o["id"] for o in objs if "record" in o}
        started = [o["start"] for o in objs if "start" in o and o["start"] not in done]
        return next(o["header"]["pid"] for o in objs if "header" in o) if started else None

    pid = poll(mid_config, 120, "the victim's worker to be in the middle of a config", 0.05)
    os.kill(pid, signal.SIGKILL)
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert w.returncode == 1 and f"unit {victim} failed" in w.stderr, w.stderr
    st = status(sweep)
    states = {u["id"]: u for u in st["units"]}
    assert states[victim]["state"] == "failed" and states[victim]["detail"] == "killed by signal 9 (SIGKILL)"
    assert {u["state"] for i, u in states.items() if i != victim} == {"done"}
    log = (sweep / "logs" / "units" / f"{victim}.log").read_text()
    assert log.rstrip().endswith(f"unit {victim} failed: killed by signal 9 (SIGKILL)"), log[-2000:]
    headers = {u: [o["header"] for o in lines(sweep / "partials" / f"{u}.jsonl") if "header" in o] for u in entries}
    assert all(len(h) == 1 for h in headers.values()), headers  # every unit ran once
    gpu = headers[victim][0]["gpu"]
    after = [h[0] for u, h in headers.items() if u != victim and h[0]["gpu"] == gpu]
    assert after and all(h["pid"] != pid for h in after)  # the GPU's next unit: a new worker
    for unit in entries:  # each unit's log holds its own lines only
        text = (sweep / "logs" / "units" / f"{unit}.log").read_text()
        assert all(other not in text for other in entries if other != unit), unit
    r = cli("resume", str(sweep))
    assert r.returncode == 0, r.stderr
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert w.returncode == 0, w.stderr
    doc = check_document(sweep, spec)  # every planned record, once
    assert all("error" not in rec for rec in doc["results"])


def test_scancel_of_a_pending_task_is_cancelled_at_once_and_resume_piped_to_head_completes(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "cancel.json", {"slurm_array_parallelism": 1, "merge_job": False}, **FOUR_UNITS)
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "3").returncode == 0
    entries = unit_jobs(sweep)
    victim = next(u for u, e in entries.items() if e["task"] == 2)
    # %1: tasks 1 and 2 wait for task 0; the pending task 2 is cancelled on its own
    poll(
        lambda: (
            "PENDING"
            in subprocess.run(
                ["squeue", "-h", "-r", "-o", "%T", "-j", entries[victim]["job_id"]], capture_output=True, text=True
            ).stdout
        ),
        30,
        "task 2 to be pending",
    )
    subprocess.run(["scancel", entries[victim]["job_id"]], check=True)
    t0 = time.monotonic()
    st = poll(
        lambda: (s := status(sweep)) and next(u for u in s["units"] if u["id"] == victim)["state"] == "cancelled" and s,
        30,
        "status to say cancelled",
        0.1,
    )
    seen_s = time.monotonic() - t0
    assert "cancelled while pending" in next(u for u in st["units"] if u["id"] == victim)["detail"]
    assert cli("status", str(sweep)).returncode == 1  # a unit ended without finishing: status says so
    # resume at once, its output cut short by `head -1`: what sbatch accepted stays accepted
    piped = subprocess.run(
        f"{sys.executable} -m orchestrator resume {sweep} | head -1",
        shell=True,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1 and "Traceback" not in piped.stderr, piped
    resumed = [e for e in jobs(sweep) if e.get("origin") == "resume"]
    assert resumed and {e["unit"] for e in resumed} <= {u["id"] for u in json.loads((sweep / "units.json").read_text())}
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert w.returncode == 0, w.stderr
    check_document(sweep, spec)  # every planned record, once
    print(f"status said cancelled {seen_s:.2f} s after scancel")


def test_two_runs_of_one_sweep_submit_it_once(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "twice.json", modes=["fwd"], compile={"workers": 1})
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "orchestrator", "run", str(spec), "--sweep-dir", str(sweep), "--units", "1"]
    first = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    poll(
        lambda: (sweep / "run.lease").exists() or first.poll() is not None, 60, "the first run to hold the sweep", 0.05
    )
    second = second_run_follows(first, args)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0, (err, second.stderr)
    assert "being run by another `tilesweep run`" in second.stderr, second.stderr
    entries = [e for e in jobs(sweep) if "event" not in e]
    assert sorted(e["unit"] for e in entries) == sorted(u["id"] for u in json.loads((sweep / "units.json").read_text()))
    for e in entries:  # one attempt each
        assert sum("header" in o for o in lines(sweep / "partials" / f"{e['unit']}.jsonl")) == 1
    check_document(sweep, spec)


def test_a_failed_unit_says_why_in_its_workers_own_words(tmp_path: Path) -> None:
    # a GPU task whose jax sees no GPU (the fake GPUs): the worker refuses to time interpret mode by accident
    spec = write_spec(tmp_path, "gpu.json", {"merge_job": False}, kernel={"interpret": "auto"}, sharding={"units": 1})
    sweep = tmp_path / "sweep"
    r = cli("run", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 1
    (unit,) = unit_jobs(sweep)
    log = sweep / "logs" / "units" / f"{unit}.log"
    # whichever fake GPU the cluster gave (another job may hold GPU 0)
    assert re.search(
        rf"unit {unit} failed \(this task was given GPU\(s\) CUDA_VISIBLE_DEVICES=\d+ but jax sees none", r.stderr
    ), r.stderr
    assert f"log: {log}" in r.stderr and log.exists()
    s = cli("status", str(sweep))
    assert s.returncode == 1 and f"log: {log}" in s.stdout
    # the two ways on, each a command that takes it; not an edit of the sweep's frozen sweep.json
    assert (
        f"install the CUDA jaxlib on the nodes (pip install 'tilesweep[cuda]', or load it in executor.slurm_setup of "
        f"{spec}), then `tilesweep resume {sweep} --spec {spec}`; or, to time interpret mode on purpose, set "
        f"kernel.interpret to true in {spec} and `tilesweep submit {spec}`, another sweep" in s.stdout
    ), s.stdout
    assert "sweep.json" not in s.stdout, s.stdout
    r = cli("resume", str(sweep), "--spec", str(spec))  # with the jaxlib loaded by its executor section
    assert r.returncode == 0 and "submitted 1 unit" in r.stdout, r.stderr
    assert cli("cancel", str(sweep)).returncode == 0
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "kernel": {"interpret": True}}))
    assert_one_line_error(cli("resume", str(sweep), "--spec", str(spec)), "is not the spec of the sweep")
    other = tmp_path / "interpreted"
    r = cli("submit", str(spec), "--sweep-dir", str(other))
    assert r.returncode == 0 and "submitted 1 unit" in r.stdout, r.stderr
    assert cli("cancel", str(other)).returncode == 0


def _submit_finding_first(spec: Path, sweep: Path, commands: Path) -> subprocess.Popen[str]:
    """``submit`` of ``spec`` into ``sweep``, started as a shell starts a command (a process group
    of its own, the one a Ctrl-C at the terminal goes to), the commands in the folder ``commands``
    found before the system's (a wrapped ``timeout``, an ``sbatch`` that does not answer)."""
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "submit", str(spec), "--sweep-dir", str(sweep)],
        cwd=REPO,
        env={**os.environ, "PATH": f"{commands}:{os.environ['PATH']}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_sbatch_starts_in_a_process_group_of_its_own_so_a_ctrl_c_cannot_reach_it(tmp_path: Path) -> None:
    """A Ctrl-C at the terminal goes to the command's process group: sbatch (and its ``timeout``
    wrapper) must be outside it from the moment it starts, or the Ctrl-C that comes as the final
    merge job is submitted kills that sbatch, and the sweep is left without its merge job."""
    import shutil

    spec = write_spec(tmp_path, "group.json")
    wrapped = tmp_path / "bin"
    wrapped.mkdir()
    groups = tmp_path / "groups"
    (wrapped / "timeout").write_text(  # the process group it starts in, before anything could move it
        f"#!/bin/sh\nps -o pgid= -p $$ | tr -d ' ' >> {groups}\nexec {shutil.which('timeout')} \"$@\"\n"
    )
    (wrapped / "timeout").chmod(0o755)
    submit = _submit_finding_first(spec, tmp_path / "sweep", wrapped)
    out, err = submit.communicate(timeout=300)
    try:
        assert submit.returncode == 0, err
        started_in = groups.read_text().split()
        assert len(started_in) == 2 and str(submit.pid) not in started_in, (started_in, submit.pid)  # array, merge job
    finally:
        cli("cancel", str(tmp_path / "sweep"))


def test_a_ctrl_c_while_sbatch_does_not_answer_is_said_at_once_with_why_the_stop_waits(tmp_path: Path) -> None:
    """A Ctrl-C is held while sbatch runs (a job it accepts must be recorded): with an sbatch that
    does not answer (a busy controller), the command says so at once, not after a silent wait of up
    to executor.sbatch_timeout_s; once sbatch answers it stops, nothing submitted."""
    spec = write_spec(tmp_path, "busy.json", {"sbatch_timeout_s": 30})  # bounds the test on a silent stop
    called, answer = tmp_path / "sbatch-called", tmp_path / "sbatch-answers"
    busy = tmp_path / "busybin"
    busy.mkdir()
    (busy / "sbatch").write_text(
        f"#!/bin/sh\ntouch {called}\nwhile [ ! -e {answer} ]; do sleep 0.1; done\n"
        "echo 'sbatch: error: Socket timed out on send/recv operation' >&2; exit 1\n"
    )
    (busy / "sbatch").chmod(0o755)
    submit = _submit_finding_first(spec, tmp_path / "sweep", busy)
    poll(lambda: called.exists() or submit.poll() is not None, 120, "submit to call sbatch")
    os.killpg(submit.pid, signal.SIGINT)
    assert submit.stderr is not None
    before: list[str] = []  # what it said before the stop (the sweep's plan), then the stop's first line
    while (said := submit.stderr.readline()) and not said.startswith("tilesweep: warning: SIGINT"):
        before.append(said)
    answer.touch()  # sbatch answers only once the stop was said (or the command ended without saying it)
    _, err = submit.communicate(timeout=120)
    assert said.startswith("tilesweep: warning: SIGINT: stopping once sbatch answers"), "".join(before) + said + err
    # it ends as stopped, nothing submitted; under load in CI it has ended on sbatch's refusal
    # instead (exit 2), the stop not delivered ahead of it: either way it says the stop came while
    # sbatch ran and that sbatch accepted no job, and nothing was submitted or left behind
    assert err.splitlines()[-2] == "tilesweep: warning: SIGINT came while sbatch ran; sbatch accepted no job", err
    stopped = submit.returncode == 130 and err.splitlines()[-1] == "tilesweep: interrupted; nothing was submitted"
    refused = submit.returncode == 2 and err.splitlines()[-1].startswith("tilesweep: error: sbatch refused the job")
    assert stopped or refused, err
    assert not (tmp_path / "sweep").exists()


def test_submission_messages_read_as_a_user_reads_them(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "msg.json", {"sbatch_timeout_s": 1})
    sweep = tmp_path / "sweep"
    # an sbatch that never answers (a full queue): given up on after sbatch_timeout_s, nothing left behind
    slow = tmp_path / "slowbin"
    slow.mkdir()
    called, answered = tmp_path / "sbatch-called", tmp_path / "sbatch-answered"
    (slow / "sbatch").write_text(f"#!/bin/sh\ntouch {called}\nsleep 300\ntouch {answered}\n")
    (slow / "sbatch").chmod(0o755)
    r = cli("submit", str(spec), "--sweep-dir", str(sweep), env={"PATH": f"{slow}:{os.environ['PATH']}"})
    assert called.exists() and not answered.exists()  # submit asked sbatch, then returned before it answered
    assert_one_line_error(r, "sbatch did not answer within 1 s", "squeue", "executor.sbatch_timeout_s")
    assert not sweep.exists()
    # run with the slurm executor where sbatch cannot be reached: no half-made sweep directory
    empty = tmp_path / "bin"
    empty.mkdir()
    assert_one_line_error(cli("run", str(spec), "--sweep-dir", str(sweep), env={"PATH": str(empty)}), "sbatch", "PATH")
    assert not sweep.exists()
    # logs of a unit that never ran, ls of a folder that is not there
    assert cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    assert_one_line_error(cli("logs", str(sweep), "0"), "has no log", "never submitted")
    assert_one_line_error(cli("logs", str(sweep), "nosuch"), 'unit "nosuch" is no unit of', "shows their ids")
    assert_one_line_error(cli("ls", str(tmp_path / "nothere")), "nothere does not exist")
    v = cli("--version")
    assert v.returncode == 0 and v.stdout.startswith("tilesweep ")
