"""No record lost, no false error: what a merge may replace, and the answers to an output or
a terminal that cannot be written, each as a user meets it (a new process per command)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock
import pytest

from orchestrator.store.locks import lock_path_for
from orchestrator.store.partials import read_partial
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import build_sweep, partial_lines, small_spec
from tests.helpers import LAUNCH, assert_one_line_error

from .conftest import REPO, SAMPLE, TINY_SPEC, run_cli


def _records(path: Path) -> list[dict]:
    return json.loads(path.read_text())["results"]


def _two_sweeps(tmp_path: Path) -> tuple[SweepDir, SweepDir, Path]:
    """Sweep A writes results.json; sweep B (another tag) appends its records into it."""
    out = tmp_path / "results.json"
    a, _ = build_sweep(tmp_path / "a", small_spec(n_seqs=1, tag="A"), 2, output=out)
    b, _ = build_sweep(tmp_path / "b", small_spec(n_seqs=1, tag="B", append=True), 2, output=out)
    return a, b, out


def test_a_merge_never_drops_records_of_another_sweep(tmp_path: Path) -> None:
    a, b, out = _two_sweeps(tmp_path)
    assert run_cli("merge", str(a.root)).returncode == 0
    assert run_cli("merge", str(b.root)).returncode == 0  # append: A's records stay
    both = out.read_bytes()
    assert len(json.loads(both)["results"]) == a.planned + b.planned
    # A merged again (append false) would drop B's records: refused, naming how many and whose
    r = run_cli("merge", str(a.root))
    line = assert_one_line_error(
        r,
        f"{out} holds {b.planned} records that are not this sweep's",
        f"of sweep {b.root}",
        "--overwrite",
        "append: true",
    )
    assert out.read_bytes() == both and not (tmp_path / "results.json.prev").exists()
    # `run` refuses before it runs anything, with the same line, its own way out named: --output
    spec = tmp_path / "a.json"
    spec.write_text(json.dumps({**small_spec(n_seqs=1, tag="A"), "output": str(out)}))
    elsewhere = line.replace(f"`tilesweep merge {a.root} --output FILE`", "another `--output FILE`")
    assert elsewhere != line and run_cli("run", str(spec), "--sweep-dir", str(a.root)).stderr.strip() == elsewhere
    # --overwrite replaces it and keeps the old document beside it, and says so
    r = run_cli("merge", str(a.root), "--overwrite")
    assert r.returncode == 0, r.stderr
    assert f"the document it replaced held {a.planned + b.planned} records: kept as {out}.prev" in r.stdout
    assert (tmp_path / "results.json.prev").read_bytes() == both
    assert len(_records(out)) == a.planned
    # merging again over its own output: nothing foreign, nothing kept aside again
    os.unlink(tmp_path / "results.json.prev")
    r = run_cli("merge", str(a.root))
    assert r.returncode == 0 and "kept as" not in r.stdout and not (tmp_path / "results.json.prev").exists()


@pytest.mark.parametrize(
    "content, needle",
    [
        ("sample", "records that are not this sweep's (4 not written by tilesweep)"),
        ("notes", "exists and is not a results document (not valid JSON"),
    ],
)
def test_a_document_tilesweep_did_not_write_is_not_replaced_silently(tmp_path: Path, content: str, needle: str) -> None:
    out = tmp_path / "results.json"
    sd, _ = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=out)
    if content == "sample":
        doc = json.loads(SAMPLE.read_text())
        doc["results"] = doc["results"][:4]
        out.write_text(json.dumps(doc, indent=1))
    else:
        out.write_text("my notes, not json\n")
    before = out.read_bytes()
    assert_one_line_error(run_cli("merge", str(sd.root)), str(out), needle, "--overwrite")
    assert out.read_bytes() == before


def test_fewer_records_keep_the_old_document_and_all_quarantined_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    sd, units = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=out)
    assert run_cli("merge", str(sd.root)).returncode == 0
    full = out.read_bytes()
    # one partial is replaced by another sweep's: quarantined, its records are gone from the merge
    other, _ = build_sweep(tmp_path / "o", small_spec(n_seqs=1, repeats=9), 2, output=tmp_path / "o.json")
    shutil.copy(other.partial_path(other.unit_index()[0]["id"]), sd.partial_path(units[0].id))
    r = run_cli("merge", str(sd.root))
    assert r.returncode == 0, r.stderr
    kept = len(_records(out))
    assert kept < sd.planned and "quarantined 1 partial file " in r.stdout
    assert f"the document it replaced held {sd.planned} records: kept as {out}.prev" in r.stdout
    assert (tmp_path / "results.json.prev").read_bytes() == full
    # now every partial with records is quarantined: nothing is written
    shutil.copy(other.partial_path(other.unit_index()[1]["id"]), sd.partial_path(units[1].id))
    before = out.read_bytes()
    r = run_cli("merge", str(sd.root))
    assert r.returncode == 1, r.stderr  # no document written: a script's `merge && report` stops
    assert "wrote nothing: every partial with records was quarantined" in r.stdout
    assert out.read_bytes() == before and len(list((sd.root / "quarantine").glob("*.jsonl.*"))) == 2


def test_unwritable_output_or_folder_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "results.json"
    sd, _ = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=out)
    assert run_cli("merge", str(sd.root)).returncode == 0
    os.chmod(out, 0o640)
    assert run_cli("merge", str(sd.root)).returncode == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # replacing the output keeps its mode
    before = out.read_bytes()
    subprocess.run(["chattr", "+i", str(out)], check=True)
    try:
        assert_one_line_error(
            run_cli("merge", str(sd.root)),
            f"cannot write {out} (Operation not permitted)",
            "it is unchanged",
            "--output",
        )
    finally:
        subprocess.run(["chattr", "-i", str(out)], check=True)
    beside = {"results.json", ".results.json.lock", ".results.json.keys"}  # the document, its lock, its key index
    assert out.read_bytes() == before and {p.name for p in folder.iterdir()} == beside
    other = folder / "other.json"
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        assert_one_line_error(
            run_cli("merge", str(sd.root), "--output", str(other)),
            f"cannot create the lock file {folder}/.other.json.lock",
            "not writable",
        )
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert not other.exists()
    # what stands in the lock file's way is named: a file where its folder goes, a folder with its name
    (folder / "afile").write_text("")
    r = run_cli("merge", str(sd.root), "--output", str(folder / "afile" / "x.json"))
    assert_one_line_error(r, f"{folder / 'afile'} is a file, where a folder belongs", f"tilesweep merge {sd.root} ")
    (folder / ".other.json.lock").mkdir()
    r = run_cli("merge", str(sd.root), "--output", str(other))
    assert_one_line_error(r, "a directory has its name: move it away")


def test_standard_output_full_or_closed(tmp_path: Path) -> None:
    sd, _ = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=tmp_path / "r.json")
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator", "status", str(sd.root)],
            cwd=REPO,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert_one_line_error(r, "cannot write to standard output: No space left on device")
    # a reader that stops early (| head -1) gets its line; the writer ends quietly, exit 0
    spec = tmp_path / "big.json"
    spec.write_text(json.dumps(small_spec(n_seqs=4)))  # 1,600 plan lines: more than a pipe holds
    cmd = f"{sys.executable} -m orchestrator plan {spec} --dry-run --json | head -1; exit ${{PIPESTATUS[0]}}"
    r = subprocess.run(cmd, shell=True, cwd=REPO, capture_output=True, text=True, executable="/bin/bash")
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith('{"dtype": "bfloat16"')


# ---------------------------------------------------------------------------- Ctrl-C

# The command is launched as a terminal would start it (``helpers.LAUNCH``: SIGINT at its
# default), in a process group of its own that the test interrupts as a terminal does, every
# process of the group at once.


def _lines_of(partial: Path) -> list[dict]:
    out = []
    for line in partial.read_text().splitlines() if partial.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _partial_lines(sweep: Path) -> dict[Path, list[dict]]:
    partials = sorted((sweep / "partials").glob("*.jsonl")) if (sweep / "partials").is_dir() else []
    return {p: _lines_of(p) for p in partials}


def _interrupt_run(
    spec: Path, sweep: Path, ready: Callable[[Path, list[dict[str, Any]]], bool]
) -> subprocess.CompletedProcess[str]:
    """Start `tilesweep run`, press Ctrl-C once ``ready(sweep, lines)`` holds, wait for the end.
    ``lines``: the partial lines this run wrote (those of earlier runs would make it ready
    before the new process has even started its interpreter)."""
    before = {p: len(lines) for p, lines in _partial_lines(sweep).items()}
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "run", str(spec), "--sweep-dir", str(sweep)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if ready(sweep, [obj for p, lines in _partial_lines(sweep).items() for obj in lines[before.get(p, 0) :]]):
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        out, err = proc.communicate()
        pytest.fail(f"the run ended (exit {proc.returncode}) before it could be interrupted:\n{out}\n{err}")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    for _ in range(300):  # every process of the group (controller, worker) is gone
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("processes of the interrupted run are still alive")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_ctrl_c_is_one_line_and_blames_no_config(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(
        modes=["fwd"],
        fwd_block_q=[16, 32, 64],
        fwd_block_k=[16, 32, 64],
        compile={"workers": 2, "cache_dir": "off"},
        executor={"kind": "local", "max_config_attempts": 1},
    )
    sweep = tmp_path / "sweep"
    attempts = [
        lambda sweep, lines: (sweep / "sweep.json").exists(),  # while it plans, before any worker
        lambda sweep, lines: any("start" in o for o in lines),  # while the first window compiles
        lambda sweep, lines: sum("record" in o for o in lines) >= 3,  # while configs are timed
    ]
    for ready in attempts:
        r = _interrupt_run(spec, sweep, ready)
        said = r.stdout + r.stderr
        assert r.returncode == 130 and "Traceback" not in said and "KeyboardInterrupt" not in said, said
        assert r.stderr.splitlines()[-1] == "tilesweep: interrupted; finished records are kept, rerun to continue"
        assert sum("interrupted" in line for line in said.splitlines()) == 1, said
    # every config in flight at each interruption was given up, none counts against it
    partial = next((sweep / "partials").glob("*.jsonl"))
    content = read_partial(partial)
    assert content.attempts >= 2 and not any(n > 0 for n in content.deaths.values())
    assert all(n <= 0 for iid, n in content.starts.items() if iid not in content.records)
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(doc["results"]) == 10 and not [rec for rec in doc["results"] if "error" in rec]


# ---------------------------------------------------------------------------- status agrees with merge


def _status(sweep: Path, code: int = 0) -> dict:
    """``status --json``; ``code``: its exit code (1: a unit ended unfinished, nothing runs it)."""
    r = run_cli("status", str(sweep), "--json")
    assert r.returncode == code, r.stderr
    return json.loads(r.stdout)


def test_status_counts_what_merge_accepts(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug"})  # the config and auto
    sweep = tmp_path / "sweep"
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    st = _status(sweep)
    assert st["complete"] and st["done"] == st["planned"] == 2
    partial = next((sweep / "partials").glob("*.jsonl"))
    whole = partial.read_bytes()
    # the partial is cut in the middle of its last record: the marker no longer vouches for it
    partial.write_bytes(whole[: whole.rstrip(b"\n").rfind(b"\n") + 40])
    st = _status(sweep, code=1)  # the run that ran it has ended: unfinished, for resume
    assert not st["complete"] and st["done"] == 1 and "marker is stale" in st["units"][0]["detail"]
    merged = run_cli("merge", str(sweep))
    assert "merged 1 record (0 errors, 1 of 2 planned missing)" in merged.stdout and "incomplete" in merged.stderr
    # redone: complete again, and the torn line is no longer worth a warning
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    st = _status(sweep)
    assert st["complete"] and st["done"] == 2
    merged = run_cli("merge", str(sweep))
    assert "0 of 2 planned missing" in merged.stdout and merged.stderr == "", merged.stderr
    # a partial of another sweep copied under the unit's name counts for nothing, as in merge
    other, _ = build_sweep(tmp_path / "o", small_spec(n_seqs=1), 1, output=tmp_path / "o.json")
    shutil.copy(other.partial_path(other.unit_index()[0]["id"]), partial)
    st = _status(sweep, code=1)
    assert not st["complete"] and st["done"] == 0 and "not this sweep's" in st["units"][0]["detail"]
    assert "wrote nothing: every partial with records was quarantined" in run_cli("merge", str(sweep)).stdout


# ---------------------------------------------------------------------------- a report that knows it is partial


def test_report_of_an_incomplete_sweep_says_what_is_missing(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    sd, units = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=out, write_partials=[0])
    # unit 1: its worker got through its first shape's autos and a few fwd configs only
    lines = partial_lines(sd, units[1], random.Random(1))
    sd.partial_path(units[1].id).write_text("\n".join(lines[:16]) + "\n")
    assert run_cli("merge", str(sd.root)).returncode == 0
    rows = json.loads(run_cli("report", str(out), "--json").stdout)
    assert len(rows) == 8  # every planned problem has a row, measured or not
    full = [r for r in rows if r["n_missing"] == 0]
    assert len(full) == 4 and all(r["n_planned"] in (90, 8) and "timed" not in r["note"] for r in full)
    partial = [r for r in rows if 0 < r["n_missing"] < r["n_planned"]]
    assert len(partial) == 1 and partial[0]["mode"] == "fwd" and partial[0]["best_label"]
    timed = partial[0]["n_configs"] - partial[0]["n_failed"]
    assert partial[0]["note"].startswith(f"best of {timed}/90 timed")
    assert sum(r["n_missing"] == r["n_planned"] for r in rows) == 1  # its auto ran, none of its configs
    nothing = [r for r in rows if r["note"] == "nothing measured"]  # planned problems without any record
    assert len(nothing) == 2 and all(r["n_missing"] == r["n_planned"] + 1 for r in nothing)  # their autos too
    text = run_cli("report", str(out)).stdout.splitlines()
    assert text[0].split()[-2:] == ["missing", "note"] and f"best of {timed}/90 timed" in "\n".join(text)


# ---------------------------------------------------------------------------- the final merge job (SLURM)


@pytest.mark.slurm
def test_final_merge_job_refuses_the_same_way_and_status_says_why(tmp_path: Path) -> None:
    from tests.slurm_cluster import poll, require_cluster

    require_cluster()
    out = tmp_path / "results.json"
    other = json.loads(SAMPLE.read_text())
    other["results"] = other["results"][:4]
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                **TINY_SPEC,
                "modes": ["fwd"],
                "output": str(out),
                "executor": {
                    "kind": "slurm",
                    "slurm_partition": "gpu",
                    "gpus_per_node": 1,
                    "timeout_min": 5,
                    "merge_partition": "cpu",
                },
            }
        )
    )
    sweep = tmp_path / "sweep"
    # submit refuses such an output up front; another tool writes it while the sweep runs, before
    # the final merge job takes the document's lock (held here until the document is written)
    with filelock.FileLock(str(lock_path_for(out))):
        r = run_cli("submit", str(spec), "--sweep-dir", str(sweep))
        assert r.returncode == 0, r.stderr
        out.write_text(json.dumps(other, indent=1))
    before = out.read_bytes()

    def merge_job_ended() -> dict[str, Any] | None:
        st = json.loads(run_cli("status", str(sweep), "--json").stdout)
        last = st["merge_jobs"][-1] if st["merge_jobs"] else {}
        return st if last.get("error") or last.get("state") == "COMPLETED" else None

    st = poll(merge_job_ended, 400, "the final merge job to end", 1)
    why = f"{out} holds 4 records that are not this sweep's (4 not written by tilesweep)"
    assert st["merge_jobs"][-1]["error"].startswith(why), st["merge_jobs"]
    assert f"failed: {why}" in run_cli("status", str(sweep)).stdout
    assert out.read_bytes() == before
    assert_one_line_error(run_cli("wait", str(sweep)), why, "--overwrite")
    r = run_cli("wait", str(sweep), "--overwrite")
    assert r.returncode == 0, r.stderr
    assert f"the document it replaced held 4 records: kept as {out}.prev" in r.stderr
    assert len(_records(out)) == st["planned"] and (tmp_path / "results.json.prev").read_bytes() == before
