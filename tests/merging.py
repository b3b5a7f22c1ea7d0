"""What the merge tests share: a finished synthetic sweep, and a document read back as the
reference format demands (``tests/test_merge*.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.planning import Unit
from orchestrator.store.merge import merge
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import build_sweep, small_spec

Sweep = tuple[SweepDir, list[Unit]]


def four_units(tmp_path: Path) -> Sweep:
    """A sweep of 4 units x 100 items, every partial complete."""
    return build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 4, output=tmp_path / "results.json")


def read_doc(path: Path) -> dict[str, Any]:
    """The document at ``path``, which must be the reference format byte for byte."""
    text = path.read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    assert json.dumps(doc, indent=1) == text  # the reference format, byte for byte
    return doc


def append_lines(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def merge_without_cache(sd: SweepDir) -> list[dict[str, Any]]:
    """The records a merge that reads every partial whole writes (into another file)."""
    out = sd.output.with_name("nocache.json")
    merge(sd, output=out, use_cache=False)
    records: list[dict[str, Any]] = read_doc(out)["results"]
    return records
