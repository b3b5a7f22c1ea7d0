"""Which kernel implementation wins each problem, where a document measured several.

A problem here is the report's (``report.ProblemKey``) less its implementation: the same
shape, dtype, mode, tag, causal and kv_heads measured by tilesweep's kernel, jax's stock one,
jax's Mosaic GPU one... Per problem each implementation measured is timed as the tuned table
answers for it (``export``'s ``wins``, what a model calling it runs): its fastest forced config
(``report.best_table``), or its ``auto`` where auto was faster (the table then says "use auto");
the implementation fastest so wins; ``margin`` is the runner-up implementation's time over the
winner's (above 1). A problem only one implementation measured (or that every implementation but
one failed) is not a contest and is left out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from orchestrator.analysis.report import ProblemKey, ProblemSummary, axis_cells, axis_columns
from orchestrator.analysis.tables import fmt_ms, fmt_ratio, render


@dataclass(frozen=True)
class ImplBest:
    """One implementation's fastest way to run a problem: its best config, or auto (``config``
    None, ``label`` "auto") where auto was faster."""

    impl: str
    label: str
    config: dict[str, Any] | None
    ms: float


@dataclass(frozen=True)
class Contest:
    """One problem that several implementations measured (module docstring)."""

    key: ProblemKey  # impl None: across implementations
    bests: tuple[ImplBest, ...]  # fastest first

    @property
    def winner(self) -> ImplBest:
        return self.bests[0]

    @property
    def margin(self) -> float:
        """The runner-up implementation's best over the winner's."""
        return self.bests[1].ms / self.bests[0].ms

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self.key)
        out.pop("impl")
        out["winner"] = self.winner.impl
        out["margin"] = self.margin
        out["bests"] = [dataclasses.asdict(b) for b in self.bests]
        return out


def contests(summaries: list[ProblemSummary]) -> list[Contest]:
    """The problems of ``summaries`` that more than one implementation timed, in their order."""
    groups: dict[ProblemKey, list[ImplBest]] = {}
    for s in summaries:
        runs = []
        if s.best_ms is not None and s.best_config is not None:
            runs.append(ImplBest(str(s.key.impl), s.best_label or "-", s.best_config, s.best_ms))
        if s.auto_ms is not None and (not runs or s.auto_ms < runs[0].ms):  # a tie: the tuned config
            runs = [ImplBest(str(s.key.impl), "auto", None, s.auto_ms)]
        if runs:
            groups.setdefault(dataclasses.replace(s.key, impl=None), []).append(runs[0])
    out = []
    for key, bests in groups.items():
        if len({b.impl for b in bests}) > 1:
            out.append(Contest(key, tuple(sorted(bests, key=lambda b: b.ms))))
    return out


def with_winners(rows: list[dict[str, Any]], found: list[Contest]) -> list[dict[str, Any]]:
    """``report --json``'s objects, each of a contested problem with ``winner_impl`` (the
    implementation whose best is fastest there) and ``impl_margin`` added."""
    by_key = {_key_of(c.to_json()): c for c in found}
    for row in rows:
        c = by_key.get(_key_of(row))
        if c is not None:
            row["winner_impl"] = c.winner.impl
            row["impl_margin"] = c.margin
    return rows


def _key_of(obj: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(obj.get(f.name) for f in dataclasses.fields(ProblemKey) if f.name != "impl")


def format_contests(found: list[Contest], style: str = "text") -> str:
    """The contests as a table: per problem each implementation's best (ms and config), the winner."""
    impls = sorted({b.impl for c in found for b in c.bests})
    axes = [a for a in axis_columns(c.key for c in found) if a != "impl"]
    header = ["dtype", "D", "seq", "B", "H", *axes, "mode", *[f"{i} ms" for i in impls], "winner", "margin", "best"]
    rows = []
    for c in found:
        k = c.key
        ms = {b.impl: b.ms for b in c.bests}
        rows.append(
            [
                k.dtype,
                str(k.head_dim),
                str(k.seq),
                str(k.batch),
                str(k.heads),
                *axis_cells(k, axes),
                k.mode,
                *[fmt_ms(ms.get(i)) for i in impls],
                c.winner.impl,
                fmt_ratio(c.margin),
                c.winner.label,
            ]
        )
    legend = (
        "margin: the runner-up implementation's ms over the winner's, each as its tuned table answers (its fastest "
        "forced config, or auto where auto was faster: best auto)."
    )
    return render(header, rows, style, left={"dtype", "mode", "winner", "best", "causal"}, legend=legend)
