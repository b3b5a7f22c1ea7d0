"""A merge whose output is another kind of tilesweep file (a spec, a tuned table) refuses to
replace it, in one line that says what the file is and the merge's ways out, not the advice the
results-document reader gives whoever passed it as a document to read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import assert_one_line_error, run_cli


@pytest.mark.parametrize(
    "content, what",
    [
        ({"dtypes": ["bfloat16"], "output": "elsewhere.json"}, "(it is a sweep spec); merging would replace it"),
        (
            {"format": "tilesweep-tuned", "version": 2, "entries": []},
            '(it is a tuned table (format "tilesweep-tuned": `export` writes them)); merging would replace it',
        ),
    ],
)
def test_merging_over_a_spec_or_a_tuned_table_says_what_it_is(
    tmp_path: Path, content: dict[str, object], what: str
) -> None:
    out = tmp_path / "results.json"
    sd, _ = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 2, output=out)
    out.write_text(json.dumps(content))
    before = out.read_bytes()
    line = assert_one_line_error(run_cli("merge", str(sd.root)), f"{out} exists and is not a results document {what}")
    assert "--overwrite" in line and "pass the" not in line, line
    assert out.read_bytes() == before
