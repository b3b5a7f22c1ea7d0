"""File names at the filesystem's limit (255 bytes). A name the filesystem takes is written,
with the files tilesweep keeps beside it (its lock, key index, temp files), whose names would
otherwise pass the limit; a name it does not take is one line and exit 2, never a traceback."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.store.files import NAME_MAX, fitted, temp_path
from tests.helpers import run_cli

LONGEST = "é" * 60 + "x" * (NAME_MAX - 120 - len(".json")) + ".json"  # 255 bytes, 195 characters


def test_a_name_of_255_bytes_is_written_with_the_files_kept_beside_it(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    assert len(os.fsencode(LONGEST)) == NAME_MAX
    out = tmp_path / LONGEST
    spec = write_spec(modes=["fwd"], output=str(out))
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    assert len(json.loads(out.read_text())["results"]) == 3
    beside = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert [n.rsplit(".", 1)[1] for n in beside] == ["keys", "lock"], beside
    assert all(len(os.fsencode(n)) <= NAME_MAX for n in beside)
    page = tmp_path / ("h" * (NAME_MAX - len(".html")) + ".html")
    table = tmp_path / ("t" * (NAME_MAX - len(".json")) + ".json")
    assert run_cli("report", str(out), "--html", str(page)).returncode == 0 and page.is_file()
    assert run_cli("export", str(out), "--out", str(table)).returncode == 0 and table.is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_names_made_from_a_long_name_stay_apart_and_within_the_limit() -> None:
    a, b = "a" * NAME_MAX, "a" * (NAME_MAX - 1) + "b"
    assert fitted(a, 6) != fitted(b, 6) and len(fitted(a, 6)) == NAME_MAX - 6
    assert fitted("short.json", 6) == "short.json"
    assert len(os.fsencode(temp_path(Path(a)).name)) <= NAME_MAX


@pytest.mark.parametrize(
    "args",
    [
        ["report", "{doc}", "--html", "{long}.html"],
        ["export", "{doc}", "--out", "{long}.json"],
        ["compare", "{doc}", "{doc}", "--html", "{long}.html"],
        ["ls", "{long}"],
        ["logs", "{long}", "0"],
        ["status", "{long}"],
        ["merge", "{long}"],
    ],
    ids=lambda a: a[0] + ("-" + a[2] if len(a) > 2 and a[2].startswith("--") else ""),
)
def test_a_name_longer_than_the_filesystem_takes_is_one_line(args: list[str], tmp_path: Path) -> None:
    from tests.report_helpers import make_doc, rec, write

    doc = write(tmp_path, make_doc([rec(auto=True, ms=2.0), rec(ms=1.0)]))
    long = str(tmp_path / ("y" * (NAME_MAX + 1)))
    r = run_cli(*(a.format(doc=doc, long=long) for a in args))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.endswith("is longer than its filesystem takes (255 bytes a name, 4096 a path); choose a shorter one")
