"""A results document edited by hand: a record's value that no tilesweep writes is refused at
load, in one line naming ``results[i].field``, the value as the file gives it and what the field
allows, by every reader (report, export, compare), instead of a traceback or a wrong table.

The three readers load a document through one loader (``store.document.load``): each value rule
is held through ``report``, and the three readers are held to the same line for a value of each
kind of rule (a field's own value, a config field missing, timings that do not add up)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernels import impls
from orchestrator.store import document
from tests.helpers import SAMPLE, assert_one_line_error, run_cli

FWD = 2  # results[2] of the sample: a forced fwd record (block_q, block_k, num_stages, num_warps)
FAILED = 121  # results[121]: a forced fwd record of a config that failed (its error, no timings)


def _sample() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SAMPLE.read_text())
    assert doc["results"][FWD]["mode"] == "fwd" and doc["results"][FWD]["config"] == "forced"
    assert "error" in doc["results"][FAILED] and "median_ms" not in doc["results"][FAILED]
    return doc


def _write(tmp_path: Path, doc: dict[str, Any], name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=1))
    return path


def _edited(tmp_path: Path, i: int, field: str, value: Any) -> Path:
    doc = _sample()
    doc["results"][i][field] = value
    return _write(tmp_path, doc)


def _refused(bad: Path) -> str:
    """The one line ``report`` refuses ``bad`` with."""
    line = assert_one_line_error(run_cli("report", str(bad)), f"{bad}: ")
    assert line.endswith("; correct or remove that record"), line
    return line


def _refused_by_every_reader(tmp_path: Path, bad: Path) -> str:
    """The one line each reader refuses ``bad`` with (the same for all three); nothing exported."""
    good = _write(tmp_path, _sample(), "good.json")
    out = tmp_path / "tuned.json"
    lines = {_refused(bad)}
    for argv in (["export", str(bad), "--out", str(out)], ["compare", str(good), str(bad)]):
        lines.add(assert_one_line_error(run_cli(*argv), f"{bad}: "))
    assert not out.exists()
    assert len(lines) == 1, lines
    return lines.pop()


@pytest.mark.parametrize(
    ("i", "field", "value", "says"),
    [
        (FWD, "impl", "nope", 'impl is "nope", expected one of "tilesweep", "jax", "mosaic", "tokamax-mosaic"'),
        (FWD, "block_q", [64], "block_q is [64], expected a power of two and at least 1"),
        (FWD, "config", "weird", 'config is "weird", expected one of "auto", "forced"'),
        (FWD, "num_warps", 0, "num_warps is 0, expected a power of two and at least 1"),
        (FWD, "mode", "sideways", 'mode is "sideways", expected one of "fwd", "fwd_bwd"'),
        (FWD, "dtype", "int8", 'dtype is "int8", expected one of "bfloat16", "float16", "float32"'),
        (FWD, "median_ms", -5, "median_ms is -5, expected a number of milliseconds from 1e-06 to 1e+09, or null"),
        (FWD, "median_ms", 0, "median_ms is 0, expected a number of milliseconds"),
        (FWD, "q1_ms", 1e-300, "q1_ms is 1e-300, expected a number of milliseconds"),
        (0, "q3_ms", 1e308, "q3_ms is 1e+308, expected a number of milliseconds"),
        (FWD, "samples_ms", [0.12, -0.5], "samples_ms[1] is -0.5, expected a number of milliseconds"),
        (FAILED, "error", ["x"], 'error is ["x"], expected a string'),
        (FWD, "head_dim", 10**30, "head_dim is 1000000000000000000000000000000, expected an integer from 16 to 256"),
    ],
)
def test_a_hand_edited_value_is_refused_in_one_line_naming_what_the_field_allows(
    tmp_path: Path, i: int, field: str, value: Any, says: str
) -> None:
    line = _refused(_edited(tmp_path, i, field, value))
    assert f"results[{i}].{says}" in line, line


def test_a_hand_edited_value_is_refused_in_one_line_by_report_export_and_compare(tmp_path: Path) -> None:
    line = _refused_by_every_reader(tmp_path, _edited(tmp_path, FWD, "block_q", 96))
    assert f"results[{FWD}].block_q is 96, expected a power of two and at least 1" in line, line


def test_a_forced_record_lacking_a_config_field_is_refused(tmp_path: Path) -> None:
    doc = _sample()
    del doc["results"][FWD]["num_warps"]
    line = _refused_by_every_reader(tmp_path, _write(tmp_path, doc))
    assert f"results[{FWD}] lacks config field(s) num_warps" in line
    assert "block_q, block_k, num_stages, num_warps" in line  # what such a record holds


def test_a_tiny_median_is_refused_rather_than_reported_as_infinite_tflops(tmp_path: Path) -> None:
    """A median of 1e-300 made ``report --json`` print ``Infinity`` (not JSON) for TFLOP/s."""
    r = run_cli("report", str(_edited(tmp_path, FWD, "median_ms", 1e-300)), "--json")
    assert "Infinity" not in r.stdout
    assert_one_line_error(r, f"results[{FWD}].median_ms is 1e-300")


@pytest.mark.parametrize(("field", "value"), [("block_q", 64.0), ("num_stages", True)])
def test_a_config_value_equal_to_a_good_one_but_of_another_type_is_refused(
    tmp_path: Path, field: str, value: Any
) -> None:
    """64.0 equals the 64 of the records before it, true the 1 (``num_stages``): a check that
    remembered the good configs by value would pass them."""
    doc = _sample()
    recs = doc["results"]
    k = next(j for j in range(FWD + 1, len(recs)) if recs[j]["config"] == "forced" and recs[j][field] == value)
    assert type(recs[k][field]) is not type(value)
    recs[k][field] = value
    assert_one_line_error(
        run_cli("report", str(_write(tmp_path, doc))), f"results[{k}].{field} is {json.dumps(value)}, expected "
    )


@pytest.mark.parametrize("impl", impls.IMPL_NAMES)
def test_every_implementations_records_load_and_its_tunables_rules_are_held(tmp_path: Path, impl: str) -> None:
    """A forced record of each implementation (``tilesweep impls``), with its tunables' default
    values, loads; the same record with an integer tunable at 0 is refused with that tunable's rule."""
    kernel = impls.get(impl)
    doc = _sample()
    rec = {k: v for k, v in doc["results"][FWD].items() if k not in ("block_q", "block_k", "num_stages", "num_warps")}
    rec["dtype"] = kernel.capabilities.dtypes[0]
    if impl != impls.DEFAULT_IMPL:
        rec["impl"] = impl
    rec.update({t.name: t.default[0] for t in kernel.tunables("fwd")})
    doc["results"].append(rec)
    good = _write(tmp_path, doc, "impl.json")
    assert len(document.load(good).results) == len(doc["results"])
    tunable = next(t for t in kernel.tunables("fwd") if t.kind is int)
    rec[tunable.name] = 0
    k = len(doc["results"]) - 1
    r = run_cli("report", str(_write(tmp_path, doc)))
    assert_one_line_error(r, f"results[{k}].{tunable.name} is 0, expected {tunable.as_recorded().rule}")


def test_a_tile_below_a_dots_16_measured_in_interpret_mode_is_kept_by_every_reader(tmp_path: Path) -> None:
    """A spec plans no Triton tile below 16 (a GPU's dot takes none), but interpret mode runs any
    power of two: a document holding such a record, measured there, is read as it is."""
    doc = _sample()
    doc["results"][FWD]["block_q"] = 8
    bad = _write(tmp_path, doc, "tile8.json")
    assert document.load(bad).results[FWD]["block_q"] == 8
    for argv in (["report", str(bad)], ["export", str(bad), "--out", str(tmp_path / "t.json")]):
        r = run_cli(*argv)
        assert r.returncode == 0, r.stderr


def _timed(tmp_path: Path, **fields: Any) -> Path:
    """The sample with its forced fwd record's timings replaced by ``fields``."""
    doc = _sample()
    doc["results"][FWD].update(fields)
    return _write(tmp_path, doc)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"q1_ms": 0.3, "median_ms": 0.4, "q3_ms": 0.35}, "q3_ms is 0.35, expected at least its median_ms, 0.4"),
        (
            {"q1_ms": 0.3, "median_ms": 0.4, "q3_ms": 0.5, "samples_ms": [0.3, 0.31, 0.5]},
            "median_ms is 0.4, expected the median of its 3 samples_ms (0.31)",
        ),
        (
            {"q1_ms": 0.3, "median_ms": 0.4, "q3_ms": 0.5, "samples_ms": [0.5, 0.3, 0.32, 0.35]},
            "median_ms is 0.4, expected the median of its 4 samples_ms (from 0.32 to 0.35, between the middle two)",
        ),
        (
            {"q1_ms": 0.3, "median_ms": 0.4, "q3_ms": 0.5, "samples_ms": []},
            "samples_ms is [], expected the samples its median_ms is the median of (at least one)",
        ),
    ],
)
def test_timings_that_do_not_add_up_are_refused_in_one_line(tmp_path: Path, fields: dict[str, Any], says: str) -> None:
    """Every writer takes a record's quartiles and median from its samples (``np.percentile``):
    a hand-edited q1_ms above the median, or a median that is not its samples', was reported."""
    line = _refused(_timed(tmp_path, **fields))
    assert f"results[{FWD}].{says}" in line, line


def test_timings_that_do_not_add_up_are_refused_in_one_line_by_report_export_and_compare(tmp_path: Path) -> None:
    bad = _timed(tmp_path, q1_ms=0.5, median_ms=0.4, q3_ms=0.6)
    line = _refused_by_every_reader(tmp_path, bad)
    assert f"results[{FWD}].q1_ms is 0.5, expected at most its median_ms, 0.4" in line, line


@pytest.mark.parametrize("repeats", [1, 2, 3, 4, 5, 8])
def test_timings_as_the_worker_takes_them_load(tmp_path: Path, repeats: int) -> None:
    """What the worker's timing (``kernels.timing.measure``, a real jitted call on this CPU) makes
    of its samples holds to the rule, for an odd and an even count of samples."""
    import jax
    import jax.numpy as jnp

    from kernels.timing import measure

    x = jnp.ones((8, 8))
    t = measure(jax.jit(lambda a: a @ a).lower(x).compile(), [x], repeats=repeats, target_ms=0.05, max_inner=2)
    fields = {"median_ms": t.median_ms, "q1_ms": t.q1_ms, "q3_ms": t.q3_ms, "samples_ms": t.samples_ms}
    bad = _timed(tmp_path, **fields)
    assert document.load(bad).results[FWD]["samples_ms"] == t.samples_ms
    assert run_cli("report", str(bad)).returncode == 0


def test_any_samples_quartiles_as_numpy_takes_them_pass(tmp_path: Path) -> None:
    """The rule holds for what ``np.percentile`` makes of any samples (the worker's, a replay's
    and a tokamax table's quartiles): 3,000 sets of 1 to 12 samples of ms to hours, in one document."""
    import numpy as np

    rng = np.random.default_rng(0)
    doc = _sample()
    base = doc["results"][FWD]
    for n in range(3000):
        samples = [float(s) for s in rng.lognormal(rng.uniform(-5, 12), rng.uniform(0, 1), 1 + n % 12)]
        q1, m, q3 = np.percentile(samples, [25, 50, 75])
        doc["results"].append(
            {**base, "q1_ms": float(q1), "median_ms": float(m), "q3_ms": float(q3), "samples_ms": samples}
        )
    assert len(document.load(_write(tmp_path, doc)).results) == len(doc["results"])
