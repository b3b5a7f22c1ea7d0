"""A unit stopped partway and resumed: ``tilesweep resume`` gave its items without a record to a
new unit. The old unit run again by hand (``python -m jobs.worker SWEEP UNIT``, as the README
shows) leaves those items to the new unit and says so: nothing is measured twice, no line is
added to its partial, and it writes no completion marker (it is not complete on its own)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from orchestrator.store.sweepdir import SweepDir
from tests.helpers import REPO, replay_specs, run_cli, until


def _recorded(path: Path) -> list[str]:
    return [obj["id"] for obj in map(json.loads, path.read_text().splitlines()) if "record" in obj]


def test_a_unit_run_by_hand_leaves_the_items_resume_gave_to_a_later_unit_to_it(tmp_path: Path) -> None:
    # at the real pace its first record comes at once and the next one a minute later, so the
    # worker can be stopped after the first
    specs = replay_specs(tmp_path, lambda k: 0.0 if k == 0 else 60.0, "local")
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(specs["real"]), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    sd = SweepDir.open(sweep)
    (old,) = [u["id"] for u in sd.unit_index()]
    worker = [sys.executable, "-m", "jobs.worker", str(sweep), old]
    proc = subprocess.Popen(worker, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    until(lambda: sd.partial_path(old).exists() and len(_recorded(sd.partial_path(old))) == 1, "a record", proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait() == 130, proc.communicate()
    r = run_cli("resume", str(sweep), "--spec", str(specs["instant"]))
    assert r.returncode == 0, r.stderr
    (new,) = [u["id"] for u in sd.unit_index() if u["id"] != old]
    assert len(_recorded(sd.partial_path(new))) == 2
    before = sd.partial_path(old).read_bytes()

    r = subprocess.run(worker, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines() == [
        f"unit {old}: 0 records written (0 errors), 1 already done, 0.0s",
        f"  not measured here: 2 items `tilesweep resume` gave to a later unit, which measures them: {new} (2 items)",
    ], r.stdout
    assert sd.partial_path(old).read_bytes() == before and not sd.marker_path(old).exists()
    r = run_cli("merge", str(sweep))
    assert r.returncode == 0 and "merged 3 records" in r.stdout + r.stderr, (r.stdout, r.stderr)
    recorded = _recorded(sd.partial_path(old)) + _recorded(sd.partial_path(new))
    assert len(recorded) == len(set(recorded)) == 3
