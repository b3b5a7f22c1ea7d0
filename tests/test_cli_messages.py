"""What the command line says when its output cannot be written and when a user slips: wrong
spec values, an empty spec file, a device or a spec file where a document or a sweep directory
goes, a unit's log captured whole (what else `logs` says: ``test_logs.py``; a stop while a command
starts: ``test_cli_stops.py``)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.files import spec_from_data
from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import REPO, SAMPLE, assert_one_line_error, run_cli

FULL = Path("/dev/full")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep directory with records, merged (its status is complete: exit 0), and a long log
    for its first unit."""
    root = tmp_path_factory.mktemp("cli") / "sweep"
    sd, units = build_sweep(root, small_spec(), 2)
    assert run_cli("merge", str(root)).returncode == 0
    log = sd.unit_log(units[0].id)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(f"2026-01-01 00:00:00,{k % 1000:03d} jobs.attempt: line {k}\n" for k in range(20000)))
    return root


def _to(cmd: str, sink: str) -> subprocess.CompletedProcess[str]:
    """``tilesweep CMD > /dev/full`` or ``tilesweep CMD | head -1``, the command's own exit status."""
    shell = f"{sys.executable} -m orchestrator {cmd} {sink}; exit ${{PIPESTATUS[0]}}"
    return subprocess.run(shell, shell=True, cwd=REPO, capture_output=True, text=True, executable="/bin/bash")


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full here")
def test_every_command_says_one_line_when_its_output_cannot_be_written_and_lets_a_closed_pipe_go(
    sweep: Path, tmp_path: Path
) -> None:
    commands = [  # one or two of each command family
        f"logs {sweep} 0",
        f"ls {sweep.parent}",
        f"status {sweep} --json",
        f"merge {sweep} --output {tmp_path / 'merged.json'}",
        f"report {SAMPLE}",
    ]
    for cmd in commands:
        full = _to(cmd, "> /dev/full")
        assert_one_line_error(full, "cannot write to standard output: No space left on device")
        head = _to(cmd, "| head -1")
        assert head.returncode == 0 and "Traceback" not in head.stderr, (cmd, head.stderr)


def test_a_run_whose_messages_cannot_be_written_measures_every_config(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """``run 2>&1 | head -1`` (the reader gone after a line) and ``run 2> /dev/full``: the sweep
    runs to its merged document without its progress and messages, as with stdout cut short."""
    for name, sink in (("piped", "2>&1 | head -1"), ("full", "2> /dev/full")):
        spec = write_spec(f"{name}-spec.json", modes=["fwd"], fwd_block_q=[32], output=str(tmp_path / f"{name}.json"))
        r = _to(f"run {spec} --sweep-dir {tmp_path / name}", sink)
        assert r.returncode == 0, (r.stdout, r.stderr)
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        assert len(doc["results"]) == 2, doc["results"]  # the forced config and auto


def test_a_units_log_is_one_stream_header_first(sweep: Path) -> None:
    r = run_cli("logs", str(sweep), "0")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    first, second = r.stdout.splitlines()[:2]
    assert first.startswith("==> ") and first.endswith(".log <==") and second.endswith("jobs.attempt: line 0")


def test_wrong_spec_values_say_what_is_allowed(write_spec: Callable[..., Path]) -> None:
    r = run_cli("plan", str(write_spec(causal="yes")), "--dry-run")
    said = 'field "causal": Input should be a valid list (got "yes"); write a list of true or false'
    assert_one_line_error(r, said)
    cases = {
        "modes": ("fwd", 'write a list of "fwd" or "fwd_bwd", e.g. ["fwd", "fwd_bwd"]'),
        "kv_heads": ("x", "write a list of integers or null"),
        "timing": (5, '"timing": Input should be an object (got 5); write an object (a table in TOML) with any of: '),
        "report": ({"html": "x"}, "write true or false"),
        "kernel": ({"interpret": "maybe"}, 'Input should be "auto", true or false (got "maybe")'),
    }
    for field, (value, needle) in cases.items():
        with pytest.raises(SpecError) as err:
            spec_from_data({field: value}, source="s.json")
        assert needle in err.value.message, err.value.message


def test_a_number_json_cannot_keep_is_refused_and_a_bound_names_the_value(write_spec: Callable[..., Path]) -> None:
    """An integer past 2**53 - 1 would come back from the sweep's files as another number (a
    float, 1e+23): refused where it is written. A bound's message says the value it got."""
    huge = write_spec(timing={"strategy": "search"}, search={"budget": 10**23})
    assert_one_line_error(run_cli("spec", str(huge)), 'field "search.budget": the number is past 9,007,199,254,740,991')
    listed = write_spec(seq_lens=[64, 2**60])
    assert_one_line_error(run_cli("plan", str(listed), "--dry-run"), 'field "seq_lens.1": the number is past')
    zero = write_spec(timing={"strategy": "halving", "screen_ms": 0})
    assert_one_line_error(
        run_cli("spec", str(zero)), 'field "timing.screen_ms": Input should be greater than 0 (got 0)'
    )


def test_a_device_given_as_an_input_is_refused_not_read_without_end(write_spec: Callable[..., Path]) -> None:
    """/dev/zero read as a spec or a document filled the machine's memory until the OOM killer
    came (here each command gets 3 GB of address space, so one that reads it fails instead)."""

    def capped(*args: str) -> subprocess.CompletedProcess[str]:
        command = shlex.join([sys.executable, "-m", "orchestrator", *args])
        return subprocess.run(
            ["bash", "-c", f"ulimit -v {3 << 20} && exec {command}"],  # KiB: 3 GiB
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert_one_line_error(capped("plan", "/dev/zero", "--dry-run"), "spec file /dev/zero is a device, not a file")
    assert_one_line_error(capped("report", "/dev/zero"), "/dev/zero: is a device, not a results document")
    assert_one_line_error(capped("compare", str(SAMPLE), "/dev/urandom"), "/dev/urandom: is a device")
    r = capped("plan", str(write_spec()), "--dry-run", "--reuse", "/dev/zero")
    assert_one_line_error(r, "--reuse /dev/zero: is a device, not a results document")


def test_an_empty_spec_file_is_called_empty(tmp_path: Path) -> None:
    for name in ("empty.json", "blank.toml"):
        path = tmp_path / name
        path.write_text("\n  \n")
        assert_one_line_error(run_cli("plan", str(path), "--dry-run"), f"spec file {path} is empty", "spec --schema")


def test_a_missing_sweep_directory_says_which_commands_make_one(tmp_path: Path) -> None:
    for command in ("merge", "status", "resume"):
        r = run_cli(command, str(tmp_path / "nosuch"))
        assert_one_line_error(
            r, f"sweep directory {tmp_path / 'nosuch'} does not exist", "that `tilesweep run`, `plan` or `submit` made"
        )


def test_a_count_of_one_is_said_in_the_singular(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    r = run_cli("plan", str(write_spec()), "--units", "1", "--sweep-dir", str(sweep))
    assert r.returncode == 0 and "in 1 unit " in r.stdout, r.stderr
    # planned, never submitted: wait refuses in one line, of one unit
    wait = run_cli("wait", str(sweep), "--interval", "0.1")
    line = assert_one_line_error(wait, f"1 unit of {sweep} was never submitted")
    assert "1 units" not in line and line.endswith(f"`tilesweep resume {sweep}` submits it"), line


def test_a_spec_file_where_a_sweep_directory_goes_is_named_so(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug"})
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    r = run_cli("status", str(spec))
    assert_one_line_error(r, f"{spec} is a spec file, not a sweep directory", "pass the --sweep-dir it was run with")
    # the default sweep directory of the spec, where it is there, is named
    fingerprint = json.loads((sweep / "sweep.json").read_text())["fingerprint"]
    default = tmp_path / "sweeps" / f"spec-{fingerprint[:8]}"
    default.parent.mkdir()
    sweep.rename(default)
    r = run_cli("wait", str(spec), cwd=tmp_path)
    assert_one_line_error(r, "is a spec file", f"pass the sweep directory it ran in: sweeps/spec-{fingerprint[:8]}")
    doc = tmp_path / "results.json"
    doc.write_text(json.dumps({**json.loads(SAMPLE.read_text()), "tilesweep": {"sweep_dir": "/x/sweep"}}))
    assert_one_line_error(run_cli("status", str(doc)), "is a results document", "merged from: /x/sweep")


@pytest.mark.parametrize("damage", ["{", "{\n", "[1]\n", "directory"])
def test_a_damaged_env_json_is_one_line_in_every_command_and_unreadable_in_ls(tmp_path: Path, damage: str) -> None:
    sweep = tmp_path / "sweeps" / "a"
    build_sweep(sweep, small_spec(n_seqs=1), 1, write_partials=False, output=tmp_path / "results.json")
    env = sweep / "env.json"
    env.unlink()
    if damage == "directory":
        env.mkdir()
    else:
        env.write_text(damage)
    for command in ("status", "merge", "wait", "resume"):
        assert_one_line_error(run_cli(command, str(sweep)), str(env), "delete it (the next worker records its own)")
    listed = run_cli("ls", str(sweep.parent))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert f"{sweep}  unreadable: {env}" in listed.stdout, listed.stdout


def test_an_output_that_is_a_directory_is_refused_before_anything_runs(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], output=str(folder))  # no executor: submit takes it too
    sweep = tmp_path / "sweep"
    for command in ("plan", "run", "submit"):
        r = run_cli(command, str(spec), "--sweep-dir", str(sweep))
        assert_one_line_error(r, f"output {folder} of {spec} is a directory", "name a file")
        assert not sweep.exists()
    good = write_spec("good.json", modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug"})
    r = run_cli("run", str(good), "--sweep-dir", str(sweep), "--output", str(folder))
    assert_one_line_error(r, f"--output {folder} is a directory")
    assert run_cli("plan", str(good), "--sweep-dir", str(sweep)).returncode == 0
    r = run_cli("merge", str(sweep), "--output", str(folder))
    assert_one_line_error(r, f"the output {folder} is a directory", f"tilesweep merge {sweep} --output FILE")


@pytest.mark.parametrize("output", ["", "  ", "results/"])
def test_a_spec_output_that_names_no_file_is_refused(
    write_spec: Callable[..., Path], tmp_path: Path, output: str
) -> None:
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], output=output)
    assert_one_line_error(run_cli("spec", str(spec)), 'field "output"', "must name a file for the results document")


def test_a_damaged_unit_index_says_how_to_go_on(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    build_sweep(sweep, small_spec(n_seqs=1), 1, write_partials=False, output=tmp_path / "results.json")
    (sweep / "units.json").write_text("[{")
    r = run_cli("status", str(sweep))
    assert_one_line_error(r, f"unit index {sweep / 'units.json'} is unreadable", "restore the file", "--reuse")
    (sweep / "units.json").unlink()
    for command in ("status", "merge", "resume"):
        r = run_cli(command, str(sweep))
        assert_one_line_error(r, f"unit index {sweep / 'units.json'} is missing", "restore the file", "--reuse")


@pytest.mark.parametrize("value", ["nan", "inf", "1e300", "0", "-1", "soon"])
def test_wait_refuses_seconds_that_are_no_duration_in_one_line(tmp_path: Path, value: str) -> None:
    for option in ("--interval", "--timeout", "--slurm-interval"):
        r = run_cli("wait", str(tmp_path), option, value)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and f"argument {option}: expected" in r.stderr, r.stderr


def test_a_sweep_dir_or_output_given_empty_and_spec_schema_with_a_file_are_refused(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug"})
    for args, needle in (
        (["run", str(spec), "--sweep-dir", ""], 'argument --sweep-dir: "" names no folder'),
        (["plan", str(spec), "--sweep-dir", "", "--dry-run"], 'argument --sweep-dir: "" names no folder'),
        (["run", str(spec), "--output", ""], 'argument --output: "" names no file'),
        (["run", str(spec), "--output", f"{tmp_path}/out/"], "argument --output: "),
        (["spec", "--schema", str(spec)], "--schema prints the schema of every spec"),
    ):
        r = run_cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]  # nothing planned, nothing written


def test_ls_lines_up_its_units_column_whatever_each_sweep_state_says(tmp_path: Path) -> None:
    spec = small_spec(n_seqs=2)
    build_sweep(tmp_path / "done", {**spec, "output": str(tmp_path / "done.json")}, 2)
    build_sweep(tmp_path / "half", {**spec, "output": str(tmp_path / "half.json")}, 2, write_partials=[0])
    listed = run_cli("ls", str(tmp_path), env={"TILESWEEP_SLURM_QUERIES": "0"})
    lines = listed.stdout.splitlines()
    assert len(lines) == 2 and "complete" in lines[0] and "incomplete" in lines[1], listed.stdout
    assert lines[0].index("units:") == lines[1].index("units:"), listed.stdout


def test_ls_of_a_folder_that_is_not_there_says_so_and_of_a_file_says_it_is_no_directory(tmp_path: Path) -> None:
    missing = assert_one_line_error(run_cli("ls", str(tmp_path / "nodir")), f"{tmp_path / 'nodir'} does not exist")
    assert "not a directory" not in missing, missing
    (tmp_path / "afile").write_text("")
    assert_one_line_error(run_cli("ls", str(tmp_path / "afile")), f"{tmp_path / 'afile'} is not a directory")


def test_every_commands_help_says_what_it_does_and_what_its_arguments_are() -> None:
    from orchestrator.cli.main import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    for name, command in sub.choices.items():  # type: ignore[union-attr]
        assert command.description, f"`tilesweep {name} --help` says nothing of what it does"
        undescribed = [a.dest for a in command._actions if not a.option_strings and not a.help]
        assert not undescribed, f"`tilesweep {name} --help` leaves {undescribed} undescribed"
        bare = [a.option_strings[-1] for a in command._actions if a.option_strings and not a.help]
        assert not bare, f"`tilesweep {name} --help` says nothing of {bare}"


def test_lower_workers_without_lower_is_refused_not_ignored(write_spec: Callable[..., Path]) -> None:
    r = run_cli("plan", str(write_spec(modes=["fwd"])), "--dry-run", "--lower-workers", "2")
    assert_one_line_error(r, "--lower-workers sets the processes of pre-flight lowering: add --lower")


def test_gpus_per_node_of_a_run_here_is_said_to_be_slurms(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug", "gpus_per_node": 2})
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0 and "note: executor.gpus_per_node is SLURM's (GPUs per task)" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "args", [["report", str(SAMPLE), "--foo"], ["impls", "extra"], ["status", "a", "b"], ["ls", ".", "--x"]]
)
def test_a_word_a_command_does_not_take_points_at_that_commands_help(args: list[str]) -> None:
    line = assert_one_line_error(run_cli(*args), f"unrecognized arguments: {args[-1]}")
    assert line.startswith(f"tilesweep {args[0]}: error: ") and line.endswith(f"(see `tilesweep {args[0]} --help`)")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["stauts", "sweeps/a"],
            'tilesweep: error: argument command: unknown "stauts" (did you mean status?); choose from ',
        ),
        (["run", "spec.json", "--executor", "lcoal"], 'argument --executor: unknown "lcoal" (did you mean local?)'),
        (["export", "a.json", "--out", "t.json", "--format", "json"], 'unknown "json"; choose from tilesweep, tokamax'),
    ],
)
def test_a_word_that_is_none_of_the_choices_names_the_closest_one(args: list[str], said: str) -> None:
    """A mistyped command or choice is said in JSON's quotes, with the choice it is closest to
    where one is close, as a mistyped spec field is."""
    line = assert_one_line_error(run_cli(*args), said)
    assert "invalid choice" not in line and f"'{args[-1]}'" not in line, line


def test_impls_says_what_a_spec_names_to_run_an_implementation_kernel_impl_does_not_name(tmp_path: Path) -> None:
    """``impls`` lists tokamax's sm100 op, which no ``kernel.impl`` names: its line says what a
    spec writes to run it, and a spec written so is taken; every other line names a kernel.impl."""
    from kernels import impls

    r = run_cli("impls")
    assert r.returncode == 0, r.stderr
    heads = {line.split(":")[0]: line for line in r.stdout.splitlines() if line and not line.startswith(" ")}
    said = 'no kernel.impl of its own: kernel.impl "tokamax-mosaic" with kernel.device_kind "NVIDIA B200" runs it'
    assert said in heads["tokamax-mosaic-sm100"], heads
    assert not any("kernel.impl" in heads[name] for name in impls.SPEC_IMPL_NAMES), heads
    spec = tmp_path / "b200.json"
    spec.write_text(
        json.dumps({"dtypes": ["bfloat16"], "kernel": {"impl": "tokamax-mosaic", "device_kind": "NVIDIA B200"}})
    )
    assert run_cli("spec", str(spec)).returncode == 0


def test_a_warning_the_library_logs_is_said_as_the_cli_says_its_own(tmp_path: Path) -> None:
    """A partial line that is no partial line: merge warns ``tilesweep: warning: ...`` (not
    ``WARNING module.name: ...``); with -v every line names its level and module."""
    sd, units = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    with open(sd.root / "partials" / f"{units[0].id}.jsonl", "a") as f:
        f.write("not json\n")
    said = ": not a tilesweep partial line; skipped (resume redoes its item where no other line records it)"
    r = run_cli("merge", str(sd.root))
    assert r.returncode == 0 and f"tilesweep: warning: {sd.root / 'partials'}" in r.stderr, r.stderr
    assert said in r.stderr and "WARNING" not in r.stderr, r.stderr
    # every item has a record: the line skipped leaves nothing for resume to redo, and the merge says so
    assert "skipped 1 torn or invalid partial lines (their items have records)" in r.stdout, r.stdout
    verbose = run_cli("-v", "merge", str(sd.root))
    assert verbose.returncode == 0 and "WARNING orchestrator.store.partials: " in verbose.stderr, verbose.stderr


def test_verbose_is_taken_after_the_command_as_before_it(tmp_path: Path) -> None:
    """``tilesweep merge DIR -v`` (as ``tilesweep -v merge DIR``, which ``tilesweep --help``
    shows): the merge's info line names its level and module, and each command's help lists -v."""
    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    for args in (["-v", "merge", str(sd.root)], ["merge", str(sd.root), "-v"], ["merge", "-vv", str(sd.root)]):
        r = run_cli(*args)
        assert r.returncode == 0 and "INFO orchestrator.store.merge: merged " in r.stderr, (args, r.stderr)
    quiet = run_cli("merge", str(sd.root))
    assert quiet.returncode == 0 and "INFO" not in quiet.stderr, quiet.stderr
    assert "-v, --verbose" in run_cli("status", "--help").stdout


def test_a_command_a_message_suggests_pastes_and_runs_where_a_path_has_a_space(tmp_path: Path) -> None:
    """``status`` of an unfinished sweep in a folder named with a space suggests its resume; the
    suggestion, pasted into a shell, is the command (it split at the space: two arguments)."""
    from orchestrator.store.synthetic import build_sweep, small_spec

    sd, units = build_sweep(tmp_path / "my sweeps" / "one", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    sd.partial_path(units[0].id).unlink()  # a unit that recorded nothing
    sd.record_jobs([{"unit": units[0].id, "executor": "local", "job_id": "999999999", "log": "/nonexistent"}])
    status = run_cli("status", str(sd.root))
    suggested = status.stdout.splitlines()[-1]
    assert suggested == f"to redo the missing items: tilesweep resume '{sd.root}'", status.stdout
    words = shlex.split(suggested.split(": ", 1)[1])
    assert words == ["tilesweep", "resume", str(sd.root)]
    assert run_cli(*words[1:2], "--help").returncode == 0 and run_cli("status", *words[2:]).returncode == 1


def test_a_device_kind_is_shown_as_json_writes_it(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    r = run_cli("plan", str(write_spec()), "--dry-run", "--device-kind", "H100")
    line = assert_one_line_error(r, 'unknown device kind "H100"; known kinds: "NVIDIA H100", "NVIDIA H100 80GB HBM3"')
    assert "'" not in line.split("kernel.device_kind'")[-1] and "(got" not in line, line


def test_a_device_kind_spelled_as_a_tokamax_folder_or_in_lower_case_names_the_kind_meant(
    write_spec: Callable[..., Path],
) -> None:
    for typed in ("nvidia h200", "nvidia_h200", "NVIDIA-H200"):
        r = run_cli("plan", str(write_spec()), "--dry-run", "--device-kind", typed)
        assert_one_line_error(r, f'unknown device kind "{typed}" (did you mean "NVIDIA H200"?')
