"""The search section as a user writes it: what a budget makes of the design, bad settings in
one line, and what `plan` and `spec` note of settings that change nothing or are cut."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import TINY_SPEC, assert_one_line_error, run_cli
from tests.search_helpers import spec_file


def test_a_budget_below_the_default_design_is_the_design_too() -> None:
    from orchestrator.spec.search_section import SearchSettings

    assert SearchSettings.model_validate({"budget": 4}).design == 4
    assert SearchSettings.model_validate({"budget": 8}).design == 6  # the default, within the budget


@pytest.mark.parametrize(
    ("search", "needles"),
    [
        ({"design": 6, "budget": 4}, ("search", "budget=4 is below design=6", "raise budget to at least 6")),
        ({"max_rounds": 0}, ("search.max_rounds", "greater than or equal to 1")),
    ],
)
def test_bad_search_settings_are_one_line(tmp_path: Path, search: dict[str, Any], needles: tuple[str, ...]) -> None:
    r = run_cli("run", str(spec_file(tmp_path, search=search)), "--sweep-dir", str(tmp_path / "sweep"))
    assert_one_line_error(r, *needles)
    assert not (tmp_path / "sweep").exists()


def test_search_settings_without_the_search_strategy_get_a_note() -> None:
    from orchestrator.planning.search import idle_settings
    from orchestrator.spec.files import spec_from_data

    assert 'timing.strategy is "full": it does nothing' in str(idle_settings(spec_from_data({"search": {"design": 3}})))
    assert idle_settings(spec_from_data({"timing": {"strategy": "search"}, "search": {"design": 3}})) is None
    assert idle_settings(spec_from_data({})) is None


def test_a_screen_that_keeps_every_config_it_screens_is_said_by_plan_and_spec(tmp_path: Path) -> None:
    """timing.keep (default 4) is halving's floor of configs timed in full per problem; a round
    after the first measures at most search.per_round (default 3), so the default screen drops
    nothing after round 1, and plan and spec say so and what to set; a keep below per_round, no
    note."""
    note = (
        "tilesweep: note: search.screen: true screens nothing out after round 1: timing.keep (4) times at least 4 "
        "configs of a problem in full, and each round after the first measures at most search.per_round (3) of "
        "them; set timing.keep below 3 for the screen to drop the configs that cannot win, or drop search.screen"
    )
    screened = spec_file(tmp_path, search={"screen": True})
    for command in (["plan", str(screened), "--dry-run"], ["spec", str(screened)]):
        r = run_cli(*command)
        assert r.returncode == 0 and r.stderr.splitlines().count(note) == 1, r.stderr
    every = spec_file(tmp_path, "every.json", search={"screen": True, "design": 4})
    r = run_cli("plan", str(every), "--dry-run")
    assert r.returncode == 0 and "screens nothing out in any round: " in r.stderr, r.stderr
    assert "(round 1 at most search.design, 4)" in r.stderr, r.stderr
    kept = spec_file(tmp_path, "kept.json", search={"screen": True}, timing={"strategy": "search", "keep": 2})
    for command in (["plan", str(kept), "--dry-run"], ["spec", str(kept)]):
        r = run_cli(*command)
        assert r.returncode == 0 and "screens nothing" not in r.stderr, r.stderr


def test_a_design_set_above_what_a_small_grid_takes_is_said_not_cut_silently(tmp_path: Path) -> None:
    r = run_cli("plan", str(spec_file(tmp_path, search={"design": 40})), "--dry-run")
    assert r.returncode == 0 and "search.design is 40, and round 1 measures " in r.stderr, r.stderr
    r = run_cli("plan", str(spec_file(tmp_path, "default.json")), "--dry-run")
    assert r.returncode == 0 and "search.design" not in r.stderr, r.stderr
    # a budget below the default design is round 1's design too: the note names the budget, which was set
    budget = {**TINY_SPEC, "modes": ["fwd"], "timing": {"strategy": "search"}, "search": {"budget": 5}}
    (tmp_path / "budget.json").write_text(json.dumps({**budget, "output": str(tmp_path / "budget.out.json")}))
    r = run_cli("plan", str(tmp_path / "budget.json"), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "search.design is" not in r.stderr and "search.budget (round 1's design too) is 5" in r.stderr, r.stderr


def test_checking_a_spec_notes_what_plan_would(tmp_path: Path) -> None:
    idle = spec_file(tmp_path, timing={"strategy": "full"}, search={"design": 3})
    r = run_cli("spec", str(idle))
    assert r.returncode == 0 and 'note: the search section is set but timing.strategy is "full"' in r.stderr, r.stderr


def test_the_plan_of_a_search_counts_every_item_of_round_1_pruned_ones_too(tmp_path: Path) -> None:
    """f32 d128 fwd: the shared-memory model prunes 8 of its 54 configs, which round 1 records
    without a run: the plan's line says so, and its parts add up to the items it records."""
    spec = spec_file(tmp_path, dtypes=["float32"], head_dims=[128], modes=["fwd"])
    r = run_cli("plan", str(spec), "--dry-run")
    assert r.returncode == 0, r.stderr
    (line,) = [line for line in r.stdout.splitlines() if line.startswith("search: round 1 records")]
    said = re.match(
        r"search: round 1 records (\d+) items: per problem auto and its design \(over (\d+) problems?: (\d+) configs "
        r"from the portfolio, (\d+) space-filling, (\d+) carried\), and (\d+) configs pruned or invalid, recorded "
        r"without a run; ",
        line,
    )
    assert said is not None, line
    size, problems, portfolio, filling, carried, unrun = map(int, said.groups())
    assert unrun == 8 and "8 pruned by the shared-memory model" in r.stdout, r.stdout
    assert problems + portfolio + filling + carried + unrun == size, line


@pytest.mark.parametrize("strategy", ["halving", "search"])
def test_a_strategy_that_chooses_among_forced_configs_with_auto_only_is_noted(tmp_path: Path, strategy: str) -> None:
    """auto_only times no forced config: plan and spec say the strategy has none to choose from,
    and plan does not promise a screen of forced configs it will not run."""
    spec = spec_file(tmp_path, auto_only=True, timing={"strategy": strategy})
    note = (
        f'note: auto_only: true times each problem\'s auto config alone, in full, so timing.strategy "{strategy}" '
        'has no forced config to choose from and runs as "full" does; set auto_only to false'
    )
    plan, checked = run_cli("plan", str(spec), "--dry-run"), run_cli("spec", str(spec))
    for r in (plan, checked):
        assert r.returncode == 0 and note in r.stderr, r.stderr
    assert "screen every forced config" not in plan.stdout, plan.stdout
    full = spec_file(tmp_path, "full.json", auto_only=True, timing={"strategy": "full"})
    r = run_cli("plan", str(full), "--dry-run")
    assert r.returncode == 0 and "auto_only" not in r.stderr and "items in" in r.stdout, r.stderr


@pytest.mark.parametrize(
    ("timing", "search", "said"),
    [
        (
            {"strategy": "full", "screen_ms": 5},
            {},
            'timing.screen_ms is the screen\'s, but nothing screens with timing.strategy "full": it does nothing; '
            'set "timing": {"strategy": "halving"} to screen',
        ),
        (
            {"strategy": "search", "keep": 2, "noise": 0.2},
            {},
            'timing.keep and timing.noise are the screen\'s, but nothing screens with timing.strategy "search" and '
            'no search.screen: they do nothing; set "search": {"screen": true} to screen',
        ),
        ({"strategy": "halving", "keep": 2}, {}, None),
        ({"strategy": "search", "keep": 2}, {"screen": True}, None),
    ],
)
def test_screen_settings_where_nothing_screens_are_noted(
    tmp_path: Path, timing: dict[str, Any], search: dict[str, Any], said: str | None
) -> None:
    spec = spec_file(tmp_path, timing=timing, search=search)
    for command in (["plan", str(spec), "--dry-run"], ["spec", str(spec)]):
        r = run_cli(*command)
        assert r.returncode == 0, r.stderr
        assert (f"note: {said}" in r.stderr) if said else "the screen's" not in r.stderr, r.stderr
