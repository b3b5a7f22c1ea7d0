"""What the report page shows of each problem (``ProblemView``): its summary, heatmap, the
configs that failed (with their first error), those missing from the plan and those a search
never measured. ``html`` renders them as cards and the summary table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from orchestrator.analysis.heatmap import Configs, HeatmapData, configs_of, heatmap_data
from orchestrator.analysis.report import ProblemSummary, astuple_key, best_table, config_label, group_by_problem
from orchestrator.analysis.scan import failure_text
from orchestrator.store.document import ResultsDoc


class Failed(NamedTuple):
    """A forced config of a problem that never produced a timing."""

    label: str
    error: str  # the first error recorded for it
    pruned: bool  # refused by the shared-memory model before running
    smem_bytes: int | None  # the model's prediction, for a pruned config


@dataclass(frozen=True)
class ProblemView:
    """What a problem's card shows. ``missing`` is None when the document cannot say."""

    number: int  # 1-based, document order: the card's anchor and the table's first column
    summary: ProblemSummary
    heatmap: HeatmapData | None
    failed: list[Failed]
    missing: list[str] | None  # labels of planned configs without a record
    never: list[str] = field(default_factory=list)  # labels of planned configs a search never measured

    @property
    def anchor(self) -> str:
        return f"p-{self.number}"


def _failed_configs(cs: Configs, mode: str, max_rel_err: float | None) -> list[Failed]:
    """Forced configs that never produced a timing, with their first error (a wrong output's
    where a timed record has one: ``spec.tolerance``)."""
    out = []
    for cid, rec in cs.best.items():
        if rec is None:
            bad = cs.first_failure[cid]
            smem = bad.get("smem_bytes")
            out.append(
                Failed(
                    cs.label(cid, mode),
                    failure_text(bad, max_rel_err),
                    bad.get("pruned") is True,
                    smem if isinstance(smem, int) else None,
                )
            )
    return out


def _missing_labels(s: ProblemSummary) -> list[str] | None:
    """The labels of the summary's planned configs without a record (None: no plan known)."""
    if s.coverage is None:
        return None
    return ["auto"] * s.auto_missing + [config_label(c, s.key.mode) for c in s.coverage.missing_configs()]


def _never_labels(s: ProblemSummary) -> list[str]:
    """The labels of the planned configs a search chose never to measure."""
    return [] if s.coverage is None else [config_label(c, s.key.mode) for c in s.coverage.never_measured_configs()]


def problem_views(doc: ResultsDoc) -> list[ProblemView]:
    """One view per problem in document order, planned problems without a record included."""
    groups = group_by_problem(doc.results)
    limit = doc.max_rel_err
    views = []
    for n, s in enumerate(best_table(doc), 1):
        recs = groups.get(astuple_key(s.key), [])
        cs = configs_of(s.key.mode, recs, limit)
        failed = _failed_configs(cs, s.key.mode, limit)
        views.append(ProblemView(n, s, heatmap_data(s.key, recs, cs), failed, _missing_labels(s), _never_labels(s)))
    return views
