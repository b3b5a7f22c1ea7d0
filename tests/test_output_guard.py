"""The files ``report --html``, ``compare --html`` and ``export --out`` write never replace the
user's data: an input, a spec, a directory or any file of another kind is refused with one line
and exit code 2, and the file is left byte for byte; an earlier output of the same kind is
replaced, and folders of the path that do not exist yet are made. A sweep's results document
(``--output``, the spec's ``output``) never replaces the spec it is measured from. Real
``python -m orchestrator`` processes on real files."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import LAUNCH_STDOUT_CLOSED, REPO, assert_one_line_error, run_cli


@pytest.fixture
def results(tmp_path: Path, sample_doc: dict[str, object]) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(sample_doc, indent=1))
    return path


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep directory planned from ``examples/small.json``, shared by the tests that only
    check that an output refused there leaves it byte for byte."""
    sweep = tmp_path_factory.mktemp("planned") / "sweep"
    assert run_cli("plan", str(REPO / "examples" / "small.json"), "--sweep-dir", str(sweep)).returncode == 0
    return sweep


def _commands(results: Path, out: Path) -> dict[str, list[str]]:
    return {
        "export": ["export", str(results), "--out", str(out)],
        "report": ["report", str(results), "--html", str(out)],
        "compare": ["compare", str(results), str(results), "--html", str(out)],
    }


def _refused(args: list[str], fragment: str) -> None:
    done = run_cli(*args)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["export", "report", "compare"])
@pytest.mark.parametrize(
    ("kept", "fragment"),
    [("input", "is a results document this command reads"), ("spec", "exists and is not a")],
)
def test_an_output_that_is_the_input_or_a_spec_is_refused_and_kept(
    results: Path, tmp_path: Path, command: str, kept: str, fragment: str
) -> None:
    target = results
    if kept == "spec":
        target = tmp_path / "sweep.toml"
        target.write_text('output = "results.json"\n[executor]\nkind = "local"\n')
    before = target.read_bytes()
    _refused(_commands(results, target)[command], fragment)
    assert target.read_bytes() == before


@pytest.mark.parametrize("command", ["export", "report", "compare"])
def test_an_output_that_is_a_directory_is_refused(results: Path, tmp_path: Path, command: str) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "kept.txt").write_text("kept")
    _refused(_commands(results, folder)[command], "is a directory")
    assert (folder / "kept.txt").read_text() == "kept"


@pytest.mark.parametrize("command", ["export", "report", "compare", "plots", "tokamax"])
def test_an_output_in_a_folder_that_takes_no_file_is_refused_before_anything_is_printed(
    results: Path, command: str
) -> None:
    """/proc takes no new file, even root's: the command says so first, not after its report."""
    args = {
        **_commands(results, Path("/proc/tilesweep-out")),
        "plots": ["report", str(results), "--plots", "/proc/p"],
        "tokamax": ["export", str(results), "--format", "tokamax", "--out", "/proc/tk"],
    }
    done = run_cli(*args[command])
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    assert "the folder /proc takes no new files (not a filesystem that holds files)" in done.stderr, done.stderr


@pytest.mark.parametrize("command", ["export", "report", "compare", "plots"])
def test_an_output_in_folders_that_do_not_exist_yet_makes_them_as_its_help_says(
    results: Path, tmp_path: Path, command: str
) -> None:
    """Every output makes the folders its path names that do not exist yet, as ``--output`` does,
    and its ``--help`` says so."""
    new = tmp_path / "new" / "deeper"
    out = new / {"export": "tuned.json", "plots": "plots"}.get(command, "page.html")
    args = {**_commands(results, out), "plots": ["report", str(results), "--plots", str(out), "--max-plots", "1"]}
    done = run_cli(*args[command])
    assert done.returncode == 0, done.stderr
    assert (out.is_dir() and any(out.glob("*.png"))) if command == "plots" else out.is_file()
    flag = {"export": "--out", "plots": "--plots"}.get(command, "--html")
    lines = run_cli(args[command][0], "--help").stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"{flag} "))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("-")), len(lines))
    assert "missing folders are made" in " ".join(" ".join(lines[start:end]).split())  # argparse wraps it


def test_an_input_named_through_a_link_is_still_the_input(results: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(results)
    before = results.read_bytes()
    _refused(["export", str(results), "--out", str(link)], "is a results document this command reads")
    assert results.read_bytes() == before


@pytest.mark.parametrize("command", ["export", "report"])
def test_an_earlier_output_of_the_same_kind_is_replaced(results: Path, tmp_path: Path, command: str) -> None:
    out = tmp_path / ("tuned.json" if command == "export" else "page.html")
    first = run_cli(*_commands(results, out)[command])
    assert first.returncode == 0, first.stderr
    out.write_bytes(out.read_bytes() + b"\n")  # an older one, not what the next run writes
    again = run_cli(*_commands(results, out)[command])
    assert again.returncode == 0, again.stderr
    assert not out.read_bytes().endswith(b"\n\n")


@pytest.mark.parametrize("command", ["report", "compare"])
@pytest.mark.parametrize(
    "text",
    ["<html><body>my notes</body></html>\n", '<!DOCTYPE html>\n<html><head><meta name="generator" content="pandoc">'],
)
def test_a_hand_written_html_file_is_not_taken_for_a_page_and_is_kept(
    results: Path, tmp_path: Path, command: str, text: str
) -> None:
    """Only a page tilesweep wrote (its generator tag) is replaced: another HTML file is the
    user's, refused in one line naming it, and left byte for byte."""
    notes = tmp_path / "notes.html"
    notes.write_text(text)
    _refused(_commands(results, notes)[command], f"--html {notes} exists and is not a tilesweep page")
    assert notes.read_text() == text


def test_export_to_dash_writes_the_table_on_stdout(results: Path, tmp_path: Path) -> None:
    done = run_cli("export", str(results), "--out", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["format"] == "tilesweep-tuned"
    assert "to stdout" in done.stderr and not (tmp_path / "-").exists()
    # of several documents: what the combining dropped is said on stderr, the table alone on stdout
    other = tmp_path / "other.json"
    other.write_bytes(results.read_bytes())
    done = run_cli("export", str(results), str(other), "--out", "-", cwd=tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout)["format"] == "tilesweep-tuned", done.stdout
    assert "combined 2 documents" in done.stderr


def test_an_empty_file_given_as_output_is_written(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "made-with-touch.json"
    out.touch()
    done = run_cli("export", str(results), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["format"] == "tilesweep-tuned"
    assert done.stdout == f"wrote {out}: 3 entries (1 tuned, 2 use auto)\n", done.stdout  # no table was there


@pytest.mark.parametrize("command", ["export", "report", "compare"])
def test_a_device_or_a_named_pipe_is_refused_and_left_as_it_is(results: Path, tmp_path: Path, command: str) -> None:
    """Written beside and renamed into place, the page or table would replace the node itself
    (``--out /dev/null`` as root replaced the machine's /dev/null with a file)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    _refused(_commands(results, fifo)[command], f"{fifo} is a named pipe, not a regular file, which writing the ")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    _refused(_commands(results, Path(os.devnull))[command], f"{os.devnull} is a device, not a regular file, which ")
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)


def test_a_plots_folder_that_is_a_device_a_pipe_or_a_file_is_refused_as_what_it_is(
    results: Path, tmp_path: Path
) -> None:
    """``report --plots /dev/null``: one line naming what the path is (not "a file" for a
    device), and what to name instead; the node is left as it is and nothing is printed."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    notes = tmp_path / "notes.txt"
    notes.write_text("kept")
    for given, what in ((Path(os.devnull), "a device"), (fifo, "a named pipe"), (notes, "a file")):
        done = run_cli("report", str(results), "--plots", str(given))
        line = assert_one_line_error(done, f"--plots {given} is {what}, not a folder; name a folder for the PNGs")
        assert done.stdout == "", line
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert notes.read_text() == "kept"


@pytest.mark.parametrize("command", ["export", "report", "compare"])
@pytest.mark.parametrize("name", ["", "new-folder/"])
def test_an_output_that_names_no_file_is_refused(results: Path, tmp_path: Path, command: str, name: str) -> None:
    args = _commands(results, tmp_path)[command]
    args[-1] = name if not name else f"{tmp_path}/{name}"  # the slash kept, as typed
    done = run_cli(*args, cwd=tmp_path)
    said = f'{args[-2]} "{args[-1]}" names no file'  # the path as JSON spells it
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.parametrize("command", ["report", "compare"])
def test_a_page_to_dash_is_refused_not_written_to_a_file_named_dash(
    results: Path, tmp_path: Path, command: str
) -> None:
    args = _commands(results, tmp_path)[command]
    args[-1] = "-"
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 2 and "not to standard output" in done.stderr and len(done.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.parametrize("out, why", [("", '--out "" names no folder'), (os.devnull, "not a folder")])
def test_tokamax_tables_go_to_a_folder_named_by_out(results: Path, tmp_path: Path, out: str, why: str) -> None:
    done = run_cli("export", str(results), "--format", "tokamax", "--out", out, cwd=tmp_path)
    assert done.returncode == 2 and why in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_tokamax_tables_never_go_into_a_device_kinds_folder(results: Path, tmp_path: Path) -> None:
    """tokamax reads ``DIR/<device dir>/<op>.json``: an ``--out`` that is one device kind's folder
    (one an export wrote, or tokamax's own ``data/autotuning/nvidia_h200``) would put the tables one
    folder too deep, where nothing reads them. Refused in one line naming the folder to give
    instead; nothing is written."""
    kind = tmp_path / "out" / "nvidia_h200"
    kind.mkdir(parents=True)
    (kind / "pallas_mosaic_gpu_flash_attention.json").write_text("{}")  # an earlier export's table
    empty = tmp_path / "autotuning" / "nvidia_h100"  # where tokamax keeps a kind's tables, empty as yet
    empty.mkdir(parents=True)
    for folder, why in ((kind, "it holds pallas_mosaic_gpu_flash_attention.json"), (empty, "nvidia_h100 is how")):
        done = run_cli("export", str(results), "--format", "tokamax", "--out", str(folder))
        said = assert_one_line_error(done, f"--out {folder} is a device kind's folder", why, f"--out {folder.parent}")
        assert not any(p.is_dir() for p in folder.iterdir()), said  # no nvidia_h200/nvidia_h200
    assert [p.name for p in kind.iterdir()] == ["pallas_mosaic_gpu_flash_attention.json"]


def test_a_link_as_output_writes_the_file_it_points_to_and_stays_a_link(results: Path, tmp_path: Path) -> None:
    (tmp_path / "tables").mkdir()
    link = tmp_path / "tuned.json"
    link.symlink_to(tmp_path / "tables" / "tuned.json")
    done = run_cli("export", str(results), "--out", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and json.loads((tmp_path / "tables" / "tuned.json").read_text())["entries"]


def test_an_export_with_nothing_timed_leaves_an_earlier_table_as_it_is(
    results: Path, tmp_path: Path, sample_doc: dict[str, Any]
) -> None:
    out = tmp_path / "tuned.json"
    assert run_cli("export", str(results), "--out", str(out)).returncode == 0
    before = out.read_bytes()
    failed = tmp_path / "failed.json"  # every config of every problem failed
    records = [{k: v for k, v in r.items() if not k.endswith("_ms")} for r in sample_doc["results"]]
    failed.write_text(json.dumps({**sample_doc, "results": [{**r, "error": "RuntimeError: boom"} for r in records]}))
    _refused(["export", str(failed), "--out", str(out)], "nothing to export")
    assert out.read_bytes() == before


def test_export_of_one_document_given_twice_is_refused(results: Path, tmp_path: Path) -> None:
    link = tmp_path / "again.json"
    link.symlink_to(results)
    _refused(["export", str(results), str(link), "--out", str(tmp_path / "t.json")], "is given twice")
    assert not (tmp_path / "t.json").exists()


def test_export_to_a_reader_that_left_says_the_table_was_cut_short(results: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "export", str(results), "--out", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command has printed anything
    err = proc.stderr.read()
    assert proc.wait() == 0 and "Traceback" not in err, err
    assert err.strip() == "tilesweep: the table was cut short: its reader closed standard output"


def test_export_to_standard_output_closed_says_the_table_went_nowhere(results: Path) -> None:
    """``export --out - >&-``: the table, the command's product, can go nowhere: one line, exit 2,
    not "wrote the table to stdout" and 0."""
    done = subprocess.run(
        [sys.executable, "-c", LAUNCH_STDOUT_CLOSED, "export", str(results), "--out", "-"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert_one_line_error(done, "cannot write the table to standard output: it is closed; write it to --out FILE")


def test_report_with_standard_output_closed_runs_and_writes_its_page(results: Path, tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    done = subprocess.run(
        [sys.executable, "-c", LAUNCH_STDOUT_CLOSED, "report", str(results), "--html", str(page)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert page.read_text().lstrip().lower().startswith("<!doctype html")


def test_an_output_that_is_the_spec_file_is_refused_even_with_overwrite(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """The results document would replace the spec it was measured from: no --overwrite offered."""
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug"})
    text = spec.read_text()
    sweep = tmp_path / "sweep"
    for flags in ([], ["--overwrite"]):
        r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--output", str(spec), *flags)
        line = assert_one_line_error(r, f"--output {spec} is the spec file {spec} this command reads", "another file")
        assert "--overwrite" not in line and spec.read_text() == text and not sweep.exists()
    itself = write_spec("itself.json", modes=["fwd"], fwd_block_q=[32], output=str(tmp_path / "itself.json"))
    r = run_cli("plan", str(itself), "--sweep-dir", str(sweep))
    assert_one_line_error(r, f"output {itself} of {itself} is the spec file")
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    r = run_cli("merge", str(sweep), "--output", str(spec), "--overwrite")
    assert_one_line_error(r, f"the output {spec} is the spec file", f"tilesweep merge {sweep} --output FILE")
    assert spec.read_text() == text


@pytest.mark.parametrize(
    ("command", "name"),
    [(c, n) for c in ("export", "report", "compare") for n in ("sweep.lock", "logs/tuned.json")]
    + [("tokamax", "."), ("tokamax", "logs")],
)
def test_an_output_in_a_sweep_directory_is_refused_and_the_sweep_kept(
    results: Path, planned: Path, command: str, name: str
) -> None:
    """A sweep directory's own files (its lock, empty, or a file in one of its folders) are no
    place for an output: writing there would replace the sweep's file or be taken for one."""
    sweep = planned
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    out = sweep / name
    args = _commands(results, out).get(command) or ["export", str(results), "--format", "tokamax", "--out", str(out)]
    _refused(args, f"the sweep directory {sweep}")
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before
