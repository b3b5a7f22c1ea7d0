"""An option's value the command line refuses (a count, a duration) is said in one line as it was
typed, in double quotes as JSON spells a string, whatever it holds (``"0"``, ``"nan"``, ``"soon"``);
an empty path for a file or a folder: ``test_cli_messages.py`` and ``test_output_guard.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_cli


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["wait", "{dir}", "--interval", "soon"], 'argument --interval: expected seconds, got "soon"'),
        (["wait", "{dir}", "--timeout", "nan"], 'at most 10000000, got "nan"'),
        (["run", "spec.json", "--units", "0"], 'argument --units: must be a positive integer, got "0"'),
        (["report", "results.json", "--max-plots", "-1"], '--max-plots: must be a whole number, 0 or more, got "-1"'),
    ],
)
def test_an_option_value_refused_is_said_as_typed_in_double_quotes(tmp_path: Path, args: list[str], said: str) -> None:
    r = run_cli(*(a.format(dir=tmp_path) for a in args), cwd=tmp_path)
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
