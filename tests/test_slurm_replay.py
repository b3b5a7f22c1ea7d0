"""Replayed sweeps on the real local SLURM cluster: a full-size sweep, and successive halving
across units and tasks, cancelled in each round and resumed.

Replay (``kernel.impl: replay``) makes the workers answer from a results document instead of
compiling and timing, so sweeps of thousands of items run in seconds while everything around
them is real: plan, job arrays, partials, the final merge job, round 2, resume, report.
Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis.report import best_table
from orchestrator.spec.files import spec_from_data
from orchestrator.store.document import from_obj, load
from orchestrator.store.scaled import scaled_document
from tests.conftest import SAMPLE, run_cli
from tests.slurm_cluster import poll, require_cluster

pytestmark = pytest.mark.slurm

# Replays need no GPU: tasks on the cpu partition, one CPU each.
EXECUTOR = {"kind": "slurm", "slurm_partition": "cpu", "cpus_per_task": 1, "timeout_min": 5, "merge_partition": "cpu"}


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def write(folder: Path, name: str, source: Path, executor: dict[str, Any], **over: Any) -> Path:
    config = json.loads(SAMPLE.read_text())["config"]
    data = {
        **config,
        "output": str(folder / f"{Path(name).stem}.results.json"),
        "kernel": {"impl": "replay"},
        "replay": {"source": str(source)},
        "executor": {**EXECUTOR, **executor},
        **over,
    }
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def cli(*args: str) -> Any:
    r = run_cli(*args, timeout=300)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def status(sweep: Path) -> dict[str, Any]:
    r = run_cli("status", str(sweep), "--json", timeout=300)
    doc = json.loads(r.stdout)
    # exit 1 when some unit ended without finishing and nothing took its items over
    failed = [u for u in doc["units"] if u["state"] in ("failed", "cancelled", "timed out") and not u["resumed"]]
    # or when every unit is done, its document is not merged and no final merge job will merge it
    unmerged = doc["complete"] and not doc["merged"] and doc["merging"] is None
    assert r.returncode == (1 if failed or unmerged else 0), r.stderr
    return doc


def test_a_replayed_full_size_sweep_completes_merges_and_reports(tmp_path: Path) -> None:
    """5,408 items (the reference grid at 13 seq lengths) in 4 units, 4 array tasks: 1,352 items a task."""
    seqs = [1024 * k for k in range(1, 14)]
    excerpt = load(SAMPLE)
    source = tmp_path / "source.json"
    source.write_text(json.dumps(scaled_document(spec_from_data({**excerpt.config, "seq_lens": seqs}), excerpt)))
    spec = write(tmp_path, "big.json", source, {}, seq_lens=seqs, sharding={"units": 4})
    sweep = tmp_path / "sweep"
    dry = cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run")  # tasks on the cpu partition
    assert "in 4 units, 4 tasks of up to 1 unit (no GPU asked for)" in dry.stdout, dry.stdout.splitlines()[0]
    r = cli("run", str(spec), "--sweep-dir", str(sweep))
    assert "merged 5408 records" in r.stderr and "0 of 5408 planned missing" in r.stderr
    st = status(sweep)
    assert st["complete"] and st["done"] == 5408 and len(st["units"]) == 4
    assert all(u["state"] == "done" and u["executor"] == "slurm" for u in st["units"])
    doc = json.loads((tmp_path / "big.results.json").read_text())
    assert len(doc["results"]) == 5408 and len({r["unit"] for r in doc["results"]}) == 4
    assert sum("error" in rec for rec in doc["results"]) == sum(
        "error" in rec for rec in json.loads(source.read_text())["results"]
    )
    rows = [line for line in r.stdout.splitlines() if line.startswith(("bfloat16", "float32"))]
    table = best_table(from_obj(doc))
    assert len(rows) == len(table) == 2 * 2 * 13 * 2 and all(row.best_ms is not None for row in table)


def _round_units(sweep: Path, round_: int) -> list[dict[str, Any]]:
    return [u for u in json.loads((sweep / "units.json").read_text()) if u.get("round", 1) == round_]


def _arrays(sweep: Path, origin: str) -> list[str]:
    """The arrays the sweep's history says ``origin`` (submit, resume, round2) submitted."""
    entries = map(json.loads, (sweep / "jobs.jsonl").read_text().splitlines())
    return list(dict.fromkeys(str(e["array_id"]) for e in entries if e.get("origin") == origin and "array_id" in e))


def _release(sweep: Path, origin: str, *, first_only: bool = False) -> None:
    """Release the held tasks of ``origin``'s arrays (the spec submits them held): every task,
    or the first task of each alone, so that the round's other units cannot run before a cancel."""
    for array in _arrays(sweep, origin):
        done = subprocess.run(
            ["scontrol", "release", f"{array}_0" if first_only else array], capture_output=True, text=True
        )
        assert done.returncode == 0 or "has already finished" in done.stderr, (array, done.stdout, done.stderr)


def _cancel_after_first_done(sweep: Path, round_: int, origin: str) -> None:
    """Let the first unit of ``origin``'s arrays (submitted held) run, then cancel the sweep's
    arrays: the round's other units, still held, never ran."""

    def first_done() -> bool:
        ids = {u["id"] for u in _round_units(sweep, round_)}
        return bool(ids & {p.stem for p in (sweep / "done").glob("*.json")})

    _release(sweep, origin, first_only=True)
    poll(first_done, 120, f"a unit of round {round_} to finish", interval=0.1)
    r = cli("cancel", str(sweep))
    assert "cancelled job array" in r.stdout, r.stdout
    st = poll(lambda: (lambda s: s if s["settled"] else None)(status(sweep)), 120, "the cancelled arrays to settle")
    assert not st["complete"] and any(u["state"] == "cancelled" and u["round"] == round_ for u in st["units"])


def test_halving_across_units_cancelled_in_each_round_and_resumed(tmp_path: Path) -> None:
    """Round 1 of 3 units: cancelled after its first unit, resumed; the resume's final merge job
    plans and submits round 2 with nobody waiting; round 2 cancelled after its first unit,
    resumed, waited for: the document is complete and every best config was timed in full. The
    arrays are submitted held (sbatch --hold), and the test releases what may run, so no unit
    can finish before a cancel, however fast the machine."""
    spec = write(
        tmp_path,
        "halving.json",
        SAMPLE,
        {"slurm_array_parallelism": 1, "slurm_additional_parameters": {"hold": True}},
        dtypes=["bfloat16"],
        head_dims=[64],
        seq_lens=[2048],
        sharding={"units": 3},
        timing={"strategy": "halving", "keep": 3},
    )
    sweep = tmp_path / "sweep"
    r = cli("submit", str(spec), "--sweep-dir", str(sweep))
    assert "then plans and submits round 2" in r.stdout
    _cancel_after_first_done(sweep, 1, "submit")
    r = cli("resume", str(sweep))
    assert "new unit" in r.stdout
    _release(sweep, "resume")
    # nobody waits: the resume's final merge job plans round 2 and submits it
    poll(lambda: (sweep / "round2.json").exists() and _round_units(sweep, 2), 180, "the merge job to plan round 2")
    poll(
        lambda: any(
            json.loads(line).get("origin") == "round2" for line in (sweep / "jobs.jsonl").read_text().splitlines()
        ),
        60,
        "round 2's array to be submitted by the merge job",
    )
    _cancel_after_first_done(sweep, 2, "round2")
    r = cli("resume", str(sweep))
    assert "survivors of round 2 are not timed in full yet" in r.stdout, r.stdout
    _release(sweep, "resume")
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert "merged 104 records" in w.stderr and "screened out" in w.stdout
    st = status(sweep)
    assert st["complete"] and st["done"] == st["total"] == 104 + st["round2"]["survivors"]
    resumed = {
        e["unit"]
        for e in map(json.loads, (sweep / "jobs.jsonl").read_text().splitlines())
        if e.get("origin") == "resume"
    }  # a unit of either round, new or resubmitted as it was
    assert resumed & {u["id"] for u in _round_units(sweep, 1)} and resumed & {u["id"] for u in _round_units(sweep, 2)}
    doc = json.loads((tmp_path / "halving.results.json").read_text())
    full = [r for r in doc["results"] if r["config"] == "forced" and "screened" not in r]
    assert len(full) == st["round2"]["survivors"]  # every survivor's newest record is timed in full
    for row in best_table(from_obj(doc)):
        assert any(r["mode"] == row.key.mode and r["median_ms"] == row.best_ms for r in full), row


def test_an_extended_sweep_cancelled_and_resumed_on_slurm_measures_only_what_is_new(tmp_path: Path) -> None:
    """A replayed sweep's document, then the same spec with one more block_k submitted to SLURM
    into it (append): cancelled after its first unit, resumed, waited for. The records the
    document held are carried (the reuse unit is done from the start, resume leaves it alone),
    the workers answer exactly the items without a reusable record."""
    out = tmp_path / "results.json"
    grid = {
        "dtypes": ["bfloat16"],
        "head_dims": [64],
        "seq_lens": [2048],
        "modes": ["fwd"],
        "append": True,
        "output": str(out),
    }
    first = write(tmp_path, "first.json", SAMPLE, {"kind": "debug"}, fwd_block_k=[32, 64], **grid)
    cli("run", str(first), "--sweep-dir", str(tmp_path / "first"))
    held = {"slurm_array_parallelism": 1, "slurm_additional_parameters": {"hold": True}}  # as the halving test's
    extended = write(tmp_path, "extended.json", SAMPLE, held, sharding={"units": 3}, **grid)
    sweep = tmp_path / "sweep"
    dry = cli("submit", str(extended), "--sweep-dir", str(sweep), "--dry-run")  # plans as submit does
    assert not sweep.exists()
    r = cli("submit", str(extended), "--sweep-dir", str(sweep))
    reused = json.loads((sweep / "reuse.json").read_text())["reused"]
    line = (
        f"reused {reused} items recorded before (not measured again; {reused} of them replayed, not measured): "
        f"{reused} from {out}"
    )
    assert line in r.stdout and line in dry.stdout and f"{sweep}: 55 items in 3 units" in dry.stdout
    _cancel_after_first_done(sweep, 1, "submit")
    r = cli("resume", str(sweep))
    assert "new unit" in r.stdout
    _release(sweep, "resume")
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert "merged 55 records" in w.stderr and "0 of 55 planned missing" in w.stderr
    units = json.loads((sweep / "units.json").read_text())
    (reuse_unit,) = [u for u in units if u["origin"] == "reuse"]
    partials = [sweep / "partials" / f"{u['id']}.jsonl" for u in units if u is not reuse_unit]
    answered = [  # a unit cancelled before it started has no partial: resume gave its items a new unit
        json.loads(line)["id"]
        for path in partials
        if path.exists()
        for line in path.read_text().splitlines()
        if '"record"' in line
    ]
    carried = {
        json.loads(line)["id"]
        for line in (sweep / "partials" / f"{reuse_unit['id']}.jsonl").read_text().splitlines()
        if '"record"' in line
    }
    assert len(carried) == reused == reuse_unit["n_items"] and not carried & set(answered)
    assert len(set(answered)) == 55 - reused  # every other item, once or (the cancelled unit's) again
    doc = json.loads(out.read_text())
    assert len(doc["results"]) == 55 and sum("reused_from" in rec for rec in doc["results"]) == reused
    assert all(rec.get("block_k") != 128 for rec in doc["results"] if "reused_from" in rec)
    assert status(sweep)["complete"]


def test_a_search_submitted_and_walked_away_from_runs_every_round_from_its_merge_jobs(tmp_path: Path) -> None:
    """``submit`` and nobody waiting: each round's final merge job plans and submits the next
    round of the search, and the last one merges the ended search's document."""
    spec = write(
        tmp_path,
        "search.json",
        SAMPLE,
        {},
        dtypes=["bfloat16"],
        head_dims=[64],
        seq_lens=[2048],
        sharding={"units": 2},
        timing={"strategy": "search"},
        search={"max_rounds": 3},
    )
    sweep = tmp_path / "sweep"
    r = cli("submit", str(spec), "--sweep-dir", str(sweep))
    assert "then plans and submits round 2 (search)" in r.stdout, r.stdout
    poll(lambda: (sweep / "search" / "end.json").exists(), 300, "the merge jobs to run the search to its end")
    st = poll(lambda: (lambda s: s if s["complete"] and s["settled"] else None)(status(sweep)), 120, "the last round")
    origins = {json.loads(line).get("origin") for line in (sweep / "jobs.jsonl").read_text().splitlines()}
    assert {"submit", "round2", "round3"} <= origins and st["search"]["ended"]
    doc = poll(lambda: _merged_search(tmp_path / "search.results.json"), 120, "the final merge of the last round")
    assert doc["tilesweep"]["search"]["rounds"] == 3 and len(doc["results"]) == st["total"]
    # wait, come back to later, finds the search ended and says what it never measured
    assert "never measured" in cli("wait", str(sweep), "--interval", "0.5").stdout


def _merged_search(path: Path) -> dict[str, Any] | None:
    """The document once a merge of the ended search wrote it."""
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    block = doc.get("tilesweep", {}).get("search")
    return doc if block is not None and block["ended"] else None


def test_a_slurm_run_whose_every_item_is_reused_merges_and_reports_without_submitting(tmp_path: Path) -> None:
    """Everything the output document holds already: ``run`` on SLURM submits nothing, says so,
    merges and shows the table (exit 0), as a local run does."""
    # bfloat16 only: no config the shared-memory model prunes (pruned items are planned again)
    here = write(tmp_path, "here.json", SAMPLE, {"kind": "local"}, dtypes=["bfloat16"])
    cli("run", str(here), "--sweep-dir", str(tmp_path / "first"))
    first = (tmp_path / "here.results.json").read_bytes()
    there = write(tmp_path, "there.json", SAMPLE, {}, dtypes=["bfloat16"], output=str(tmp_path / "here.results.json"))
    r = cli("run", str(there), "--sweep-dir", str(tmp_path / "second"), "--reuse-errors")
    assert "nothing to submit" in r.stderr and "0 of" in r.stderr and "planned missing" in r.stderr, r.stderr
    assert "best" in r.stdout  # the best-config table
    jobs = (tmp_path / "second" / "jobs.jsonl").read_text() if (tmp_path / "second" / "jobs.jsonl").exists() else ""
    assert '"slurm"' not in jobs, jobs
    doc = json.loads((tmp_path / "here.results.json").read_text())
    assert len(doc["results"]) == len(json.loads(first)["results"])
    # a dry run of the complete sweep says what submit would: nothing to submit, no script
    dry = cli("submit", str(there), "--sweep-dir", str(tmp_path / "second"), "--dry-run")
    assert "nothing to submit" in dry.stdout and "sbatch script" not in dry.stdout, dry.stdout
