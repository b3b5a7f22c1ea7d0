"""A sweep measured with another stack than this interpreter's (jax upgraded since, tokamax
installed or removed since): `run` and `resume` here refuse it in one line before any worker
starts, as every worker would refuse it (`tests/test_env_mismatch.py`: the worker's own line),
and each names the differences as JSON spells them.

The sweep's env.json is the one a worker of that other stack writes (its first worker's
environment); the installed packages are this interpreter's, as a user's are."""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path

from kernels import tokamax_meta
from tests.helpers import assert_one_line_error, run_cli


def _planned_by_another_stack(
    write_spec: Callable[..., Path], tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[Path, Path]:
    """A local sweep planned here whose first worker ran on ``env`` (its env.json; default: jax
    0.4.30 without tokamax)."""
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], executor={"kind": "local"})
    sweep = tmp_path / "sweep"
    planned = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
    assert planned.returncode == 0, planned.stderr
    older = env or {"jax": "0.4.30", "jaxlib": "0.4.30", "backend": "cpu", "device_kind": "cpu"}
    (sweep / "env.json").write_text(json.dumps(older) + "\n")
    return spec, sweep


def _differences_said() -> list[str]:
    """The differences as the line says them: this interpreter's value first."""
    jax = importlib.metadata.version("jax")
    said = [f'jax "{jax}" vs "0.4.30"']
    if tokamax_meta.version() is not None:
        said.append(f'tokamax "{tokamax_meta.version()}" vs absent')
    return said


def test_run_and_resume_refuse_a_sweep_of_another_stack_before_any_worker(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec, sweep = _planned_by_another_stack(write_spec, tmp_path)
    for args in (["run", str(spec), "--sweep-dir", str(sweep)], ["resume", str(sweep)]):
        line = assert_one_line_error(
            run_cli(*args), f"the sweep in {sweep} was measured with another stack (here vs the sweep's: "
        )
        for said in _differences_said():
            assert said in line, line
        assert "None" not in line and "'0" not in line, line
        assert not list((sweep / "partials").glob("*.jsonl")), args  # no worker started


def test_tokamax_installed_or_removed_since_is_another_stack_too(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """The same jax and jaxlib, and tokamax installed since (or removed since, where this
    interpreter has none): every worker would refuse the sweep on it, so resume does first."""
    same = {
        "jax": importlib.metadata.version("jax"),
        "jaxlib": importlib.metadata.version("jaxlib"),
        "backend": "cpu",
        "device_kind": "cpu",
    }
    installed = tokamax_meta.version()
    env = same if installed is not None else {**same, "tokamax": "0.0.1"}
    _, sweep = _planned_by_another_stack(write_spec, tmp_path, env)
    said = f'tokamax "{installed}" vs absent' if installed is not None else 'tokamax absent vs "0.0.1"'
    line = assert_one_line_error(
        run_cli("resume", str(sweep)), f"(here vs the sweep's: {said}; see {sweep / 'env.json'})"
    )
    assert "jax" not in line.replace("tokamax", ""), line  # the same jax and jaxlib are not named


def test_run_with_another_output_refused_for_another_stack_keeps_the_sweeps_output(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """`run --output NEW` of such a sweep is refused as the plain `run` is, and the refusal
    changes nothing: the sweep still merges into its own output, and no line says it moved."""
    spec, sweep = _planned_by_another_stack(write_spec, tmp_path)
    meta_before = (sweep / "sweep.json").read_bytes()
    new = tmp_path / "new.json"
    line = assert_one_line_error(
        run_cli("run", str(spec), "--sweep-dir", str(sweep), "--output", str(new)),
        f"the sweep in {sweep} was measured with another stack (here vs the sweep's: ",
    )
    assert "from now on" not in line, line
    assert (sweep / "sweep.json").read_bytes() == meta_before
    assert json.loads((sweep / "sweep.json").read_text())["output"] == str(tmp_path / "results.json")
    status = run_cli("status", str(sweep), "--json")  # (exit code 1: the sweep is not complete)
    assert json.loads(status.stdout)["output"] == str(tmp_path / "results.json")
    assert not new.exists()
