"""A large merge parses its partials in worker processes (``store.parse_procs``): the document,
the warnings and the quarantine are byte for byte those of a merge in one process, the workers
really parse (their segments are in the merge cache before the merge reads any), the folder of
claims and the temp files a killed merge leaves are removed by the next one, and a wrong ``TILESWEEP_MERGE_PROCS``
is one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cpus import usable_cpus
from orchestrator.pyproc import module_env
from orchestrator.store import keyindex
from orchestrator.store.parse_procs import ENV, MAX_PROCS, SHARES, _procs, parse_ahead
from orchestrator.store.segments import CACHE_DIR, current
from orchestrator.store.synthetic import build_sweep, small_spec
from tests.crash_events import EVENT_TIMEOUT_S
from tests.helpers import REPO, assert_one_line_error, run_cli, until


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """A sweep of 6 units: one partial with a junk line, one of another sweep."""
    sd, units = build_sweep(tmp_path / "sweep", small_spec(n_seqs=3), 6, output=tmp_path / "one.json")
    with open(sd.partial_path(units[1].id), "a") as f:
        f.write('{"id": "not an item", "attempt": 1, "record": {}}\n')
    other, _ = build_sweep(tmp_path / "other", small_spec(n_seqs=1), 2, output=tmp_path / "other.json", seed=3)
    shutil.copy(other.partial_path(other.unit_index()[0]["id"]), sd.partial_path(units[4].id))
    return sd.root


def test_a_merge_in_worker_processes_writes_what_one_process_writes(damaged: Path, tmp_path: Path) -> None:
    twin = tmp_path / "twin"
    shutil.copytree(damaged, twin)
    one = run_cli("merge", str(damaged), env={ENV: "1"})
    many = run_cli("merge", str(twin), "--output", str(tmp_path / "many.json"), env={ENV: "3"})
    assert one.returncode == 0 and many.returncode == 0, one.stderr + many.stderr
    assert (tmp_path / "many.json").read_bytes().split(b'"tilesweep"')[0] == (tmp_path / "one.json").read_bytes().split(
        b'"tilesweep"'
    )[0]

    def said(text: str) -> list[str]:  # a quarantined file's name holds the time and the merge's pid
        return sorted(re.sub(r"\.\d{4}-\d\d-\d\dT\d{6}Z\.\S+", ".*", line) for line in text.splitlines())

    assert said(many.stderr.replace(str(twin), str(damaged))) == said(one.stderr) and many.stderr, many.stderr
    assert len(list((twin / "quarantine").glob("*.jsonl.*"))) == 1


def test_the_workers_parse_into_the_merge_cache(damaged: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.store.sweepdir import SweepDir

    monkeypatch.setenv(ENV, "2")
    sd = SweepDir.open(damaged)
    units = [e["id"] for e in sd.unit_index()]
    assert not any(current(sd.root, u, sd.partial_path(u)) for u in units)
    calls: list[str] = []  # the merge's turns: the partials it claimed, and those the worker finished, to load

    def here(unit: str) -> None:
        calls.append(unit)
        if len(calls) == 1:  # the merge's first turn lasts until the worker has put a partial into the cache
            end = time.monotonic() + EVENT_TIMEOUT_S
            while not any(current(sd.root, u, sd.partial_path(u)) for u in units if u != unit):
                assert time.monotonic() < end, "the worker never wrote a segment"
                time.sleep(0.005)

    theirs = parse_ahead(sd, units, here)
    assert theirs and set(theirs) < set(calls) and len(calls) == len(set(calls)), (theirs, calls)
    assert all(current(sd.root, u, sd.partial_path(u)) for u in theirs)
    assert set(calls) == set(units)  # each parsed here or loaded here once a worker had parsed it
    assert parse_ahead(sd, list(theirs), here) == set()  # those are current now: nothing to parse again


def _parse_worker_of(pid: int) -> int | None:
    """The pid of a parse worker (``python -P -m orchestrator.store.parse_procs``) the process
    ``pid`` started, if one runs."""
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid and b"orchestrator.store.parse_procs" in command:
            return int(proc.name)
    return None


def test_a_stopped_parse_worker_is_named_and_its_partials_parsed_by_the_merge(damaged: Path, tmp_path: Path) -> None:
    """A worker stopped by SIGSTOP (a Ctrl-Z of its group, a debugger) made the merge wait for
    it forever, silently: the merge says which process is stopped, parses its partials itself,
    ends it, and writes the document a merge in one process writes."""
    twin = tmp_path / "twin"
    shutil.copytree(damaged, twin)
    one = run_cli("merge", str(damaged), env={ENV: "1"})
    assert one.returncode == 0, one.stderr
    merge = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "merge", str(twin), "--output", str(tmp_path / "many.json")],
        cwd=REPO,
        env={**os.environ, ENV: "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    worker: int | None = None
    try:
        until(lambda: _parse_worker_of(merge.pid) is not None, "a parse worker started", merge)
        worker = _parse_worker_of(merge.pid)
        assert worker is not None
        os.kill(worker, signal.SIGSTOP)

        def stopped() -> bool:  # the signal is delivered as the worker runs: it stops, or had ended already
            state = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
            assert state != "Z", "the worker had parsed every partial before it was stopped"
            return state == "T"

        until(stopped, "the worker stopped", merge)
        out, err = merge.communicate(timeout=EVENT_TIMEOUT_S)
    finally:
        if merge.poll() is None:
            merge.kill()
            merge.communicate()
        if worker is not None and Path(f"/proc/{worker}").exists() and _parse_worker_of(merge.pid) == worker:
            os.kill(worker, signal.SIGCONT)
            os.kill(worker, signal.SIGKILL)
    assert merge.returncode == 0, err
    told = [line for line in err.splitlines() if f"parse worker {worker} " in line]
    assert len(told) == 1 and f"is stopped (state T in /proc/{worker}/stat" in told[0], err
    assert "Traceback" not in err and out == one.stdout.replace(f"{damaged.parent}/one.json", f"{tmp_path}/many.json")
    assert not Path(f"/proc/{worker}").exists()  # ended, and collected, by the merge
    assert (tmp_path / "many.json").read_bytes().split(b'"tilesweep"')[0] == (tmp_path / "one.json").read_bytes().split(
        b'"tilesweep"'
    )[0]


_WORKER_IMPORTS = """
import sys
from pathlib import Path
from orchestrator.store.parse_procs import main
root = Path(sys.argv[1])
main([str(root), sys.argv[2], sys.argv[3]])
print(sorted(m for m in ("pydantic", "orchestrator.spec.model") if m in sys.modules))
"""


def test_a_parse_worker_loads_no_spec_model(damaged: Path, tmp_path: Path) -> None:
    """A worker parses partials without the spec model and pydantic, which would double the
    time it takes to start."""
    listing = tmp_path / "shares" / "units.json"
    (listing.parent / "claims").mkdir(parents=True)
    units = [e["id"] for e in json.loads((damaged / "units.json").read_text())]
    listing.write_text(json.dumps(units))
    r = subprocess.run(
        [sys.executable, "-P", "-c", _WORKER_IMPORTS, str(damaged), str(listing), str(tmp_path / "said")],
        cwd=REPO,
        env=module_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    parsed, loaded = r.stdout.splitlines()[:-1], r.stdout.splitlines()[-1]
    assert parsed and all(current(damaged, unit, damaged / "partials" / f"{unit}.jsonl") for unit in parsed)
    assert loaded == "[]"


def test_a_wrong_number_of_merge_processes_is_one_line(damaged: Path) -> None:
    for value in ("many", "0", "-2", "\u00b2"):  # "²" reads as a digit to str.isdigit, not to int()
        r = run_cli("merge", str(damaged), env={ENV: value})
        assert_one_line_error(r, f'{ENV}="{value}": write a number of processes')  # as JSON spells it
    assert not (damaged.parent / "one.json").exists()
    assert json.loads((damaged / "sweep.json").read_text())["output"].endswith("one.json")


@pytest.mark.parametrize("command", ["run", "submit", "resume", "wait"])
def test_a_wrong_number_of_merge_processes_is_said_before_anything_is_measured(
    command: str, damaged: Path, write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """Commands that end in a merge refuse a wrong ``TILESWEEP_MERGE_PROCS`` first: ``run``
    had measured the whole sweep before it said so, and written no document."""
    sweep = tmp_path / "new-sweep"
    args = [str(write_spec()), "--sweep-dir", str(sweep)] if command in ("run", "submit") else [str(damaged)]
    before = sorted(p.name for p in damaged.rglob("*"))
    assert_one_line_error(run_cli(command, *args, env={ENV: "abc"}), f'{ENV}="abc": write a number of processes')
    assert not sweep.exists() and sorted(p.name for p in damaged.rglob("*")) == before


def test_the_number_of_merge_processes_is_capped_and_an_empty_setting_is_none(
    damaged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "99999999999999999999")  # one interpreter a partial, before the cap
    assert _procs(1 << 40) == MAX_PROCS
    monkeypatch.setenv(ENV, " 3 ")
    assert _procs(0) == 3
    monkeypatch.setenv(ENV, "")
    assert _procs(0) == 1 and _procs(1 << 40) == min(len(usable_cpus()), MAX_PROCS)
    r = run_cli("merge", str(damaged), env={ENV: ""})
    assert r.returncode == 0, r.stderr


def test_a_killed_merges_claims_and_temp_files_are_removed_by_the_next_merge(damaged: Path) -> None:
    cache = damaged / CACHE_DIR
    cache.mkdir()
    ended = subprocess.Popen(["true"])
    ended.wait()  # a process that has ended: a merge killed, as far as its pid says
    host = socket.gethostname()

    def left_by(pid: int) -> Path:  # what a merge killed while its processes took turns leaves in the cache
        folder = cache / f"{SHARES}.{host}.{pid}.x1y2z3"
        (folder / "claims").mkdir(parents=True)
        (folder / "units.json").write_text("[]")
        (folder / "claims" / "some-unit").touch()
        return folder

    killed = left_by(ended.pid)
    running = left_by(os.getpid())  # a merge still running: its folder stays
    output = damaged.parent / "one.json"
    temps = [  # the temp files it was writing, named as files.temp_path names them, just now
        p.with_name(f".{p.name}.{host}.{ended.pid}.0123abcd.tmp")
        for p in (output, keyindex.index_path(output), cache / "some-unit.seg")
    ]
    for temp in temps:
        temp.write_bytes(b"half a file")
    r = run_cli("merge", str(damaged), env={ENV: "2"})
    assert r.returncode == 0, r.stderr
    assert not killed.exists() and running.is_dir()
    assert not any(temp.exists() for temp in temps)  # at once: a retry on a full disk needs their space


@pytest.mark.parametrize("procs", ["1", "2"])
def test_a_merge_cache_that_takes_no_file_is_said_once(damaged: Path, tmp_path: Path, procs: str) -> None:
    cache = damaged / CACHE_DIR
    cache.mkdir()
    subprocess.run(["chattr", "+i", str(cache)], check=True)
    try:
        r = run_cli("merge", str(damaged), "--output", str(tmp_path / "doc.json"), env={ENV: procs})
    finally:
        subprocess.run(["chattr", "-i", str(cache)], check=True)
    assert r.returncode == 0, r.stderr
    told = [line for line in r.stderr.splitlines() if f"the merge cache {cache} cannot be written" in line]
    assert len(told) == 1 and "parses every partial again" in told[0], r.stderr
    assert json.loads((tmp_path / "doc.json").read_text())["results"]
