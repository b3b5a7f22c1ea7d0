"""A merge whose output is another kind of tilesweep file (a spec, a tuned table), or no results
document at all, refuses to replace it, in one line that says what the file is and the ways out of
the command that merges (``merge``, or ``run``: another ``--output``), not the advice the
results-document reader gives whoever passed it as a document to read; and a merge into a folder
that takes no new file is refused before it reads a partial."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import assert_one_line_error, run_cli


@pytest.mark.parametrize(
    "content, what",
    [
        ({"dtypes": ["bfloat16"], "output": "elsewhere.json"}, "(it is a sweep spec); merging would replace it"),
        (
            {"format": "tilesweep-tuned", "version": 2, "entries": []},
            '(it is a tuned table (format "tilesweep-tuned": `export` writes them)); merging would replace it',
        ),
    ],
)
def test_merging_over_a_spec_or_a_tuned_table_says_what_it_is(
    tmp_path: Path, content: dict[str, object], what: str
) -> None:
    out = tmp_path / "results.json"
    sd, _ = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=out)
    out.write_text(json.dumps(content))
    before = out.read_bytes()
    line = assert_one_line_error(run_cli("merge", str(sd.root)), f"{out} exists and is not a results document {what}")
    assert "--overwrite" in line and "pass the" not in line, line
    assert out.read_bytes() == before


def test_run_onto_a_file_that_is_no_results_document_names_its_own_way_out(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """``run --output`` onto a file that is no results document (notes, say): refused before a
    sweep directory is made, naming the way out ``run`` has (another ``--output``), not a merge
    of a sweep that does not exist; a merge's refusal names its own sweep directory to merge."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    sweep = tmp_path / "sweep"
    line = assert_one_line_error(
        run_cli("run", str(write_spec()), "--sweep-dir", str(sweep), "--output", str(notes)),
        f"{notes} exists and is not a results document",
        "write elsewhere (another `--output FILE`), or pass --overwrite to replace it",
    )
    assert "merge" not in line and not sweep.exists() and notes.read_text() == "my notes\n", line
    sd, _ = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=notes)
    assert_one_line_error(
        run_cli("merge", str(sd.root)), f"write elsewhere (`tilesweep merge {sd.root} --output FILE`)"
    )
    assert notes.read_text() == "my notes\n"


def test_merging_into_a_new_folder_of_a_folder_that_takes_no_files_names_that_folder(tmp_path: Path) -> None:
    """``merge --output`` into a folder not made yet, under a folder that takes no new files (here
    an immutable one): the line names the folder that refuses, not the one that does not exist."""
    folder = tmp_path / "out"
    folder.mkdir()
    sd, _ = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=tmp_path / "results.json")
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        r = run_cli("merge", str(sd.root), "--output", str(folder / "new" / "results.json"))
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert_one_line_error(r, f"the folder {folder} is not writable: make it writable, or merge into another folder")
    assert list(folder.iterdir()) == []


def test_a_merge_into_a_folder_that_takes_no_new_file_is_refused_before_it_reads_a_partial(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "results.json"
    sd, _ = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=out)
    assert run_cli("merge", str(sd.root)).returncode == 0  # the document and its lock file are there
    before = out.read_bytes()
    shutil.rmtree(sd.root / "merge-cache")
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        r = run_cli("merge", str(sd.root))
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert_one_line_error(r, f"cannot write {out}: its folder {folder} takes no new files", "it is unchanged")
    assert out.read_bytes() == before and not (sd.root / "merge-cache").exists()  # no partial was read
