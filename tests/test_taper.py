"""A whole-node task's units shrink towards its end: its GPUs take the largest first, so the
units left for the task's end are small and its GPUs end close together even where units run
longer or shorter than planned."""

from __future__ import annotations

import heapq
import random
import re
import statistics
from pathlib import Path

import pytest

from orchestrator.control.dispatch.slurm import tasks_of
from orchestrator.planning import Unit, WorkItem, expand, shard
from orchestrator.spec.executor_section import ExecutorSettings
from orchestrator.spec.model import SweepSpec
from tests.helpers import run_cli
from tests.slurm_sweeps import write_spec


def _items() -> tuple[list[WorkItem], list[float]]:
    """12 shapes whose items cost very different amounts (as in ``test_plan``'s balance test)."""
    spec = SweepSpec(
        dtypes=["bfloat16", "float32"], head_dims=[64, 128], seq_lens=[1024, 4096, 16384], smem_limit_bytes=None
    )
    items = expand(spec)
    cost = [
        (1.0 + (it.seq / 4096) ** 2) * (3.0 if it.mode == "fwd_bwd" else 1.0) * (1 + (it.index % 7) / 7) for it in items
    ]
    return items, cost


def _gpus(n: int) -> ExecutorSettings:
    return ExecutorSettings(kind="slurm", gpus_per_node=n)


def _cost(unit: Unit, cost: list[float]) -> float:
    return sum(cost[it.index] for it in unit.items)


def test_a_task_of_one_gpu_or_a_local_run_keeps_its_units_equal() -> None:
    assert _gpus(1).unit_shares() is None
    assert ExecutorSettings(kind="local").unit_shares() is None
    shares = _gpus(4).unit_shares()
    assert shares is not None and len(shares) == _gpus(4).units_per_task() == 16
    assert statistics.mean(shares) == pytest.approx(1.0) and list(shares) == sorted(shares, reverse=True)


@pytest.mark.parametrize("strategy", ["shape", "balanced"])
def test_each_task_holds_every_share_and_its_gpus_take_the_largest_first(strategy: str) -> None:
    items, cost = _items()
    settings = _gpus(2)
    shares = settings.unit_shares()
    assert shares is not None
    per_task = settings.units_per_task()
    units = shard(
        items, 2 * per_task, costs=cost, setups={it.shape: 0.0 for it in items}, strategy=strategy, shares=shares
    )
    assert sorted(it.id for u in units for it in u.items) == sorted(it.id for it in items)
    costs = {u.id: _cost(u, cost) for u in units}
    mean = sum(costs.values()) / len(units)
    for task in tasks_of([u.id for u in units], per_task, costs):
        taken = [costs[u] / mean for u in task]  # in the order the task's GPUs take them
        assert taken == sorted(taken, reverse=True)
        # each unit within a few percent of its share of the work
        assert taken == pytest.approx(sorted(shares, reverse=True), rel=0.06), taken


def test_a_unit_count_that_is_not_whole_tasks_is_cut_equal() -> None:
    items, cost = _items()
    units = shard(items, 12, costs=cost, setups={it.shape: 0.0 for it in items}, shares=_gpus(2).unit_shares())
    loads = [_cost(u, cost) for u in units]
    assert max(loads) / min(loads) <= 1.02, loads


def _idle_at_end(units: list[Unit], cost: list[float], gpus: int, rnd: random.Random, error: float) -> float:
    """GPU-seconds idle between each GPU's last unit and the task's end, the task's GPUs taking
    its units in ``tasks_of``'s order, each unit running ``error`` (log-normal) off its plan."""
    planned = {u.id: _cost(u, cost) for u in units}
    (task,) = tasks_of(list(planned), len(units), planned)
    free = [(0.0, g) for g in range(gpus)]
    for uid in task:
        t, g = heapq.heappop(free)
        heapq.heappush(free, (t + planned[uid] * rnd.lognormvariate(0, error), g))
    ends = [t for t, _ in free]
    return sum(max(ends) - t for t in ends)


def test_tapered_units_leave_a_4_gpu_task_less_idle_at_its_end_than_equal_ones() -> None:
    items, cost = _items()
    settings = _gpus(4)
    n = settings.units_per_task()
    setups = {it.shape: 0.0 for it in items}
    tapered = shard(items, n, costs=cost, setups=setups, strategy="balanced", shares=settings.unit_shares())
    equal = shard(items, n, costs=cost, setups=setups, strategy="balanced")
    for error in (0.15, 0.3):
        rnd_t, rnd_e = random.Random(0), random.Random(0)  # the same draws for both
        idle_t = statistics.mean(_idle_at_end(tapered, cost, 4, rnd_t, error) for _ in range(400))
        idle_e = statistics.mean(_idle_at_end(equal, cost, 4, rnd_e, error) for _ in range(400))
        assert idle_t < 0.7 * idle_e, (error, idle_t, idle_e)


GRID = {"fwd_block_q": [16, 32, 64, 128], "fwd_block_k": [16, 32, 64, 128], "fwd_stages": [1, 2], "fwd_warps": [4, 8]}


def test_plan_says_a_whole_node_tasks_units_shrink_and_not_where_they_are_equal(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "taper.json", {"gpus_per_node": 2}, modes=["fwd"], seq_lens=[256, 1024], **GRID)
    r = run_cli("plan", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    note = "units: each task's 2 GPUs take its largest units first, and its units shrink towards its end"
    assert note in r.stdout, r.stdout
    sizes = sorted(int(n) for n in re.findall(r"^  unit +\d+ \w+: +(\d+) items?", r.stdout, re.M))
    assert len(sizes) == 8 and sizes[-1] >= 5 * sizes[0], r.stdout
    # 6 units are not whole tasks of 8: equal units, and no such note
    r = run_cli("plan", str(spec), "--sweep-dir", str(tmp_path / "six"), "--units", "6")
    assert r.returncode == 0 and "shrink" not in r.stdout, r.stdout
    sizes = sorted(int(n) for n in re.findall(r"^  unit +\d+ \w+: +(\d+) items?", r.stdout, re.M))
    assert len(sizes) == 6 and sizes[-1] <= 2 * sizes[0], r.stdout
