"""Compile processes (``compile.mode: processes``), end to end on this CPU (interpret mode):
the same records as threads apart from timings, through the local executor and the local
SLURM cluster; a compile process killed with SIGKILL costs nothing but a recompile of its
config; USR2 and TERM on SLURM stop every process of the unit; a broken environment in the
children is one clear error. Every process is real, every signal a real one."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobs.compile_procs import START_FAILURES, ProcessPool
from jobs.worker import run_unit
from orchestrator.control.sweeps import prepare_sweep
from orchestrator.errors import WorkerEnvironmentError
from orchestrator.planning import WorkItem
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import item_id
from orchestrator.store.lines import abandon_line, encode_line
from orchestrator.store.merge import merge
from orchestrator.store.partials import read_partial
from orchestrator.store.sweepdir import SweepDir
from tests.conftest import REPO, TINY_SPEC, run_cli
from tests.slurm_cluster import poll, require_cluster
from tests.test_slurm_dispatch import lines

# the tiny shape, 4 configs: auto and one forced config of each mode (a fwd_bwd executable
# holds several kernels and a custom_vjp: it must travel between processes too); blocks of
# the whole sequence, the quickest to compile in interpret mode
SPEC = {
    **TINY_SPEC,
    "fwd_block_q": [64],
    "fwd_block_k": [64],
    "bwd_outer": [64],
    "bwd_inner": [64],
    "sharding": {"units": 1},
}
TIMINGS = {"compile_s", "inner", "median_ms", "q1_ms", "q3_ms", "samples_ms"}
PROVENANCE = {"unit", "attempt"}


def _write(folder: Path, name: str, mode: str, **over: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    data = {
        **SPEC,
        "output": str(folder / f"{name}.results.json"),
        "compile": {"mode": mode, "workers": 2, "cache_dir": "off"},
        **over,
    }
    path.write_text(json.dumps(data))
    return path


def _records(doc_path: Path, *, drop: set[str] = TIMINGS | PROVENANCE) -> dict[str, dict]:
    """A document's records by item id, without the fields that may differ between runs."""
    doc = json.loads(doc_path.read_text())
    return {item_id(r): {k: v for k, v in r.items() if k not in drop} for r in doc["results"]}


def compile_processes(worker_pid: int) -> list[int]:
    """Live compile processes started by ``worker_pid`` (their last argument), orphans too."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            raw = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        argv = [a.decode() for a in raw if a]
        if "jobs.compile_child" in argv and argv[-1] == str(worker_pid) and state != "Z":
            found.append(int(proc.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def threads_doc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny unit run with compile threads (in this process): what processes must match."""
    folder = tmp_path_factory.mktemp("threads")
    sd, (unit,), _ = prepare_sweep(str(_write(folder, "threads", "threads")), str(folder / "sweep"), None, None)
    run_unit(str(sd.root), unit)
    merge(sd)
    return folder / "threads.results.json"


def _kill_one_busy_compile_process(logs: Path, done: Callable[[], bool]) -> list[tuple[str, str]]:
    """SIGKILL compile processes the worker's log shows with a config handed to them, one at a
    time, until the log shows one that died with a config in flight; return (pid, item) of
    that death. A kill that lands between two configs ("ended while idle") is followed by
    another."""
    victims: list[int] = []
    deaths: list[tuple[str, str]] = []

    def step() -> bool:
        text = "".join(p.read_text() for p in sorted([*logs.glob("*_log.err"), *logs.glob("units/*.log")]))
        deaths[:] = re.findall(r"compile process (\d+) died \(killed by signal 9\) while compiling item (\w+)", text)
        if deaths or done():
            return True
        if victims and f"compile process {victims[-1]} ended while idle" not in text:
            return False  # the last kill is not accounted for yet
        handed = [int(p) for p in re.findall(r"compile process (\d+) compiles item", text)]
        live = [p for p in reversed(handed) if p not in victims and _alive(p)]
        if live:
            victims.append(live[0])
            os.kill(live[0], signal.SIGKILL)
        return False

    poll(step, 300, "a compile process killed with a config in flight", 0.05)
    return deaths


def test_processes_match_threads_and_a_killed_compile_process_costs_one_recompile(
    threads_doc: Path, tmp_path: Path
) -> None:
    """``tilesweep run`` (local executor) in processes mode, one compile process SIGKILLed
    mid-unit: the unit completes, only the config in flight in it was compiled again, and the
    records are those of threads apart from timings."""
    spec = _write(tmp_path, "procs", "processes")
    sweep = tmp_path / "sweep"
    run = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", str(spec), "--sweep-dir", str(sweep)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deaths = _kill_one_busy_compile_process(sweep / "logs", lambda: run.poll() is not None)
        out, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 0, err
    assert len(deaths) == 1, err  # the kill landed on a config in flight
    ((_, victim),) = deaths
    (partial,) = (sweep / "partials").iterdir()
    objs = lines(partial)
    starts = [o["start"] for o in objs if "start" in o]
    # started in the window, died alone in its process (an alone start line), started again
    assert [o.get("alone", False) for o in objs if o.get("start") == victim] == [False, True, False]
    assert all(starts.count(s) == 1 for s in set(starts) - {victim})
    # stopped right after the restart, the death still counts once against it, nothing else
    cut = objs[: max(k for k, o in enumerate(objs) if o.get("start") == victim) + 1]
    (tmp_path / "cut.jsonl").write_text(
        "".join(json.dumps(o) + "\n" for o in cut) + encode_line(abandon_line(victim, cut[-1]["attempt"])) + "\n"
    )
    stopped = read_partial(tmp_path / "cut.jsonl")
    assert (stopped.starts[victim], stopped.deaths[victim], sum(stopped.deaths.values())) == (2, 1, 1)
    recorded = [o["id"] for o in objs if "record" in o]
    assert sorted(recorded) == sorted(it.id for it in SweepDir.open(sweep).items())  # each once, nothing lost
    assert not [o for o in objs if "abandon" in o]
    procs = _records(tmp_path / "procs.results.json")
    assert procs == _records(threads_doc) and len(procs) == 4
    assert not any("WorkerCrashed" in r.get("error", "") for r in procs.values())
    doc, threads = (json.loads(p.read_text()) for p in (tmp_path / "procs.results.json", threads_doc))
    assert [list(r) for r in doc["results"]] == [list(r) for r in threads["results"]]  # same fields, same order
    assert all(r["compile_cached"] is False for r in doc["results"] if "compile_s" in r)  # cache off
    header = next(o["header"] for o in objs if "header" in o)
    marker = json.loads(next((sweep / "done").iterdir()).read_text())
    assert (marker["compile_mode"], marker["compile_workers"], marker["compile_deaths"]) == ("processes", 2, 1)
    assert marker["timer"] == "wall" and header["measure"]["timer"] == doc["results"][0]["timer"]  # on a CPU
    assert compile_processes(header["pid"]) == []  # none outlived its worker


def test_compile_processes_that_cannot_start_are_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orchestrator.planning import RUN, expand

    spec = SweepSpec(**SPEC)
    item = next(it for it in expand(spec) if it.kind == RUN)
    # their Python cannot even start (a node's broken module environment); it dies at once,
    # where a jax that cannot find its platform dies after seconds of imports, same path
    monkeypatch.setenv("PYTHONHOME", str(tmp_path / "no-such-python"))
    with ProcessPool(1, spec, None) as pool, pytest.raises(WorkerEnvironmentError) as err:
        pool.collect([item])
    assert f"{START_FAILURES} compile processes in a row died before they were ready" in err.value.message
    assert "compile.mode: threads" in err.value.message and "\n" not in err.value.message


def test_compile_processes_die_with_their_worker(tmp_path: Path) -> None:
    spec = _write(tmp_path, "orphans", "processes")
    sd, (unit,), _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobs.worker", str(sd.root), unit],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        children = poll(lambda: len(c := compile_processes(worker.pid)) == 2 and c, 120, "two compile processes")
    finally:
        worker.kill()  # SIGKILL: nothing of the worker runs to end them
    worker.wait()
    poll(lambda: not any(_alive(c) for c in children), 30, "the compile processes to die with their worker", 0.1)


@pytest.mark.slurm
def test_usr2_and_term_on_slurm_stop_every_process_of_the_unit(threads_doc: Path, tmp_path: Path) -> None:
    """Two units as one SLURM array, each signalled while its compile processes compile.
    USR2 (the time-limit warning): the worker stops on its own, abandons its window, its
    compile processes end, the task is requeued and completes. TERM (scancel): every process
    ends, every config in flight is abandoned (none counts as a crash). The records are
    those of threads apart from timings (and compile_cached: the requeued attempt may load
    from the persistent cache what the first one's processes compiled)."""
    require_cluster()
    # one compile process per unit (two units share two cores), the persistent cache on
    spec = _write(
        tmp_path,
        "slurm",
        "processes",
        compile={"mode": "processes", "workers": 1},
        executor={"kind": "slurm", "slurm_partition": "gpu", "gpus_per_node": 1, "timeout_min": 5, "merge_job": False},
    )
    sweep = tmp_path / "sweep"
    r = run_cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "2")
    assert r.returncode == 0, r.stderr
    usr2, term = [e for e in map(json.loads, (sweep / "jobs.jsonl").read_text().splitlines()) if "event" not in e]

    def compiling(entry: dict) -> tuple[int, list[int]] | None:
        """(worker pid, its compile processes) once a compile process was handed a config."""
        log = Path(entry["log"])  # the unit's worker log
        partial = sweep / "partials" / f"{entry['unit']}.jsonl"
        if not (log.exists() and "compiles item" in log.read_text() and partial.exists()):
            return None
        pid = next(o["header"]["pid"] for o in lines(partial) if "header" in o)
        return pid, compile_processes(pid)

    pids = []
    for entry, cmd in ((usr2, ["scancel", "--signal", "USR2"]), (term, ["scancel"])):
        pid, children = poll(functools.partial(compiling, entry), 240, f"unit {entry['unit']} to compile")
        assert len(children) == 1
        subprocess.run([*cmd, entry["job_id"]], check=True)
        pids += [pid, *children]
    poll(lambda: not any(_alive(p) for p in pids), 60, "every process of both units gone")
    poll(lambda: (sweep / "done" / f"{usr2['unit']}.json").exists(), 240, "the requeued unit to complete")
    for entry in (usr2, term):
        objs = lines(sweep / "partials" / f"{entry['unit']}.jsonl")
        first = [o for o in objs if o.get("attempt") == 1]
        # a config the signal found in flight is abandoned, none blamed; one that ended before it
        # kept its record, and so did one that TERM abandoned but that ended before the kill
        started = {o["start"] for o in first if "start" in o}
        recorded = {o["id"] for o in first if "record" in o}
        abandoned = {o["abandon"] for o in first if "abandon" in o}
        assert started - recorded <= abandoned <= started
        assert not any("error" in o["record"] for o in objs if "record" in o)
    assert compile_processes(pids[0]) == [] and compile_processes(pids[2]) == []
    assert run_cli("merge", str(sweep)).returncode == 0
    drop = TIMINGS | PROVENANCE | {"compile_cached"}
    procs, threads = _records(tmp_path / "slurm.results.json", drop=drop), _records(threads_doc, drop=drop)
    assert procs and procs == {iid: threads[iid] for iid in procs}
    assert set(procs) >= {o["id"] for o in lines(sweep / "partials" / f"{usr2['unit']}.jsonl") if "record" in o}


def test_the_device_timer_is_the_default_only_on_a_gpu_with_compile_processes() -> None:
    procs = SweepSpec(**{**SPEC, "compile": {"mode": "processes"}})
    assert procs.timer_on("gpu") == "device"
    # the wall clock wherever compile processes do not run beside the timing on a GPU
    assert {procs.timer_on("cpu"), SweepSpec(**SPEC).timer_on("gpu")} == {"wall"}
    named = SweepSpec(**{**SPEC, "compile": {"mode": "processes"}, "timing": {"timer": "wall"}})
    assert named.timer_on("gpu") == "wall"


def test_the_compile_pool_follows_the_workers_cpu_share() -> None:
    """A whole-node task pins each of its G workers to a share of its CPUs (all of them,
    shared, where it has fewer CPUs than workers, each worker counting one as its own):
    compile.workers is capped at that share, and the default is the share. Pinned here as
    node.py pins a worker (affinity of this thread only, restored after); the shared count is
    set in a child process, as a forked worker sets it."""
    from jobs.compile_pool import pool_size

    cpus = sorted(os.sched_getaffinity(0))
    try:
        os.sched_setaffinity(0, cpus[:1])
        assert (pool_size(None), pool_size(4)) == (1, 1)
    finally:
        os.sched_setaffinity(0, cpus)
    assert (pool_size(None), pool_size(1), pool_size(len(cpus) + 3)) == (len(cpus), 1, len(cpus))
    shared = "from jobs import compile_pool as c; c.share(1); print(c.pool_size(None), c.pool_size(4))"
    r = subprocess.run([sys.executable, "-c", shared], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["1", "1"], r.stderr


def test_a_config_whose_compile_processes_keep_dying_is_given_up(tmp_path: Path) -> None:
    """``on_death`` says not to compile it again (``executor.max_config_attempts`` reached):
    its result says ``died`` (the worker records WorkerCrashed), the pool carries on with a
    new compile process. Each config is SIGKILLed in its compile process; a kill that lands
    after its compile finished is an idle death and the next config is tried."""
    from orchestrator.planning import RUN, expand

    spec = SweepSpec(**SPEC)
    items = [it for it in expand(spec) if it.kind == RUN]
    given_up: list[str] = []
    with ProcessPool(1, spec, None) as pool:
        for item in items:
            victims: list[int] = []

            def kill_once_busy(pool: ProcessPool = pool, victims: list[int] = victims) -> bool:
                child = pool._children[0]
                if child.item is not None and not victims:
                    victims.append(child.proc.pid)
                    os.kill(child.proc.pid, signal.SIGKILL)
                return False

            def give_up(it: WorkItem) -> bool:
                given_up.append(it.id)
                return False

            (result,) = pool.collect([item], should_stop=kill_once_busy, on_death=give_up)
            if result is not None and result.died:
                break
        (after,) = pool.collect(items[:1])
    assert given_up == [item.id] and pool.deaths == 1
    assert result is not None and result.died and result.error is None and result.blob is None
    assert after is not None and after.error is None and after.blob is not None  # a new process compiles on


def test_compile_processes_hand_over_what_the_persistent_cache_holds(threads_doc: Path, tmp_path: Path) -> None:
    """A unit whose every compile its compile processes load from a warm persistent cache (a
    resumed unit, a repeated sweep) checks and times each config as a cold one does. The cache is
    filled by the same unit in compile threads: it holds the same executables, without the seconds
    of imports a compile process starts with."""
    cache = tmp_path / "cache"
    for name, mode in (("cold", "threads"), ("warm", "processes")):
        spec = _write(tmp_path, name, mode, compile={"mode": mode, "workers": 2, "cache_dir": str(cache)})
        sd, (unit,), _ = prepare_sweep(str(spec), str(tmp_path / name), None, None)
        run_unit(str(sd.root), unit)
        merge(sd)
    warm = json.loads((tmp_path / "warm.results.json").read_text())["results"]
    assert [r["compile_cached"] for r in warm] == [True] * 4
    drop = TIMINGS | PROVENANCE | {"compile_cached"}
    assert _records(tmp_path / "warm.results.json", drop=drop) == _records(threads_doc, drop=drop)
