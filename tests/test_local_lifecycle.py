"""A local sweep's life when it does not go to plan, as a user meets it: a worker killed with
SIGKILL, Ctrl-C during a unit and between units, then ``status``, ``wait`` and ``resume``.

Real processes throughout: ``tilesweep run`` starts each unit's worker (``resume --no-wait``
under submitit's local controller, which outlives the command); the tests kill and interrupt
those as a user would (Ctrl-C as a terminal sends it: SIGINT to the whole process group, see
``helpers.LAUNCH``), each once an event happened (a record written, a unit's marker), never
after a guessed time.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import TINY_SPEC, ctrl_c_after_first_record, records_written, run_cli, start_run, until

# one shape, fwd only, three forced configs besides auto: four items a unit, compiled one at a
# time, so a worker that wrote its first record has seconds of work left to be stopped in
SPEC = {
    "modes": ["fwd"],
    "fwd_block_q": [16, 32, 64],
    "fwd_block_k": [32],
    "compile": {"workers": 1},
    "executor": {"kind": "local"},
}
ITEMS = 4
SETTLE_S = 120  # a guard, not a wait: each command below returns as soon as it is done


@pytest.fixture(autouse=True)
def _ctrl_c_raises() -> Any:
    """A Ctrl-C raises in this process, as in a terminal, also where the suite was started in
    the background (a shell starts ``cmd &`` with SIGINT ignored, and Python keeps it so)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _worker_pid(sweep: Path) -> int:
    """The pid of the worker that holds a unit's lease (the process a user finds with ps)."""
    for lease in (sweep / "leases").glob("*.lease"):
        text = lease.read_text()
        if text.endswith("\n"):
            return int(json.loads(text)["pid"])
    raise AssertionError("no unit lease")


def _has_lease(sweep: Path) -> bool:
    try:
        _worker_pid(sweep)
    except (AssertionError, FileNotFoundError, ValueError):
        return False
    return True


def _child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A local sweep whose worker was killed with SIGKILL after its first record: the sweep
    directory and how its ``run`` ended. The tests below read it in order; the last resumes it."""
    tmp = tmp_path_factory.mktemp("killed")
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({**TINY_SPEC, **SPEC, "output": str(tmp / "results.json")}))
    sweep = tmp / "sweep"
    run = start_run(spec, sweep)
    until(lambda: records_written(sweep) >= 1 and _has_lease(sweep), "a first record", run)
    os.kill(_worker_pid(sweep), signal.SIGKILL)
    out, err = run.communicate(timeout=SETTLE_S)
    return sweep, subprocess.CompletedProcess(run.args, run.returncode, out, err)


def test_a_worker_killed_by_sigkill_is_said_so_by_run_and_status(
    killed: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    sweep, run = killed
    assert run.returncode == 1, run.stderr
    assert f"failed: killed by signal 9 (SIGKILL) (log: {sweep}/logs/" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    status = run_cli("status", str(sweep))
    assert status.returncode == 1
    (line,) = [line for line in status.stdout.splitlines() if " failed " in line]
    assert "killed by signal 9 (SIGKILL)" in line, status.stdout


def test_wait_on_a_settled_local_sweep_with_a_failed_unit_ends_at_once_with_the_resume_hint(
    killed: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    sweep, _ = killed
    cpu = _child_cpu_s()
    wait = run_cli("wait", str(sweep), "--interval", "0.2", timeout=SETTLE_S)
    assert wait.returncode == 1, wait.stderr
    assert re.fullmatch(
        rf"tilesweep: [1-3] items? ha(s|ve) no record; `tilesweep resume {re.escape(str(sweep))}` redoes only those",
        wait.stderr.splitlines()[-1],
    ), wait.stderr
    assert "killed by signal 9 (SIGKILL)" in wait.stderr
    assert _child_cpu_s() - cpu < 20, "wait burned CPU"


def test_resume_no_wait_starts_the_new_unit_and_wait_merges_it(
    killed: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    sweep, _ = killed
    resumed = run_cli("resume", str(sweep), "--no-wait")
    assert resumed.returncode == 0, resumed.stderr
    last = resumed.stdout.splitlines()[-1]
    assert last.startswith("started 1 unit here, left running; follow with:") and f"tilesweep wait {sweep}" in last
    wait = run_cli("wait", str(sweep), "--interval", "0.2", timeout=SETTLE_S)
    assert wait.returncode == 0, wait.stderr
    doc = json.loads((sweep.parent / "results.json").read_text())
    assert len(doc["results"]) == ITEMS and not [r for r in doc["results"] if "error" in r]
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert st["complete"] and st["done"] == ITEMS


def test_ctrl_c_reads_as_interrupted_and_resume_runs_and_merges(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(**SPEC)
    sweep = tmp_path / "sweep"
    _, err = ctrl_c_after_first_record(spec, sweep)
    # the worker's log: no traceback, its last word says it was interrupted
    (log,) = (sweep / "logs").glob("*_0_log.err")
    text = log.read_text()
    assert "Traceback" not in text and "race condition" not in text, text
    assert (
        text.rstrip()
        .splitlines()[-1]
        .endswith("interrupted: stopped by SIGINT (Ctrl-C); its finished records are kept")
    ), text
    status = run_cli("status", str(sweep))
    assert status.returncode == 1, status.stdout
    assert "interrupted" in status.stdout and "failed" not in status.stdout and "KeyboardInterrupt" not in status.stdout
    assert "in progress" not in status.stdout and "ETA" not in status.stdout, status.stdout
    assert status.stdout.splitlines()[-1] == f"to redo the missing items: tilesweep resume {sweep}"
    # resume runs the missing items here and merges, as run does: the document is whole
    resumed = run_cli("resume", str(sweep), timeout=SETTLE_S)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout and f"merged {ITEMS} records" in resumed.stderr, resumed.stdout + resumed.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(doc["results"]) == ITEMS


def test_ctrl_c_between_units_leaves_no_prediction_of_work_nobody_does(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    # a replay: units take no compile, so the run is between its two units within moments
    spec = write_spec(**SPEC, kernel={"impl": "replay"}, replay={"source": str(replay_source(tmp_path))})
    sweep = tmp_path / "sweep"
    run = start_run(spec, sweep, "--units", "2", "--workers", "1")
    until(lambda: any((sweep / "done").glob("*.json")) if (sweep / "done").is_dir() else False, "a unit done", run)
    os.killpg(run.pid, signal.SIGINT)
    out, err = run.communicate(timeout=SETTLE_S)
    assert run.returncode == 130, out + err
    status = run_cli("status", str(sweep))
    assert "in progress" not in status.stdout and "ETA" not in status.stdout, status.stdout
    # the second unit's worker may have run its unit (a replay's takes moments) before the stop
    # reached it: then the sweep is complete, and otherwise it says how to finish it
    if not status.stdout.splitlines()[0].endswith(", complete"):
        assert "incomplete" in status.stdout.splitlines()[0], status.stdout
        assert status.stdout.splitlines()[-1] == f"to redo the missing items: tilesweep resume {sweep}"
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert st["settled"] and st["eta_s"] is None


def test_a_ctrl_c_while_the_run_starts_a_worker_stops_the_run_and_not_the_worker_early() -> None:
    """The run starts each worker with SIGINT blocked (the worker takes it over once its unit
    runs); a Ctrl-C in that moment still reaches the run's own handler, though the run has
    other threads (a lease's heartbeat, the bar's monitor) that the kernel may hand it to."""
    from orchestrator.control.dispatch.local_procs import children_block_sigint

    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    idle = threading.Event()
    other = threading.Thread(target=idle.wait)
    other.start()
    probe = "import signal; print(int(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"
    try:
        with children_block_sigint():
            os.kill(os.getpid(), signal.SIGINT)  # the other thread may take it while a worker starts
            child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        assert got == [signal.SIGINT]
        assert child.stdout.strip() == "1", "the worker starts with SIGINT blocked"
    finally:
        idle.set()
        other.join()
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_as_a_worker_starts_stops_that_worker_before_its_unit_runs(
    write_spec: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that lands the moment a worker process has started (a real SIGINT, sent as the
    process is made) stops the run there and the worker with it: no worker goes on to run its
    unit behind a run that said it was interrupted."""
    from orchestrator.control.dispatch import local_procs
    from orchestrator.control.sweeps import prepare_sweep

    sd, unit_ids, _ = prepare_sweep(str(write_spec(modes=["fwd"])), str(tmp_path / "sweep"), None, None)
    started: list[subprocess.Popen[bytes]] = []

    class Interrupted(subprocess.Popen[bytes]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(local_procs.subprocess, "Popen", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        local_procs.start_worker(sd, unit_ids[0], None, None)
    (worker,) = started
    assert worker.poll() is not None, "the worker was left running"
    partial = sd.partial_path(unit_ids[0])
    assert not partial.exists() or '"record"' not in partial.read_text()


def replay_source(tmp_path: Path) -> Path:
    """A results document of the spec the replay test runs (a real run of it would cost a
    compile: this one is made up, as a replay's source may be)."""
    from orchestrator.store import synthetic

    data = {**TINY_SPEC, **SPEC, "output": str(tmp_path / "source.json")}
    path = tmp_path / "source.json"
    path.write_text(json.dumps(synthetic.document(data)))
    return path


def test_a_ctrl_c_as_resume_no_wait_starts_a_controller_still_records_its_job(
    write_spec: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that lands the moment ``resume --no-wait`` has started a unit's controller (a
    real SIGINT, sent as the controller is made) stops the command only once the controller is
    in jobs.jsonl: the unit it runs, left running by design, is one status and wait follow."""
    from orchestrator.control.dispatch import local_background, local_controller
    from orchestrator.control.sweeps import prepare_sweep

    spec = write_spec(**SPEC, kernel={"impl": "replay"}, replay={"source": str(replay_source(tmp_path))})
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    started: list[subprocess.Popen[bytes]] = []
    real = local_controller.start_controller

    def interrupted(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        process = real(*args, **kwargs)
        started.append(process)
        os.kill(os.getpid(), signal.SIGINT)
        return process

    monkeypatch.setattr(local_controller, "start_controller", interrupted)
    with pytest.raises(KeyboardInterrupt):
        local_background.start_units_locally(sd, unit_ids[:1])
    (controller,) = started
    jobs = [json.loads(line) for line in (sd.root / "jobs.jsonl").read_text().splitlines()]
    assert [(e["unit"], e["job_id"]) for e in jobs if "unit" in e] == [(unit_ids[0], str(controller.pid))]
    assert controller.wait(timeout=SETTLE_S) == 0


def test_a_ctrl_c_as_run_records_a_units_worker_stops_that_worker_too(
    write_spec: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that lands the moment ``run`` has started a unit's worker and put it in
    jobs.jsonl (a real SIGINT, sent as the job is recorded) stops that worker with the run: no
    worker is left running unseen by the run, for status to report as in progress."""
    from orchestrator.control.dispatch import local
    from orchestrator.control.sweeps import prepare_sweep

    spec = write_spec(**SPEC, kernel={"impl": "replay"}, replay={"source": str(replay_source(tmp_path))})
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    real = sd.record_jobs

    def interrupted(entries: list[dict[str, Any]]) -> None:
        real(entries)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(sd, "record_jobs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        local.run_units_locally(sd, unit_ids, workers=1)
    jobs = [json.loads(line) for line in (sd.root / "jobs.jsonl").read_text().splitlines()]
    (pid,) = [int(e["job_id"]) for e in jobs if "unit" in e]
    assert not Path(f"/proc/{pid}").exists(), "the unit's worker outlived the interrupted run"
    status = run_cli("status", str(sd.root))
    assert "in progress" not in status.stdout and "ETA" not in status.stdout, status.stdout


def test_a_copied_sweep_directory_is_complete_and_shows_its_own_logs(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """A finished sweep directory copied elsewhere (a new inode for every file, new mtimes):
    status calls it complete with no stale marker, and logs shows the copy's own files, also once
    the original is gone."""
    import shutil

    spec = write_spec(**SPEC, kernel={"impl": "replay"}, replay={"source": str(replay_source(tmp_path))})
    sweep = tmp_path / "sweep"
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    copy = tmp_path / "elsewhere" / "sweep"
    shutil.copytree(sweep, copy, copy_function=shutil.copy)  # content only: new inodes and mtimes
    status = run_cli("status", str(copy))
    assert status.returncode == 0 and status.stdout.splitlines()[0].endswith(", complete"), status.stdout
    assert "stale" not in status.stdout, status.stdout
    shutil.rmtree(sweep)
    logs = run_cli("logs", str(copy), "0")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith(f"==> {copy / 'logs'}"), logs.stdout[:200]


def test_a_unit_done_whose_worker_then_fails_is_done_for_run_as_for_status(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """A worker that wrote its unit's marker and then exited non-zero (a write at exit that a
    full disk refused, say): ``run`` calls the unit done, as ``status`` does, merges every
    record and exits 0, and its log says what the worker did after."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    # every local worker of this run exits 3 after its unit: a real exit code at interpreter exit
    (hooks / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "atexit.register(lambda: os._exit(3) if sys.argv and sys.argv[0].endswith('local_worker.py') else None)\n"
    )
    spec = write_spec(**SPEC, kernel={"impl": "replay"}, replay={"source": str(replay_source(tmp_path))})
    sweep = tmp_path / "sweep"
    env = {"PYTHONPATH": f"{hooks}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"merged {ITEMS} records" in r.stderr and not re.search(r"\bfailed\b[:(]", r.stdout + r.stderr), r.stderr
    assert "its worker then exited with code 3" in r.stderr, r.stderr
    assert run_cli("status", str(sweep)).returncode == 0


def test_run_after_an_interrupted_resume_runs_only_the_resumed_unit_and_times_no_item_twice(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(**SPEC)
    sweep = tmp_path / "sweep"
    ctrl_c_after_first_record(spec, sweep)
    # resume hands the three missing items to a new unit; Ctrl-C once it recorded one of them
    resume = start_run(spec, sweep, command="resume")
    until(lambda: records_written(sweep) >= 2, "the resumed unit's first record", resume)
    os.killpg(resume.pid, signal.SIGINT)
    _, err = resume.communicate(timeout=SETTLE_S)
    assert resume.returncode == 130 and "Traceback" not in err, err
    units = json.loads((sweep / "units.json").read_text())
    assert len(units) == 2, units
    # the rerun runs the resumed unit's last items, never the first unit's again
    rerun = run_cli("run", str(spec), "--sweep-dir", str(sweep), timeout=SETTLE_S)
    assert rerun.returncode == 0, rerun.stderr
    assert records_written(sweep) == ITEMS, [p.read_text() for p in (sweep / "partials").glob("*.jsonl")]
    assert len(json.loads((tmp_path / "results.json").read_text())["results"]) == ITEMS


def test_log_paths_written_relative_to_another_directory_are_this_sweeps_logs(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """A SLURM submission with a relative ``--sweep-dir`` wrote its units' log paths relative to
    where it ran: status and logs, asked from anywhere, read them as this sweep's own logs."""
    spec = write_spec(**SPEC, kernel={"impl": "replay"}, replay={"source": str(replay_source(tmp_path))})
    sweep = tmp_path / "sweep"
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    history = (sweep / "jobs.jsonl").read_text().splitlines()
    relative = [json.loads(line) for line in history]
    for entry in relative:  # as `cd tmp_path; tilesweep submit ... --sweep-dir sweep` writes them
        if "log" in entry:
            entry["log"] = os.path.relpath(entry["log"], tmp_path)
    (sweep / "jobs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in relative))
    shown = run_cli("logs", str(sweep), "0")
    assert shown.returncode == 0 and shown.stdout.startswith(f"==> {sweep / 'logs'}"), shown.stderr
