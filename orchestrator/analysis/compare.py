"""Two results documents side by side: best config and median per problem, and B/A.

The usual question is "what changed between two runs" (two clusters, two jax versions, a
kernel change, our kernel against jax's stock one), and such runs carry different tags or
implementations, so problems are matched on (dtype, head_dim, seq, batch, heads, causal,
kv_heads, mode) alone. Only when a document holds one problem under several tags or
implementations do tag and implementation join the match key (otherwise which one to pair is
a guess).

``ratio = B best ms / A best ms``: below 1, B is faster.

A document of replayed records (``store.replayed``) is labelled so wherever it is named, and a
problem whose timings on one side are replayed says so in its note: a replay against its own
source compares two draws of one measurement, not two runs.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from orchestrator.analysis.report import (
    ProblemKey,
    ProblemSummary,
    axis_cells,
    axis_columns,
    best_table,
)
from orchestrator.analysis.tables import fmt_ms, render
from orchestrator.store.document import ResultsDoc
from orchestrator.store.provenance import own_block
from orchestrator.store.replayed import describe


@dataclass(frozen=True)
class ProblemComparison:
    key: ProblemKey  # tag is None when problems were matched without it
    a: ProblemSummary | None
    b: ProblemSummary | None

    @property
    def presence(self) -> str:
        if self.a is None:
            return "only B"
        if self.b is None:
            return "only A"
        return "both"

    @property
    def ratio(self) -> float | None:
        if self.a is None or self.b is None or not self.a.best_ms or self.b.best_ms is None:
            return None
        return self.b.best_ms / self.a.best_ms

    @property
    def same_config(self) -> bool:
        """A and B's best is one config of one kernel (two kernels' configs are never the same)."""
        return (
            self.a is not None
            and self.b is not None
            and self.a.key.impl == self.b.key.impl
            and self.a.best_label is not None
            and self.a.best_label == self.b.best_label
        )

    @property
    def kernels(self) -> str | None:
        """ "A tilesweep, B jax" where A and B measured the problem with two kernel implementations."""
        if self.a is None or self.b is None or self.a.key.impl == self.b.key.impl:
            return None
        return f"A {self.a.key.impl}, B {self.b.key.impl}"

    @property
    def note(self) -> str:
        a, b = self.a, self.b
        if a is None or b is None:
            present = a or b
            return f"only in {self.presence[-1]}" + (" (replayed)" if present is not None and present.replayed else "")
        notes = [f"{side} replayed" for side, s in (("A", a), ("B", b)) if s.replayed]
        notes += [f"no timing in {side}" for side, s in (("A", a), ("B", b)) if s.best_ms is None]
        if self.same_config:
            notes.append("same config")
        if self.kernels:
            notes.append(self.kernels)
        return ", ".join(notes)

    def to_json(self) -> dict[str, Any]:
        k = self.key
        out: dict[str, Any] = {
            "dtype": k.dtype,
            "head_dim": k.head_dim,
            "seq": k.seq,
            "batch": k.batch,
            "heads": k.heads,
            "causal": k.causal,
            "kv_heads": k.kv_heads,
            "mode": k.mode,
            "tag": k.tag,
            "impl": k.impl,
            "presence": self.presence,
        }
        for side, s in (("a", self.a), ("b", self.b)):
            out[side] = (
                None
                if s is None
                else {
                    "tag": s.key.tag,
                    "impl": s.key.impl,
                    "best_label": s.best_label,
                    "best_config": s.best_config,
                    "best_ms": s.best_ms,
                    "auto_ms": s.auto_ms,
                    "replayed": s.replayed,
                }
            )
        out["ratio_b_over_a"] = self.ratio
        out["same_config"] = self.same_config
        out["note"] = self.note
        return out


def _several_tags(summaries: list[ProblemSummary]) -> bool:
    counts = Counter(_untagged(s.key) for s in summaries)
    return any(n > 1 for n in counts.values())


def _untagged(k: ProblemKey) -> ProblemKey:
    return dataclasses.replace(k, tag=None, impl=None)


def compare(doc_a: ResultsDoc, doc_b: ResultsDoc) -> list[ProblemComparison]:
    """One comparison per problem in either document: A's order, then B-only problems."""
    sa, sb = best_table(doc_a), best_table(doc_b)
    with_tag = _several_tags(sa) or _several_tags(sb)

    def key(s: ProblemSummary) -> ProblemKey:
        return s.key if with_tag else _untagged(s.key)

    a_by = {key(s): s for s in sa}
    b_by = {key(s): s for s in sb}
    keys = list(a_by) + [k for k in b_by if k not in a_by]
    return [ProblemComparison(k, a_by.get(k), b_by.get(k)) for k in keys]


def caveats(rows: list[ProblemComparison], doc_a: ResultsDoc, doc_b: ResultsDoc) -> list[str]:
    """What makes B/A mean less than it seems: one file given as both, no problem in common, or
    two device kinds."""
    out = []
    if _one_file(doc_a, doc_b):
        names = doc_a.name if doc_a.name == doc_b.name else f"{doc_a.name} and {doc_b.name}"
        out.append(
            f"A and B are one file ({names}): it is compared with itself, so B/A is 1 wherever it has a timing; "
            "name two results documents to compare"
        )
    if rows and not any(r.presence == "both" for r in rows):
        out.append(f"A and B have no problem in common ({_apart(rows)}): no B/A to give")
    elif rows and not any(r.ratio is not None for r in rows):
        out.append(
            "no problem has a best timing in both A and B (those in common failed or were not timed): no B/A to give"
        )
    pairs = sorted({r.kernels for r in rows if r.kernels})
    if pairs:
        out.append(
            f"A and B were measured with different kernel implementations ({'; '.join(pairs)}): B/A compares the "
            "kernels as much as their configs"
        )
    kind_a, kind_b = doc_a.device.get("device_kind"), doc_b.device.get("device_kind")
    if kind_a and kind_b and kind_a != kind_b:
        out.append(f"A was measured on {kind_a}, B on {kind_b}: B/A compares the devices as much as the configs")
    return out


def _one_file(doc_a: ResultsDoc, doc_b: ResultsDoc) -> bool:
    """Whether A and B were read from one file (named twice, or by two names: a link)."""
    if doc_a.path is None or doc_b.path is None:
        return False
    try:
        return os.path.samefile(doc_a.path, doc_b.path)
    except OSError:  # a document gone since it was read: no longer the other one's file
        return False


def _apart(rows: list[ProblemComparison]) -> str:
    """What keeps A's problems from B's: the axes on which they share no value, else those
    whose values differ (the keys as they were matched: the tag only where it joined them)."""
    keys = {side: [r.key for r in rows if getattr(r, side) is not None] for side in ("a", "b")}
    values = {
        f.name: ({getattr(k, f.name) for k in keys["a"]}, {getattr(k, f.name) for k in keys["b"]})
        for f in dataclasses.fields(ProblemKey)
        if f.name != "impl"
    }
    apart = [axis for axis, (a, b) in values.items() if not a & b]
    differ = apart or [axis for axis, (a, b) in values.items() if a != b]
    if not differ:
        return "no single axis tells them apart: they differ in how the axes combine"
    return "they differ in " + ", ".join(differ)


def _doc_label(doc: ResultsDoc) -> str:
    """The document's name and what its device block says it was measured on (and with which jax);
    what the block does not name is said so, not shown as ``?``."""
    kind, jax = doc.device.get("device_kind"), doc.device.get("jax")
    if kind or jax:
        on = f"{kind or 'no device kind named'}, {f'jax {jax}' if jax else _jax_of_reused(doc)}"
    elif doc.results:
        on = "its device block names no device kind and no jax version"
    else:
        on = "no record: measured on no device"
    replayed = describe(doc)
    return f"{doc.name} ({on}" + (f"; {replayed})" if replayed else ")")


def _jax_of_reused(doc: ResultsDoc) -> str:
    """The jax of a document whose device block names none: one whose records were all reused
    (no worker of its sweep ran, so no worker's device block is there), whose ``tilesweep``
    block keeps the environment they were checked against when they were reused, and the
    documents they came from."""
    own = own_block(doc.extra.get("tilesweep"))
    reused = own.get("reused") if own is not None else None
    if own is None or not isinstance(reused, dict):
        return "no jax version named"
    env, sources = own.get("env"), reused.get("from")
    names = ", ".join(map(str, sources)) if isinstance(sources, dict) and sources else "earlier documents"
    if isinstance(env, dict) and env.get("jax"):
        return f"jax {env['jax']}, of the records it reused from {names}"
    return f"no jax version named: its records were reused from {names}, whose device blocks name it"


def format_compare(
    rows: list[ProblemComparison],
    style: str = "text",
    *,
    doc_a: ResultsDoc | None = None,
    doc_b: ResultsDoc | None = None,
) -> str:
    """Text or GitHub table; names the two documents above it when given."""
    with_tag = any(r.key.tag is not None for r in rows)
    axes = axis_columns(r.key for r in rows)
    header = ["dtype", "D", "seq", "B", "H", *axes, "mode"] + (["tag"] if with_tag else [])
    header += ["A best", "A ms", "B best", "B ms", "B/A", "note"]
    body = []
    for r in rows:
        k = r.key
        row = [k.dtype, str(k.head_dim), str(k.seq), str(k.batch), str(k.heads), *axis_cells(k, axes), k.mode]
        if with_tag:
            row.append(str(k.tag))
        for s in (r.a, r.b):
            row += ["-", "-"] if s is None else [s.best_label or "-", fmt_ms(s.best_ms)]
        row += ["-" if r.ratio is None else f"{r.ratio:.3f}", r.note]
        body.append(row)
    left = {"dtype", "mode", "tag", "A best", "B best", "note", "causal", "impl"}
    legend = "B/A = B best ms / A best ms (below 1: B is faster)."
    table = render(header, body, style, left=left, legend=legend)
    head = []
    if doc_a is not None and doc_b is not None:
        head = [f"A: {_doc_label(doc_a)}", f"B: {_doc_label(doc_b)}", ""]
        if style == "markdown":  # a blank line ends the list: a table right below one renders as its text
            head = [f"- A: `{_doc_label(doc_a)}`", f"- B: `{_doc_label(doc_b)}`", "", ""]
    return "\n".join(head) + table


def to_json(rows: list[ProblemComparison], doc_a: ResultsDoc, doc_b: ResultsDoc) -> dict[str, Any]:
    """The ``--json`` form: the two documents' names and devices, then one object per problem."""
    return {
        "a": {"path": doc_a.name, "device": doc_a.device, "replayed": describe(doc_a)},
        "b": {"path": doc_b.name, "device": doc_b.device, "replayed": describe(doc_b)},
        "ratio": "b_best_ms / a_best_ms",
        "problems": [r.to_json() for r in rows],
    }
