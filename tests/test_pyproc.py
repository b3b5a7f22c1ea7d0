"""tilesweep's own processes (a merge's parse workers, a local run's unit workers) run
tilesweep's code whatever folder the command is typed in: one holding another ``orchestrator``
or ``jobs`` package (an old checkout) is not imported from (``orchestrator.pyproc``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.store.parse_procs import ENV
from tests.helpers import fwd_replay_spec

TILESWEEP = Path(sys.executable).with_name("tilesweep")  # the command a user types, not `python -m`


def _impostors(folder: Path) -> list[Path]:
    """Packages named as tilesweep's in ``folder``, each leaving a file behind when imported."""
    made = []
    for name in ("orchestrator", "jobs"):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text("open(__file__ + '.imported', 'w').close()\nraise SystemExit(3)\n")
        made.append(folder / name / "__init__.py.imported")
    return made


def _tilesweep(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TILESWEEP), *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600
    )


def test_a_run_and_its_merge_in_a_folder_holding_other_packages_of_those_names_run_tilesweeps(
    tmp_path: Path,
) -> None:
    here = tmp_path / "checkout"
    imported = _impostors(here)
    spec = fwd_replay_spec(tmp_path)
    sweep = tmp_path / "sweep"
    run = _tilesweep(here, "run", str(spec), "--sweep-dir", str(sweep))  # each unit's worker a process of its own
    assert run.returncode == 0, run.stderr
    merge = _tilesweep(here, "merge", str(sweep), env={ENV: "2"})  # parse workers, forced
    assert merge.returncode == 0, merge.stderr
    assert not any(p.exists() for p in imported)
    assert len(json.loads((tmp_path / "r.json").read_text())["results"]) == 3
