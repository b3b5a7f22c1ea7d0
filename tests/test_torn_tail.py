"""A partial whose last line was cut off (its worker stopped mid-write, or its disk full): the
first merge that finds it says so in neutral words, later merges and status stay quiet about the
same line, the line is never read as a record, and resume redoes its item."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_cli
from tests.test_full_disk import _replay_spec

SAID = "the last line, incomplete: the writer was stopped or the disk was full (or it is still being written)"


def _cut_last_line(partial: Path) -> None:
    """Cut the partial's last line (a record) in half, as a write stopped half-way leaves it."""
    lines = partial.read_bytes().splitlines(keepends=True)
    assert "record" in json.loads(lines[-1])
    partial.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])


def _run_and_cut(tmp_path: Path) -> tuple[Path, Path]:
    """A replay sweep of one unit run to its end, then its partial's last line cut off: the
    sweep directory and the partial."""
    spec = _replay_spec(tmp_path, sharding={"units": 1})
    sweep = tmp_path / "sweep"
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    (partial,) = (sweep / "partials").glob("*.jsonl")
    _cut_last_line(partial)
    return sweep, partial


def test_a_cut_off_last_line_is_said_in_neutral_words_and_never_read(tmp_path: Path) -> None:
    sweep, partial = _run_and_cut(tmp_path)
    first = run_cli("merge", str(sweep))
    assert first.returncode == 0, first.stderr
    warned = [line for line in first.stderr.splitlines() if "warning" in line]
    assert warned == [
        f"tilesweep: warning: {partial} line {len(partial.read_bytes().splitlines())}: {SAID}; skipped "
        "(resume redoes its item where no other line records it)"
    ], first.stderr
    assert len(json.loads((tmp_path / "results.json").read_text())["results"]) == 3  # the cut record is not one


def test_a_cut_off_last_line_is_said_once_and_resume_redoes_its_item(tmp_path: Path) -> None:
    sweep, partial = _run_and_cut(tmp_path)
    first = run_cli("merge", str(sweep))
    assert first.returncode == 0 and first.stderr.count(f"{partial} line") == 1, first.stderr
    for command in ("merge", "status", "merge"):
        again = run_cli(command, str(sweep))
        assert str(partial) not in again.stderr and "warning" not in again.stderr, (command, again.stderr)
    resumed = run_cli("resume", str(sweep))
    assert resumed.returncode == 0, resumed.stderr
    status = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert status["complete"] and status["merged"] and status["done"] == status["planned"] == 4, status
    assert len(json.loads((tmp_path / "results.json").read_text())["results"]) == 4
