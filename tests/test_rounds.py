"""Advancing a sweep to its next round (``control.rounds``) for a strategy of more than two
rounds: a stand-in strategy of three, plugged in where a real one would be, run by the real
advance, the real units and the real (replaying) workers."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from orchestrator.control import dispatch, rounds
from orchestrator.control.status import sweep_status
from orchestrator.control.strategy import RoundChoice
from orchestrator.control.sweeps import prepare_sweep
from orchestrator.planning import RUN, Unit
from orchestrator.store.merge import merge
from orchestrator.store.sweepdir import SweepDir
from tests.search_helpers import spec_file

LAST = 3
RECORD = "three-rounds.json"


class ThreeRounds:
    """Rounds 2 and 3 each time the first two forced configs again, once every unit of the
    round before has finished; the record lists the rounds planned."""

    def _planned(self, sd: SweepDir) -> list[int]:
        path = sd.root / RECORD
        return json.loads(path.read_text()) if path.exists() else []

    def pending(self, sd: SweepDir) -> int | None:
        number = max(self._planned(sd), default=1) + 1
        return number if number <= LAST else None

    def choose(self, sd: SweepDir) -> RoundChoice | None:
        number = self.pending(sd)
        assert number is not None
        before = [u for u in sweep_status(sd, query_slurm=False).units if u.round == number - 1]
        if not all(u.complete for u in before):
            return None
        items = [it for it in sd.items() if it.kind == RUN and it.config == "forced"][:2]
        return RoundChoice(number=number, items=items, summary={"survivors": 2, "screened": 2})

    def record(self, sd: SweepDir, choice: RoundChoice, units: list[Unit]) -> None:
        (sd.root / RECORD).write_text(json.dumps([*self._planned(sd), choice.number]))

    def forget(self, sd: SweepDir, number: int) -> None:
        (sd.root / RECORD).write_text(json.dumps([n for n in self._planned(sd) if n != number]))


def test_a_strategy_of_three_rounds_is_advanced_round_by_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rounds.PLANNERS, "full", ThreeRounds())
    spec = spec_file(tmp_path, "three.json", timing={})  # the search's spec (2 units), timed in full
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    settings = sd.spec.executor
    # a round is to come, so a merge job submitted now would advance the sweep
    assert rounds.pending_round(sd) == 2 and rounds.merge_hook(sd) is rounds.after_merge
    assert rounds.advance(sd, settings) is None  # round 1 has not run: nothing is planned
    run = functools.partial(dispatch.run_units_locally, sd, kind="debug")
    assert all(o.ok for o in run(unit_ids))
    seen: list[rounds.NextRound] = []
    outcomes = rounds.run_rounds_here(sd, settings, run, on_round=seen.append)
    # each later round's two items in as many units as the plan had (two), of that round
    assert [nxt.number for nxt in seen] == [2, 3] and all(o.ok for o in outcomes) and len(outcomes) == 4
    assert [u.get("round", 1) for u in sd.unit_index()] == [1, 1, 2, 2, 3, 3]
    assert [u["origin"] for u in sd.unit_index()][2:] == ["round2", "round2", "round3", "round3"]
    # every round planned: nothing is left to advance, and a merge job submitted now would not try
    assert rounds.pending_round(sd) is None and rounds.merge_hook(sd) is None
    assert rounds.advance(sd, settings) is None
    # the last round's records are the document's: the newest record of an item wins
    last = {u.id for u in seen[-1].units}
    summary = merge(sd)
    assert summary.records == sd.planned == 104
    doc = json.loads(Path(summary.output).read_text())
    assert sum(r["unit"] in last for r in doc["results"]) == 2


def test_a_merge_job_of_0_1_0_still_finds_its_hook() -> None:
    """A final merge job pickles its hook by reference; one submitted by tilesweep 0.1.0 names
    ``orchestrator.control.submit.after_merge``: unpickled now, that is the one home's hook."""
    import pickle

    from orchestrator.control import rounds

    old_reference = b"\x80\x04corchestrator.control.submit\nafter_merge\n."
    assert pickle.loads(old_reference) is rounds.after_merge


def test_a_rounds_line_says_one_config_one_unit_and_one_round_in_the_singular() -> None:
    """What ``run`` and ``resume`` say of a round they planned counts as a line says it:
    "1 config", "1 unit", "1 round", never "1 configs"."""
    from orchestrator.cli.common import round_note
    from orchestrator.planning.items import expand
    from orchestrator.spec.model import SweepSpec

    spec = {"dtypes": ["bfloat16"], "head_dims": [64], "seq_lens": [256], "modes": ["fwd"], "batch": 1, "heads": 2}
    item = next(it for it in expand(SweepSpec.model_validate(spec)) if it.config == "forced")
    one = [Unit(index=0, items=[item])]
    search = rounds.NextRound(2, one, {"kind": "search", "searching": 1, "search_round": 2})
    assert round_note(search) == "round 2: 1 problem still searches: 1 config not measured before, in 1 unit"
    halving = rounds.NextRound(2, one, {"survivors": 1, "screened": 1})
    assert round_note(halving) == "round 2: 1 of 1 screened config can still win; timing it in full in 1 unit"
    ended = rounds.NextRound(2, [], {"kind": "end", "search_round": 1})
    assert "the search ended after 1 round:" in round_note(ended)


def test_wait_says_a_search_of_one_round_ended_after_1_round(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    spec = spec_file(tmp_path, search={"max_rounds": 1})
    sweep = tmp_path / "sweep"
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    r = run_cli("wait", str(sweep))
    assert r.returncode == 0 and "the search ended after 1 round\n" in r.stderr.replace("\r", "\n"), r.stderr
