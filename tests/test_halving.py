"""Successive halving (``timing.strategy: halving``): the survivor rule, two rounds run here,
the report that never names a screened record, and a round 2 the merge job could not submit."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis.report import best_table
from orchestrator.planning.halving import margin, survivors
from orchestrator.store.document import from_obj
from tests.conftest import SAMPLE, run_cli
from tests.helpers import REPO, assert_one_line_error

HALVING_SPEC = {
    "dtypes": ["bfloat16"],
    "head_dims": [64],
    "seq_lens": [2048],
    "sharding": {"units": 3},
    "timing": {"strategy": "halving"},
}


def spec_file(tmp_path: Path, executor: dict[str, Any] | None = None) -> Path:
    """bf16 d64 s2048, fwd and fwd_bwd (104 items), replayed from the excerpt, halving."""
    config = json.loads(SAMPLE.read_text())["config"]
    data = {
        **config,
        **HALVING_SPEC,
        "output": str(tmp_path / "results.json"),
        "kernel": {"impl": "replay"},
        "replay": {"source": str(SAMPLE)},
        "executor": executor or {"kind": "debug"},
    }
    path = tmp_path / "halving.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def halved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A halving sweep of ``spec_file`` run here to its end (both rounds, debug executor), for the
    tests that only read it: its folder (the sweep directory ``sweep``, the document
    ``results.json``) and how its ``run`` ended."""
    folder = tmp_path_factory.mktemp("halved")
    return folder, run_cli("run", str(spec_file(folder)), "--sweep-dir", str(folder / "sweep"))


def test_survivors_keep_the_fastest_and_those_within_the_noise() -> None:
    screens = [("a", 1.00), ("b", 1.08), ("c", 1.30), ("d", 1.50), ("e", 2.0)]
    assert survivors(screens, keep=2, noise=0.1) == ["a", "b"]
    assert survivors(screens, keep=1, noise=0.1) == ["a", "b"]  # within 10% of the best
    assert survivors(screens, keep=4, noise=0.0) == ["a", "b", "c", "d"]
    auto = {"median_ms": 1.0, "q1_ms": 0.9, "q3_ms": 1.1}  # a 20% spread: noise judged 40%
    assert margin(0.1, auto) == pytest.approx(0.4)
    assert survivors(screens, keep=1, noise=0.1, auto=auto) == ["a", "b", "c"]
    assert margin(0.1, {"error": "x"}) == 0.1 and survivors([], keep=3, noise=0.1) == []


def test_report_never_names_a_screened_record_best(sample_doc: dict[str, Any]) -> None:
    recs = [r for r in sample_doc["results"] if r["mode"] == "fwd" and r["dtype"] == "bfloat16"]
    fastest = min((r for r in recs if "median_ms" in r and r["config"] == "forced"), key=lambda r: r["median_ms"])
    screened = {**fastest, "median_ms": fastest["median_ms"] / 2, "screened": True}
    doc = {**sample_doc, "results": [screened if r is fastest else r for r in recs]}
    (row,) = best_table(from_obj(doc))
    assert row.best_ms is not None and row.best_ms > screened["median_ms"]
    assert row.n_screened == 1 and "1 screened out" in row.note and row.n_configs == 54


def test_a_problem_merged_between_the_rounds_has_no_full_timing_yet_and_nothing_failed(
    sample_doc: dict[str, Any],
) -> None:
    recs = [r for r in sample_doc["results"] if r["mode"] == "fwd" and r["dtype"] == "bfloat16"]
    screened = [{**r, "screened": True} if r["config"] == "forced" and "median_ms" in r else r for r in recs]
    (row,) = best_table(from_obj({**sample_doc, "results": screened}))
    assert row.best_ms is None and row.n_screened > 0 and row.n_failed < row.n_configs
    assert "no full timing yet" in row.note and "all failed" not in row.note and "screened out" not in row.note


def test_an_export_between_the_rounds_says_no_config_is_timed_in_full_yet_and_writes_no_use_auto(
    tmp_path: Path,
) -> None:
    """A halving sweep (replayed) stopped once round 1 screened every config: auto alone is timed in
    full, so nothing says auto wins. The export writes no "use auto" entry for its problems: it refuses in
    one line that says why, and writes nothing; once round 2 timed the survivors, it exports."""
    from orchestrator.control import dispatch
    from orchestrator.control.rounds import advance
    from orchestrator.control.sweeps import prepare_sweep

    sweep, out = tmp_path / "sweep", tmp_path / "tuned.json"
    sd, unit_ids, _ = prepare_sweep(str(spec_file(tmp_path)), str(sweep), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    assert run_cli("merge", str(sweep)).returncode == 0
    said = assert_one_line_error(
        run_cli("export", str(tmp_path / "results.json"), "--out", str(out), "--include-replays"), "nothing to export"
    )
    assert "the configs of 2 problems in " in said and "not timed in full yet" in said and not out.exists(), said
    second = advance(sd, sd.spec.executor)
    assert second is not None
    assert all(o.ok for o in dispatch.run_units_locally(sd, [u.id for u in second.units], kind="debug"))
    assert run_cli("merge", str(sweep)).returncode == 0
    r = run_cli("export", str(tmp_path / "results.json"), "--out", str(out), "--include-replays")
    assert r.returncode == 0 and ": 2 entries (" in r.stdout and "skipped" not in r.stdout, r.stdout + r.stderr


def test_an_export_while_round_2_has_timed_some_survivors_writes_no_entry_for_their_problems(
    tmp_path: Path,
) -> None:
    """A halving sweep (replayed) merged while round 2 has timed the survivors of one of its units:
    its problems have a best timed in full, but the survivors still waiting may beat it, so their
    best is not known. The export writes no entry for them (of the document alone, or combined with
    a copy) and says why in one line; once round 2 timed every survivor, it exports them."""
    from orchestrator.control import dispatch
    from orchestrator.control.rounds import advance
    from orchestrator.control.sweeps import prepare_sweep

    sweep, doc, out = tmp_path / "sweep", tmp_path / "results.json", tmp_path / "tuned.json"
    sd, unit_ids, _ = prepare_sweep(str(spec_file(tmp_path)), str(sweep), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    second = advance(sd, sd.spec.executor)
    assert second is not None and len(second.units) > 1
    first, *rest = [u.id for u in second.units]
    assert all(o.ok for o in dispatch.run_units_locally(sd, [first], kind="debug"))
    assert run_cli("merge", str(sweep)).returncode == 0
    rows = json.loads(run_cli("report", str(doc), "--json").stdout)
    assert [(row["n_waiting"] > 0, row["best_ms"] is not None) for row in rows] == [(True, True)] * 2, rows
    copy = tmp_path / "copy.json"
    copy.write_bytes(doc.read_bytes())
    for given in ([doc], [doc, copy]):
        r = run_cli("export", *map(str, given), "--out", str(out), "--include-replays")
        said = assert_one_line_error(r, "nothing to export", "the configs of 2 problems in ", "not timed in full yet")
        assert not out.exists(), said
    assert all(o.ok for o in dispatch.run_units_locally(sd, rest, kind="debug"))
    assert run_cli("merge", str(sweep)).returncode == 0
    r = run_cli("export", str(doc), "--out", str(out), "--include-replays")
    assert r.returncode == 0 and ": 2 entries (" in r.stdout and "skipped" not in r.stdout, r.stdout + r.stderr


def test_two_rounds_run_here_and_the_best_is_timed_in_full(
    halved: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    folder, r = halved
    sweep = folder / "sweep"
    assert r.returncode == 0, r.stderr
    assert "round 2:" in r.stderr and "screened out" in r.stdout
    round2 = json.loads((sweep / "round2.json").read_text())
    assert round2["screened"] == 102 and len(round2["problems"]) == 2
    assert all(p["kept"] >= 4 for p in round2["problems"])
    units = json.loads((sweep / "units.json").read_text())
    assert [u.get("round", 1) for u in units] == [1] * 3 + [2] * len(round2["units"])
    doc = json.loads((folder / "results.json").read_text())
    assert len(doc["results"]) == 104 and doc["tilesweep"]["rounds"]["survivors"] == round2["survivors"]
    full = [r for r in doc["results"] if r["config"] == "forced" and not r.get("screened")]
    assert len(full) == round2["survivors"]  # each survivor's newest record is its full one
    assert all(r["attempt"] == 1 for r in full) and {r["unit"] for r in full} <= set(round2["units"])
    for row in best_table(from_obj(doc)):
        best = next(r for r in full if r["mode"] == row.key.mode and r["median_ms"] == row.best_ms)
        assert "screened" not in best
    status = run_cli("status", str(sweep), "--json")
    st = json.loads(status.stdout)
    assert st["complete"] and st["total"] == 104 + round2["survivors"] and st["done"] == st["total"]
    # a round-2 file of the wrong shape is named damaged, as one that is no JSON is
    damaged = tmp_path / "damaged"
    shutil.copytree(sweep, damaged)
    for content in ('{"problems": 5}', "[]", json.dumps({**round2, "survivors": None})):
        (damaged / "round2.json").write_text(content)
        for command in ("status", "merge"):
            assert_one_line_error(run_cli(command, str(damaged)), "round2.json is damaged", "restore the file")


def test_round2_the_merge_job_cannot_submit_is_submitted_by_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where compute nodes have no sbatch, the merge job's hook says so (in the sweep's history
    and in status), and ``resume`` plans and runs round 2."""
    from orchestrator.control import dispatch
    from orchestrator.control.resume import resume_sweep
    from orchestrator.control.rounds import after_merge
    from orchestrator.control.status import format_status, sweep_status
    from orchestrator.control.sweeps import prepare_sweep

    sd, unit_ids, _ = prepare_sweep(str(spec_file(tmp_path, {"kind": "slurm"})), str(tmp_path / "sweep"), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    deferred = after_merge(str(sd.root))
    assert deferred is not None and deferred["round2"] == "deferred"
    text = format_status(sweep_status(sd, query_slurm=False))
    assert "round 2 not planned: the merge job could not submit it (`sbatch` is not on PATH" in text
    assert not (sd.root / "round2.json").exists()
    monkeypatch.undo()
    merged = run_cli("merge", str(sd.root))  # every item has its screen: the document is not final yet
    assert merged.returncode == 0 and "0 of 104 planned missing" in merged.stdout, merged.stderr
    assert "note: the sweep is not done, so neither is this document: round 1 (screening)" in merged.stdout
    assert "round 2 not planned" in merged.stdout
    settings = sd.spec.executor.model_copy(update={"kind": "debug"})
    result = resume_sweep(sd, settings, force=False, units=None, max_array_size=None)
    assert result.next_round is not None and all(o.ok for o in result.outcomes)
    st = sweep_status(sd, query_slurm=False)
    assert st.complete and st.round2 is not None and st.round2_deferred is None


def _screened_only_cells(doc: dict[str, Any], mode: str) -> set[tuple[int, int]]:
    """The heatmap cells (row and column tile) of ``mode`` whose records are all screens."""
    axes = ("block_q", "block_k") if mode == "fwd" else ("bwd_outer", "bwd_inner")
    cells: dict[tuple[int, int], bool] = {}
    for r in doc["results"]:
        if r["mode"] == mode and r["config"] == "forced":
            cell = (r[axes[0]], r[axes[1]])
            cells[cell] = cells.get(cell, True) and r.get("screened") is True
    return {cell for cell, only in cells.items() if only}


def test_a_halving_sweep_reads_the_same_everywhere_and_its_heatmaps_mark_the_screens(
    halved: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """Screened configs are recorded, not missing, in the text, markdown and JSON reports, the
    page, the merge line and status; the page's heatmaps mark the cells timed by a screening
    sample only, and a legend says what the mark means."""
    from tests.test_html import Page

    folder, r = halved
    sweep, out = folder / "sweep", folder / "results.json"
    assert r.returncode == 0, r.stderr
    assert "merged 104 records (0 errors, 0 of 104 planned missing)" in r.stderr
    rows = json.loads(run_cli("report", str(out), "--json").stdout)
    assert [(row["n_planned"], row["n_missing"]) for row in rows] == [(54, 0), (48, 0)]
    assert all(row["n_screened"] > 0 and f"{row['n_screened']} screened out" in row["note"] for row in rows)
    text = run_cli("report", str(out)).stdout.splitlines()
    end = text[0].index("missing") + len("missing")  # a right-aligned column
    assert [line[:end].split()[-1] for line in text[1:3]] == ["0", "0"]
    assert [line.endswith(row["note"]) for line, row in zip(text[1:3], rows, strict=True)] == [True, True]
    md = run_cli("report", str(out), "--markdown").stdout.splitlines()
    at = [c.strip() for c in md[0].split("|")].index("missing")
    assert [line.split("|")[at].strip() for line in md[2:4]] == ["0", "0"]
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert st["complete"] and st["errors"] == 0

    page_path = tmp_path / "page.html"
    assert run_cli("report", str(out), "--html", str(page_path)).returncode == 0
    page = Page(page_path.read_text())
    assert [row[16] for row in page.rows] == ["0", "0"]  # the summary's missing column
    assert "without a record (resume redoes them)" not in page_path.read_text()  # no missing list
    assert "screened: timed by one screening sample only (halving), never a best" in page_path.read_text()
    doc = json.loads(out.read_text())
    for svg, mode in zip(page.svgs, ("fwd", "fwd_bwd"), strict=True):
        screened = _screened_only_cells(doc, mode)
        assert screened and svg.count(">screened</text>") == len(screened)
        assert svg.count("fill='url(#hs)'") == len(screened)

    # merged while round 2 ran (a stop, then merge): a survivor of the screen without its full
    # timing is missing (resume times it), not screened out; faster screens may still win
    full = [r for r in doc["results"] if r["mode"] == "fwd" and r["config"] == "forced" and not r.get("screened")]
    screen = {**full[-1], "screened": True}  # its screen, where its full timing was to replace it
    stopped = {**doc, "results": [screen if r is full[-1] else r for r in doc["results"]]}
    (tmp_path / "stopped.json").write_text(json.dumps(stopped))
    before = rows[0]
    (row, _) = json.loads(run_cli("report", str(tmp_path / "stopped.json"), "--json").stdout)
    assert row["n_waiting"] == 1 and row["n_missing"] == 1 and row["n_screened"] == before["n_screened"]
    assert "1 survivor of the screen not timed in full yet" in row["note"], row["note"]


def test_the_plots_heatmaps_of_a_halving_sweep_mark_the_screens(
    halved: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The plots' heatmaps mark the cells timed by a screening sample only, as the page's do, and
    their legend says what the mark means."""
    from orchestrator.analysis import plots
    from orchestrator.analysis.heatmap import heatmap_data
    from orchestrator.analysis.report import ProblemKey, group_by_problem

    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (the plots extra)")
    doc = json.loads((halved[0] / "results.json").read_text())
    mpl = plots._matplotlib()
    for key, recs in group_by_problem(doc["results"]).items():
        data = heatmap_data(ProblemKey(*key), recs)
        assert data is not None
        fig = plots._heatmap_figure(mpl, data, False)
        marks = [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("screened")]
        assert len(marks) == len(_screened_only_cells(doc, key[5]))
        (legend,) = fig.legends
        assert [t.get_text() for t in legend.get_texts()] == [plots.SCREENED_LEGEND]


def test_items_are_counted_apart_from_the_timings_of_later_rounds(
    halved: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """What a user planned (items) is one count, each later round's timings another: neither
    goes past 100%, in status, its JSON or ls."""
    folder, r = halved
    sweep = folder / "sweep"
    assert r.returncode == 0, r.stderr
    n = json.loads((sweep / "round2.json").read_text())["survivors"]
    lines = run_cli("status", str(sweep)).stdout.splitlines()
    head, (rounds,) = lines[0], [line for line in lines if line.startswith("round 1")]
    assert head == f"{sweep}: 104/104 items done (0 error records), complete"
    assert rounds.startswith(
        f"round 1 (screening): 104/104 items; round 2 (full timing of the survivors): {n}/{n} timings"
    )
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert st["items_done"] == 104 and st["planned"] == 104
    assert st["rounds"] == [{"number": 1, "done": 104, "total": 104}, {"number": 2, "done": n, "total": n}]
    (line,) = run_cli("ls", str(folder)).stdout.splitlines()
    assert line.split()[1:4] == ["104/104", "items", "complete"] and f"(round 2: {n}/{n} timings)" in line, line


def test_every_round_after_the_first_is_counted_on_its_own(tmp_path: Path) -> None:
    """A strategy of more rounds (units of origin round<N>): each round's timings apart."""
    from orchestrator.control.status import format_status, sweep_status
    from orchestrator.planning import Unit
    from orchestrator.store.synthetic import build_sweep, small_spec

    sd, units = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 1)
    items = units[0].items
    for number, chosen in ((2, items[:10]), (3, items[:4])):
        later = Unit(0, chosen, round=number)
        later.finalize()
        sd.add_units([later], origin=f"round{number}")
    st = sweep_status(sd, query_slurm=False)
    text = format_status(st)
    assert text.splitlines()[0].startswith(f"{sd.root}: 400/400 items done"), text
    assert "round 1: 400/400 items, round 2: 0/10 timings, round 3: 0/4 timings" in text, text
    shown = st.to_json()
    assert shown["items_done"] == 400 and shown["done"] == 400 and shown["total"] == 414
    assert [(r["number"], r["done"], r["total"]) for r in shown["rounds"]] == [(1, 400, 400), (2, 0, 10), (3, 0, 4)]


def test_a_round_1_done_with_nothing_to_plan_round_2_says_resume_and_exits_1(tmp_path: Path) -> None:
    """Round 1's units run by hand (or a run stopped as they ended): nothing will plan round 2
    but ``resume``, so status names it and exits 1, as for a unit that needs resume; once
    resume has run it, status exits 0."""
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec_file(tmp_path)), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    worker = subprocess.run([sys.executable, "-m", "jobs.worker", str(sweep), "0"], cwd=REPO, capture_output=True)
    assert worker.returncode == 0, worker.stderr
    r = run_cli("status", str(sweep))
    assert r.returncode == 1, r.stdout
    assert f"round 2 is still to plan: `tilesweep resume {sweep}` plans and runs it" in r.stdout, r.stdout
    assert run_cli("resume", str(sweep)).returncode == 0
    assert run_cli("status", str(sweep)).returncode == 0


def test_a_keep_no_smaller_than_the_grid_is_noted_as_screening_nothing_out(tmp_path: Path) -> None:
    """A ``timing.keep`` at or above every problem's grid keeps every config the screen screens:
    halving then screens them all and times them all in full, more GPU time than ``full``. ``spec``
    and ``plan`` say so; a keep below the grid gets no such note."""
    grid = {"fwd": {"block_q": [64, 128], "block_k": [64], "num_stages": [2], "num_warps": [4]}}
    for keep, noted in ((2, True), (8, True), (1, False)):
        spec = tmp_path / f"keep{keep}.json"
        data = {**HALVING_SPEC, "modes": ["fwd"], "grid": grid, "output": str(tmp_path / "o.json")}
        spec.write_text(json.dumps({**data, "timing": {"strategy": "halving", "keep": keep}}))
        for command in (["spec"], ["plan", "--dry-run"]):
            r = run_cli(*command, str(spec))
            assert r.returncode == 0, r.stderr
            said = [line for line in r.stderr.splitlines() if "screens nothing out" in line]
            assert len(said) == noted, r.stderr
            if noted:
                assert f"timing.keep ({keep}) is at least the 2 configs" in said[0], said
                assert 'timing.strategy "full"' in said[0] and "set timing.keep below 2" in said[0], said
