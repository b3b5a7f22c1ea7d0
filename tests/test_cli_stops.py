"""What a stop (Ctrl-C, SIGTERM) of a command does where it is hardest to take: while the
command's modules load, where Python would drop the KeyboardInterrupt (a ``__del__``, the hook
that takes it again, code run from a string), while it blocks opening its input, and after
its last line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import LAUNCH, REPO, assert_one_line_error, run_cli


@pytest.mark.parametrize("loaded", ["argparse", "pydantic", "orchestrator.spec.records"])
def test_ctrl_c_while_the_command_loads_is_one_line(tmp_path: Path, loaded: str) -> None:
    """Ctrl-C once the interpreter has imported ``loaded`` (Python says so on stderr with
    PYTHONPROFILEIMPORTTIME), while the command's modules are still loading. The command ends
    with exit code 130, also where the interrupt landed in code run from a string (below)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "ls", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == loaded:
            break
    else:
        pytest.fail(f"{loaded} was never imported:\n{''.join(seen[-5:])}")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 130 and "Traceback" not in err, err
    # also before the parser has read the command line: `ls` changes nothing
    assert said == [STOPPED_LS], said


STOPPED_LS = "tilesweep: interrupted; nothing was changed"


def _run_module(tmp_path: Path, name: str, text: str) -> subprocess.CompletedProcess[str]:
    """``text`` run as ``python -m name`` (the way CPython ends a ``-m`` run is the subject)."""
    (tmp_path / f"{name}.py").write_text(text)
    return subprocess.run(
        [sys.executable, "-m", name],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,
    )


_CTRL_C_IN_EXEC = """
import signal, sys, time
from orchestrator.cli.main import _interrupted
signal.signal(signal.SIGINT, _interrupted)
try:
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nmade = True")
    print("the code run from a string ran to its end", flush=True)
    while True:
        time.sleep(0.01)
except KeyboardInterrupt:
    sys.exit(130)
"""


_CTRL_C_IN_DEL = """
import os, signal, sys, time
from orchestrator.cli.main import _interrupted, _swallowed
signal.signal(signal.SIGINT, _interrupted)
sys.unraisablehook = _swallowed(sys.unraisablehook)
class Doomed:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        print("the __del__ ran to its end", flush=True)
try:
    Doomed()
    print("past the __del__", flush=True)
    while True:
        time.sleep(0.01)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_a_ctrl_c_that_python_would_drop_in_a_del_is_taken_again(tmp_path: Path) -> None:
    """A Ctrl-C whose KeyboardInterrupt is raised where Python only prints and drops it (a
    ``__del__``, a garbage-collector callback such as jax's) still stops the command, silently."""
    r = _run_module(tmp_path, "ctrl_c_in_del", _CTRL_C_IN_DEL)
    assert r.stdout == "past the __del__\n" and r.stderr == "", (r.stdout, r.stderr)
    assert r.returncode == 130


def test_a_ctrl_c_taken_again_that_lands_in_the_hook_itself_still_stops_the_command(tmp_path: Path) -> None:
    """The Ctrl-C taken again may land while the hook that asked for it still runs (a loaded
    machine: the hook's moment passed before it returned); Python would drop it there too."""
    landing_in_the_hook = _CTRL_C_IN_DEL.replace(
        "sys.unraisablehook = ",
        "cli_main = sys.modules['orchestrator.cli.main']\n"
        "later = cli_main._again\n"
        "def at_once(signum=signal.SIGINT):\n"
        "    cli_main._again = later\n"
        "    os.kill(os.getpid(), signum)\n"
        "cli_main._again = at_once\n"
        "sys.unraisablehook = ",
    )
    r = _run_module(tmp_path, "ctrl_c_in_the_hook", landing_in_the_hook)
    assert r.stdout == "past the __del__\n" and r.stderr == "", (r.stdout, r.stderr)
    assert r.returncode == 130


_CTRL_C_WHILE_SBATCH_REFUSES = """
import gc, logging, signal, sys
from orchestrator.cli.main import _interrupted, _swallowed
from orchestrator.control.dispatch.sbatch import held_signals
from orchestrator.errors import DispatchError
signal.signal(signal.SIGINT, _interrupted)
sys.unraisablehook = _swallowed(sys.unraisablehook)
class Cycle:
    def __init__(self):
        self.me = self
    def __del__(self):
        pass
class CollectionDue(logging.Handler):
    def emit(self, record):
        if "came while sbatch ran" in record.getMessage():  # its last word before it delivers the stop
            gc.set_threshold(1)
            for _ in range(10):
                Cycle()
logging.getLogger("orchestrator.control.dispatch.sbatch").addHandler(CollectionDue())
try:
    with held_signals():
        signal.raise_signal(signal.SIGINT)
        raise DispatchError("sbatch refused the job")
except KeyboardInterrupt:
    sys.exit(130)
except DispatchError:
    for taken in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # as the command ends: a stop now stops nothing
        signal.signal(taken, signal.SIG_IGN)
    print("ended on the refusal", flush=True)
    sys.exit(2)
"""


def test_a_ctrl_c_held_while_sbatch_ran_wins_over_its_refusal_when_a_collection_is_due(tmp_path: Path) -> None:
    """A Ctrl-C held while sbatch ran, which then refused: the stop is delivered over the refusal
    (exit 130), also where a garbage collection is due just then, whose finalizers' code would
    have taken a signal raised again (Python runs the collection first) and lost the stop."""
    r = _run_module(tmp_path, "ctrl_c_while_sbatch_refuses", _CTRL_C_WHILE_SBATCH_REFUSES)
    assert r.returncode == 130 and r.stdout == "", (r.returncode, r.stdout, r.stderr)


def test_a_ctrl_c_in_code_run_from_a_string_is_taken_after_it_and_the_exit_code_is_130(tmp_path: Path) -> None:
    """A Ctrl-C that lands in code ``exec`` runs from text (a dataclass's methods being made while
    a module loads) is taken once that code has ended: CPython ends a ``python -m`` process
    by SIGINT, whatever its exit code, where a KeyboardInterrupt left such code."""
    r = _run_module(tmp_path, "ctrl_c_in_exec", _CTRL_C_IN_EXEC)
    assert r.stdout == "the code run from a string ran to its end\n" and r.stderr == "", r.stderr
    assert r.returncode == 130


_CTRL_C_IN_EXEC_THEN_REFUSED = """
import argparse, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal: a test runner's worker ignores it
import orchestrator.cli.main
from orchestrator.errors import SpecError
cli_main = sys.modules["orchestrator.cli.main"]  # the package's name ``main`` is the function
def command(args):
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)")  # the stop lands in code run from text
    raise SpecError("spec.json: refused right after the stop")  # before the stop is taken again
class Parser(argparse.ArgumentParser):
    def parse_args(self, argv=None, namespace=None):
        return argparse.Namespace(command="spec", func=command, verbose=0)
cli_main.build_parser = lambda: Parser()
sys.exit(cli_main.main())
"""


def test_a_ctrl_c_taken_again_wins_over_an_error_that_came_before_it_was(tmp_path: Path) -> None:
    """A Ctrl-C that landed where it could not be raised (code run from text) is sent again a
    moment later; a command that ends on an error in that moment ends stopped all the same
    (exit 130, the stop's one line), not on the error as if no stop had come."""
    r = _run_module(tmp_path, "ctrl_c_then_refused", _CTRL_C_IN_EXEC_THEN_REFUSED)
    assert r.returncode == 130, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("tilesweep: interrupted; ") and len(r.stderr.splitlines()) == 1, r.stderr


def test_ctrl_c_of_a_command_that_measures_nothing_says_nothing_was_changed(tmp_path: Path) -> None:
    """``report`` blocked opening its input (a named pipe nobody writes): a Ctrl-C then says the
    command changed nothing, not that records are kept."""
    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    assert _ctrl_c_while_it_opens(fifo, "report", str(fifo)) == [STOPPED_LS]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--dry-run"], "nothing was written"),
        (["--sweep-dir", "{sweep}"], "nothing was measured; rerun it to finish the sweep directory"),
        (
            ["--lower", "--sweep-dir", "{sweep}"],
            "nothing was lowered; rerun it to finish the sweep directory and lower its configs",
        ),
        (["--lower", "--dry-run"], "nothing was written"),
    ],
)
def test_ctrl_c_of_plan_says_what_a_plan_leaves(tmp_path: Path, args: list[str], said: str) -> None:
    """``plan`` measures nothing: a Ctrl-C (here while it opens its spec, a pipe) says what it
    leaves, not that finished records are kept."""
    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)
    given = [a.format(sweep=tmp_path / "sweep") for a in args]
    assert _ctrl_c_while_it_opens(fifo, "plan", str(fifo), *given) == [f"tilesweep: interrupted; {said}"]


def _ctrl_c_while_it_opens(fifo: Path, *args: str) -> list[str]:
    """The lines on stderr of the CLI with ``args``, sent Ctrl-C once it blocks opening ``fifo``
    (a named pipe nobody writes); it must end with 130."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wchan = Path(f"/proc/{proc.pid}/wchan")
    deadline = time.monotonic() + 120
    while not (wchan.exists() and wchan.read_text() in ("fifo_open", "wait_for_partner")):  # blocked opening it
        if proc.poll() is not None or time.monotonic() > deadline or not Path("/proc/self/wchan").exists():
            proc.kill()
            pytest.skip("cannot see the command block on the pipe here (no /proc wchan)")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    return err.splitlines()


def test_a_stop_after_the_command_has_finished_changes_nothing_it_said(tmp_path: Path) -> None:
    """Ctrl-C in the last moments of a command, after its last line, while the interpreter
    shuts down: the command ends as it would have, not killed without a word."""
    script = tmp_path / "late_stop.py"
    script.write_text(
        "import os, signal, sys\n"
        "sys.argv = ['tilesweep', 'impls']\n"
        "from orchestrator.cli.main import main\n"
        "code = main()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", (done.returncode, done.stderr)
    assert "tilesweep" in done.stdout


def test_ctrl_c_of_submit_before_sbatch_took_anything_says_nothing_was_submitted(tmp_path: Path) -> None:
    """A stop of ``submit`` while it reads its spec (a pipe): it says nothing was submitted, not
    that what sbatch accepted runs on (nothing was)."""
    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)
    said = _ctrl_c_while_it_opens(fifo, "submit", str(fifo), "--sweep-dir", str(tmp_path / "sweep"))
    assert said == ["tilesweep: interrupted; nothing was submitted"]


def test_status_and_ls_of_a_plan_cut_short_before_its_sweep_file_say_so_and_the_command_finishes_it(
    tmp_path: Path, write_spec: Any
) -> None:
    """A Ctrl-C of ``run`` while it writes a new sweep directory, after its folders and empty
    unit index and before ``sweep.json`` (which it writes last): ``status`` says the plan was
    interrupted and names the command that finishes it, ``ls`` lists it saying the same (and not a
    folder that merely holds an empty ``logs``), and that command finishes it."""
    spec, sweeps = write_spec(), tmp_path / "sweeps"
    sweep = sweeps / "sweep"
    for folder in ("units", "partials", "done", "logs"):
        (sweep / folder).mkdir(parents=True)
    (sweep / "units.json").write_text("[]\n")
    (sweeps / "other" / "logs").mkdir(parents=True)
    said = assert_one_line_error(run_cli("status", str(sweep)), str(sweep), "interrupted before it was written whole")
    assert f"tilesweep run SPEC --sweep-dir {sweep}" in said and "not a sweep directory" not in said, said
    listed = run_cli("ls", str(sweeps))
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 1, listed
    assert listed.stdout.startswith(f"{sweep}  a plan cut short before it was written whole (no sweep.json yet)")
    assert f"`tilesweep run SPEC --sweep-dir {sweep}` (or `tilesweep plan` or" in listed.stdout, listed.stdout
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    after = run_cli("status", str(sweep))
    assert f"{sweep}: 0/" in after.stdout and "pending" in after.stdout and not after.stderr, after
    listed = run_cli("ls", str(sweeps))
    assert listed.stdout.startswith(f"{sweep}  ") and "0/" in listed.stdout and "cut short" not in listed.stdout


def test_status_and_ls_of_a_plan_cut_short_before_its_units_say_so_and_the_command_finishes_it(
    tmp_path: Path, write_spec: Any
) -> None:
    """A Ctrl-C of ``plan`` after it wrote ``sweep.json`` and before it wrote its units (the empty
    unit index it writes first, no unit file): ``status`` says the plan was cut short and names the
    command that finishes it, with the spec file its sweep.json names (exit code 1: the sweep waits
    for that command), ``ls`` says the same, and that command plans it, saying so."""
    spec, sweeps = write_spec(), tmp_path / "sweeps"
    sweep = sweeps / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    (sweep / "units.json").write_text("[]")
    for unit in (sweep / "units").iterdir():
        unit.unlink()
    finish = f"`tilesweep run {spec} --sweep-dir {sweep}` (or `tilesweep plan` or `tilesweep submit` with that"
    said = run_cli("status", str(sweep))
    lines = said.stdout.splitlines()
    assert said.returncode == 1 and not said.stderr, said
    assert lines[0].endswith("a plan cut short before its units were written (units.json is empty)"), lines
    assert lines[-1].startswith(f"to finish the plan, run the command that started it again: {finish}"), lines
    assert "incomplete" not in said.stdout and "()" not in said.stdout, said.stdout
    assert json.loads(run_cli("status", str(sweep), "--json").stdout)["plan_cut_short"] is True
    listed = run_cli("ls", str(sweeps))
    assert listed.returncode == 0 and listed.stdout.startswith(
        f"{sweep}  a plan cut short before its units were written (units.json is empty); run again, {finish}"
    ), listed.stdout
    planned = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
    assert planned.returncode == 0 and f"planned into {sweep} (1 unit)" in planned.stdout, planned
    assert "planned before" not in planned.stdout, planned.stdout
    after = run_cli("status", str(sweep))
    assert f"{sweep}: 0/" in after.stdout and "pending" in after.stdout and "cut short" not in after.stdout, after
    assert json.loads(run_cli("status", str(sweep), "--json").stdout)["plan_cut_short"] is False
