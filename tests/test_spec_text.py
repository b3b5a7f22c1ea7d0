"""A spec file's text: what JSON lacks (comments, trailing commas, Python's spellings) and an
encoding tilesweep does not read (UTF-16, UTF-32) are named as what they are, with the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.files import load_spec
from tests.helpers import assert_one_line_error, run_cli


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{\n  "batch": 1,\n  // the small one\n  "heads": 2\n}\n', "line 3: JSON has no comments; remove it"),
        ('{\n  "batch": 1, /* small */\n  "heads": 2\n}\n', "line 2: JSON has no comments"),
        ('# a sweep\n{"batch": 1}\n', "line 1: JSON has no comments"),
        ('{\n  "batch": 1,\n  "heads": 2,\n}\n', "line 3: trailing comma after the last item"),
        ('{\n  "fwd_warps": [4, 8,],\n  "batch": 1\n}\n', "line 2: trailing comma after the last item"),
        ('{"auto_only": True}', "line 1: True is Python's spelling; JSON writes true"),
        ('{"kv_heads": [None]}', "line 1: None is Python's spelling; JSON writes null"),
        ("{'batch': 1}", "line 1: JSON strings and keys take double quotes"),
    ],
    ids=["line-comment", "block-comment", "hash-comment", "object-comma", "list-comma", "True", "None", "quotes"],
)
def test_what_json_lacks_is_named_with_its_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "spec.json"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.message.startswith(f"spec file {path} {needle}"), err.value.message
    assert "Expecting" not in err.value.message


def test_a_comment_is_one_line_from_the_cli_and_toml_is_offered(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text('{\n  "dtypes": ["float32"],\n  // tiles\n  "fwd_warps": [4, 8]\n}\n')
    assert_one_line_error(
        run_cli("spec", str(path)),
        f"spec file {path} line 3: JSON has no comments; remove it (or write the spec in TOML",
    )


def test_other_json_errors_keep_the_parsers_words(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text('{"batch": 1 "heads": 2}')
    with pytest.raises(SpecError, match=r"is not valid JSON: Expecting ',' delimiter at line 1 column 13"):
        load_spec(path)


@pytest.mark.parametrize(
    ("text", "stopped", "as_document"),
    [
        ('{"dtypes": ["bfloat16"], "ta', "Unterminated string starting at line 1 column 26", "the file ends before"),
        ('{"tag": "a\tb"}', "Invalid control character at line 1 column 11", None),
    ],
)
def test_a_truncated_or_damaged_file_says_where_the_parser_stopped_in_one_phrase(
    tmp_path: Path, text: str, stopped: str, as_document: str | None
) -> None:
    """A spec cut short (a copy that stopped, an editor's crash) or holding a raw tab in a string:
    the parser's words read as one phrase, as a spec and as a document given to ``report`` (which
    names a file cut short as one)."""
    path = tmp_path / "spec.json"
    path.write_text(text)
    assert_one_line_error(run_cli("spec", str(path)), f"spec file {path} is not valid JSON: {stopped}")
    said = as_document or f"not valid JSON: {stopped}"
    assert_one_line_error(run_cli("report", str(path)), f"not a results document: {said}")


@pytest.mark.parametrize(
    ("encoding", "name"),
    [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")],
)
def test_a_spec_saved_as_utf16_or_utf32_says_to_save_it_as_utf8(tmp_path: Path, encoding: str, name: str) -> None:
    """What Windows editors save as "Unicode" (UTF-16, with a byte-order mark or without one: a
    NUL beside each character) is text in another encoding, not a binary file."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"batch": 1, "dtypes": ["float32"]}), encoding=encoding)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.message.startswith(f"spec file {path} is {name} text; tilesweep reads UTF-8: save it as UTF-8")


def test_a_utf16_toml_spec_is_named_too(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text('batch = 1\ndtypes = ["float32"]\n', encoding="utf-16")
    assert_one_line_error(run_cli("spec", str(path)), f"spec file {path} is UTF-16 text", "save it as UTF-8")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["spec", "-"], ["spec file -: tilesweep reads no spec from standard input", "pass its path"]),
        (["plan", "-", "--dry-run"], ["spec file -: tilesweep reads no spec from standard input"]),
        (["report", "-"], ["-: tilesweep reads no results document from standard input", "pass its path"]),
        (["compare", "-", "-"], ["-: tilesweep reads no results document from standard input"]),
    ],
    ids=["spec", "plan", "report", "compare"],
)
def test_a_dash_for_standard_input_is_said_to_be_not_read(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    spec = json.dumps({"dtypes": ["float32"], "head_dims": [64], "seq_lens": [256], "modes": ["fwd"]})
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], input=spec, capture_output=True, text=True, cwd=tmp_path
    )
    said = assert_one_line_error(r, *needles)
    assert "does not exist" not in said and "no such file" not in said


def test_a_file_named_dash_is_read_as_a_spec(tmp_path: Path) -> None:
    (tmp_path / "-").write_text(json.dumps({"batch": 1}))
    r = run_cli("spec", "-", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["batch"] == 1, r.stderr
