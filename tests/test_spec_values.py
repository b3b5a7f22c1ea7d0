"""Spec values a user can get wrong, refused in the spec's own words: flags that are flags, not
numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.files import spec_from_data
from tests.helpers import assert_one_line_error, run_cli


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
    assert f"s.json: field '{field}': Input should be 'auto', true or false (got " in err.value.message


@pytest.mark.parametrize("value", ["auto", True, False])
def test_auto_true_and_false_are_taken(value: Any) -> None:
    spec = spec_from_data({"kernel": {"interpret": value}, "timing": {"flush_l2": value}})
    assert spec.kernel.interpret is value or spec.kernel.interpret == value == "auto"
    assert type(spec.timing.flush_l2) is type(value)


def test_interpret_1_is_one_line_from_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"kernel": {"interpret": 1}}))
    assert_one_line_error(run_cli("spec", str(path)), "field 'kernel.interpret'", "'auto', true or false")
