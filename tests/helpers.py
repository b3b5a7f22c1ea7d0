"""What several test files share and is not a fixture (those are in conftest.py): the
repository's paths, the tiny spec, replay specs (a sweep that compiles nothing), running the CLI
as a user would, stopping it as Ctrl-Z does, assertions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# The excerpt of the reference run's results document (a copy of shared/seed/, kept with the
# tests so a fresh clone needs nothing beside it).
SAMPLE = REPO / "tests" / "data" / "attention_tiles.sample.json"

# A sweep small enough for tests: one tiny shape, both modes, a few configs, quick timing.
TINY_SPEC: dict[str, Any] = {
    "dtypes": ["float32"],
    "head_dims": [16],
    "seq_lens": [64],
    "modes": ["fwd", "fwd_bwd"],
    "batch": 1,
    "heads": 1,
    "repeats": 2,
    "tag": "test",
    "fwd_block_q": [32, 64],
    "fwd_block_k": [32],
    "fwd_stages": [2],
    "fwd_warps": [4],
    "bwd_outer": [32],
    "bwd_inner": [16, 32],
    "bwd_stages": [2],
    "bwd_warps": [4],
    "timing": {"target_ms": 1, "max_inner": 2, "warmup": 0},
    # interpret mode on purpose: the local SLURM cluster's GPUs are fake, and a GPU task
    # whose jax sees no GPU is otherwise refused
    "kernel": {"interpret": True},
}
# jax's Mosaic GPU kernel (``kernel.impl: mosaic``) at one small shape: float16 d64 s256, fwd and fwd_bwd
MOSAIC_SPEC: dict[str, Any] = {
    "dtypes": ["float16"],
    "head_dims": [64],
    "seq_lens": [256],
    "modes": ["fwd", "fwd_bwd"],
    "batch": 1,
    "heads": 2,
    "kernel": {"impl": "mosaic"},
}
# tokamax's Mosaic op on tokamax's own search (``"grid": "tokamax"``): bf16 d128 s2048, fwd and fwd_bwd
TOKAMAX_SPEC: dict[str, Any] = {
    "dtypes": ["bfloat16"],
    "head_dims": [128],
    "seq_lens": [2048],
    "modes": ["fwd", "fwd_bwd"],
    "batch": 4,
    "heads": 8,
    "grid": "tokamax",
    "kernel": {"impl": "tokamax-mosaic"},
}


# ``python -c LAUNCH ARGS``: the CLI with SIGINT and SIGHUP at their defaults, so that a SIGINT
# to its process group is the Ctrl-C of a terminal and a SIGHUP its closing (a process started in
# the background by a non-interactive shell, as the tests' are, starts with SIGINT ignored, and
# a test worker may run with SIGHUP ignored: Python would never see them)
_EXEC = "os.execv(sys.executable, [sys.executable, '-m', 'orchestrator', *sys.argv[1:]])"
LAUNCH = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    f"signal.signal(signal.SIGHUP, signal.SIG_DFL); {_EXEC}"
)

# SIGINT ignored, as a script's `&` starts a command (no preexec_fn: forking the test process,
# which has jax's threads, to run Python before exec may deadlock)
LAUNCH_IGNORING_SIGINT = LAUNCH.replace("signal.SIGINT, signal.SIG_DFL", "signal.SIGINT, signal.SIG_IGN")
# SIGHUP ignored too, as `nohup ... &` starts a command
LAUNCH_NOHUP = LAUNCH_IGNORING_SIGINT.replace("signal.SIGHUP, signal.SIG_DFL", "signal.SIGHUP, signal.SIG_IGN")
# the CLI with its standard output closed (`>&-`)
LAUNCH_STDOUT_CLOSED = LAUNCH.replace(_EXEC, f"os.close(1); {_EXEC}")


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``python -m orchestrator ARGS`` in a real subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
        env={**os.environ, **(env or {})},
    )


@contextmanager
def stopped(pid: int, *, group: bool = False) -> Iterator[None]:
    """The process ``pid`` (``group``: its process group, as Ctrl-Z stops a command in its shell)
    stopped with SIGSTOP for the block, and continued with SIGCONT after it, whatever happened."""
    signal_it = os.killpg if group else os.kill
    signal_it(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        signal_it(pid, signal.SIGCONT)


def status_while_stopped(
    sweep: Path, pid: int, event: Callable[[], bool], what: str, *, group: bool = False
) -> subprocess.CompletedProcess:
    """``tilesweep status SWEEP``, as from another shell, while ``pid`` (``group``: its process
    group) is ``stopped``, once ``event`` (``what``) has happened; continued after it."""
    with stopped(pid, group=group):
        until(event, what)
        return run_cli("status", str(sweep))


def second_run_follows(first: subprocess.Popen[str], args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``args`` (a second ``tilesweep run`` of the sweep ``first`` runs, which holds its run
    lease already) while ``first`` is stopped (``second_while_first_stopped``), until the second
    says it follows the first."""
    return second_while_first_stopped(first, args, "following its progress")


def second_while_first_stopped(
    first: subprocess.Popen[str], args: list[str], says: str
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` while ``first``'s process group (``start_new_session``) is stopped, as Ctrl-Z
    stops a command in its shell, until the second command's stderr says ``says``; then continue
    ``first``. However fast ``first`` would be, it cannot finish before the second has looked."""
    with stopped(first.pid, group=True):
        second = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert second.stderr is not None
        seen: list[str] = []
        while says not in (line := second.stderr.readline()):
            if not line:  # it ended without saying it
                break
            seen.append(line)
        seen.append(line)
    out, err = second.communicate(timeout=600)
    return subprocess.CompletedProcess(args, second.returncode, out, "".join(seen) + err)


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """A user error as the CLI must report it: exit code 2, exactly one line on stderr, no
    traceback, and the line names each of ``needles``. Returns the line."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def records_written(sweep: Path) -> int:
    """Record lines in a sweep directory's partial files."""
    return sum(p.read_text().count('"record"') for p in (sweep / "partials").glob("*.jsonl"))


def until(event: Callable[[], bool], what: str, proc: subprocess.Popen[str] | None = None) -> None:
    """Wait for ``event`` (polled), failing if ``proc`` ends first or after a guard of minutes."""
    deadline = time.monotonic() + 300
    while not event():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the command ended (exit {proc.returncode}) before {what}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"no {what} within 300 s"
        time.sleep(0.05)


def start_run(
    spec: Path, sweep: Path, *extra: str, command: str = "run", sigint_ignored: bool = False, nohup: bool = False
) -> subprocess.Popen[str]:
    """``tilesweep run SPEC --sweep-dir SWEEP`` (or another ``command`` of the sweep directory
    alone, ``spec`` then unused) in its own process group with SIGINT at its default, as at a
    terminal (``sigint_ignored``: ignored, as a script's ``&`` starts it; ``nohup``: SIGHUP
    ignored too, as ``nohup ... &`` starts it)."""
    args = ["run", str(spec), "--sweep-dir", str(sweep)] if command == "run" else [command, str(sweep)]
    launch = LAUNCH_NOHUP if nohup else LAUNCH_IGNORING_SIGINT if sigint_ignored else LAUNCH
    return subprocess.Popen(
        [sys.executable, "-c", launch, *args, *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def ctrl_c_after_first_record(spec: Path, sweep: Path) -> tuple[int, str]:
    """Run ``spec`` in ``sweep`` and press Ctrl-C once a record is written: the run's pid and
    stderr, once it ended with 130 and no traceback."""
    run = start_run(spec, sweep)
    until(lambda: records_written(sweep) >= 1, "a first record", run)
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130 and "Traceback" not in err, err
    return run.pid, err


def scheduler_view(**states: Any) -> Any:
    """A scheduler's answer built by hand, squeue and sacct both asked: ``j36_5=TaskState(...)``
    is what they say of task 36_5."""
    from orchestrator.control.scheduler import SchedulerView

    return SchedulerView(
        {k.replace("j", "", 1): v for k, v in states.items()}, asked=True, squeue_ok=True, sacct_ok=True
    )


def replay_spec(
    path: Path,
    grid: Mapping[str, Any],
    source: Path,
    output: Path,
    /,
    *,
    replay: Mapping[str, Any] | None = None,
    kernel: Mapping[str, Any] | None = None,
    **over: Any,
) -> Path:
    """Write at ``path`` a spec of ``grid`` that replays the results document ``source``
    (``kernel.impl: replay``: its workers compile and time nothing, and take moments), its own
    results document ``output``. ``replay``, ``kernel``: fields added to those sections (a pace,
    the source's impl, prune_smem); ``over``: fields on top of all (an ``output`` there wins)."""
    data = {
        **grid,
        "output": str(output),
        "kernel": {"impl": "replay", **(kernel or {})},
        "replay": {"source": str(source), **(replay or {})},
        **over,
    }
    path.write_text(json.dumps(data))
    return path


def synthetic_source(
    path: Path, grid: Mapping[str, Any], fields: Callable[[int], Mapping[str, Any]] | None = None
) -> Path:
    """Write at ``path`` a made-up results document of every item of ``grid``, a replay's source
    (a real run of ``grid`` would cost its compiles); ``fields(k)``: what the k-th record has in
    place of the made-up values."""
    from orchestrator.store import synthetic

    doc = synthetic.document({"output": str(path), **grid})
    for k, rec in enumerate(doc["results"]):
        rec.update(fields(k) if fields else {})
    path.write_text(json.dumps(doc))
    return path


def fwd_replay_spec(folder: Path, **over: Any) -> Path:
    """In ``folder``: a spec of the three fwd items of ``TINY_SPEC`` (``spec.json``, its results
    ``r.json``) replayed from a made-up document of them (``source.json``), ``over`` on top."""
    fwd = {**TINY_SPEC, "modes": ["fwd"]}
    source = synthetic_source(folder / "source.json", fwd)
    return replay_spec(folder / "spec.json", fwd, source, folder / "r.json", **over)


def replay_specs(tmp_path: Path, seconds: Callable[[int], float], kind: str) -> dict[str, Path]:
    """A replay of three fwd configs of ``TINY_SPEC`` (a synthetic source document written in
    ``tmp_path``) as two spec files, one per pace ("real", "instant"), run by the ``kind``
    executor; ``seconds(k)``: the k-th record's compile seconds, which the real pace waits out
    before it writes that record."""
    grid = {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [16, 32]}
    source = synthetic_source(tmp_path / "source.json", grid, lambda k: {"compile_s": seconds(k)})
    out, specs = tmp_path / "out.json", {}
    for pace in ("real", "instant"):
        specs[pace] = replay_spec(
            tmp_path / f"{pace}.json", grid, source, out, replay={"pace": pace}, executor={"kind": kind}
        )
    return specs


# the excerpt's (``SAMPLE``'s) one problem shape at seq 2048, bf16 d64: with its fwd and fwd_bwd configs, 104 items
EXCERPT_BF16_D64: dict[str, Any] = {"dtypes": ["bfloat16"], "head_dims": [64], "seq_lens": [2048]}


def sample_config() -> dict[str, Any]:
    """The excerpt's config block: the spec of the sweep it holds records of."""
    config: dict[str, Any] = json.loads(SAMPLE.read_text())["config"]
    return config


def sample_replay_spec(path: Path, output: Path, /, **over: Any) -> Path:
    """Write at ``path`` a spec that replays the excerpt (``SAMPLE``: its config, its records)
    in this process's debug executor, its results document ``output``, ``over`` on top."""
    return replay_spec(path, sample_config(), SAMPLE, output, **{"executor": {"kind": "debug"}, **over})


def contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """WCAG 2's contrast ratio of two sRGB colours (0-255 each): 1 (none) to 21 (black on white);
    small text needs 4.5 at least. Written here from the standard, apart from the page's own rule,
    so a test checks that rule rather than repeating it."""

    def luminance(rgb: tuple[int, int, int]) -> float:
        lin = [c / 255 / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
