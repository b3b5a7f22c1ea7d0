"""Where a document's records come from, as the report and its page say it: the sweeps merged
into it (a document that several sweeps appended into in turn keeps each one's tilesweep block,
``store.provenance.blocks``), what each planned, and when each measured and merged; and the
records reuse carried from earlier documents (``reused_from``: where each was measured), how
many from where, and when they were measured there (``store.append.measured_times``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.store.append import measured_times
from orchestrator.store.carry import source_of
from orchestrator.store.document import ResultsDoc
from orchestrator.store.provenance import TilesweepBlock, blocks, measured_span
from orchestrator.store.replayed import replayed_of

# a provenance row: its name and its value (several lines: a list), left out where None or ""
Row = tuple[str, Any]


def span_text(span: tuple[str, str] | None) -> str | None:
    """A span of times as the page says it: one time, or ``FIRST to LAST``."""
    if span is None:
        return None
    return span[0] if span[0] == span[1] else f"{span[0]} to {span[1]}"


def measured(every: Sequence[TilesweepBlock]) -> tuple[str, str] | None:
    """When the sweeps' records were measured: the earliest start to the latest end of any of
    them (``store.provenance.measured_span``), or None where none says."""
    spans = [s for b in every if (s := measured_span(b)) is not None]
    return (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None


def _name(block: TilesweepBlock | dict[str, Any]) -> str | None:
    """A sweep as the page names it: its directory and its spec's fingerprint."""
    return " ".join(str(x) for x in (block.get("sweep_dir"), block.get("fingerprint")) if x) or None


def _planned(block: TilesweepBlock) -> int | None:
    planned = block.get("planned")
    return planned if isinstance(planned, int) and not isinstance(planned, bool) else None


def _hours(block: TilesweepBlock) -> float | None:
    hours = block.get("gpu_hours")
    return float(hours) if isinstance(hours, (int, float)) and not isinstance(hours, bool) else None


def _line(block: TilesweepBlock) -> str:
    """One of several sweeps: its name, then what it planned, when it measured and merged, its GPU-hours."""
    facts = [
        f"{p} planned items" if (p := _planned(block)) is not None else None,
        f"measured {when}" if (when := span_text(measured([block]))) else None,
        f"merged {block['merged']}" if block.get("merged") else None,
        f"{h:g} GPU-hours" if (h := _hours(block)) is not None else None,
    ]
    said = ", ".join(f for f in facts if f)
    return (_name(block) or "a sweep") + (f" ({said})" if said else "")


def sweep_rows(tilesweep: object) -> list[Row]:
    """The provenance rows of the sweeps behind a document (``tilesweep``: its value of that
    key): one sweep's directory and fingerprint, planned items, when it measured and merged and
    its GPU-hours; of several (appended in turn), each sweep on a line of its own, oldest first,
    with the same facts, then the totals."""
    every = blocks(tilesweep)
    if len(every) <= 1:
        block: TilesweepBlock | dict[str, Any] = every[0] if every else {}
        return [
            ("sweep", _name(block)),
            ("planned items", block.get("planned")),
            ("measured", span_text(measured(every))),
            ("merged", block.get("merged")),
            ("GPU-hours", block.get("gpu_hours")),
        ]
    planned = [p for b in every if (p := _planned(b)) is not None]
    hours = [h for b in every if (h := _hours(b)) is not None]
    total = f"{sum(hours):g}"
    total += "" if len(hours) == len(every) else f" (of {len(hours)} of the {len(every)} sweeps; the others say none)"
    return [
        (f"sweeps ({len(every)}, appended in turn)", [_line(b) for b in every]),
        ("planned items", sum(planned) if planned else None),
        ("measured", span_text(measured(every))),
        ("merged", every[-1].get("merged")),
        ("GPU-hours", total if hours else None),
    ]


def carried_text(doc: ResultsDoc) -> str | None:
    """How many of the document's records reuse carried from earlier documents, from which (and
    how many from each), how many of them are replayed, and when the others were measured where
    they come from; None where reuse carried none."""
    sources: dict[str, int] = {}
    times: list[str] = []
    replayed, when = replayed_of(doc), measured_times(doc.extra.get("tilesweep"))
    n_replayed = 0
    for rec in doc.results:
        reused_from = rec.get("reused_from")
        if not isinstance(reused_from, str) or not reused_from:
            continue
        source = source_of(reused_from)
        sources[source] = sources.get(source, 0) + 1
        if replayed(rec):
            n_replayed += 1
        elif (started := when.of(rec)) is not None:
            times.append(started)
    if not sources:
        return None
    n, total = sum(sources.values()), len(doc.results)
    text = f"{n} of {total} record{'s' if total != 1 else ''} carried from earlier documents (not measured again): "
    text += ", ".join(f"{k} from {path}" for path, k in sources.items())
    if n_replayed:
        text += f"; {'all' if n_replayed == n else n_replayed} of them replayed, not measured"
    if times:
        measured = "the others measured" if n_replayed else "measured"
        text += f"; {measured} there {span_text((min(times), max(times)))}"
    return text
