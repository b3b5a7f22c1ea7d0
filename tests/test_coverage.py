"""Planned versus recorded: the report's missing count and the page's missing list agree.

Both come from ``analysis.coverage``: the configs the document's plans have for a problem (the
plans of every sweep appended into it) and which of those have no record.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from orchestrator.analysis import html, report
from orchestrator.analysis.views import problem_views
from orchestrator.planning import WorkItem
from orchestrator.store import document as results_doc
from orchestrator.store import synthetic
from tests.conftest import run_cli
from tests.test_html import Page

# Two sweeps of different grids into one output; they share seq 512
SPEC_A: dict[str, Any] = {
    "tag": "t",
    "dtypes": ["bfloat16"],
    "head_dims": [64],
    "seq_lens": [256, 512],
    "modes": ["fwd"],
    "fwd_block_q": [32, 64],
    "fwd_block_k": [32],
    "fwd_stages": [2],
    "fwd_warps": [4],
}
SPEC_B: dict[str, Any] = {**SPEC_A, "seq_lens": [512, 1024], "fwd_block_q": [128], "fwd_block_k": [64], "append": True}


def _sweep_without(root: Path, spec: dict[str, Any], out: Path, seq: int, block_q: int) -> None:
    """A sweep of ``spec`` whose workers wrote every record but that of the (seq, block_q)
    config, merged into ``out`` by ``tilesweep merge``."""
    n_units = len(spec["seq_lens"])  # a unit per shape
    sd, units = synthetic.build_sweep(root, {**spec, "output": str(out)}, n_units, write_partials=False, output=out)
    rng = random.Random(1)
    for unit in units:
        dropped = {it.id for it in unit.items if _is(it, seq, block_q)}
        lines = [line for line in synthetic.partial_lines(sd, unit, rng) if _item_of(line) not in dropped]
        sd.partial_path(unit.id).write_text("\n".join(lines) + "\n")
    r = run_cli("merge", str(sd.root))
    assert r.returncode == 0 and f"1 of {sd.planned} planned missing" in r.stdout, r.stdout + r.stderr


def _is(it: WorkItem, seq: int, block_q: int) -> bool:
    return it.seq == seq and it.config == "forced" and it.params[0] == block_q


def _item_of(line: str) -> str | None:
    """The item a partial line is about (None: the header)."""
    obj = json.loads(line)
    return obj.get("start") or obj.get("id")


def _missing_lists(page: str) -> dict[int, list[str]]:
    """Per card (problem number), the configs its missing list names."""
    out = {}
    for number, card in re.findall(r'<section class="problem" id="p-(\d+)">(.*?)</section>', page):
        gone = re.search(r"without a record \(resume redoes them\)</summary><ul><li>(.*?)</li>", card)
        out[int(number)] = re.findall(r"<code>(.*?)</code>", gone.group(1)) if gone else []
    return out


def test_an_appended_document_counts_and_lists_the_missing_configs_of_every_sweep(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    _sweep_without(tmp_path / "a", SPEC_A, out, seq=256, block_q=64)  # a problem only A plans
    _sweep_without(tmp_path / "b", SPEC_B, out, seq=512, block_q=128)  # one both plan
    doc = json.loads(out.read_text())
    assert len(doc["tilesweep"]["earlier"]) == 1  # B's block, A's kept under it

    rows = json.loads(run_cli("report", str(out), "--json").stdout)
    assert [(r["seq"], r["n_planned"], r["n_missing"]) for r in rows] == [(256, 2, 1), (512, 3, 1), (1024, 1, 0)]
    text = run_cli("report", str(out)).stdout.splitlines()
    end = text[0].index("missing") + len("missing")  # a right-aligned column
    assert [line[:end].split()[-1] for line in text[1:4]] == ["1", "1", "0"]
    md = run_cli("report", str(out), "--markdown").stdout.splitlines()
    at = [c.strip() for c in md[0].split("|")].index("missing")
    assert [line.split("|")[at].strip() for line in md[2:5]] == ["1", "1", "0"]

    page = tmp_path / "page.html"
    assert run_cli("report", str(out), "--html", str(page)).returncode == 0
    text = page.read_text()
    assert [row[16] for row in Page(text).rows] == ["1", "1", "0"]  # the summary's missing column
    assert _missing_lists(text) == {1: ["bq64 bk32 s2 w4"], 2: ["bq128 bk64 s2 w4"], 3: []}
    assert [len(v) for v in _missing_lists(text).values()] == [r["n_missing"] for r in rows]


def test_a_screened_config_is_recorded_not_missing() -> None:
    spec = synthetic.problems_spec(n_seqs=1, dtypes=["bfloat16"], head_dims=[64], modes=["fwd"])
    full = synthetic.document(spec)
    screened = [r for r in full["results"] if r["config"] == "forced" and "median_ms" in r][:5]
    for r in screened:
        r["screened"] = True  # a halving sweep's screen, never timed in full
    (s,) = report.best_table(results_doc.from_obj(full))
    assert (s.n_screened, s.n_missing) == (5, 0)
    assert problem_views(results_doc.from_obj(full))[0].missing == []


def test_a_planned_problem_without_a_record_has_a_row_and_a_card() -> None:
    spec = synthetic.problems_spec(n_seqs=1, dtypes=["bfloat16"], head_dims=[64])
    full = synthetic.document(spec)
    doc = results_doc.from_obj({**full, "results": [r for r in full["results"] if r["mode"] == "fwd"]})
    rows = report.to_json(report.best_table(doc))
    # nothing of fwd_bwd recorded: every planned config is missing, and its auto (merge counts it too)
    assert [(r["mode"], r["n_missing"]) for r in rows] == [("fwd", 0), ("fwd_bwd", rows[1]["n_planned"] + 1)]
    assert rows[1]["note"] == "nothing measured"
    views = problem_views(doc)
    assert [len(v.missing or []) for v in views] == [r["n_missing"] for r in rows]
    assert "no best config: nothing measured" in html.facts(views[1].summary)
    assert len(Page(html.report_page(doc)).rows) == 2
