"""A merge that finds another merge into the same document holding its lock says that it waits,
and for whom, before it waits (up to ``merge.lock_timeout_s``), then merges once it is free."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.store.locks import MergeLock, lock_path_for
from orchestrator.store.synthetic import build_sweep, small_spec
from tests.crash_events import wait_until
from tests.helpers import REPO


@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_a_merge_waiting_for_the_lock_says_so_then_merges(tmp_path: Path, kind: str) -> None:
    output = tmp_path / "doc.json"
    spec = {**small_spec(n_seqs=1), "merge": {"lock": kind}}
    sd, _ = build_sweep(tmp_path / "sweep", spec, 2, output=output)
    err = tmp_path / "merge.err"
    with MergeLock(lock_path_for(output), kind, 5), open(err, "w") as f:  # another merge, as far as it can tell
        merge = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "merge", str(sd.root)],
            cwd=REPO,
            stderr=f,
            env=dict(os.environ),
            text=True,
        )
        said = wait_until(merge, lambda: "waiting for the lock" in err.read_text())
        assert said and merge.poll() is None, err.read_text()
        assert not output.exists()
    assert merge.wait(timeout=300) == 0, err.read_text()
    text = err.read_text()
    assert f"waiting for the lock {lock_path_for(output)}, held by" in text and "merge.lock_timeout_s" in text
    assert output.exists()
