"""A sweep directory with a file this user may not read, or a unit index of the wrong shape,
as a user meets it: ``status``, ``merge`` and ``logs`` say in one line which file and what to
do (exit 2), ``ls`` lists that sweep as unreadable beside the others, and nothing already
written is lost. Permissions are real: a file is ``chmod 000``; as root, whom modes do not stop,
the command runs under ``setpriv`` without the capabilities that override them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import REPO, assert_one_line_error, run_cli

# as root: the CLI without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so file modes bind it
NO_DAC = ["--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search", "--"]
READABLE = "chmod +r"


def _setpriv() -> list[str]:
    """The prefix that makes modes bind the CLI ([] for a user, whom they bind already); the
    test is skipped where root cannot drop the capabilities here."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("modes do not bind root, and setpriv (util-linux) is not installed to drop its capabilities")
    tried = subprocess.run(["setpriv", *NO_DAC, "true"], capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"root cannot drop its capabilities here (setpriv: {tried.stderr.strip()})")
    return ["setpriv", *NO_DAC]


def _unprivileged(*args: str) -> subprocess.CompletedProcess[str]:
    """``run_cli(ARGS)`` as a user whom file modes bind (root: under setpriv, as ``run_cli``
    runs it otherwise)."""
    prefix = _setpriv()
    if not prefix:
        return run_cli(*args)
    cmd = [*prefix, sys.executable, "-m", "orchestrator", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)


def _sweep(root: Path) -> Path:
    """A sweep of one unit with its partial written, merged once into its results document."""
    build_sweep(root, small_spec(1), 1, output=root.parent / f"{root.name}.json")
    merged = run_cli("merge", str(root))
    assert merged.returncode == 0, merged.stderr
    return root


def _unmerged(root: Path) -> Path:
    """A sweep of one unit with its partial written, never merged (what ``ls`` lists is its
    partials and markers)."""
    build_sweep(root, small_spec(1), 1, output=root.parent / f"{root.name}.json")
    return root


def _unreadable(path: Path) -> Path:
    path.chmod(0)
    probe = subprocess.run([*_setpriv(), "cat", str(path)], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{path} is still readable with mode 000 here (a filesystem that ignores modes)")
    return path


def _partial(sweep: Path) -> Path:
    (partial,) = (sweep / "partials").glob("*.jsonl")
    return partial


def test_an_unreadable_partial_is_named_by_status_and_merge_and_the_document_is_kept(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "sweep")
    document = tmp_path / "sweep.json"
    before = document.read_bytes()
    partial = _unreadable(_partial(sweep))
    for command in (["status", str(sweep)], ["merge", str(sweep)]):
        done = _unprivileged(*command)
        assert_one_line_error(done, f"cannot read {partial}", READABLE)
    assert document.read_bytes() == before, "the merge changed the results document"
    partial.chmod(0o644)
    assert _unprivileged("status", str(sweep)).returncode == 0


def test_an_unreadable_log_is_named_by_logs(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "sweep")
    log = sweep / "logs" / "units" / f"{_partial(sweep).stem}.log"
    log.parent.mkdir(parents=True)
    log.write_text("the worker's output\n")
    _unreadable(log)
    r = _unprivileged("logs", str(sweep), "0")
    assert_one_line_error(r, f"cannot read {log}", READABLE)
    assert r.stdout == ""  # no header of a log it could not show


def test_ls_lists_a_sweep_it_may_not_read_beside_the_others(tmp_path: Path) -> None:
    parent = tmp_path / "sweeps"
    good, bad, closed = (_unmerged(parent / name) for name in ("good", "bad", "nested/closed"))
    partial = _unreadable(_partial(bad))
    closed.chmod(0)
    try:
        done = _unprivileged("ls", str(parent))
    finally:
        closed.chmod(0o755)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert set(lines) == {str(good), str(bad), str(closed)}, done.stdout
    assert "unreadable" not in lines[str(good)] and "1 done" in lines[str(good)], lines[str(good)]
    assert f"unreadable: cannot read {partial}" in lines[str(bad)] and READABLE in lines[str(bad)]
    assert f"unreadable: cannot read {closed}" in lines[str(closed)] and "chmod +rx" in lines[str(closed)]


@pytest.mark.parametrize(
    "index",
    [[{"id": 5}], [{"id": "abc"}], [5], [{"id": "abc", "n_items": "3", "origin": "plan"}]],
    ids=["id-only", "no-count", "not-an-object", "count-a-string"],
)
def test_a_unit_index_with_entries_of_the_wrong_shape_is_damaged(tmp_path: Path, index: list[object]) -> None:
    parent = tmp_path / "sweeps"
    good = _unmerged(parent / "good")
    sweep = _sweep(parent / "bad")
    units = sweep / "units.json"
    units.write_text(json.dumps(index) + "\n")
    document = parent / "bad.json"
    before = document.read_bytes()
    for command in ("status", "merge", "resume"):
        assert_one_line_error(run_cli(command, str(sweep)), f"unit index {units} is damaged", "restore the file")
    assert document.read_bytes() == before
    listed = run_cli("ls", str(parent))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert f"unreadable: unit index {units} is damaged" in lines[str(sweep)], listed.stdout
    assert "1 done" in lines[str(good)], listed.stdout


@pytest.mark.parametrize(
    ("where", "made", "said"),
    [
        ("partials/{unit}.jsonl", "directory", "is a directory, where a file belongs"),
        ("partials", "file", "partials is a file, where a directory belongs"),
        ("done", "file", "done is a file, where a directory belongs"),
        ("jobs.jsonl", "directory", "jobs.jsonl is a directory, where a file belongs"),
    ],
)
def test_a_file_where_a_folder_belongs_or_the_other_way_is_named_by_every_command(
    tmp_path: Path, where: str, made: str, said: str
) -> None:
    sd, units = build_sweep(tmp_path / "sweeps" / "damaged", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    build_sweep(tmp_path / "sweeps" / "sound", small_spec(n_seqs=1), 2, output=tmp_path / "other.json")
    path = sd.root / where.format(unit=units[0].id)
    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    path.mkdir() if made == "directory" else path.write_text("")
    for command in ("status", "merge", "resume") if where != "done" else ("status", "resume"):  # merge reads no marker
        assert_one_line_error(run_cli(command, str(sd.root)), said, "move it away")
    listed = run_cli("ls", str(tmp_path / "sweeps"))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    damaged, sound = listed.stdout.splitlines()
    assert "unreadable: " in damaged and said in damaged and "complete" in sound, listed.stdout


def test_a_history_line_that_is_no_object_is_skipped(tmp_path: Path) -> None:
    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    with open(sd.root / "jobs.jsonl", "a") as f:
        f.write("null\n[]\n")
    for command in ("merge", "status"):  # status after the merge: complete and merged
        r = run_cli(command, str(sd.root))
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_a_run_refused_for_a_damaged_unit_index_leaves_the_sweeps_output_as_it_was(
    tmp_path: Path, write_spec: Any
) -> None:
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug"})
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    before = json.loads((sweep / "sweep.json").read_text())["output"]
    (sweep / "units.json").unlink()
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--output", str(tmp_path / "elsewhere.json"))
    assert_one_line_error(r, "unit index", "units.json")
    assert json.loads((sweep / "sweep.json").read_text())["output"] == before


@pytest.mark.parametrize("made", ["pipe", "link to /dev/zero"])
def test_a_history_or_partial_that_is_no_file_is_named_and_never_read(tmp_path: Path, made: str) -> None:
    """jobs.jsonl or a partial that is a named pipe (whose reading waits for a writer for ever)
    or a link to /dev/zero (whose reading never ends): ``status``, ``logs`` and ``merge`` say so
    in one line, and ``ls`` lists that sweep as unreadable beside the others."""
    sd, units = build_sweep(tmp_path / "sweeps" / "damaged", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    build_sweep(tmp_path / "sweeps" / "sound", small_spec(n_seqs=1), 2, output=tmp_path / "other.json")
    history, partial = sd.root / "jobs.jsonl", sd.root / "partials" / f"{units[0].id}.jsonl"
    for path in (history, partial):
        path.unlink(missing_ok=True)
        os.mkfifo(path) if made == "pipe" else path.symlink_to("/dev/zero")
    said = f"is {'a named pipe' if made == 'pipe' else 'a device'}, where a sweep directory holds a file"
    for command in (["status", str(sd.root)], ["logs", str(sd.root), "0"], ["merge", str(sd.root)]):
        assert_one_line_error(run_cli(*command, timeout=60), said, "remove it")
    listed = run_cli("ls", str(tmp_path / "sweeps"), timeout=60)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    damaged, sound = listed.stdout.splitlines()
    assert f"unreadable: {history} {said}" in damaged and "complete" in sound, listed.stdout


@pytest.mark.parametrize(
    "name",
    [
        "sweep.json",
        "units.json",
        "env.json",
        "units/{unit}.json",
        "done/{unit}.json",
        "leases/{unit}.lease",
        "status-tally.json",
        "run.lease",
    ],
)
def test_any_file_of_a_sweep_that_is_a_pipe_is_named_by_status_and_ls(tmp_path: Path, name: str) -> None:
    """Any file a command reads of a sweep directory (its spec, index, environment, a unit file,
    a marker, a lease of a unit not done, the tally) made a named pipe: ``status`` says which
    in one line instead of waiting for a writer for ever, and ``ls`` lists the other sweeps."""
    sd, units = build_sweep(tmp_path / "sweeps" / "damaged", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    build_sweep(tmp_path / "sweeps" / "sound", small_spec(n_seqs=1), 2, output=tmp_path / "other.json")
    path = sd.root / name.format(unit=units[0].id)
    if name.startswith("leases/"):  # status reads the lease of a unit not done yet, which a worker may hold
        sd.partial_path(units[0].id).unlink()
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    said = f"{path} is a named pipe, where a sweep directory holds a file"
    assert_one_line_error(run_cli("status", str(sd.root), timeout=60), said, f"rm {path}")
    listed = run_cli("ls", str(tmp_path / "sweeps"), timeout=60)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    damaged, sound = listed.stdout.splitlines()
    assert f"unreadable: {said}" in damaged and "complete" in sound, listed.stdout


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("logs/units/{unit}.log", "logs"),  # the unit's log `logs` shows
        ("sweep.lock", "cancel"),  # the sweep's lock, which filelock would take a pipe for
        ("merge-cache/output-stamps.json", "status"),  # what the merge read, which says whether it is merged
    ],
)
def test_a_file_a_command_reads_or_locks_that_is_a_pipe_is_named_by_it(tmp_path: Path, name: str, command: str) -> None:
    """A unit's log, the sweep's lock or the merge's stamps made a named pipe: the command that
    reads or locks it says which in one line instead of waiting for a writer for ever."""
    sweep = _sweep(tmp_path / "sweep")
    path = sweep / name.format(unit=_partial(sweep).stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    args = [command, str(sweep), *(["0"] if command == "logs" else [])]
    assert_one_line_error(run_cli(*args, timeout=60), f"{path} is a named pipe, where a sweep directory holds a file")


def test_lowering_verdicts_that_are_a_pipe_are_named_by_the_plan_that_reads_them(
    tmp_path: Path, write_spec: Any
) -> None:
    """``lowering.jsonl`` made a named pipe: ``plan`` of the sweep planned before, which prunes
    its items by the verdicts, names it in one line, as it would name a pipe at any file it reads."""
    spec, sweep = write_spec(), tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    os.mkfifo(sweep / "lowering.jsonl")
    planned = run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--dry-run", timeout=60)
    assert_one_line_error(planned, f"{sweep / 'lowering.jsonl'} is a named pipe, where a sweep directory holds a file")


def test_a_pipe_where_no_command_reads_leaves_status_and_merge_as_they_are(tmp_path: Path) -> None:
    """Commands check the files they read as they open them, not the whole sweep directory (its
    logs and compile cache grow with the sweep): a pipe left in the workers' compile cache, which
    neither ``status`` nor ``merge`` reads, changes nothing they say."""
    sweep = _sweep(tmp_path / "sweep")
    before = [run_cli(command, str(sweep)) for command in ("status", "merge")]
    (sweep / "compile-cache").mkdir()
    os.mkfifo(sweep / "compile-cache" / "left-behind")
    after = [run_cli(command, str(sweep), timeout=60) for command in ("status", "merge")]
    assert [(r.returncode, r.stdout, r.stderr) for r in after] == [(r.returncode, r.stdout, r.stderr) for r in before]
