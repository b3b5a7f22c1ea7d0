"""``tilesweep plan --lower --sweep-dir`` run again on one sweep directory: after a run that was
killed, and beside another of the same directory. Each config's verdict is written once, under
one header, and the second command says it waits for the first. A rerun of a larger sweep lowers
only what its workers will measure, not what it reuses. Lowering jax's stock Triton kernel for an
H100 needs no CUDA plugin."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.planning import RUN, expand
from orchestrator.spec.files import load_spec
from orchestrator.store import lowering
from tests.helpers import LAUNCH, REPO, run_cli, second_while_first_stopped, until

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")]

SPEC: dict[str, Any] = {
    "dtypes": ["float16"],
    "head_dims": [64],
    "seq_lens": [256],
    "modes": ["fwd"],
    "batch": 1,
    "heads": 1,
    "kernel": {"impl": "jax", "device_kind": "NVIDIA H100"},
    "grid": {"fwd": {"block_q": [64, 128], "block_k": [64], "num_stages": [2], "num_warps": [4]}},
}


def _spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**SPEC, "output": str(tmp_path / "out.json")}))
    return path


def _lower(spec: Path, sweep: Path) -> list[str]:
    return ["plan", str(spec), "--lower", "--sweep-dir", str(sweep), "--lower-workers", "1"]


def _verdict_lines(sweep: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(headers, verdicts) of the sweep's ``lowering.jsonl``, every whole line."""
    headers: list[dict[str, Any]] = []
    verdicts: list[dict[str, Any]] = []
    for text in (sweep / lowering.FILE).read_text().splitlines():
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            continue
        (headers if "lowering" in obj else verdicts).append(obj)
    return headers, verdicts


def _planned(spec: Path) -> list[str]:
    """The ids of the spec's runnable configs, sorted."""
    return sorted(it.id for it in expand(load_spec(spec)) if it.kind == RUN)


def _started(r: subprocess.CompletedProcess[str]) -> int:
    """How many lowering processes a ``-vv`` command started, as its debug lines say."""
    assert r.returncode == 0, r.stderr
    return len(re.findall(r"^DEBUG jobs\.compile_procs: compile process \d+ started$", r.stderr, re.M))


def test_a_rerun_adds_its_verdicts_under_the_one_header_starting_a_lowering_process_per_config_at_most(
    tmp_path: Path,
) -> None:
    """Killed while it wrote its last verdict: the rerun lowers that config again, on a line of its
    own under the one header. Each lowering process imports jax before its first config: the rerun
    starts one for its one config, however many CPUs there are, and one with nothing to lower
    starts none."""
    spec, sweep = _spec(tmp_path), tmp_path / "sweep"
    lower = [*_lower(spec, sweep)[:-2], "--lower-workers", "2", "-vv"]
    first = run_cli(*lower)
    assert "lowered 3 configs" in first.stdout and _started(first) >= 1, first.stderr
    path = sweep / lowering.FILE
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    again = run_cli(*lower)
    assert "lowered 1 config " in again.stdout and _started(again) == 1, again.stderr
    nothing = run_cli(*lower)
    assert "nothing to lower" in nothing.stdout and _started(nothing) == 0, nothing.stderr
    headers, verdicts = _verdict_lines(sweep)
    assert len(headers) == 1 and headers[0]["device_kind"] == "NVIDIA H100"
    assert sorted(v["id"] for v in verdicts) == _planned(spec)  # each config's verdict once
    found = lowering.read_verdicts(sweep, load_spec(spec).fingerprint(), "NVIDIA H100")
    assert {v.verdict for v in found.values()} == {"lowered"} and len(found) == 3


def _start_lowering(spec: Path, sweep: Path) -> subprocess.Popen[str]:
    """``plan --lower`` of ``sweep`` in its own process group, SIGINT at its default (a terminal's Ctrl-C)."""
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *_lower(spec, sweep)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_ctrl_c_of_a_lowering_says_which_verdicts_it_kept_and_what_a_rerun_lowers(tmp_path: Path) -> None:
    """Ctrl-C once the first verdict is written (the command stopped meanwhile, as Ctrl-Z stops it,
    so it cannot lower every config first): it says how many verdicts it kept and where, and the
    command that lowers only the configs without one, which the rerun does."""
    grid = {"block_q": [16, 32, 64, 128], "block_k": [16, 32, 64, 128], "num_stages": [1], "num_warps": [4]}
    spec, sweep = tmp_path / "spec.json", tmp_path / "sweep"
    spec.write_text(json.dumps({**SPEC, "grid": {"fwd": grid}, "output": str(tmp_path / "out.json")}))
    planned = _planned(spec)
    first = _start_lowering(spec, sweep)
    until(lambda: (sweep / lowering.FILE).exists() and bool(_verdict_lines(sweep)[1]), "a first verdict", first)
    os.killpg(first.pid, signal.SIGSTOP)
    os.killpg(first.pid, signal.SIGINT)
    os.killpg(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=600)
    assert first.returncode == 130 and "Traceback" not in err, err
    kept = len(_verdict_lines(sweep)[1])
    left = len(planned) - kept
    assert 0 < kept < len(planned)
    said = f"the {kept} verdict{'s' if kept != 1 else ''} it wrote {'is' if kept == 1 else 'are'} kept in "
    assert err.splitlines()[-1] == (
        f"tilesweep: interrupted; {said}{sweep / lowering.FILE} (the configs they refuse are pruned); "
        f"`tilesweep plan {spec} --lower --sweep-dir {sweep}` lowers only the {left} configs left without one"
    ), err
    again = run_cli(*_lower(spec, sweep))
    assert again.returncode == 0 and f"lowered {left} configs" in again.stdout, again.stderr
    assert sorted(v["id"] for v in _verdict_lines(sweep)[1]) == planned


def test_ctrl_c_once_every_config_has_its_verdict_says_a_rerun_lowers_nothing(tmp_path: Path) -> None:
    """Ctrl-C after the last verdict, while the command ends (its lowering processes closing, its
    summary held on a standard output nobody reads, a full pipe): it says every config has its
    verdict, kept, and that a rerun lowers nothing, which the rerun does."""
    spec, sweep = _spec(tmp_path), tmp_path / "sweep"
    planned = _planned(spec)
    read, write = os.pipe()
    os.set_blocking(write, False)
    with contextlib.suppress(BlockingIOError):
        while True:  # full: the command's first line on it (its summary) waits for a reader
            os.write(write, b"x" * 4096)
    os.set_blocking(write, True)
    first = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *_lower(spec, sweep)],
        cwd=REPO,
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # each line written as printed, as to a terminal
    )
    os.close(write)
    try:
        until(
            lambda: (sweep / lowering.FILE).exists() and sorted(v["id"] for v in _verdict_lines(sweep)[1]) == planned,
            "every verdict",
            first,
        )
        os.killpg(first.pid, signal.SIGINT)
        _, err = first.communicate(timeout=600)
    finally:
        os.close(read)
    assert first.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"tilesweep: interrupted; the 3 verdicts it wrote are kept in {sweep / lowering.FILE} (the configs they "
        "refuse are pruned); every config to measure has one, so a rerun of plan --lower lowers nothing"
    ), err
    again = run_cli(*_lower(spec, sweep))
    assert again.returncode == 0 and "nothing to lower for NVIDIA H100" in again.stdout, again.stderr
    assert sorted(v["id"] for v in _verdict_lines(sweep)[1]) == planned


def test_a_second_lowering_waits_for_the_first_says_so_on_ctrl_c_and_lowers_nothing_twice(tmp_path: Path) -> None:
    """A second ``plan --lower`` of the sweep waits for the first (stopped, as Ctrl-Z stops it);
    Ctrl-C of the second says it lowered nothing, that the first goes on, and what to run once
    it ends. A third waits for the first as well, then lowers nothing the first lowered."""
    spec, sweep = _spec(tmp_path), tmp_path / "sweep"
    first = _start_lowering(spec, sweep)
    until(lambda: (sweep / "lowering.lease").exists(), "the first lowering holds the sweep's lowering lease", first)
    os.killpg(first.pid, signal.SIGSTOP)
    try:
        second = _start_lowering(spec, sweep)
        assert second.stderr is not None
        seen: list[str] = []
        while "waiting for the other `plan --lower`" not in (line := second.stderr.readline()):
            assert line, "".join(seen)  # it ended without saying it waits
            seen.append(line)
        os.killpg(second.pid, signal.SIGINT)
        _, err = second.communicate(timeout=600)
        assert second.returncode == 130 and "Traceback" not in err, err
        assert err.splitlines() == [
            f"tilesweep: interrupted; nothing was lowered here, and the other `plan --lower` of {sweep} goes on; once "
            f"it ends, `tilesweep plan {spec} --lower --sweep-dir {sweep}` lowers only the configs it left without a "
            "verdict"
        ], err
    except BaseException:  # the first continued, never left stopped
        os.killpg(first.pid, signal.SIGCONT)
        raise
    third = second_while_first_stopped(  # continues the first once the third says it waits
        first, [sys.executable, "-m", "orchestrator", *_lower(spec, sweep)], "waiting for the other `plan --lower`"
    )
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0 and "lowered 3 configs" in out, err
    assert third.returncode == 0, third.stderr
    (said,) = [line for line in third.stderr.splitlines() if "waiting" in line]
    assert f"pid {first.pid} " in said and str(sweep) in said and "without a verdict" in said
    assert "nothing to lower" in third.stdout and "lowered before" in third.stdout
    headers, verdicts = _verdict_lines(sweep)
    assert len(headers) == 1 and sorted(v["id"] for v in verdicts) == _planned(spec)


def test_configs_the_output_document_holds_are_reused_not_lowered_and_the_summary_says_how_many(
    tmp_path: Path,
) -> None:
    """A sweep whose output document holds an earlier, smaller sweep's records carries those
    configs, never measured: ``plan --lower`` (and its dry run) lowers only the configs added
    since, and says how many it left out as reused."""
    kernel = {**SPEC["kernel"], "interpret": True}  # the earlier sweep runs here, in interpret mode
    out, small, spec = tmp_path / "out.json", tmp_path / "small.json", tmp_path / "spec.json"
    small.write_text(json.dumps({**SPEC, "kernel": kernel, "output": str(out)}))
    ran = run_cli("run", str(small), "--sweep-dir", str(tmp_path / "small"))
    assert ran.returncode == 0 and len(json.loads(out.read_text())["results"]) == 3, ran.stderr
    grid = {**SPEC["grid"]["fwd"], "block_k": [64, 128]}
    spec.write_text(json.dumps({**SPEC, "kernel": kernel, "grid": {"fwd": grid}, "output": str(out)}))
    added = sorted(
        it.id for it in expand(load_spec(spec)) if it.kind == RUN and (it.fields() or {}).get("block_k") == 128
    )
    said = "; 3 reused from earlier documents, not lowered (carried into the results, never measured)"
    dry = run_cli("plan", str(spec), "--lower", "--dry-run", "--lower-workers", "1")
    assert dry.returncode == 0 and "lowered 2 configs " in dry.stdout and said in dry.stdout, dry.stderr
    sweep = tmp_path / "sweep"
    r = run_cli(*_lower(spec, sweep))
    assert r.returncode == 0 and "lowered 2 configs " in r.stdout and said in r.stdout, r.stderr
    kept = run_cli("plan", str(spec), "--dry-run", "--sweep-dir", str(sweep)).stdout  # its reuse unit: 3 items
    assert re.search(r"^  unit +\d+ \w+: +3 items +\(reuse\)$", kept, re.MULTILINE), kept
    assert sorted(v["id"] for v in _verdict_lines(sweep)[1]) == added
    again = run_cli(*_lower(spec, sweep))
    assert again.returncode == 0 and "nothing to lower for NVIDIA H100: 2 planned configs" in again.stdout
    assert said in again.stdout and sorted(v["id"] for v in _verdict_lines(sweep)[1]) == added


def test_screens_a_halving_sweep_carries_are_lowered_as_its_round_2_may_time_them_in_full(tmp_path: Path) -> None:
    """A halving sweep carries an earlier one's screens as its own round 1, and its round 2 may
    time any of them in full: ``plan --lower`` lowers them with the configs added since, and
    leaves out only the records carried for good (the full ones)."""
    kernel = {**SPEC["kernel"], "interpret": True}
    grid = {**SPEC["grid"]["fwd"], "block_q": [16, 32, 64, 128]}
    # screens of 40 ms (not target_ms / 10 = 5 ms: a few calls of the fastest config, which one
    # time slice lost to a loaded machine can make look as slow as the slowest): the screens rank
    # the configs by their cost (block_q 16 takes ~6x as long as 128 here), so some are dropped
    halving = {"strategy": "halving", "keep": 1, "screen_ms": 40}
    data = {**SPEC, "kernel": kernel, "timing": halving, "output": str(tmp_path / "out.json")}
    small, spec = tmp_path / "small.json", tmp_path / "spec.json"
    small.write_text(json.dumps({**data, "grid": {"fwd": grid}}))
    ran = run_cli("run", str(small), "--sweep-dir", str(tmp_path / "small"))
    assert ran.returncode == 0, ran.stderr
    measured = json.loads((tmp_path / "out.json").read_text())["results"]
    full = {_tiles(r["config"], r) for r in measured if not r.get("screened")}
    assert len(measured) == 5 and 2 <= len(full) < 5  # auto and the survivors in full, the rest screens
    spec.write_text(json.dumps({**data, "grid": {"fwd": {**grid, "block_k": [64, 128]}}}))
    planned = [it for it in expand(load_spec(spec)) if it.kind == RUN]
    lowered = sorted(it.id for it in planned if _tiles(it.config, it.fields() or {}) not in full)
    said = f"; {len(full)} reused from earlier documents, not lowered (carried into the results, never measured)"
    sweep = tmp_path / "sweep"
    r = run_cli(*_lower(spec, sweep))
    assert r.returncode == 0 and f"lowered {len(lowered)} configs " in r.stdout and said in r.stdout, r.stderr
    assert len(lowered) == len(planned) - len(full)
    assert sorted(v["id"] for v in _verdict_lines(sweep)[1]) == lowered


def _tiles(config: str, fields: dict[str, Any]) -> tuple[Any, ...]:
    """A fwd config as a record or a plan's item names it: auto or forced, and its tiles."""
    return config, fields.get("block_q"), fields.get("block_k")


def test_a_lowering_after_a_partial_run_skips_the_configs_its_workers_recorded_and_says_so(tmp_path: Path) -> None:
    """A sweep that ran in part: ``plan --lower`` lowers only the configs no worker recorded yet (a
    recorded config ran, or was tried, on a GPU) and says in one line how many it skipped and why."""
    kernel = {**SPEC["kernel"], "interpret": True}  # its first unit runs here, in interpret mode
    spec, sweep = tmp_path / "spec.json", tmp_path / "sweep"
    spec.write_text(json.dumps({**SPEC, "kernel": kernel, "output": str(tmp_path / "out.json")}))
    planned = run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "3")
    assert planned.returncode == 0, planned.stderr
    worker = [sys.executable, "-m", "jobs.worker", str(sweep), "0"]
    ran = subprocess.run(worker, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert ran.returncode == 0, ran.stderr
    recorded = {
        obj["id"]
        for path in (sweep / "partials").glob("*.jsonl")
        for obj in map(json.loads, path.read_text().splitlines())
        if "record" in obj
    }
    assert len(recorded) == 1
    r = run_cli(*_lower(spec, sweep))
    assert r.returncode == 0 and "lowered 2 configs " in r.stdout, r.stderr
    (skipped,) = [line for line in r.stdout.splitlines() if "skipped" in line]
    assert skipped.startswith("1 config skipped, not lowered: the sweep's workers recorded it already (measured or")
    assert sorted(v["id"] for v in _verdict_lines(sweep)[1]) == sorted(set(_planned(spec)) - recorded)
    again = run_cli(*_lower(spec, sweep))
    assert again.returncode == 0 and "nothing to lower" in again.stdout and skipped in again.stdout, again.stderr
