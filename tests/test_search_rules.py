"""The search strategy's rules (``orchestrator.planning.search``) on small grids of named axes:
neighbours, the space-filling design, when a problem searches on, and what a round measures
first when the other problems of the sweep have spoken."""

from __future__ import annotations

import itertools

from orchestrator.planning.search import (
    BUDGET,
    EXHAUSTED,
    IMPROVED_NOTHING,
    ROUNDS,
    SEARCHING,
    Grid,
    Problem,
    design,
    design_size,
    space_filling,
    step,
)
from orchestrator.planning.searchmodel import Timed, predicted
from orchestrator.spec.search_section import SearchSettings

FWD_FIELDS = ("block_q", "block_k", "num_stages", "num_warps")


def test_neighbours_are_one_step_along_one_axis_of_the_grid_as_planned() -> None:
    """Any axes, of any values: a neighbour changes one axis by one step and is planned."""
    configs = [(t, s, f) for t, s, f in itertools.product((256, 64, 128), (1, 2), (False, True)) if (t, s) != (256, 2)]
    grid = Grid.of(("tile", "split", "fused"), configs)
    assert grid.values == ((64, 128, 256), (1, 2), (False, True))
    assert grid.neighbours((128, 2, False)) == [(64, 2, False), (128, 1, False), (128, 2, True)]  # no (256, 2, _)
    assert grid.neighbours((256, 1, True)) == [(128, 1, True), (256, 1, False)]


def test_space_filling_starts_at_the_centre_and_covers_every_axis_value() -> None:
    grid = Grid.of(FWD_FIELDS, itertools.product((32, 64, 128), (32, 64, 128), (1, 2, 3), (4, 8)))
    picks = space_filling(grid, grid.configs, [], 3)
    assert picks[0] == (64, 64, 2, 4)
    assert all({p[i] for p in picks} == set(axis) for i, axis in enumerate(grid.values))
    apart = space_filling(grid, grid.configs, [], 3, apart=picks)  # what another problem measures
    assert not set(apart) & set(picks)  # as spread out, elsewhere
    assert all({p[i] for p in apart} == set(axis) for i, axis in enumerate(grid.values))


def test_the_design_takes_the_portfolio_first_and_counts_carried_configs() -> None:
    grid = Grid.of(("a", "b"), itertools.product((1, 2, 3), (1, 2, 3)))
    d = design(grid, grid.configs, portfolio=[(3, 3), (9, 9), (1, 1)], carried={(1, 1)}, size=4)
    assert d.portfolio == [(3, 3)] and len(d.space_filling) == 2 and (1, 1) not in d.configs


def test_round_1_takes_at_most_one_in_8_of_what_a_problem_can_run() -> None:
    assert design_size(6, runnable=54) == 6  # the reference grid: the design as set
    assert design_size(6, runnable=22) == 3  # a grid shared memory cut down: fewer
    assert design_size(6, runnable=5) == 2 and design_size(1, runnable=5) == 1


def _problem(rounds: dict[int, list[Timed]], measured: int = 4) -> Problem:
    """A 3 x 3 grid whose first ``measured`` configs, (1, 1), (1, 2), (1, 3), (2, 1), ..., were measured."""
    grid = Grid.of(("a", "b"), itertools.product((1, 2, 3), (1, 2, 3)))
    return Problem(grid, grid.configs, frozenset(grid.configs[:measured]), rounds)


def test_a_problem_searches_on_only_while_a_round_finds_something_faster_beyond_the_noise() -> None:
    settings = SearchSettings(design=4, max_rounds=4, budget=8)
    first = [Timed((1, 1), 1.0, 0.95, 1.05), Timed((2, 1), 2.0, 1.9, 2.1)]
    within = _problem({1: first, 2: [Timed((1, 2), 0.97, 0.9, 1.0)]})  # faster, but inside the noise
    # converged: no neighbours, but another problem's winner it has not measured yet
    assert step(within, 2, [(3, 3)], settings) == ([(3, 3)], IMPROVED_NOTHING)
    assert step(within, 2, [(1, 2)], settings) == ([], IMPROVED_NOTHING)
    beyond = _problem({1: first, 2: [Timed((1, 2), 0.9, 0.88, 0.93)]})
    # the other problems' winner, then the new leader's neighbour not measured yet
    assert step(beyond, 2, [(3, 3)], settings) == ([(3, 3), (2, 2)], SEARCHING)
    assert step(beyond, 2, [(3, 3)], SearchSettings(design=4, budget=5)) == ([(3, 3)], SEARCHING)
    assert step(beyond, 4, [], settings)[1] == ROUNDS
    assert step(_problem({1: first}, measured=8), 1, [], settings)[1] == BUDGET


def test_a_round_measures_first_what_the_other_problems_found_fast_and_at_most_per_round() -> None:
    settings = SearchSettings(design=4, max_rounds=4, per_round=2)
    first = [Timed((2, 2), 1.0, 0.95, 1.05), Timed((1, 1), 2.0, 1.9, 2.1)]
    problem = _problem({1: first}, measured=0)
    # another problem, timed alike on (2, 2) and (1, 1), found (1, 2) and (2, 1) slow and (3, 2) fastest
    alike = [Timed((2, 2), 1.0, 1, 1), Timed((1, 1), 2.0, 2, 2), Timed((1, 2), 3.0, 3, 3), Timed((2, 1), 3.0, 3, 3)]
    outlook = predicted(first, [[*alike, Timed((3, 2), 0.95, 0.95, 0.95)]])
    assert outlook[(1, 2)] > outlook[(2, 2)] > outlook[(3, 2)] and (2, 3) not in outlook
    # (2, 2)'s neighbours (1, 2), (3, 2), (2, 1), (2, 3): the one rated faster than (2, 2) and the
    # one no other problem measured (as good as a best); the slow ones wait, beyond per_round
    assert step(problem, 1, [], settings, outlook) == ([(3, 2), (2, 3)], SEARCHING)
    assert step(problem, 1, [], SearchSettings(design=4, per_round=None), outlook)[0] == [
        (3, 2),
        (2, 3),
        (1, 2),
        (2, 1),
    ]
    # a problem that times nothing alike weighs less than one that does
    unlike = [Timed((2, 2), 3.0, 3, 3), Timed((1, 1), 1.0, 1, 1), Timed((1, 2), 1.0, 1, 1)]
    assert predicted(first, [alike, unlike])[(1, 2)] > 0.5


def test_a_capped_round_measures_only_what_the_alike_problems_rate_faster_than_the_problems_best() -> None:
    settings = SearchSettings(design=4, max_rounds=4, per_round=4)
    first = [Timed((2, 2), 1.0, 0.95, 1.05), Timed((1, 1), 2.0, 1.9, 2.1)]
    problem = _problem({1: first}, measured=0)
    # another problem, timed alike, measured every neighbour of (2, 2) and found (2, 2) the fastest
    alike = [Timed((2, 2), 1.0, 1, 1), Timed((1, 1), 2.0, 2, 2), Timed((3, 2), 1.03, 1, 1)]
    slow = [Timed((1, 2), 1.2, 1.2, 1.2), Timed((2, 1), 1.2, 1.2, 1.2)]
    # the family's model rates the problem's best at least as fast as every candidate: its search ends
    assert step(problem, 1, [], settings, predicted(first, [[*alike, *slow, Timed((2, 3), 1.02, 1, 1)]])) == (
        [],
        EXHAUSTED,
    )
    # per_round null asks for every neighbour: the slow ones too
    everything = predicted(first, [[*alike, *slow, Timed((2, 3), 1.02, 1, 1)]])
    assert len(step(problem, 1, [], SearchSettings(design=4, per_round=None), everything)[0]) == 4
    # where it found (2, 3) faster than (2, 2), that one is worth a round, (3, 2) still is not
    faster = predicted(first, [[*alike, *slow, Timed((2, 3), 0.97, 0.97, 0.97)]])
    assert step(problem, 1, [], settings, faster) == ([(2, 3)], SEARCHING)
    # a neighbour none of them measured is always worth a round
    assert step(problem, 1, [], settings, predicted(first, [[*alike, *slow]])) == ([(2, 3)], SEARCHING)


def _timed(config: tuple[int, int], median: float) -> Timed:
    return Timed(config, median, 0.98 * median, 1.02 * median)


def test_a_problem_climbs_only_the_way_its_own_timings_lean_and_steps_back_where_that_way_is_closed() -> None:
    """A step along an axis towards a value whose configs the problem timed at least as fast as
    its leader's value is taken; the steps back only where no such step is left to measure."""
    first = [_timed((2, 2), 1.0), _timed((2, 1), 2.0), _timed((3, 1), 1.1), _timed((3, 3), 1.1), _timed((1, 3), 3.0)]
    grid = Grid.of(("a", "b"), itertools.product((1, 2, 3), (1, 2, 3)))
    problem = Problem(grid, grid.configs, frozenset(t.config for t in first), {1: first})
    # a = 3 timed faster than a = 2 on average, b = 2 fastest: (3, 2) only, not (1, 2) nor (2, 3)
    assert step(problem, 1, [], SearchSettings(design=4, per_round=None)) == ([(3, 2)], SEARCHING)
    assert step(problem, 1, [], SearchSettings(design=4)) == ([(3, 2)], SEARCHING)
    # a leader its timings rate fastest along every axis: every step is one back
    best_everywhere = [Timed((2, 2), 1.0, 0.95, 1.05), Timed((1, 1), 2.0, 1.9, 2.1), Timed((3, 3), 1.2, 1.15, 1.25)]
    alone = _problem({1: best_everywhere}, measured=0)
    assert step(alone, 1, [], SearchSettings(design=4, per_round=None))[0] == [(3, 2), (1, 2), (2, 3), (2, 1)]


def test_a_capped_round_measures_a_config_the_cost_model_prices_at_two_typical_ones_only_if_rated_faster() -> None:
    settings = SearchSettings(design=4, max_rounds=4, per_round=4)
    first = [Timed((2, 2), 1.0, 0.95, 1.05), Timed((1, 1), 2.0, 1.9, 2.1)]
    problem = _problem({1: first}, measured=0)
    costs = {c: 1.0 for c in problem.grid.configs} | {(3, 2): 2.5}  # a spilling tile: 2.5 typical configs
    assert step(problem, 1, [], settings, None, costs) == ([(1, 2), (2, 3), (2, 1)], SEARCHING)
    # another problem, timed alike, found (3, 2) faster than (2, 2): worth its price
    alike = [Timed((2, 2), 1.0, 1, 1), Timed((1, 1), 2.0, 2, 2), Timed((3, 2), 0.9, 0.9, 0.9)]
    assert step(problem, 1, [], settings, predicted(first, [alike]), costs)[0][0] == (3, 2)
    # per_round null measures every candidate, whatever it costs
    assert (3, 2) in step(problem, 1, [], SearchSettings(design=4, per_round=None), None, costs)[0]
