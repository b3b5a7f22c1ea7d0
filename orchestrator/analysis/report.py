"""Best config per problem: what a sweep found, how sure it is, and how much it buys over auto.

A *problem* is one (dtype, head_dim, seq, batch, heads, mode, tag) plus, where a record has
them, causal, kv_heads and the kernel implementation (``orchestrator.spec.records.problem_key``).
Per problem the best config is the forced config with the lowest median, a tie broken by ``ranking``'s
rules, never by record order (a halving sweep's ``"screened": true`` records are screens, never
candidates: counted as *screened out*); ``auto`` is the implementation's
own choice and is the baseline, never a candidate, so ``speedup = auto_ms / best_ms`` (above 1: tuning pays).

Throughput uses the attention FLOP count (``kernels.config.attention_flops``):

* fwd: ``4*B*H*S*S*D`` -- two matmuls (Q K^T and P V), 2 FLOPs per multiply-add;
* fwd_bwd: forward plus backward, the backward counted as 2.5x the forward (five matmuls,
  the usual FlashAttention convention), so ``3.5 * 4*B*H*S*S*D`` in total;
* causal: half of either, the lower triangle that is computed (the masked diagonal tiles are
  not counted), so a causal TFLOP/s is useful work, comparable with a non-causal one.

H is the query heads (grouped-query attention does the same matmuls). Softmax and other
elementwise work are not counted. Modes other than these two get no TFLOP/s.

A best config is flagged as *within noise* when its q1-q3 range overlaps the runner-up's:
the sweep has not separated the two, so either is a fair pick.

Each problem names the config ``auto`` ran (``analysis.auto``, the kernel's own rule). Where the
best forced config is that config, the best and auto are two timings of one kernel: the speedup
is 1.00 and their ratio is shown as noise in the note, never as a gain.

Replayed records (``store.replayed``) are no measurements: a problem whose best or auto timing
is replayed says so (``replayed``), and the legend says what that means.

Where the document knows its plan (``coverage``: the one home of planned versus recorded), a
problem also says how many planned configs have no record (``missing``; a planned problem without
any record gets a row) and how many a search chose never to measure (``never measured``: not
missing), and a best chosen while fewer than half the configs to be measured were timed is marked
``best of N/M timed``.

``best_table`` returns data, from one pass over the records (``scan``); ``format_table`` turns it
into text or a GitHub table. The CLI (and ``tilesweep run`` at the end of a sweep) prints.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kernels.config import attention_flops
from orchestrator.analysis.auto import AutoRule, auto_choice, auto_config, auto_rule, same_config
from orchestrator.analysis.coverage import Coverage, Plans, plans_of
from orchestrator.analysis.labels import config_label
from orchestrator.analysis.legend import REPLAYED_LEGEND, table_legend
from orchestrator.analysis.problems import ProblemKey, astuple_key, axis_cells, axis_columns
from orchestrator.analysis.ranking import quartiles, rank
from orchestrator.analysis.scan import ProblemScan, scan
from orchestrator.analysis.screens import Survivors, survivors_of
from orchestrator.analysis.summary import (
    CAUSAL_FLOPS_FORMULAS,
    FLOPS_FORMULAS,
    FWD_FLOPS_FORMULA,
    ProblemSummary,
    tflops_text,
    within_noise,
)
from orchestrator.analysis.tables import fmt_ms, fmt_ratio, render
from orchestrator.spec.records import config_of, problem_key
from orchestrator.store.document import ResultsDoc
from orchestrator.store.provenance import blocks
from orchestrator.store.replayed import Replayed, replayed_of

# what a problem is lives in ``problems``, its row in ``summary``; named here too, where the reports' callers find it
__all__ = [
    "CAUSAL_FLOPS_FORMULAS",
    "FLOPS_FORMULAS",
    "FWD_FLOPS_FORMULA",
    "REPLAYED_LEGEND",
    "ProblemKey",
    "ProblemSummary",
    "astuple_key",
    "axis_cells",
    "axis_columns",
    "best_table",
    "config_label",
    "format_table",
    "group_by_problem",
    "tflops_text",
    "to_json",
]


def group_by_problem(results: Iterable[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Records per problem key tuple, problems in order of first appearance (plan order)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    get = groups.get
    for rec in results:
        k = problem_key(rec)
        g = get(k)
        if g is None:
            groups[k] = g = []
        g.append(rec)
    return groups


def best_table(doc: ResultsDoc, plans: Plans | None = None, survivors: Survivors | None = None) -> list[ProblemSummary]:
    """One ``ProblemSummary`` per problem, in the document's order, then planned ones without records.
    ``plans``, ``survivors``: what the documents ``doc`` was combined from planned and named survivors
    of (``analysis.combine``; default: ``doc``'s own blocks)."""
    plans = plans_of(doc) if plans is None else plans
    scans = scan(doc.results, doc.max_rel_err)
    unrecorded = plans.problems() - scans.keys()
    for problem in sorted(unrecorded, key=lambda k: tuple((v is None, 0 if v is None else v) for v in k)):
        scans[problem] = ProblemScan(problem[5], problem[9])
    about = _About(auto_rule(doc), replayed_of(doc), _auto_only(doc))
    rule = survivors_of(doc) if survivors is None else survivors
    out = []
    for k, sc in scans.items():
        waiting = rule.waiting(sc) if rule is not None else set()  # missing: resume times them in full
        out.append(_summary(ProblemKey(*k), sc, plans.coverage(k, sc.recorded() - waiting), about, len(waiting)))
    return out


@dataclass(frozen=True)
class _About:
    """What a document says about all its problems: the rule of its auto configs, which of its
    records are replayed, and whether its sweeps measured auto alone."""

    auto: AutoRule
    replayed: Replayed
    auto_only: bool

    def auto_of(self, key: ProblemKey) -> dict[str, Any] | None:
        return auto_config(self.auto, mode=key.mode, dtype=key.dtype, head_dim=key.head_dim, seq=key.seq, impl=key.impl)

    def any_replayed(self, *records: dict[str, Any] | None) -> bool:
        return any(r is not None and self.replayed(r) for r in records)


def _auto_only(doc: ResultsDoc) -> bool:
    """Whether the document's sweeps measured each problem's auto alone (``auto_only: true`` in
    every sweep's spec; in the config block of a document without a tilesweep block)."""
    specs = [b.get("spec") for b in blocks(doc.extra.get("tilesweep"))]
    if not specs:
        return doc.config.get("auto_only") is True
    return all(isinstance(spec, dict) and spec.get("auto_only") is True for spec in specs)


def _summary(
    key: ProblemKey, sc: ProblemScan, cover: Coverage | None, about: _About, waiting: int = 0
) -> ProblemSummary:
    fields, per_config, auto_ms = sc.fields, sc.per_config, sc.auto_ms
    ok = [r for r in per_config.values() if r is not None]
    n_failed = len(per_config) - len(ok)
    n_pruned = sum(1 for cid in sc.pruned if per_config.get(cid) is None)
    best, runner = _two_fastest(ok, fields)

    auto = about.auto_of(key)
    best_config = best_label = best_ms = q1 = q3 = speedup = tflops = None
    is_auto = False
    if best is not None:
        best_config = {f: best.get(f) for f in fields}
        best_label = config_label(best_config, key.mode)
        best_ms = float(best["median_ms"])
        q1, q3 = quartiles(best)
        is_auto = same_config(best_config, auto)  # two timings of one kernel: no speedup
        if auto_ms is not None and best_ms > 0:
            speedup = 1.0 if is_auto else auto_ms / best_ms
    flops = attention_flops(key.mode, key.batch, key.heads, key.seq, key.head_dim, causal=key.causal)
    if flops is not None and best_ms:
        tflops = flops / (best_ms * 1e-3) / 1e12

    return ProblemSummary(
        key=key,
        best_config=best_config,
        best_label=best_label,
        best_ms=best_ms,
        best_q1_ms=q1 if best is not None else None,
        best_q3_ms=q3 if best is not None else None,
        auto_ms=auto_ms,
        auto_status="ok" if auto_ms is not None else ("failed" if sc.auto_seen else "absent"),
        speedup=speedup,
        flops=flops,
        tflops=tflops,
        n_configs=len(sc.recorded()),
        n_failed=n_failed,
        n_pruned=n_pruned,
        n_screened=len(sc.screened.keys() - per_config.keys()) - waiting,
        n_waiting=waiting,
        auto_error=sc.auto_error if auto_ms is None else None,
        runner_up_label=config_label(config_of(runner), key.mode) if runner else None,
        runner_up_ms=float(runner["median_ms"]) if runner else None,
        within_noise=_within_noise(best, runner),
        first_error=sc.first_error if best is None else None,
        coverage=cover,
        auto_config=auto,
        auto_config_from=about.auto.source if auto is not None else None,
        auto_choice=auto_choice(key.impl) if auto is None else None,
        best_is_auto=is_auto,
        replayed=about.any_replayed(best, sc.auto_rec) or (best is None and about.any_replayed(sc.first_failed)),
        auto_only=about.auto_only,
        **_auto_spread(sc),
    )


def _two_fastest(records: list[dict[str, Any]], fields: Iterable[str]) -> tuple[dict | None, dict | None]:
    """Fastest and second fastest, as ``ranking`` ranks them (``fields``: the config fields): a tie
    on the median never goes by document order."""
    names = list(fields)
    ranked = sorted(records, key=lambda r: rank(r, {f: r.get(f) for f in names}))
    return (ranked[0] if ranked else None), (ranked[1] if len(ranked) > 1 else None)


def _within_noise(best: dict[str, Any] | None, runner: dict[str, Any] | None) -> bool:
    """Whether the best's q1-q3 range overlaps the runner-up's: the sweep has not separated them."""
    if best is None or runner is None:
        return False
    return within_noise(quartiles(best), quartiles(runner))


def _auto_spread(sc: ProblemScan) -> dict[str, float]:
    """auto's q1 and q3 as ``ProblemSummary`` fields, where auto has a timing."""
    if sc.auto_ms is None or sc.auto_rec is None:
        return {}
    q1, q3 = quartiles(sc.auto_rec)
    return {"auto_q1_ms": q1, "auto_q3_ms": q3}


# --------------------------------------------------------------------------- formatting


def _row(s: ProblemSummary, with_tag: bool, axes: list[str], with_missing: bool = False) -> list[str]:
    k = s.key
    row = [k.dtype, str(k.head_dim), str(k.seq), str(k.batch), str(k.heads), *axis_cells(k, axes), k.mode]
    if with_tag:
        row.append("-" if k.tag is None else str(k.tag))
    q = "-" if s.best_q1_ms is None else f"{fmt_ms(s.best_q1_ms)}-{fmt_ms(s.best_q3_ms)}"
    row += [
        s.best_label or "-",
        fmt_ms(s.best_ms),
        q,
        fmt_ms(s.auto_ms),
        s.auto_cell,
        fmt_ratio(s.speedup),
        "-" if s.tflops is None else tflops_text(s.tflops),
        str(s.n_configs),
        str(s.n_failed),
        *([("-" if s.n_missing is None else str(s.n_missing))] if with_missing else []),
        s.note,
    ]
    return row


_HEADER = ["dtype", "D", "seq", "B", "H", "mode"]
_HEADER_TAIL = ["best", "ms", "q1-q3 ms", "auto ms", "auto config", "speedup", "TFLOP/s", "configs", "failed", "note"]
_LEFT = {"dtype", "mode", "tag", "best", "auto config", "note", "causal", "impl"}


def format_table(summaries: list[ProblemSummary], style: str = "text", *, legend: bool = True) -> str:
    """Render summaries as an aligned plain-text table (``text``) or a GitHub table (``markdown``).
    The tag column appears only when the summaries hold more than one tag, the missing column
    only where the document's plan is known (``render`` refuses another style)."""
    with_tag = len({s.key.tag for s in summaries}) > 1
    axes = axis_columns(s.key for s in summaries)
    with_missing = any(s.n_missing is not None for s in summaries)
    tail = _HEADER_TAIL[:-1] + ["missing", "note"] if with_missing else _HEADER_TAIL
    header = _HEADER[:5] + axes + _HEADER[5:] + (["tag"] if with_tag else []) + tail
    rows = [_row(s, with_tag, axes, with_missing) for s in summaries]
    return render(header, rows, style, left=_LEFT, legend=table_legend(summaries) if legend else None)


def to_json(summaries: list[ProblemSummary]) -> list[dict[str, Any]]:
    """The ``--json`` form: one object per problem, with the FLOP formula it used."""
    return [s.to_json() for s in summaries]
