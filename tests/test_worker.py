"""The worker on this CPU (interpret mode): pruning without compiling, the compile pool, the
persistent compilation cache, and crash attribution when a window of configs was in flight."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobs import measure, node_env, worker
from orchestrator.control.sweeps import prepare_sweep
from orchestrator.planning import PRUNED, RUN, WorkItem
from orchestrator.spec.compat import env_fingerprint
from orchestrator.spec.model import SweepSpec
from orchestrator.store.lines import PartialHeader, partial_header
from orchestrator.store.partials import read_partial
from orchestrator.store.sweepdir import SweepDir

WriteSpec = Callable[..., Path]

TIMING_FIELDS = {"compile_s", "inner", "median_ms", "q1_ms", "q3_ms", "samples_ms"}
# float32 d16 at seq 64 in TINY_SPEC: the backward of the forced fwd_bwd config with
# bwd_inner 32 needs 16640 bytes, the other configs at most 16384, so this limit prunes that
# one config; every runnable config (autos included) is then a distinct program in
# interpret mode, where stages and warps do not change the program.
PRUNING_LIMIT = 16500


def _sweep(write_spec: WriteSpec, tmp_path: Path, name: str, **overrides: Any) -> tuple[SweepDir, str]:
    spec = write_spec(f"{name}.json", **{"smem_limit_bytes": PRUNING_LIMIT, "sharding": {"units": 1}, **overrides})
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / name), None, None)
    assert len(unit_ids) == 1
    return sd, unit_ids[0]


def _lines(sd: SweepDir, unit_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sd.partial_path(unit_id).read_text().splitlines() if line.strip()]


def _records(sd: SweepDir, unit_id: str) -> dict[str, dict[str, Any]]:
    return {obj["id"]: obj["record"] for obj in _lines(sd, unit_id) if "record" in obj}


def _count_shapes_made(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The shapes whose inputs and reference the worker makes (``ShapeContext.make``), in order."""
    made = []
    make = measure.ShapeContext.make

    def counted(cls: type[measure.ShapeContext], it: WorkItem, spec: SweepSpec) -> measure.ShapeContext:
        made.append(it.shape)
        return make(it, spec)

    monkeypatch.setattr(measure.ShapeContext, "make", classmethod(counted))
    return made


def test_pool_cache_and_pruning(write_spec: WriteSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _count_shapes_made(monkeypatch)
    # Parallel compile, cold cache
    sd, unit = _sweep(write_spec, tmp_path, "parallel", compile={"workers": 2})
    items = sd.unit_items(unit)
    pruned = [it for it in items if it.kind == PRUNED]
    runnable = [it for it in items if it.kind == RUN]
    assert len(pruned) == 1 and len(runnable) == 5
    summary = worker.run_unit(str(sd.root), unit)
    assert summary["compile_workers"] == 2 and summary["compiled"] == 5 and summary["done"] == 6
    assert made == [items[0].shape]  # inputs and references once for the shape's 5 configs
    recs = _records(sd, unit)
    # pruned configs are recorded without compiling: no start line, the model's verdict
    started = {obj["start"] for obj in _lines(sd, unit) if "start" in obj}
    assert started == {it.id for it in runnable}
    for it in pruned:
        rec = recs[it.id]
        assert it.smem_bytes is not None  # the model's prediction, which pruned it
        assert rec["pruned"] is True and rec["smem_bytes"] == it.smem_bytes > PRUNING_LIMIT
        assert rec["error"].startswith("SharedMemoryPredicted: ") and "compile_s" not in rec
    # a cold cache: no compile came from it, and it now holds them
    assert [recs[it.id]["compile_cached"] for it in runnable] == [False] * 5
    assert any((sd.root / "compile-cache").iterdir())

    # The serial path (one config after another, no cache) gives the same records except timings
    sd_serial, unit_serial = _sweep(write_spec, tmp_path, "serial", compile={"workers": 1, "cache_dir": "off"})
    assert worker.run_unit(str(sd_serial.root), unit_serial)["compile_workers"] == 1
    assert not (sd_serial.root / "compile-cache").exists()
    serial = _records(sd_serial, unit_serial)

    def strip(rec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in rec.items() if k not in TIMING_FIELDS}

    assert {i: strip(r) for i, r in serial.items()} == {i: strip(r) for i, r in recs.items()}
    assert all(list(serial[i]) == list(recs[i]) for i in recs)  # same fields, same order

    # A warm cache: a new sweep using the first one's cache loads every compile
    sd_warm, unit_warm = _sweep(
        write_spec, tmp_path, "warm", compile={"workers": 2, "cache_dir": str(sd.root / "compile-cache")}
    )
    summary = worker.run_unit(str(sd_warm.root), unit_warm)
    assert summary["compile_cached"] == 5
    warm = _records(sd_warm, unit_warm)
    assert [warm[it.id]["compile_cached"] for it in runnable] == [True] * 5
    assert {i: strip(r) for i, r in warm.items() if r.get("compile_cached")} == {
        i: {**strip(r), "compile_cached": True} for i, r in recs.items() if "compile_cached" in r
    }


def _header(sd: SweepDir, unit_id: str, attempt: int) -> PartialHeader:
    """An attempt's header as a worker of this sweep on this machine writes it."""
    device = node_env.device_block()
    return partial_header(
        unit=unit_id,
        sweep=sd.spec.fingerprint(),
        attempt=attempt,
        device=device,
        env=env_fingerprint(device),
        host=socket.gethostname(),
        pid=os.getpid(),
        slurm_job_id=None,
        started=f"2026-01-01T00:00:0{attempt}+00:00",
    )


def _fake_attempts(sd: SweepDir, unit_id: str, attempts: list[list[dict[str, object]]]) -> None:
    """Previous attempts that died, as a worker of this sweep leaves them: a header each
    (this sweep, this unit, this machine's environment), then the given lines."""
    path = sd.partial_path(unit_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines: list[object] = []
    for n, body in enumerate(attempts, 1):
        lines.append({"header": _header(sd, unit_id, n)})
        lines += [{**obj, "attempt": n} for obj in body]
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines))


def test_only_deaths_alone_in_flight_count_against_a_config(write_spec: WriteSpec, tmp_path: Path) -> None:
    sd, unit = _sweep(write_spec, tmp_path, "crash", compile={"workers": 2, "cache_dir": "off"})
    runnable = [it for it in sd.unit_items(unit) if it.kind == RUN]
    killer, *suspects = runnable[:3]
    # the killer died twice alone in flight (max_config_attempts is 2); the two others died
    # twice in a window together (killed from outside, say): suspects, but nothing against them
    _fake_attempts(
        sd,
        unit,
        [
            [{"start": killer.id, "alone": True}],
            [{"start": killer.id, "alone": True}],
            [{"start": it.id} for it in suspects],
            [{"start": it.id} for it in suspects],
        ],
    )
    content = read_partial(sd.partial_path(unit))
    assert content.deaths[killer.id] == 2 and all(content.deaths[it.id] == 0 for it in suspects)
    summary = worker.run_unit(str(sd.root), unit)
    assert summary["attempt"] == 5 and summary["done"] == 6
    recs = _records(sd, unit)
    assert recs[killer.id]["error"].startswith("WorkerCrashed: this config was the only one in flight 2 times")
    assert all("error" not in recs[it.id] for it in runnable[1:])  # no false error
    # each suspect had a window of its own (its start line says it was alone), then its record
    lines = [obj for obj in _lines(sd, unit) if obj.get("attempt") == 5]
    for it in suspects:
        k = next(i for i, obj in enumerate(lines) if obj.get("start") == it.id)
        assert lines[k]["alone"] is True and lines[k + 1].get("id") == it.id
    # the killer was not started again
    assert [obj for obj in lines if obj.get("start") == killer.id] == []


def test_stop_abandons_the_configs_compiled_ahead(write_spec: WriteSpec, tmp_path: Path) -> None:
    sd, unit = _sweep(write_spec, tmp_path, "stop", compile={"workers": 2, "cache_dir": "off"})
    runnable = [it for it in sd.unit_items(unit) if it.kind == RUN]
    polls = []

    def stop_after_first_config() -> bool:
        polls.append(1)
        return len(polls) > 2  # before the window, before config 1, then stop

    summary = worker.run_unit(str(sd.root), unit, stop_check=stop_after_first_config)
    assert summary["stopped"] and summary["done"] == 1 + 1  # the pruned one and one config
    assert not sd.marker_path(unit).exists()
    content = read_partial(sd.partial_path(unit))
    abandoned = [obj["abandon"] for obj in _lines(sd, unit) if "abandon" in obj]
    assert abandoned == [it.id for it in runnable[1:]]
    assert all(content.starts[it.id] == 0 for it in runnable[1:])  # nobody is a suspect
    assert worker.abandon_in_flight() is None
    summary = worker.run_unit(str(sd.root), unit)
    assert summary["done"] == 4 and summary["errors"] == 0
    assert all("error" not in r for r in _records(sd, unit).values() if not r.get("pruned"))


def test_a_config_a_sigterm_gives_up_while_it_is_timed_gets_no_record(
    write_spec: WriteSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole-node worker's TERM (``unit_worker._on_term``: scancel) abandons the configs in
    flight at once and stops at the next config; the config whose timing the TERM came in runs
    on to its end, but its record, timed through the task's teardown, is not written: its
    abandon line stands, and resume measures it again."""
    from jobs import compiled, in_flight

    sd, unit = _sweep(write_spec, tmp_path, "term", compile={"workers": 1, "cache_dir": "off"})
    runnable = [it for it in sd.unit_items(unit) if it.kind == RUN]
    stopped: list[str] = []
    finish = measure.finish_item

    def term_while_timed(it: WorkItem, *args: Any, **kwargs: Any) -> Any:
        out = finish(it, *args, **kwargs)
        if not stopped:  # what the TERM handler does, as the first config's timing ends
            stopped.append(str(in_flight.abandon_in_flight()))
        return out

    monkeypatch.setattr(compiled.measure, "finish_item", term_while_timed)
    summary = worker.run_unit(str(sd.root), unit, stop_check=lambda: bool(stopped))
    assert summary["stopped"]
    first = runnable[0].id
    assert first in stopped[0].split(",")
    assert first not in _records(sd, unit)
    assert {"abandon": first, "attempt": 1} in _lines(sd, unit)
    monkeypatch.undo()
    summary = worker.run_unit(str(sd.root), unit)
    assert first in _records(sd, unit) and summary["errors"] == 0


def test_a_config_the_tasks_grace_finds_hung_is_marked_by_usr1_and_given_up_as_a_timeout(
    write_spec: WriteSpec, tmp_path: Path
) -> None:
    """When a SLURM task's grace after USR2 runs out, it sends its workers USR1 before the kill
    (``node.TaskWorkers.mark_hung``): the unit worker's handler writes a ``hung`` line for each
    config in flight, so a config found hung alone every time is given up on as a timeout
    (``worker._record_uncompiled`` makes this record for it)."""
    import signal

    from jobs import in_flight
    from orchestrator.control.dispatch import unit_worker
    from orchestrator.store.lines import PartialWriter, header_line, start_line

    sd, unit = _sweep(write_spec, tmp_path, "hung", compile={"workers": 2, "cache_dir": "off"})
    stuck = next(it for it in sd.unit_items(unit) if it.kind == RUN)
    _fake_attempts(sd, unit, [[{"start": stuck.id, "alone": True}, {"hung": stuck.id}]])
    previous = {s: signal.getsignal(s) for s in unit_worker.SIGNALS}
    unit_worker.install_handlers()  # USR2, TERM and USR1, as the unit worker process has them
    try:
        with PartialWriter(sd.partial_path(unit)) as w:
            in_flight.begin(w, 2)
            in_flight.write(w, header_line(_header(sd, unit, 2)))
            in_flight.write(w, start_line(stuck.id, 2, alone=True), started=stuck.id)
            os.kill(os.getpid(), signal.SIGUSR1)  # a real signal: the handler runs at the next bytecode
            in_flight.end()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    assert {"hung": stuck.id, "attempt": 2} in _lines(sd, unit)
    content = read_partial(sd.partial_path(unit))
    assert content.deaths[stuck.id] == 2 and content.hangs[stuck.id] == 2
    # what the next attempt records for it (max_config_attempts is 2): a timeout, not a crash
    assert sd.spec.executor.max_config_attempts == 2
    rec = measure.crashed_record(stuck, content.deaths[stuck.id], content.hangs[stuck.id])
    assert rec["error"].startswith("WorkerTimeout: ")


def test_a_ctrl_c_stays_the_reason_when_the_runs_sigterm_follows_it_while_a_line_is_written(tmp_path: Path) -> None:
    """Ctrl-C in a terminal reaches a local run's worker and the run, which hands it on to the
    worker as a SIGTERM: both can come while the worker writes a line (the stop waits for it).
    The worker stops as interrupted by the Ctrl-C, exit status 130, not by the SIGTERM."""
    import signal

    from jobs import in_flight
    from orchestrator.store.lines import PartialLine, PartialWriter, start_line

    class CtrlCThenRelay(PartialWriter):
        sent = False

        def write(self, line: PartialLine, *, sync: bool = True) -> None:
            super().write(line, sync=sync)
            if not self.sent:
                self.sent = True
                os.kill(os.getpid(), signal.SIGINT)  # real signals: each handler runs at the next bytecode
                os.kill(os.getpid(), signal.SIGTERM)

    previous = {s: signal.getsignal(s) for s in in_flight.STOP_SIGNALS}
    try:
        with pytest.raises(KeyboardInterrupt):
            with in_flight.stop_signals(), CtrlCThenRelay(tmp_path / "unit.partial.jsonl") as w:
                in_flight.begin(w, 1)
                in_flight.write(w, start_line("cfg", 1, alone=True), started="cfg")
        assert in_flight.stop_signal() == signal.SIGINT
        assert {"abandon": "cfg", "attempt": 1} in [json.loads(s) for s in w.path.read_text().splitlines()]
    finally:
        in_flight.end()
        with in_flight.stop_signals():  # forgets the stop
            pass
        for s, h in previous.items():
            signal.signal(s, h)


def test_a_process_running_a_sweeps_units_in_turn_makes_a_shapes_inputs_once(
    write_spec: WriteSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole-node task's worker runs its GPU's units one after another: the second unit of the
    same shape times against the inputs and reference the first one made."""
    made = _count_shapes_made(monkeypatch)
    spec = write_spec("two.json", modes=["fwd"], sharding={"units": 2})
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / "two"), None, None)
    assert len(unit_ids) == 2 and len({it.shape for u in unit_ids for it in sd.unit_items(u)}) == 1
    for unit in unit_ids:
        assert worker.run_unit(str(sd.root), unit)["errors"] == 0
    assert len(made) == 1


def test_an_error_with_no_message_says_where_it_was_raised_and_the_line_there(tmp_path: Path) -> None:
    """A library's bare ``assert`` (tokamax's stage limit) raises an AssertionError with no
    text: the record or verdict says the file, line and condition, not "AssertionError" alone."""
    import importlib.util

    from jobs.measure import error_string

    lib = tmp_path / "somelib.py"  # a library's module (pytest rewrites the asserts of tests, not of it)
    lib.write_text("def stages(n):\n    assert n + 2 <= 16\n")
    found = importlib.util.spec_from_file_location("somelib", lib)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    try:
        module.stages(99)
    except AssertionError as exc:
        said = error_string(exc)
    assert said == "AssertionError: at somelib.py:2: assert n + 2 <= 16", said
    assert error_string(ValueError("boom")) == "ValueError: boom"
