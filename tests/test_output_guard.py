"""The files ``report --html``, ``compare --html`` and ``export --out`` write never replace the
user's data: an input, a spec, a directory or any file of another kind is refused with one line
and exit code 2, and the file is left byte for byte; an earlier output of the same kind is
replaced. Real ``python -m orchestrator`` processes on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli


@pytest.fixture
def results(tmp_path: Path, sample_doc: dict[str, object]) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(sample_doc, indent=1))
    return path


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


def test_export_to_dash_writes_the_table_on_stdout(results: Path, tmp_path: Path) -> None:
    done = run_cli("export", str(results), "--out", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["format"] == "tilesweep-tuned"
    assert "to stdout" in done.stderr and not (tmp_path / "-").exists()


def test_an_empty_file_given_as_output_is_written(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "made-with-touch.json"
    out.touch()
    done = run_cli("export", str(results), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["format"] == "tilesweep-tuned"
