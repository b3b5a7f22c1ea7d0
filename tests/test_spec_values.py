"""Spec values a user can get wrong, refused in the spec's own words: Triton tiles a dot can
take, flags that are flags, not numbers, and every value shown as JSON writes it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kernels.tuned import TunedTable, TunedTableError
from orchestrator.errors import SpecError
from orchestrator.planning import INVALID, RUN, expand
from orchestrator.spec.files import spec_from_data
from tests.helpers import assert_one_line_error, run_cli

DOT = "a tile is a dimension of a Triton dot, which tl.dot takes from 16"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"fwd_block_q": [1, 32]}, 'field "fwd_block_q": must be powers of two from 16 (16, 32, 64, ...; '),
        ({"fwd_block_k": [8]}, 'field "fwd_block_k": must be powers of two from 16'),
        ({"bwd_outer": [4, 64]}, 'field "bwd_outer": must be powers of two from 16'),
        ({"bwd_inner": [8, 16]}, 'field "bwd_inner": must be powers of two from 16'),
        (
            {"bwd_fwd_config": [8, 128]},
            f'field "bwd_fwd_config.block_q": must be a power of two from 16 ({DOT}), got 8',
        ),
        ({"grid": {"fwd": {"block_k": [8, 64]}}, "modes": ["fwd"]}, "grid.fwd: block_k=8 is refused: block_k must "),
        (
            {"kernel": {"impl": "jax"}, "grid": {"fwd_bwd": {"bwd_inner": [8]}}, "modes": ["fwd_bwd"]},
            "grid.fwd_bwd: bwd_inner=8 is refused: bwd_inner must be a power of two and at least 16",
        ),
    ],
)
def test_a_triton_tile_below_16_is_refused_naming_the_field_value_and_minimum(data: dict[str, Any], says: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_from_data(data, source="s.json")
    assert err.value.message.startswith(f"s.json: {says}"), err.value.message
    assert "16" in err.value.message and DOT in err.value.message


def test_a_tile_below_16_is_one_line_from_plan(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"fwd_block_q": [1, 32], "modes": ["fwd"]}))
    r = run_cli("plan", str(path), "--sweep-dir", str(tmp_path / "sweep"))
    assert_one_line_error(r, 'field "fwd_block_q"', "from 16", "got [1]")
    assert not (tmp_path / "sweep").exists()


def test_the_mosaic_kernels_keep_their_own_tile_rule() -> None:
    """jax's Mosaic GPU kernel takes forward tiles in multiples of 64 (its own check), so 16
    is not what it is told; its backward tiles are left to its compiler at lowering."""
    data = {"kernel": {"impl": "mosaic"}, "dtypes": ["float16"], "head_dims": [64], "modes": ["fwd"]}
    with pytest.raises(SpecError) as err:
        spec_from_data({**data, "grid": {"fwd": {"block_q": [16]}}}, source="s.json")
    assert "block_q must be a multiple of 64 and at least 64 (jax's TuningConfig)" in err.value.message


def test_a_seq_below_16_plans_its_forced_configs_invalid() -> None:
    """A seq below 16 clamps every tile to it: no Triton dot takes that, so nothing is compiled."""
    spec = spec_from_data({"seq_lens": [8, 64], "modes": ["fwd"], "dtypes": ["float32"], "head_dims": [64]})
    forced = [it for it in expand(spec) if it.config == "forced"]
    short = [it for it in forced if it.seq == 8]
    assert short and all(it.kind == INVALID for it in short)
    assert short[0].reason is not None and "runs as 8 at seq=8, below 16, the smallest tile a Triton dot" in (
        short[0].reason
    )
    assert any(it.kind == RUN for it in forced if it.seq == 64)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"kernel": {"interpret": 1}}, "kernel.interpret"),
        ({"kernel": {"interpret": 0}}, "kernel.interpret"),
        ({"kernel": {"interpret": 1.0}}, "kernel.interpret"),
        ({"timing": {"flush_l2": 1}}, "timing.flush_l2"),
        ({"timing": {"flush_l2": 0}}, "timing.flush_l2"),
    ],
)
def test_a_number_is_not_read_as_a_flag_that_may_be_auto(data: dict[str, Any], field: str) -> None:
    """``causal: [1]`` is refused; so is ``interpret: 1``: a flag is true or false everywhere."""
    with pytest.raises(SpecError) as err:
        spec_from_data(data, source="s.json")
    assert f"""s.json: field "{field}": Input should be "auto", true or false (got """ in err.value.message


@pytest.mark.parametrize("value", ["auto", True, False])
def test_auto_true_and_false_are_taken(value: Any) -> None:
    spec = spec_from_data({"kernel": {"interpret": value}, "timing": {"flush_l2": value}})
    assert spec.kernel.interpret is value or spec.kernel.interpret == value == "auto"
    assert type(spec.timing.flush_l2) is type(value)


def test_interpret_1_is_one_line_from_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"kernel": {"interpret": 1}}))
    assert_one_line_error(run_cli("spec", str(path)), 'field "kernel.interpret"', '"auto", true or false')


def test_a_toml_specs_wrong_choice_is_named_with_the_choices_as_the_file_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text('modes = ["fwd"]\n[timing]\nstrategy = "halv"\n')
    said = assert_one_line_error(
        run_cli("spec", str(path)), 'field "timing.strategy"', 'Input should be "full", "halving" or "search"'
    )
    assert "'full'" not in said and "'halving'" not in said, said


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"repeats": True}, 'field "repeats": Input should be a valid integer (got true)'),
        ({"batch": None}, 'field "batch": Input should be a valid integer (got null)'),
        (
            {"kernel": {"interpret": None}},
            """field "kernel.interpret": Input should be "auto", true or false (got null)""",
        ),
        ({"causal": [True, True]}, 'field "causal": lists each value once; repeated: true (got [true, true])'),
        ({"tag": ["a"]}, 'field "tag": Input should be a valid string (got ["a"])'),
        ({"grid": True}, 'field "grid": true is not a grid'),
        ({"grid": {"fwd": {"block_q": {"a": 1}}}}, 'grid.fwd.block_q must be a list of values ({"block_q": [64'),
        ({"grid": {"fwd": {"block_q": [True]}}, "modes": ["fwd"]}, "grid.fwd: block_q=true is refused"),
        ({"grid": {"fwd": {"block_q": ["64"]}}, "modes": ["fwd"]}, 'block_q="64" is refused'),
        ({"kv_heads": [None, 8]}, "lists each value once (null and 8 are both multi-head), got [null, 8]"),
        ({"modes": ["fwdx"]}, """field "modes.0": Input should be "fwd" or "fwd_bwd" (got "fwdx")"""),
        ({"timing": {"strategy": "halv"}}, 'Input should be "full", "halving" or "search" (got "halv")'),
        ({"dtypes": "bfloat16"}, 'write a list of "bfloat16", "float16" or "float32", e.g. ["bfloat16", "float32"]'),
    ],
)
def test_a_spec_error_shows_values_as_json_writes_them(data: dict[str, Any], says: str) -> None:
    """Python's True, None, 'x' and {'a': 1} are no spelling a spec file has; the message says
    what the file holds, once."""
    with pytest.raises(SpecError) as err:
        spec_from_data(data, source="s.json")
    msg = err.value.message
    assert says in msg, msg
    assert not re.search(r"\b(True|False|None)\b|\{'|\['|(be|or|of|,) '", msg), msg
    assert msg.count("got ") <= 1, msg


def test_a_tuned_table_entry_error_shows_the_files_values_as_json(tmp_path: Path) -> None:
    entry = {"dtype": "bfloat16", "head_dim": 64, "seq": 2048, "batch": 4, "heads": 8, "mode": "fwd"}
    entry |= {"config": None, "median_ms": None, "auto_ms": 1.0, "causal": None}
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"format": "tilesweep-tuned", "version": 2, "device": {}, "entries": [entry]}))
    with pytest.raises(TunedTableError) as err:
        TunedTable.load(path, check_env=False)
    assert "entries[0] lacks impl, kv_heads" in str(err.value)
    entry |= {"impl": "tilesweep", "kv_heads": 8}
    path.write_text(json.dumps({"format": "tilesweep-tuned", "version": 2, "device": {}, "entries": [entry]}))
    with pytest.raises(TunedTableError, match=r"entries\[0\]: causal=null must be true or false$"):
        TunedTable.load(path, check_env=False)


@pytest.mark.parametrize(
    ("suffix", "text", "got"),
    [
        ("json", '{"bwd_fwd_config": [64]}', "[64]"),
        ("json", '{"bwd_fwd_config": [64, 128, 256]}', "[64, 128, 256]"),
        ("json", '{"bwd_fwd_config": 128}', "128"),
        ("toml", 'bwd_fwd_config = "128"', '"128"'),
    ],
)
def test_a_bwd_fwd_config_of_another_shape_names_the_field_its_spellings_and_what_it_got(
    tmp_path: Path, suffix: str, text: str, got: str
) -> None:
    path = tmp_path / f"spec.{suffix}"
    path.write_text(text)
    assert_one_line_error(
        run_cli("spec", str(path)),
        f'{path}: field "bwd_fwd_config": write [block_q, block_k] such as [64, 128], an object {{"block_q": 64, '
        f'"block_k": 128}}, or null (in TOML: leave it out) for 128/128; got {got}',
    )
    path.write_text(text.replace(got, "[64, 32]"))
    assert run_cli("spec", str(path)).returncode == 0
