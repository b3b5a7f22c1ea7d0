"""The search strategy (``timing.strategy: search``; its rules: ``tests/test_search_rules.py``): a
replayed search run here round by round and what its document says (the round of each record,
the configs it never measured), a full sweep after it that measures only the rest, the
portfolio of earlier documents, a later round resumed, and bad input."""

from __future__ import annotations

import functools
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis.export import tuned_table
from orchestrator.analysis.html import report_page
from orchestrator.analysis.report import best_table
from orchestrator.spec.records import config_fields
from orchestrator.store.document import load
from tests.helpers import SAMPLE, run_cli
from tests.search_helpers import spec_file

# ---------------------------------------------------------------------------- a search, run here


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(spec, sweep dir) of a replayed search run to its end with ``tilesweep run``."""
    tmp = tmp_path_factory.mktemp("search")
    spec, sweep = spec_file(tmp), tmp / "sweep"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    assert "round 2: " in r.stderr and "never measured" in r.stdout
    (tmp / "run.err").write_text(r.stderr)  # what the run said, its progress bar in a log's lines
    return spec, sweep


def test_the_document_says_per_problem_what_was_measured_in_which_round_and_what_never(
    searched: tuple[Path, Path],
) -> None:
    spec, sweep = searched
    doc = json.loads((spec.parent / "results.json").read_text())
    block = doc["tilesweep"]["search"]
    assert block["ended"] and block["rounds"] >= 2 and len(block["problems"]) == 2
    forced = [r for r in doc["results"] if r["config"] == "forced"]
    assert all(isinstance(r["round"], int) for r in doc["results"] if not r.get("pruned"))
    for p in block["problems"]:
        mine = [r for r in forced if r["mode"] == p["problem"][5]]
        assert p["measured"] == len(mine) == sum(p["measured_in"].values())
        configs = {tuple(r[f] for f in p["fields"]) for r in mine}
        assert not configs & {tuple(c) for c in p["never_measured"]}
        assert len(configs) + len(p["never_measured"]) == (54 if p["problem"][5] == "fwd" else 48)
    assert len(forced) < 0.6 * 102  # the search measured a part of the grid
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert st["complete"] and st["strategy"] == "search" and st["search"]["ended"]
    assert st["done"] == st["total"] == len(doc["results"]) and len(st["search"]["rounds"]) >= 2


def test_status_and_ls_of_a_search_count_the_configs_of_its_grid_it_measured_over_every_round(
    searched: tuple[Path, Path],
) -> None:
    """The search measured a part of the 104 configs of its grid in several rounds: status and ls
    say how many (every round's, as the document holds them), not round 1's items alone."""
    spec, sweep = searched
    measured = len(json.loads((spec.parent / "results.json").read_text())["results"])
    text = run_cli("status", str(sweep)).stdout.splitlines()
    assert text[0] == f"{sweep}: {measured}/104 configs of the grid measured (0 error records), complete", text
    (search,) = [line for line in text if line.startswith("search: ")]
    assert "round 2 (search): " in search and " items" not in search and search.count(" configs") >= 2, search
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)["search"]
    assert st["configs_measured"] == measured and st["grid"] == 104
    (row,) = run_cli("ls", str(sweep.parent)).stdout.splitlines()
    assert row.split()[1:4] == [f"{measured}/104", "configs", "complete"], row
    assert "timings" not in row and "round 2: " in row, row


def test_the_bar_of_run_counts_each_rounds_configs_as_status_says_them(searched: tuple[Path, Path]) -> None:
    """A search's bar (its lines in a log) counts the configs of each round, one bar per round
    named as status names it, each ending on the count status gives ("round 2 (search): 4/4
    configs"); no item is counted."""
    spec, sweep = searched
    said = (spec.parent / "run.err").read_text().splitlines()
    rate = r"\[[0-9:]+<[0-9:?]+, +[0-9.?]+ ?(?:config/s|s/config)\]"  # a slow round reads s/config
    bar = re.compile(r"^(round \d+ \(\w+\)): +\d+%\|[# 0-9]*\| (\d+/\d+ configs) " + rate + "$")
    meters = [(m.group(1), m.group(2)) for line in said if (m := bar.match(line))]
    assert meters and not [line for line in said if "item/s" in line or "%|" in line and not bar.match(line)], said
    last = dict(meters)  # each round's last line
    assert list(last) == sorted(last, key=lambda r: int(r.split()[1])) and len(last) >= 2, meters
    (search,) = [line for line in run_cli("status", str(sweep)).stdout.splitlines() if line.startswith("search: ")]
    rounds = search.removeprefix("search: ").split("; ")[: len(last)]
    assert [f"{r}: {counted}" for r, counted in last.items()] == rounds, (meters, search)


def test_the_report_shows_never_measured_configs_as_such_and_tunes_from_what_was_measured(
    searched: tuple[Path, Path],
) -> None:
    spec, _ = searched
    doc = load(spec.parent / "results.json")
    rows = best_table(doc)
    block = {p["problem"][5]: p for p in doc.extra["tilesweep"]["search"]["problems"]}
    for row in rows:
        never = len(block[row.key.mode]["never_measured"])
        assert row.n_never_measured == never and row.n_missing == 0 and row.n_failed == 0
        assert f"{never} never measured" in row.note and "best of" not in row.note
        assert row.to_json()["n_never_measured"] == never
    page = report_page(doc)
    assert "never measured (the search did not need them" in page and "without a record (resume" not in page
    table, _ = tuned_table(doc, keep_slower=True)
    assert len(table["entries"]) == 2 and all(e["config"] for e in table["entries"])


def test_the_report_of_a_search_that_has_not_ended_says_what_it_has_not_measured_yet(
    searched: tuple[Path, Path], tmp_path: Path
) -> None:
    """A document merged before its search ended (a stop, then ``merge``): what the search has
    not measured may be measured by its next round, so the report and its page say "not measured
    yet", not that the search did not need it."""
    spec, _ = searched
    data = json.loads((spec.parent / "results.json").read_text())
    data["tilesweep"]["search"]["ended"] = False
    for p in data["tilesweep"]["search"]["problems"]:
        p["state"] = "searching"
    (tmp_path / "unended.json").write_text(json.dumps(data))
    doc = load(tmp_path / "unended.json")
    for row in best_table(doc):
        assert "not measured yet (search not ended)" in row.note and "never measured" not in row.note
        assert row.to_json()["search_ended"] is False
    page = report_page(doc)
    assert "not measured yet (the search has not ended" in page and "the search did not need them" not in page


def test_a_full_sweep_of_the_same_spec_measures_only_what_the_search_left_out(
    searched: tuple[Path, Path], tmp_path: Path
) -> None:
    spec, _ = searched
    output = tmp_path / "results.json"  # the search's document, to be extended
    output.write_text((spec.parent / "results.json").read_text())
    data = {**json.loads(spec.read_text()), "timing": {"strategy": "full"}, "output": str(output)}
    full = tmp_path / "full.json"
    full.write_text(json.dumps(data))
    before = len(json.loads(output.read_text())["results"])
    r = run_cli("run", str(full), "--sweep-dir", str(tmp_path / "full"))
    assert r.returncode == 0, r.stderr
    reuse = json.loads((tmp_path / "full" / "reuse.json").read_text())
    assert reuse["reused"] == before
    units = json.loads((tmp_path / "full" / "units.json").read_text())
    assert sum(u["n_items"] for u in units if u["origin"] == "plan") == 104 - before
    rows = best_table(load(output))
    assert all(row.n_configs == (54 if row.key.mode == "fwd" else 48) and not row.n_never_measured for row in rows)


# ---------------------------------------------------------------------------- portfolio, resume, bad input


def test_round_1_starts_from_the_winners_of_earlier_documents_of_this_kernel_and_device(
    searched: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The search's fwd problem under another tag (another problem, on the same device), searched
    with the first search's document as a reuse source: its design starts with that document's
    fwd winner. A document of another kernel implementation is said once and ignored."""
    from orchestrator.control.sweeps import prepare_sweep

    spec, _ = searched
    doc = json.loads((spec.parent / "results.json").read_text())
    other = tmp_path / "jax.json"
    jax_config = {**doc["config"], "kernel": {"impl": "jax"}}
    other.write_text(
        json.dumps({**doc, "config": jax_config, "results": [{**r, "impl": "jax"} for r in doc["results"]]})
    )
    again = spec_file(tmp_path, "again.json", tag="again", modes=["fwd"], output=str(tmp_path / "again.results.json"))
    with caplog.at_level(logging.WARNING):
        sd, _, _ = prepare_sweep(str(again), str(tmp_path / "again"), None, None, reuse=_reuse(spec.parent, other))
    record = json.loads((sd.root / "search" / "round1.json").read_text())
    (problem,) = record["problems"]
    assert problem["portfolio"] == 1 and problem["space_filling"] == 5 and problem["measured"] == 6
    fwd_winner = next(c for c in record["portfolio"]["configs"]["fwd tilesweep"])
    assert fwd_winner["wins"] == 1 and record["portfolio"]["sources"] == [str(spec.parent / "results.json")]
    ignored = [m for m in caplog.messages if "not used as the search's portfolio" in m]
    assert len(ignored) == 1 and "kernel implementation jax (this sweep's: tilesweep)" in ignored[0]


def _reuse(folder: Path, *extra: Path) -> Any:
    from orchestrator.control.reuseplan import ReuseRequest

    return ReuseRequest(documents=[str(folder / "results.json"), *map(str, extra)])


def test_a_later_round_with_a_unit_that_never_ran_is_resumed_in_that_round(tmp_path: Path) -> None:
    from orchestrator.control import dispatch
    from orchestrator.control.resume import resume_sweep
    from orchestrator.control.rounds import advance
    from orchestrator.control.status import sweep_status
    from orchestrator.control.sweeps import prepare_sweep

    sd, unit_ids, _ = prepare_sweep(str(spec_file(tmp_path)), str(tmp_path / "sweep"), None, None)
    run = functools.partial(dispatch.run_units_locally, sd, kind="debug")
    assert all(o.ok for o in run(unit_ids))
    second = advance(sd, sd.spec.executor)
    assert second is not None and second.number == 2 and len(second.units) == 2
    assert all(o.ok for o in run([second.units[0].id]))  # the other unit of round 2 never runs
    st = sweep_status(sd, query_slurm=False)
    assert not st.complete and st.search_pending
    result = resume_sweep(sd, sd.spec.executor, force=False, units=None, max_array_size=None)
    assert {u.round for u in result.new_units} == {2}
    assert [it.id for it in result.plan.later[2]] == [it.id for it in second.units[1].items]
    assert not result.plan.missing  # the configs no round chose are not missing
    st = sweep_status(sd, query_slurm=False)
    assert st.complete and st.search_end is not None


def test_status_of_a_search_run_here_names_who_plans_its_next_round_and_where_it_ends(tmp_path: Path) -> None:
    from orchestrator.control import dispatch
    from orchestrator.control.rounds import advance
    from orchestrator.control.status import format_status, sweep_status
    from orchestrator.control.sweeps import prepare_sweep

    spec = spec_file(tmp_path, search={"max_rounds": 2})
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    run = functools.partial(dispatch.run_units_locally, sd, kind="debug")
    assert all(o.ok for o in run(unit_ids[:1]))
    text = format_status(sweep_status(sd, query_slurm=False))
    here = (
        "round 2 is planned once round 1 is complete (by the `tilesweep run` or `tilesweep resume` that runs it here)"
    )
    assert here in text and "final merge job" not in text, text
    assert all(o.ok for o in run(unit_ids[1:]))
    second = advance(sd, sd.spec.executor)
    assert second is not None and all(o.ok for o in run([second.units[0].id]))
    text = format_status(sweep_status(sd, query_slurm=False))
    assert "the search ends once round 2 is complete (search.max_rounds: 2)" in text and "round 3" not in text, text


def test_a_round_the_merge_job_cannot_submit_is_said_by_status_and_planned_by_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.control import dispatch
    from orchestrator.control.resume import resume_sweep
    from orchestrator.control.rounds import after_merge
    from orchestrator.control.status import format_status, sweep_status
    from orchestrator.control.sweeps import prepare_sweep

    spec = spec_file(tmp_path, executor={"kind": "slurm"}, search={"max_rounds": 2})
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    deferred = after_merge(str(sd.root))
    assert deferred is not None and deferred["round2"] == "deferred"
    text = format_status(sweep_status(sd, query_slurm=False))
    assert "round 2 not planned: the merge job could not submit it (`sbatch` is not on PATH" in text, text
    monkeypatch.undo()
    settings = sd.spec.executor.model_copy(update={"kind": "debug"})
    result = resume_sweep(sd, settings, force=False, units=None, max_array_size=None)
    assert result.next_round is not None and all(o.ok for o in result.outcomes)
    st = sweep_status(sd, query_slurm=False)
    assert st.complete and st.search_end is not None and st.search_deferred is None


def test_a_screened_search_times_in_full_only_the_survivors_of_each_rounds_screen(tmp_path: Path) -> None:
    from orchestrator.cli.common import round_note
    from orchestrator.control import dispatch
    from orchestrator.control.rounds import run_rounds_here
    from orchestrator.control.status import format_status, sweep_status
    from orchestrator.control.sweeps import prepare_sweep
    from orchestrator.store.merge import merge

    spec = spec_file(tmp_path, search={"screen": True, "max_rounds": 2}, timing={"strategy": "search", "keep": 2})
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    run = functools.partial(dispatch.run_units_locally, sd, kind="debug")
    run(unit_ids)
    said: list[str] = []
    run_rounds_here(sd, sd.spec.executor, run, on_round=lambda nxt: said.append(round_note(nxt)))
    kinds = [json.loads((sd.root / "search" / f"round{n}.json").read_text())["kind"] for n in (1, 2, 3, 4)]
    assert kinds == ["design", "survivors", "search", "survivors"] and (sd.root / "search" / "end.json").exists()
    # one numbering told in the other's words: the search's rounds (measured_in) and the units' (a record's round)
    assert [line.split(":")[0] for line in said] == [
        "round 2 (round 1 of the search",
        "round 3 (round 2 of the search",
        "round 4 (round 2 of the search",
    ], said
    assert "its survivors): " in said[0] and "its screen): " in said[1] and "its survivors): " in said[2], said
    st = sweep_status(sd, query_slurm=False)
    assert "ended after 2 rounds (4 rounds of units: " in format_status(st)
    doc = load(merge(sd).output)
    assert st.configs_measured == len(doc.results) < st.done  # a survivor timed in full is no second config
    screened = [r for r in doc.results if r.get("screened")]
    assert screened and {r["round"] for r in screened} <= {1, 3}
    assert all(r["round"] in (2, 4) for r in doc.results if r["config"] == "forced" and not r.get("screened"))
    for row in best_table(doc):
        assert row.n_screened > 0 and row.best_ms is not None  # the best is one timed in full


def test_a_search_of_jax_stock_kernel_searches_its_own_grid(tmp_path: Path) -> None:
    """A replayed search of jax's stock kernel (the excerpt relabelled as its measurements):
    every record is of that implementation, and measured plus never measured make its grid (its
    backward ignores num_stages, so its fwd_bwd grid is smaller than ours)."""
    sample = json.loads(SAMPLE.read_text())
    source = tmp_path / "jax-source.json"
    jax_config = {**sample["config"], "kernel": {"impl": "jax"}}
    source.write_text(
        json.dumps({**sample, "config": jax_config, "results": [{**r, "impl": "jax"} for r in sample["results"]]})
    )
    spec = spec_file(tmp_path, replay={"source": str(source), "impl": "jax"})
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert {rec.get("impl") for rec in doc["results"]} == {"jax"}
    sizes = {}
    for p in doc["tilesweep"]["search"]["problems"]:
        measured = {
            tuple(rec[f] for f in p["fields"])
            for rec in doc["results"]
            if rec["config"] == "forced" and rec["mode"] == p["problem"][5]
        }
        sizes[p["problem"][5]] = len(measured) + len(p["never_measured"])
        assert p["measured"] == len(measured) and p["never_measured"]
    assert sizes == {"fwd": 54, "fwd_bwd": 24}


def test_a_search_records_the_pruned_configs_and_never_counts_them_as_not_measured(tmp_path: Path) -> None:
    """f32 d128 fwd: the shared-memory model prunes 8 of its 54 configs. Round 1 records them as
    pruned (a record line that names no round: nothing measured it), and the search neither
    measures them nor lists them as never measured."""
    spec = spec_file(tmp_path, dtypes=["float32"], head_dims=[128], modes=["fwd"])
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    (p,) = doc["tilesweep"]["search"]["problems"]
    pruned = {tuple(rec[f] for f in p["fields"]) for rec in doc["results"] if rec.get("pruned")}
    timed = {tuple(rec[f] for f in p["fields"]) for rec in doc["results"] if rec["config"] == "forced"} - pruned
    assert len(pruned) == 8 and not [rec for rec in doc["results"] if rec.get("pruned") and "round" in rec]
    assert not pruned & {tuple(c) for c in p["never_measured"]} and p["measured"] == len(timed)
    assert len(pruned) + len(timed) + len(p["never_measured"]) == 54


def test_a_document_of_another_device_kind_is_said_once_and_left_out_of_the_portfolio(
    searched: tuple[Path, Path], tmp_path: Path
) -> None:
    spec, _ = searched
    doc = json.loads((spec.parent / "results.json").read_text())
    doc["tilesweep"]["env"]["device_kind"] = "NVIDIA A100-SXM4-80GB"
    a100 = tmp_path / "a100.json"
    a100.write_text(json.dumps(doc))
    again = spec_file(tmp_path, "again.json", tag="again", output=str(tmp_path / "again.results.json"))
    r = run_cli("plan", str(again), "--sweep-dir", str(tmp_path / "again"), "--reuse", str(a100))
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "not used as the search's portfolio" in line]
    assert len(said) == 1 and "device NVIDIA A100-SXM4-80GB (this sweep's: NVIDIA H100)" in said[0], r.stderr
    record = json.loads((tmp_path / "again" / "search" / "round1.json").read_text())
    assert record["portfolio"]["sources"] == [] and all(p["portfolio"] == 0 for p in record["problems"])


def test_a_search_again_counts_the_records_it_carries_as_measured(searched: tuple[Path, Path], tmp_path: Path) -> None:
    """The same search again into the first one's document: reuse carries every record, round 1
    has nothing left to measure, and what a later round measures is new configs only."""
    spec, _ = searched
    output = tmp_path / "results.json"
    output.write_text((spec.parent / "results.json").read_text())
    before = json.loads(output.read_text())["results"]
    again = spec_file(tmp_path, "again.json")
    r = run_cli("run", str(again), "--sweep-dir", str(tmp_path / "again"))
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "again" / "search" / "round1.json").read_text())
    forced = [r for r in before if r["config"] == "forced"]  # each problem's auto is carried too
    assert record["planned"] == 0 and sum(p["carried"] for p in record["problems"]) == len(forced)
    doc = json.loads(output.read_text())
    seen = {(r["mode"], *(r[f] for f in config_fields(r["mode"]))) for r in forced}
    new = [r for r in doc["results"] if "reused_from" not in r and r["config"] == "forced"]
    assert new and all((r["mode"], *(r[f] for f in config_fields(r["mode"]))) not in seen for r in new)
    # round 1 measured nothing itself, all of it carried: it still counts, as status counts it
    block = doc["tilesweep"]["search"]
    measured_in = {k for p in block["problems"] for k in p["measured_in"]}
    end = json.loads((tmp_path / "again" / "search" / "end.json").read_text())
    assert block["rounds"] == len(measured_in) == end["search_round"], (block, end["search_round"])
