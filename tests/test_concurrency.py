"""Many mergers, writers and a reader at once; lock timeouts; the soft lock's stale handling.
All with real processes and real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.errors import LockTimeout
from orchestrator.planning import Unit
from orchestrator.spec.records import item_id
from orchestrator.store.locks import FOREIGN_STALE_S, HolderRecord, MergeLock, lock_path_for
from orchestrator.store.merge import merge
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import build_sweep, small_spec
from tests.crash_trials import check_document, finished_records, spawn_writer

from .conftest import REPO, run_cli

MERGER = """
import sys, time
from pathlib import Path
from orchestrator.store.merge import merge
from orchestrator.store.sweepdir import SweepDir
sd, stop, n = SweepDir.open(sys.argv[1]), Path(sys.argv[2]), 0
while not stop.exists():
    merge(sd); n += 1
merge(sd); print(n + 1)
"""

HOLDER = """
import sys, time
from pathlib import Path
from orchestrator.store import locks as mergelock
if sys.argv[3] == "elsewhere":
    mergelock.host_identity = lambda: {"host": "node-elsewhere", "boot_id": "another-boot", "pidns": "pid:[1]"}
with mergelock.MergeLock(Path(sys.argv[1]), sys.argv[2], 5):
    print("locked", flush=True)
    time.sleep(600)
"""


def _py(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _hold(lock: Path, kind: str, where: str = "here") -> subprocess.Popen[str]:
    p = _py(HOLDER, str(lock), kind, where)
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.readline().strip() == "locked", p.stderr.read()
    return p


def _sweep(tmp_path: Path, n_seqs: int = 2, **merge_opts: object) -> tuple[SweepDir, list[Unit]]:
    return build_sweep(
        tmp_path / "sweep",
        small_spec(n_seqs=n_seqs, merge=merge_opts),
        4,
        write_partials=False,
        output=tmp_path / "results.json",
    )


@dataclass
class _Reads:
    """What the reader thread saw of the document: whole reads, and what was wrong with the others."""

    ok: int = 0
    bad: list[str] = field(default_factory=list)


@pytest.mark.parametrize("lock", ["hard", "soft"])
def test_eight_mergers_four_writers_one_reader(tmp_path: Path, lock: str) -> None:
    sd, units = _sweep(tmp_path, lock=lock)
    stop = tmp_path / "stop"
    reads = _Reads()
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                data = sd.output.read_bytes()
            except FileNotFoundError:
                continue
            try:
                doc = json.loads(data)
                assert isinstance(doc["results"], list)
                reads.ok += 1
            except (ValueError, KeyError, AssertionError) as exc:
                reads.bad.append(f"{len(data)} bytes: {exc}")

    t = threading.Thread(target=reader)
    t.start()
    mergers = [_py(MERGER, str(sd.root), str(stop)) for _ in range(8)]
    writers = [spawn_writer(sd, u.id, delay=0.004, seed=k) for k, u in enumerate(units)]
    try:
        for w in writers:
            _, err = w.communicate(timeout=120)
            assert w.returncode == 0, err
        stop.touch()
        counts = []
        for m in mergers:
            out, err = m.communicate(timeout=120)
            assert m.returncode == 0, err
            counts.append(int(out.strip()))
    finally:
        done.set()
        t.join()
        for p in mergers + writers:
            if p.poll() is None:
                p.kill()
    print(f"merges per merger: {counts}, document reads: {reads.ok}")
    assert reads.bad == [] and reads.ok > 0
    assert all(c >= 1 for c in counts)
    doc = check_document(sd.output)
    ids = [item_id(r) for r in doc["results"]]
    assert len(ids) == len(set(ids)) == sd.planned  # every finished record exactly once
    finished = finished_records(sd)
    merged = {
        iid: {k: v for k, v in r.items() if k not in ("unit", "attempt")}
        for iid, r in zip(ids, doc["results"], strict=True)
    }
    assert merged == finished


@pytest.mark.parametrize("lock", ["hard", "soft"])
def test_lock_wait_times_out_naming_the_lock_file(tmp_path: Path, lock: str) -> None:
    sd, _ = _sweep(tmp_path, n_seqs=1, lock=lock, lock_timeout_s=1)
    lock_file = lock_path_for(sd.output)
    holder = _hold(lock_file, lock)
    try:
        with pytest.raises(LockTimeout, match=str(lock_file)):
            merge(sd)
        r = run_cli("merge", str(sd.root))
        waiting, refused = r.stderr.splitlines()  # it said that it waits, then that it gave up
        assert f"waiting for the lock {lock_file}, held by" in waiting and "merge.lock_timeout_s" in waiting
        assert r.returncode == 2 and refused.startswith("tilesweep: error:") and str(lock_file) in refused
        assert not sd.output.exists()
    finally:
        holder.kill()
        holder.communicate()
    assert merge(sd).records == 0  # the dead holder's lock is gone or stale: merging works


def _soft_lock_content(lock_file: Path) -> HolderRecord:
    return json.loads(lock_file.read_text())


def test_soft_lock_of_a_dead_holder_on_this_host_is_broken(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lock_file = tmp_path / ".doc.lock"
    holder = _hold(lock_file, "soft")
    pid = _soft_lock_content(lock_file)["pid"]
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate()
    assert lock_file.exists()
    with MergeLock(lock_file, "soft", 5):
        assert _soft_lock_content(lock_file)["pid"] == os.getpid()
    assert f"pid {pid}" in caplog.text and "dead" in caplog.text
    assert not lock_file.exists()


def test_soft_lock_of_a_live_holder_is_never_broken(tmp_path: Path) -> None:
    lock_file = tmp_path / ".doc.lock"
    holder = _hold(lock_file, "soft")
    try:
        before = lock_file.read_text()
        with pytest.raises(LockTimeout, match=rf"{lock_file}.*pid {holder.pid}"):
            with MergeLock(lock_file, "soft", 0.5):
                pass
        assert lock_file.read_text() == before
    finally:
        holder.kill()
        holder.communicate()


def test_soft_lock_whose_pid_was_reused_is_stale(tmp_path: Path) -> None:
    """The holder died and its pid now belongs to another process (here: this test)."""
    lock_file = tmp_path / ".doc.lock"
    holder = _hold(lock_file, "soft")
    holder.kill()
    holder.communicate()
    content = _soft_lock_content(lock_file)
    content["pid"] = os.getpid()  # alive, but started at another time than the holder was
    lock_file.write_text(json.dumps(content))
    with MergeLock(lock_file, "soft", 2):
        pass


def test_soft_lock_held_on_another_host_waits_then_breaks_only_when_old(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lock_file = tmp_path / ".doc.lock"
    holder = _hold(lock_file, "soft", where="elsewhere")
    holder.kill()  # from here we cannot tell whether a process on another host is alive
    holder.communicate()
    before = lock_file.read_text()
    with pytest.raises(LockTimeout, match="node-elsewhere"):
        with MergeLock(lock_file, "soft", 0.5):
            pass
    assert lock_file.read_text() == before  # young: never broken
    old = time.time() - FOREIGN_STALE_S - 60
    os.utime(lock_file, (old, old))
    with MergeLock(lock_file, "soft", 2):
        assert _soft_lock_content(lock_file)["pid"] == os.getpid()
    assert "BREAKING THE SOFT LOCK" in caplog.text and "node-elsewhere" in caplog.text


def test_soft_lock_heartbeat_keeps_a_long_merge_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.store import locks as mergelock

    monkeypatch.setattr(mergelock, "HEARTBEAT_S", 0.05)
    lock_file = tmp_path / ".doc.lock"
    with MergeLock(lock_file, "soft", 1):
        old = time.time() - 1000
        os.utime(lock_file, (old, old))
        end = time.monotonic() + 60
        while time.time() - lock_file.stat().st_mtime > 5 and time.monotonic() < end:
            time.sleep(0.01)  # until the heartbeat has refreshed the file
        assert time.time() - lock_file.stat().st_mtime < 5


def test_soft_lock_never_writes_through_a_symlink_planted_at_the_lock_path(tmp_path: Path) -> None:
    """The race of filelock's CVE-2025-68146 and CVE-2026-22701, tried on ours: a link at the
    lock path is a holder it cannot read, waited for, and at worst broken; its target is kept."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    lock_file = tmp_path / ".doc.lock"
    lock_file.symlink_to(victim)
    with pytest.raises(LockTimeout, match="unreadable holder"):
        with MergeLock(lock_file, "soft", 0.3):
            pass
    old = time.time() - FOREIGN_STALE_S - 60
    os.utime(victim, (old, old))  # as old as a holder elsewhere that is gone
    with MergeLock(lock_file, "soft", 2):
        assert not lock_file.is_symlink() and _soft_lock_content(lock_file)["pid"] == os.getpid()
    assert victim.read_text() == "keep me\n" and not lock_file.exists()
