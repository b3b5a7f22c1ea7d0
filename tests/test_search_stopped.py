"""A search stopped before its end, as a user goes on with it: a resume here says each round it
runs, and an export of the document merged meanwhile (a tuned table, tokamax's tables) says it
holds the best so far. Real commands; a replayed search, or a tiny measured one where the export
reads its own document."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import TINY_SPEC, run_cli
from tests.search_helpers import spec_file

SEARCH_TIMING = {**TINY_SPEC["timing"], "strategy": "search"}


def test_a_resume_here_says_each_round_its_units_make_due_as_run_says_it(tmp_path: Path) -> None:
    """A planned search resumed here runs round 1's units, then each round they make due: it
    says each of those rounds once, in run's line, before the round's units run."""
    spec, sweep = spec_file(tmp_path), tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    r = run_cli("resume", str(sweep))
    assert r.returncode == 0, r.stderr
    rounds = json.loads(run_cli("status", str(sweep), "--json").stdout)["search"]["rounds"]
    assert len(rounds) >= 2, rounds
    said = [line for line in r.stderr.splitlines() if re.match(r"round \d+: ", line)]
    assert [line.split(":")[0] for line in said] == [f"round {n}" for n in range(2, len(rounds) + 1)], r.stderr
    assert all(re.fullmatch(r"round \d+: \d+ problems? still search(es)?: \d+ configs .*", line) for line in said), said


def test_an_export_of_a_search_that_has_not_ended_says_its_entries_are_the_best_so_far(tmp_path: Path) -> None:
    """A search stopped after round 1, merged: its tuned table holds the best of what it measured so
    far, which its next rounds may change; the export says so in one note, of the document alone
    or combined (with another, or for a --device). Once resumed to its end, the export says nothing of it."""
    from orchestrator.control import dispatch
    from orchestrator.control.sweeps import prepare_sweep
    from orchestrator.store.merge import merge
    from orchestrator.store.sweepdir import SweepDir

    sweep, doc, out = tmp_path / "sweep", str(tmp_path / "results.json"), str(tmp_path / "tuned.json")
    spec = tmp_path / "measured.json"  # measured, not replayed: the export reads its one document as it is
    grid = {"fwd_block_q": [16, 32, 64], "fwd_block_k": [16, 32, 64], "seq_lens": [64, 128]}
    spec.write_text(json.dumps({**TINY_SPEC, **grid, "modes": ["fwd"], "output": doc, "timing": SEARCH_TIMING}))
    sd, unit_ids, _ = prepare_sweep(str(spec), str(sweep), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    merge(SweepDir.open(sd.root))  # merged here, as `tilesweep merge` merges it
    kind = json.loads(Path(doc).read_text())["device"]["device_kind"]
    copy = tmp_path / "copy.json"  # another document of the same records: combined with it, as is --device
    copy.write_bytes(Path(doc).read_bytes())
    exports = ([doc], [doc, "--device", kind], [doc, str(copy)])
    for given in exports:
        r = run_cli("export", *given, "--out", out)
        assert r.returncode == 0 and ": 2 entries (" in r.stdout, r.stdout + r.stderr
        notes = [line for line in r.stderr.splitlines() if "has not ended" in line]
        assert notes == [
            "tilesweep: note: the search of 2 problems has not ended: their entries are the best of what it "
            "measured so far, which its next rounds may change (resume its sweep, then export again)"
        ], (given, r.stderr)
    assert run_cli("resume", str(sweep)).returncode == 0
    copy.write_bytes(Path(doc).read_bytes())
    for given in exports:
        r = run_cli("export", *given, "--out", out)
        assert r.returncode == 0 and "has not ended" not in r.stderr, (given, r.stderr)


def test_a_tokamax_export_of_a_search_that_has_not_ended_says_its_tables_hold_what_it_measured_so_far(
    tmp_path: Path,
) -> None:
    """tokamax runs the fastest config of a table's key: where a search of tokamax's kernel has not
    ended, one it has yet to measure may be faster. A replayed search stopped after round 1 (its
    source made up for tokamax's own search space), exported: one note says so; at its end, none."""
    from kernels import tokamax_meta as meta

    pytest.importorskip("tokamax", reason=meta.missing("tokamax's own search space"))
    from orchestrator.control import dispatch
    from orchestrator.control.sweeps import prepare_sweep
    from orchestrator.store import synthetic
    from orchestrator.store.merge import merge
    from orchestrator.store.sweepdir import SweepDir

    problem = {"dtypes": ["bfloat16"], "head_dims": [64], "seq_lens": [256], "modes": ["fwd"], "batch": 1, "heads": 2}
    measured = {**problem, "grid": "tokamax", "kernel": {"impl": "tokamax-mosaic", "device_kind": "NVIDIA H200"}}
    source = tmp_path / "source.json"
    source.write_text(json.dumps(synthetic.document({**measured, "tag": "t"})))
    replay = {"source": str(source), "impl": "tokamax-mosaic"}
    doc, sweep, out = tmp_path / "results.json", tmp_path / "sweep", str(tmp_path / "tables")
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                **measured,
                "kernel": {"impl": "replay", "device_kind": "NVIDIA H200"},
                "replay": replay,
                "output": str(doc),
                "executor": {"kind": "debug"},
                "timing": {"strategy": "search"},
            }
        )
    )
    sd, unit_ids, _ = prepare_sweep(str(spec), str(sweep), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    merge(SweepDir.open(sd.root))  # merged here, as `tilesweep merge` merges it
    export = ("export", str(doc), "--format", "tokamax", "--out", out, "--include-replays", "--keep-slower")
    r = run_cli(*export)
    assert r.returncode == 0 and "wrote " in r.stdout, r.stdout + r.stderr
    notes = [line for line in r.stderr.splitlines() if "has not ended" in line]
    assert notes == [
        "tilesweep: note: the search of 1 problem has not ended: the tables hold the configs it measured so far, "
        "and its next rounds may measure faster ones (resume its sweep, then export again)"
    ], r.stderr
    assert run_cli("resume", str(sweep)).returncode == 0
    r = run_cli(*export)
    assert r.returncode == 0 and "has not ended" not in r.stderr, r.stderr
