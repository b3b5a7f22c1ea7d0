"""A terminal that closes during a local run: its shell sends SIGHUP to the run's process group.
Without ``nohup`` the run stops as on Ctrl-C and blames no config; under ``nohup`` it goes on.
Real processes, signalled once a record is written."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

from tests.helpers import records_written, run_cli, start_run, until
from tests.test_local_lifecycle import ITEMS, SETTLE_S, SPEC


def _unended_starts(sweep: Path) -> list[str]:
    """The configs whose ``start`` line has neither a record nor an ``abandon`` line after it:
    those a resume counts as having killed their worker."""
    open_starts: list[str] = []
    for partial in (sweep / "partials").glob("*.jsonl"):
        for line in partial.read_text().splitlines():
            entry = json.loads(line)
            if "start" in entry:
                open_starts.append(entry["start"])
            for ended in (entry.get("id"), entry.get("abandon")):
                if ended in open_starts:
                    open_starts.remove(ended)
    return open_starts


def test_a_closed_terminal_stops_run_as_a_ctrl_c_does_and_blames_no_config(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """The terminal closes during a run: its shell sends SIGHUP to the run's process group. The
    run stops as on Ctrl-C: one line, exit 129, its worker gives its config in flight up
    (``abandon``), not counted as a crash, and status calls the unit interrupted."""
    spec = write_spec(**SPEC)
    sweep = tmp_path / "sweep"
    run = start_run(spec, sweep)
    until(lambda: records_written(sweep) >= 1, "a first record", run)
    os.killpg(run.pid, signal.SIGHUP)
    _, err = run.communicate(timeout=SETTLE_S)
    assert run.returncode == 128 + signal.SIGHUP and "Traceback" not in err, err
    assert err.rstrip().splitlines()[-1] == "tilesweep: stopped by SIGHUP; finished records are kept, rerun to continue"
    assert records_written(sweep) < ITEMS and _unended_starts(sweep) == []
    status = run_cli("status", str(sweep))
    assert "interrupted" in status.stdout and "failed" not in status.stdout, status.stdout


def test_a_run_started_with_nohup_outlives_its_terminal(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """Under ``nohup`` (SIGHUP ignored) the run and its workers go on when the terminal closes,
    and the sweep ends merged."""
    spec = write_spec(**SPEC)
    sweep = tmp_path / "sweep"
    run = start_run(spec, sweep, nohup=True)
    until(lambda: records_written(sweep) >= 1, "a first record", run)
    os.killpg(run.pid, signal.SIGHUP)
    _, err = run.communicate(timeout=SETTLE_S)
    assert run.returncode == 0, err
    assert f"merged {ITEMS} records" in err and _unended_starts(sweep) == [], err
