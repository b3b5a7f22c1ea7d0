"""An export of results documents combined (several, ``--device``, or replayed ones) tells what
an export of each document alone tells: a problem whose configs are not timed in full yet (a
round still to run, planned configs still to measure) gets no entry, said in one line, beside
the entries of the documents whose sweeps finished; a problem with a best and planned configs
not measured yet is noted as the best so far; each document's outputs are judged by its own
limit; and where no record is of the device asked, the refusal says why. Real sweeps
(replayed), real commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator.store.sweepdir import SweepDir
from tests.helpers import REPO, SAMPLE, assert_one_line_error, run_cli, sample_replay_spec


def _spec(tmp_path: Path, name: str, **over: Any) -> Path:
    """A replayed sweep of the excerpt's measurements, run here in-process."""
    return sample_replay_spec(tmp_path / f"{name}.json", tmp_path / f"{name}.results.json", **over)


def _auto_timed_alone(tmp_path: Path) -> Path:
    """A halving sweep of bf16 d64 s2048 (fwd, fwd_bwd) planned one item per unit, of which only
    the units of auto ran (by hand, as ``plan`` says), merged: auto is timed, round 1's screens of
    the forced configs are still to run."""
    spec = _spec(tmp_path, "halving", dtypes=["bfloat16"], head_dims=[64], seq_lens=[2048])
    spec_data = json.loads(spec.read_text())
    spec.write_text(json.dumps({**spec_data, "timing": {"strategy": "halving"}}))
    sweep = tmp_path / "halving-sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "104").returncode == 0
    sd = SweepDir.open(sweep)  # the units as `plan --dry-run --sweep-dir` lists them
    units = {u["id"]: [it.config for it in sd.unit_items(u["id"])] for u in sd.unit_index()}
    autos = sorted(uid for uid, configs in units.items() if "auto" in configs)
    assert len(autos) == 2 and all(units[u] == ["auto"] for u in autos), units
    for unit in autos:
        worker = [sys.executable, "-m", "jobs.worker", str(sweep), str(unit)]
        assert subprocess.run(worker, cwd=REPO, capture_output=True).returncode == 0
    merged = run_cli("merge", str(sweep))
    assert merged.returncode == 0 and "merged 2 records" in merged.stdout, merged.stdout + merged.stderr
    return tmp_path / "halving.results.json"


def _finished(tmp_path: Path) -> Path:
    """A finished full sweep of another problem (float32 d128 s2048 fwd)."""
    spec = _spec(tmp_path, "full", dtypes=["float32"], head_dims=[128], seq_lens=[2048], modes=["fwd"])
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "full-sweep"))
    assert r.returncode == 0, r.stderr
    return tmp_path / "full.results.json"


def test_a_combined_export_leaves_out_problems_not_timed_in_full_yet_as_an_export_of_their_document_does(
    tmp_path: Path,
) -> None:
    """Auto is timed, the forced configs are not: nothing says auto wins, so no "use auto" entry,
    whether the document is exported alone or combined with a finished one (either order)."""
    stopped, finished, out = _auto_timed_alone(tmp_path), _finished(tmp_path), tmp_path / "tuned.json"
    said = assert_one_line_error(
        run_cli("export", str(stopped), "--out", str(out), "--include-replays"), "nothing to export"
    )
    assert f"the configs of 2 problems in {stopped} are not timed in full yet" in said and not out.exists(), said
    for docs in ([stopped, finished], [finished, stopped]):
        r = run_cli("export", *map(str, docs), "--out", str(out), "--include-replays")
        assert r.returncode == 0, r.stderr
        assert (
            "1 entry (0 tuned, 1 use auto, 1 of them replayed, not measured), 2 problems skipped: their configs "
            "are not timed in full yet, so their best is not known (resume their sweep to time them)"
        ) in r.stdout, r.stdout
        entries = json.loads(out.read_text())["entries"]
        assert [(e["dtype"], e["head_dim"], e["mode"]) for e in entries] == [("float32", 128, "fwd")], entries


def test_an_export_of_a_sweep_stopped_part_way_notes_its_entries_are_the_best_measured_so_far(
    tmp_path: Path,
) -> None:
    """A full sweep of one problem planned in 4 units, of which one ran (by hand) and was merged:
    its entry is the best of what was measured so far, which the configs not measured yet may beat;
    the export says so in one note, alone or combined with a copy. Once every unit ran, it says nothing of it."""
    spec = _spec(tmp_path, "full", dtypes=["float32"], head_dims=[128], seq_lens=[2048], modes=["fwd"])
    sweep, doc, out = tmp_path / "full-sweep", tmp_path / "full.results.json", tmp_path / "tuned.json"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "4").returncode == 0
    worker = [sys.executable, "-m", "jobs.worker", str(sweep), "0"]
    assert subprocess.run(worker, cwd=REPO, capture_output=True).returncode == 0
    assert run_cli("merge", str(sweep)).returncode == 0
    note = (
        "tilesweep: note: 1 problem has planned configs not measured yet: its entry is the best of what was "
        "measured so far, which those may beat (resume the sweep, then export again)"
    )
    copy = tmp_path / "copy.json"  # another document of the same records: combined with it
    copy.write_bytes(doc.read_bytes())
    for docs in ([doc], [doc, copy]):
        r = run_cli("export", *map(str, docs), "--out", str(out), "--include-replays")
        assert r.returncode == 0 and ": 1 entry (" in r.stdout, r.stdout + r.stderr
        assert [line for line in r.stderr.splitlines() if "not measured yet" in line] == [note], r.stderr
    assert run_cli("resume", str(sweep)).returncode == 0
    r = run_cli("export", str(doc), "--out", str(out), "--include-replays")
    assert r.returncode == 0 and "not measured yet" not in r.stderr, r.stderr


def _checked_with(tmp_path: Path, name: str, seq: int, max_rel_err: float, rel_err: float) -> Path:
    """A finished sweep's document (bf16 d64 at ``seq``, fwd and fwd_bwd) whose spec sets
    ``check.max_rel_err``, every record's ``rel_err`` set to ``rel_err`` (a stack that rounds so)."""
    from orchestrator.store import synthetic

    spec = {
        "output": str(tmp_path / name),
        "dtypes": ["bfloat16"],
        "head_dims": [64],
        "seq_lens": [seq],
        "check": {"max_rel_err": max_rel_err},
    }
    doc = synthetic.document(spec)
    doc["results"] = [{**r, "rel_err": rel_err} if "rel_err" in r else r for r in doc["results"]]
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_a_combined_export_judges_each_documents_records_by_its_own_check_max_rel_err(tmp_path: Path) -> None:
    """One sweep allowed a rel_err of 0.1 (above bfloat16's default 0.05), another 0.001: each
    document's records are judged by its own limit, combined as alone; the first's problems are
    exported, the second's (every output above its limit) are not."""
    loose = _checked_with(tmp_path, "loose.json", 1024, 0.1, 0.07)
    strict = _checked_with(tmp_path, "strict.json", 2048, 0.001, 0.002)
    other = _finished(tmp_path)  # a finished sweep of another problem
    out = tmp_path / "tuned.json"
    alone = run_cli("export", str(loose), "--out", str(out))
    assert alone.returncode == 0 and ": 2 entries (2 tuned" in alone.stdout, alone.stdout + alone.stderr
    said = assert_one_line_error(run_cli("export", str(strict), "--out", str(out)), "nothing to export")
    assert "none of them timed" in said, said
    r = run_cli("export", str(loose), str(strict), str(other), "--out", str(out), "--include-replays")
    assert r.returncode == 0 and ": 3 entries (" in r.stdout, r.stdout + r.stderr
    entries = json.loads(out.read_text())["entries"]
    assert sorted((e["dtype"], e["seq"], e["mode"], e["config"] is not None) for e in entries) == [
        ("bfloat16", 1024, "fwd", True),
        ("bfloat16", 1024, "fwd_bwd", True),
        ("float32", 2048, "fwd", False),
    ], entries


def test_documents_with_no_record_of_the_device_asked_say_why_and_name_a_choice_only_where_there_is_one(
    tmp_path: Path,
) -> None:
    """No record of the --device kind: the kinds held are named to choose from (it holds, they
    hold); documents that hold no record say so; records that name no device kind say so and how to
    export them, never "pass --device with one of those" where there are none."""
    sample = json.loads(SAMPLE.read_text())
    kindless = tmp_path / "kindless.json"  # a document another tool wrote, its device block without a kind
    kindless.write_text(json.dumps({**sample, "device": {"jax": sample["device"]["jax"]}}))
    empty = [tmp_path / "empty-a.json", tmp_path / "empty-b.json"]
    for path in empty:
        path.write_text(json.dumps({**sample, "results": []}))
    out = str(tmp_path / "tuned.json")
    said = assert_one_line_error(run_cli("export", str(SAMPLE), "--device", "TPU v5", "--out", out))
    assert said.endswith(f'in {SAMPLE}; it holds "NVIDIA H100": pass --device with one of those'), said
    said = assert_one_line_error(run_cli("export", *map(str, empty), "--out", out))
    assert said == f"tilesweep: error: nothing to export: {empty[0]}, {empty[1]} hold no record; nothing written"
    said = assert_one_line_error(run_cli("export", str(kindless), "--device", "NVIDIA H100", "--out", out))
    assert said == (
        f'tilesweep: error: no record of device "NVIDIA H100" in {kindless}: its records name no device kind '
        "(no device_kind in its device block); export it alone, without --device"
    )
    r = run_cli("export", str(kindless), "--out", out)
    assert r.returncode == 0 and ": 3 entries (" in r.stdout, r.stdout + r.stderr


def test_a_document_naming_no_device_kind_beside_one_that_names_it_exports_the_named_kind_and_says_so(
    tmp_path: Path,
) -> None:
    """A document whose device block names no kind, exported with one that names it, in either
    order: the table is of the named kind (not of no device, every measured record dropped), the
    line names the kind taken and how many records were left out for naming none, and how to
    export those; a kind of a third document is named with the --device that picks it."""
    sample = json.loads(SAMPLE.read_text())
    kindless = tmp_path / "kindless.json"
    kindless.write_text(json.dumps({**sample, "device": {"jax": sample["device"]["jax"]}}))
    n = len(sample["results"])
    for order in ((kindless, SAMPLE), (SAMPLE, kindless)):
        out = tmp_path / "tuned.json"
        r = run_cli("export", *map(str, order), "--out", str(out))
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(out.read_text())["device"]["device_kind"] == "NVIDIA H100"
        assert f'kept the newest of {n} identities of device "NVIDIA H100" (the first device kind they name)' in (
            r.stdout
        ), r.stdout
        assert f"dropped {n} that name no device kind ({n} in {kindless}" in r.stdout, r.stdout
        assert "export it alone, without --device, for a table of them" in r.stdout, r.stdout
        out.unlink()
    a100 = tmp_path / "a100.json"
    a100.write_text(json.dumps({**sample, "device": {**sample["device"], "device_kind": "NVIDIA A100"}}))
    r = run_cli("export", str(SAMPLE), str(a100), "--out", str(tmp_path / "t.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"(\"NVIDIA A100\": {n} in {a100}; --device 'NVIDIA A100' picks it)" in r.stdout, r.stdout


def test_a_tokamax_export_of_a_document_naming_no_device_kind_beside_one_that_names_it_says_how_to_export_it(
    tmp_path: Path,
) -> None:
    """tokamax files its tables by device kind: the records of a document that names none go in no
    table, and the line says so and what makes them exportable, not to export it alone (which
    --format tokamax refuses for naming no device kind)."""
    from orchestrator.store import synthetic

    named, kindless = tmp_path / "named.json", tmp_path / "kindless.json"
    spec = {"dtypes": ["float16"], "head_dims": [64], "seq_lens": [1024], "modes": ["fwd"]}
    kernel = {"impl": "tokamax-triton", "device_kind": "NVIDIA H100"}
    doc = synthetic.document({**spec, "output": str(named), "kernel": kernel})
    named.write_text(json.dumps(doc))
    kindless.write_text(json.dumps({**doc, "device": {"jax": doc["device"]["jax"]}}))
    r = run_cli("export", str(kindless), str(named), "--format", "tokamax", "--out", str(tmp_path / "tables"))
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(doc["results"])
    assert (
        f"dropped {n} that name no device kind ({n} in {kindless}: no device_kind in the device block or the "
        "records; tokamax files its tables by device kind: name the GPU as device_kind in the device block to "
        "export them)"
    ) in r.stdout.splitlines()[0], r.stdout
    said = assert_one_line_error(run_cli("export", str(kindless), "--format", "tokamax", "--out", str(tmp_path / "t")))
    assert "no record names its device kind" in said, said
