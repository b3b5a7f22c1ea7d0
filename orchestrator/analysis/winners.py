"""Which kernel implementation wins each problem, where a document measured several.

A problem here is the report's (``report.ProblemKey``) less its implementation: the same
shape, dtype, mode, tag, causal and kv_heads measured by tilesweep's kernel, jax's stock one,
jax's Mosaic GPU one... Per problem each implementation measured is timed as the tuned table
answers for it (``export``'s ``wins``, what a model calling it runs): its fastest forced config
(``report.best_table``), or its ``auto`` where auto was faster (the table then says "use auto");
the implementation fastest so wins (a tie on the time broken as the tuned table breaks it,
``ranking.pick``: the lower q3, then config order, then the implementation's name, never the
order of the records); ``margin`` is the runner-up implementation's time over the
winner's (above 1). A problem only one implementation measured (or that every implementation but
one failed) is not a contest and is left out.

A contest is a *tie* when the runner-up's q1-q3 range overlaps the fastest's (equal times
included): as the report's "within noise" says of two configs, the sweep has not separated the
implementations, so no winner is named; the margin is then noise, never a gain. Every form that
names the winner (the text and markdown table, the page, ``--json``'s ``winner``/``winner_impl``,
null on a tie) says the tie and the implementations in it (``tied``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from orchestrator.analysis.ranking import pick
from orchestrator.analysis.report import ProblemKey, ProblemSummary, axis_cells, axis_columns
from orchestrator.analysis.summary import within_noise
from orchestrator.analysis.tables import fmt_ms, fmt_ratio, render


@dataclass(frozen=True)
class ImplBest:
    """One implementation's fastest way to run a problem: its best config, or auto (``config``
    None, ``label`` "auto") where auto was faster."""

    impl: str
    label: str
    config: dict[str, Any] | None
    ms: float
    q1_ms: float
    q3_ms: float


@dataclass(frozen=True)
class Contest:
    """One problem that several implementations measured (module docstring)."""

    key: ProblemKey  # impl None: across implementations
    bests: tuple[ImplBest, ...]  # fastest first

    @property
    def winner(self) -> ImplBest:
        """The fastest implementation; ``tie`` says whether the sweep separated it from the next."""
        return self.bests[0]

    @property
    def tied(self) -> tuple[ImplBest, ...]:
        """The implementations whose q1-q3 overlaps the fastest's, the fastest first; one: no tie."""
        first = self.bests[0]
        return tuple(b for b in self.bests if within_noise((b.q1_ms, b.q3_ms), (first.q1_ms, first.q3_ms)))

    @property
    def tie(self) -> bool:
        return len(self.tied) > 1

    @property
    def margin(self) -> float:
        """The runner-up implementation's best over the winner's."""
        return self.bests[1].ms / self.bests[0].ms

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self.key)
        out.pop("impl")
        out["winner"] = None if self.tie else self.winner.impl
        out["tied"] = [b.impl for b in self.tied] if self.tie else []
        out["margin"] = self.margin
        out["bests"] = [dataclasses.asdict(b) for b in self.bests]
        return out


def contests(summaries: list[ProblemSummary]) -> list[Contest]:
    """The problems of ``summaries`` that more than one implementation timed, in their order."""
    groups: dict[ProblemKey, list[ImplBest]] = {}
    for s in summaries:
        run = _impl_best(s)
        if run is not None:
            groups.setdefault(dataclasses.replace(s.key, impl=None), []).append(run)
    out = []
    for key, bests in groups.items():
        if len({b.impl for b in bests}) > 1:
            out.append(Contest(key, tuple(sorted(bests, key=lambda b: pick(b.ms, b.q3_ms, b.config, b.impl)))))
    return out


def _impl_best(s: ProblemSummary) -> ImplBest | None:
    """How the tuned table runs ``s``'s implementation: its best config, or auto where faster."""
    impl = str(s.key.impl)
    # auto where it alone was timed or was faster; on a tie with auto, the tuned config
    if s.auto_ms is not None and (s.best_ms is None or s.best_config is None or s.auto_ms < s.best_ms):
        q1, q3 = s.auto_q1_ms, s.auto_q3_ms
        return ImplBest(impl, "auto", None, s.auto_ms, s.auto_ms if q1 is None else q1, s.auto_ms if q3 is None else q3)
    if s.best_ms is None or s.best_config is None:
        return None  # neither a forced config nor auto timed
    q1, q3 = s.best_q1_ms, s.best_q3_ms
    return ImplBest(
        impl,
        s.best_label or "-",
        s.best_config,
        s.best_ms,
        s.best_ms if q1 is None else q1,
        s.best_ms if q3 is None else q3,
    )


def with_winners(rows: list[dict[str, Any]], found: list[Contest]) -> list[dict[str, Any]]:
    """``report --json``'s objects, each of a contested problem with ``winner_impl`` (the
    implementation whose best is fastest there, null on a tie), ``impl_tie`` (the implementations
    tied there, fastest first; empty where one wins) and ``impl_margin`` added."""
    by_key = {_key_of(c.to_json()): c for c in found}
    for row in rows:
        c = by_key.get(_key_of(row))
        if c is not None:
            row["winner_impl"] = None if c.tie else c.winner.impl
            row["impl_tie"] = [b.impl for b in c.tied] if c.tie else []
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
                "tie" if c.tie else c.winner.impl,
                fmt_ratio(c.margin),
                "; ".join(f"{b.impl}: {b.label}" for b in c.tied) if c.tie else c.winner.label,
            ]
        )
    legend = (
        "margin: the runner-up implementation's ms over the winner's, each as its tuned table answers (its fastest "
        "forced config, or auto where auto was faster: best auto)."
    )
    if any(c.tie for c in found):
        legend += (
            " tie: the implementations' q1-q3 ranges overlap (or their times are equal): the sweep has not separated "
            "them, so none wins and the margin is noise; best names each tied implementation's."
        )
    return render(header, rows, style, left={"dtype", "mode", "winner", "best", "causal"}, legend=legend)
