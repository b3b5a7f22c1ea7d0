"""Shared fixtures: tiny specs that run in seconds in interpret mode on a CPU."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, SAMPLE, TINY_SPEC, run_cli

# The test modules import these from here; their home is tests/helpers.py, which, unlike this
# plugin, any test module or shared test helper may import without an import circle.
__all__ = ["REPO", "SAMPLE", "TINY_SPEC", "run_cli"]


# Interpret-mode kernels cost the suite mostly XLA's CPU compile, not their runs, and LLVM's
# optimisation is most of that compile: without it a fwd_bwd case compiles about 3x faster
# and runs (tiny shapes) no slower that a test would notice. Set before jax starts here, and
# inherited by the CLI, worker and SLURM processes the tests start. A user's own XLA_FLAGS are
# kept; tests assert no timings, so nothing depends on the generated code's speed.
_FAST_COMPILE = "--xla_backend_optimization_level=0"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()


def pytest_itemcollected(item: pytest.Item) -> None:
    """Where the suite runs on several processes (pytest-xdist, ``--dist loadgroup``), the tests
    of the local SLURM cluster all run on one of them, in their order: they share its four GPUs
    and its queue, and the ``last`` ones check on a job that process's session fixture submitted."""
    if item.get_closest_marker("slurm") is not None:
        item.add_marker(pytest.mark.xdist_group("slurm"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``last`` run after all others, in their order: they check on work (a SLURM
    job past its time limit) that a session fixture started early, so the suite overlaps that
    work instead of waiting for it."""
    last = [item for item in items if item.get_closest_marker("last") is not None]
    if last:
        items[:] = [item for item in items if item.get_closest_marker("last") is None] + last


@pytest.fixture(scope="session")
def slow_slurm_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(spec, sweep dir) of one SLURM unit with ~130 s of work against a 2-minute limit, submitted
    the first time a test asks (test_slurm_dispatch's first test does) and checked by a ``last``
    test: it must be session-wide, since a module fixture would be set up again, a second sweep,
    for a test moved past its module's end."""
    from tests.slurm_sweeps import submit_slow_sweep

    return submit_slow_sweep(tmp_path_factory.mktemp("slow"))


@pytest.fixture(scope="session")
def time_limit_sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """The sweeps (spec, sweep dir) whose SLURM tasks run out of their time limits, by name
    (tests.slurm_sweeps.submit_time_limit_sweeps), submitted with ``slow_slurm_sweep`` and
    checked by ``last`` tests, so that their minutes overlap the other SLURM tests."""
    from tests.slurm_sweeps import submit_time_limit_sweeps

    return submit_time_limit_sweeps(tmp_path_factory.mktemp("limits"))


@pytest.fixture(scope="session")
def first_doc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The document of reuse's first sweep (``tests.reuse_helpers.run_first``: a real two-config
    sweep), run once per test process for the reuse tests, which read it or copy it."""
    from tests.reuse_helpers import run_first

    return run_first(tmp_path_factory.mktemp("first"))


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    """Write a spec file (TINY_SPEC updated with overrides) and return its path."""

    def _write(name: str = "spec.json", **overrides: Any) -> Path:
        data = {**TINY_SPEC, "output": str(tmp_path / "results.json"), **overrides}
        path = tmp_path / name
        path.write_text(json.dumps(data))
        return path

    return _write


@pytest.fixture
def sample_doc() -> dict[str, Any]:
    return json.loads(SAMPLE.read_text())


@pytest.fixture(scope="session")
def page_2000(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report page of a synthetic 2,000-problem document (small grids: 18 fwd and 12
    fwd_bwd configs per shape; 1% of the configs missing, 1% failed), built once per session
    for the HTML and the browser tests."""
    from orchestrator.analysis import html
    from orchestrator.store import document, synthetic

    spec = synthetic.problems_spec(fwd_stages=[2], fwd_warps=[4, 8], bwd_stages=[1], bwd_warps=[4])
    doc = document.from_obj(synthetic.document(spec, missing=0.01, failed=0.01), name="synthetic-2000.json")
    return html.write_page(tmp_path_factory.mktemp("page") / "synthetic-2000.html", html.report_page(doc))
