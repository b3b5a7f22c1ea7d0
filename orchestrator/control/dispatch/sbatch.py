"""Calling sbatch through submitit: bounded in time, never half-undone, shown without a call.

- **Bounded.** submitit runs sbatch without a timeout, and sbatch retries for about two
  minutes when the controller's job table is full (docs/slurm-notes.md, surprise 6). While
  tilesweep submits, submitit's hook for the command that submits a script
  (``SlurmExecutor._make_submission_command``, which its array path calls on a copy of the
  executor, so the class is patched, for the duration of the call only) returns
  ``timeout --kill-after=5 T sbatch SCRIPT``. That command starts in a process group of its own,
  set before it is executed (``_own_process_group``), so a Ctrl-C at the terminal reaches
  neither it nor sbatch half-way: ``timeout`` would move itself there only once started.
- **Never half-undone.** SIGINT, SIGTERM and SIGHUP that arrive between the call of sbatch
  and the moment its jobs are recorded in ``jobs.jsonl`` are held and delivered once the
  jobs are recorded (``held_signals``): an accepted array is always recorded, and the stop,
  delivered by calling its handler (``_deliver``), wins over a refusal sbatch answered meanwhile.
- **Refused in one line.** sbatch's own words and the spec field they point at
  (``submission_error``), and none of submitit's temp files left behind (``sbatch_call``).
- **Shown, not submitted.** ``render_script`` is the text submitit writes for an array of
  ``n`` tasks, made by submitit itself, without writing a file or calling sbatch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import submitit

from kernels.spelling import as_json
from orchestrator import PROG
from orchestrator.control.scheduler import one_line
from orchestrator.errors import DispatchError
from orchestrator.spec.executor_section import ExecutorSettings

log = logging.getLogger(__name__)

_TEMP_LITTER = re.compile(r"(\.submission_file_[0-9a-f]{32}\.sh|[0-9a-f]{32}\.pkl)")
_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KILL_AFTER_S = 5
_TIMED_OUT = (124, 137)  # timeout(1): the command timed out; killed after --kill-after


_holding: list[bool] = []  # a held_signals block is running (in the main thread)


@contextlib.contextmanager
def held_signals(accepted: Callable[[], str] | None = None) -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP for the block, then deliver each one that came, once it
    is logged with what sbatch accepted (``accepted()``: the jobs, in words); the first is said
    as it comes, with why the stop waits. A block inside another holds nothing more (the outer
    one delivers them, once, at its end)."""
    if threading.current_thread() is not threading.main_thread() or _holding:
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        if not caught:  # said at once: an sbatch that does not answer is waited for up to its bound
            log.warning(
                "%s: stopping once sbatch answers (executor.sbatch_timeout_s bounds the wait), so that a job it "
                "accepts is recorded, not lost",
                signal.Signals(signum).name,
            )
        caught.append(signum)

    previous = {s: signal.signal(s, hold) for s in _HELD}
    _holding.append(True)
    try:
        yield
    finally:
        _holding.pop()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught:
            said = accepted() if accepted is not None else "the jobs it accepted are recorded"
            names = " and ".join(signal.Signals(s).name for s in dict.fromkeys(caught))
            log.warning("%s came while sbatch ran; %s", names, said)
        for signum in dict.fromkeys(caught):
            _deliver(signum, previous[signal.Signals(signum)])


def _deliver(signum: int, handler: Any) -> None:
    """A held signal, to the handler the block restored: a Python handler is called here, in this
    frame, so that its stop (the CLI's KeyboardInterrupt) is raised over whatever the block raised
    (sbatch's refusal), never taken elsewhere first: ``signal.raise_signal`` lets Python run a
    garbage collection that is due before the handler, and a finalizer's code would take the signal,
    where a KeyboardInterrupt has no place to go (``cli.main`` sends it again, too late: the refusal
    ended the command). The default action is the kernel's; an ignored signal stays ignored."""
    if callable(handler):
        handler(signum, sys._getframe())
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


class _OwnGroupSubprocess:
    """The ``subprocess`` module as submitit's command runner sees it in ``_own_process_group``:
    its ``Popen`` starts each command in a process group of its own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:  # noqa: N802 - subprocess's name
        return subprocess.Popen(*args, process_group=0, **kwargs)


@contextlib.contextmanager
def _own_process_group() -> Iterator[None]:
    """The commands submitit runs in the block (sbatch) start in a process group of their own,
    set between fork and exec: a Ctrl-C sent to the terminal's group never reaches them, not
    even in the moment before a program could move itself (``timeout`` does, once started)."""
    utils = submitit.core.utils
    original = utils.subprocess
    utils.subprocess = _OwnGroupSubprocess()  # type: ignore[assignment]
    try:
        yield
    finally:
        utils.subprocess = original


@contextlib.contextmanager
def bounded_sbatch(timeout_s: float) -> Iterator[None]:
    """submitit's sbatch calls in the block give up after ``timeout_s``, each in a process group
    of its own (see the module docstring)."""
    tool = shutil.which("timeout")
    if tool is None:
        log.warning("`timeout` (coreutils) is not on PATH: sbatch runs without a time bound")
        with _own_process_group():
            yield
        return
    cls = submitit.SlurmExecutor
    original = cls.__dict__["_make_submission_command"]

    def command(self: Any, submission_file_path: Path) -> list[str]:
        return [tool, f"--kill-after={KILL_AFTER_S}", f"{timeout_s:g}", *original(self, submission_file_path)]

    # submitit has no hook for the sbatch command line: its method is replaced for the block
    cls._make_submission_command = command  # type: ignore[method-assign]
    try:
        with _own_process_group():
            yield
    finally:
        cls._make_submission_command = original  # type: ignore[method-assign]


def _litter(folder: Path) -> set[str]:
    try:
        return {p.name for p in folder.iterdir() if _TEMP_LITTER.fullmatch(p.name)}
    except FileNotFoundError:
        return set()


@contextlib.contextmanager
def sbatch_call(folder: Path, timeout_s: float, asked: ExecutorSettings | None = None) -> Iterator[None]:
    """One bounded sbatch call of submitit: a failure becomes a one-line DispatchError with
    sbatch's own message (and, for the units' arrays, ``asked``, the spec field its words point
    at), submitit's copy of sbatch's stderr is swallowed, and the temp files a failed submission
    leaves in the folder are removed."""
    before = _litter(folder)
    swallowed = io.StringIO()
    try:
        with contextlib.redirect_stderr(swallowed), bounded_sbatch(timeout_s):
            yield
    except Exception as exc:
        for name in _litter(folder) - before:
            with contextlib.suppress(OSError):
                (folder / name).unlink()
        raise submission_error(exc, swallowed.getvalue(), timeout_s, asked) from None


def submission_error(
    exc: Exception, stderr: str, timeout_s: float, asked: ExecutorSettings | None = None
) -> DispatchError:
    """sbatch's refusal in one line. Its command is not shown: the script it names is a temp file
    of submitit's, removed with the refusal (`tilesweep submit SPEC --dry-run` shows the script)."""
    cause = exc.__cause__
    if isinstance(cause, subprocess.CalledProcessError):  # submitit's FailedJobError from sbatch
        if cause.returncode in _TIMED_OUT and isinstance(cause.cmd, list) and "timeout" in str(cause.cmd[0]):
            return DispatchError(
                f"sbatch did not answer within {timeout_s:g} s (the controller is busy, or its job table is full: "
                "`scontrol show config | grep MaxJobCount`); gave up; check `squeue --me` before submitting again, "
                "or raise executor.sbatch_timeout_s"
            )
        said = _sbatch_words(cause.stderr or str(exc) or stderr) or f"exit {cause.returncode}"
        if asked is None:
            return DispatchError(f"sbatch refused the job: {said}")
        fix = _field_of(said, asked) or (
            f"the spec's executor section sets its options (`{PROG} submit SPEC --dry-run` shows its sbatch script)"
        )
        return DispatchError(f"sbatch refused the job: {said}; {fix}")
    if isinstance(exc, FileNotFoundError):
        return DispatchError(
            f"cannot run sbatch ({exc.filename or 'sbatch'}: {exc.strerror}); is SLURM installed here?"
        )
    return DispatchError(f"submitting to SLURM failed: {type(exc).__name__}: {one_line(exc) or one_line(stderr)}")


def _field_of(said: str, asked: ExecutorSettings) -> str | None:
    """The spec fields that sbatch's words for a refusal of the units' arrays point at, and what
    to do (``node_choice`` and ``partitions`` refuse what they can read before sbatch)."""
    if "Invalid feature specification" in said and asked.slurm_constraint:
        return (
            f"executor.slurm_constraint {as_json(asked.slurm_constraint)} names a feature the cluster's nodes lack: "
            "name features that `sinfo -N -o '%P %N %f'` lists, or leave slurm_constraint out"
        )
    if "Requested node configuration is not available" in said:
        fields = ("gpus_per_node", "cpus_per_task", "mem_gb", "slurm_constraint", "slurm_exclude")
        given = [
            f"{f} {as_json(v)}" if isinstance(v, str) else f"{f} {v:g}" for f in fields if (v := getattr(asked, f))
        ]
        if asked.slurm_additional_parameters:
            given.append("slurm_additional_parameters")
        partition = f"partition {asked.slurm_partition}" if asked.slurm_partition else "the default partition"
        return (
            f"no node of {partition} takes a task as the spec asks ({', '.join(given) or 'its defaults'}): change "
            "those in its executor section, or name a partition whose nodes meet them in executor.slurm_partition "
            "(`sinfo -N -o '%P %N %G %c %m %f'` lists them)"
        )
    return None


_HELP_HINT = re.compile(r'^Try "sbatch --help" for more information\.?$')


def _sbatch_words(stderr: object) -> str:
    """sbatch's refusal in one line, without the hint to its ``--help`` that follows an option it
    does not know (the message says what to do instead)."""
    return one_line("\n".join(line for line in str(stderr).splitlines() if not _HELP_HINT.match(line.strip())))


_UNKNOWN_OPTION = re.compile(r"unrecognized option '--([^=' ]+)")


def test_only(script: str, asked: ExecutorSettings) -> str | None:
    """sbatch's refusal of ``script`` (one line, with the spec field its words point at), where it
    refuses it: ``sbatch --test-only`` parses every option as a submission does and asks the
    controller whether the job could run, submitting nothing. None where it takes it, or does not
    answer within ``executor.sbatch_timeout_s`` (a dry run then shows the script unchecked)."""
    try:
        done = subprocess.run(
            ["sbatch", "--test-only"], input=script, capture_output=True, text=True, timeout=asked.sbatch_timeout_s
        )
    except subprocess.TimeoutExpired:
        log.warning("sbatch --test-only did not answer within %g s: the script is not checked", asked.sbatch_timeout_s)
        return None
    if done.returncode == 0:
        return None
    said = _sbatch_words(done.stderr) or f"exit {done.returncode}"
    fix = _option_of(said, asked) or _field_of(said, asked) or "the spec's executor section sets its options"
    return f"sbatch refuses the job: {said}; {fix}"


def _option_of(said: str, asked: ExecutorSettings) -> str | None:
    """The key of ``slurm_additional_parameters`` that names an option sbatch does not know, and
    what to do."""
    found = _UNKNOWN_OPTION.search(said)
    if found is None:
        return None
    option = found.group(1)
    key = next((k for k in asked.slurm_additional_parameters if k.replace("_", "-") == option), None)
    if key is None:
        return None
    return (
        f"executor.slurm_additional_parameters.{key} is no option of sbatch (`sbatch --help` lists them, as "
        "--NAME; write NAME with _ for -): correct or remove it"
    )


def render_script(executor: Any, n_tasks: int) -> str:
    """The sbatch script submitit would write for ``n_tasks`` calls of ``executor``'s
    ``map_array`` (one call: ``submit``), made the way submitit's array path makes it."""
    inner = executor._executor
    if n_tasks <= 1:
        return str(inner._make_submission_file_text(inner._submitit_command_str, "dry-run"))
    array_ex = submitit.SlurmExecutor(inner.folder, inner.max_num_timeout)
    array_ex.update_parameters(**inner.parameters)
    array_ex.parameters["map_count"] = n_tasks
    return str(array_ex._make_submission_file_text(array_ex._submitit_command_str, "dry-run"))
