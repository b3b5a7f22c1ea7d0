"""A search's portfolio: the configs that won the most problems in earlier documents.

A search (``timing.strategy: search``, ``planning.search``) measures first, per problem, the
configs that won the most problems of the sweep's reuse sources (its output document, the
``--reuse`` and ``reuse.documents`` ones: ``store.reuse.load_sources``), counted over the records
measured by the sweep's kernel implementation on its device kind. A problem's winner is its
forced record with the lowest median, never a screen nor an error (the report's best). Winners
of any problem count, not only of the sweep's own: the tiles that win on one shape tend to win
on its neighbours, which is what the portfolio is for.

A source whose records are all of another implementation or device kind gives no winner: one
warning per source says so, and the search goes on without it (its records may still be
reused where they are compatible; that is ``store.reuse``'s to judge).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import ResultsError
from orchestrator.planning.search import ranked
from orchestrator.planning.searchmodel import Config
from orchestrator.spec.records import DEFAULT_IMPL, config_fields, problem_key
from orchestrator.store.document import paused_gc, scan
from orchestrator.store.reuse import document_env
from orchestrator.store.reuse_sources import Source

log = logging.getLogger(__name__)

Family = tuple[str, str]  # (mode, impl): the configs of one grid layout


@dataclass
class Portfolio:
    """Per (mode, impl), the configs that won problems of the sources, most wins first, and how
    many each won; the sources that gave winners, and one line per source that gave none."""

    configs: dict[Family, list[Config]] = field(default_factory=dict)
    wins: dict[Family, dict[Config, int]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def of(self, mode: str, impl: str) -> list[Config]:
        return self.configs.get((mode, impl), [])


@dataclass
class _Best:
    """The fastest forced record seen per problem of one source."""

    ms: dict[tuple[Any, ...], float] = field(default_factory=dict)
    config: dict[tuple[Any, ...], tuple[Family, Config]] = field(default_factory=dict)
    other_impl: set[str] = field(default_factory=set)
    other_device: set[str] = field(default_factory=set)


def _offer(best: _Best, rec: Mapping[str, Any], impl: str, kind: Any, doc_kind: Any) -> None:
    """Count one record of a source towards its problem's winner, where it is this sweep's
    implementation's, on this sweep's device kind, and a full timing."""
    rec_impl = rec.get("impl", DEFAULT_IMPL)
    if rec_impl != impl:
        best.other_impl.add(str(rec_impl))
        return
    rec_kind = rec.get("device", doc_kind)
    if kind is not None and rec_kind is not None and rec_kind != kind:
        best.other_device.add(str(rec_kind))
        return
    if rec.get("config") != "forced" or "error" in rec or rec.get("screened"):
        return
    ms = rec.get("median_ms")
    if not isinstance(ms, (int, float)):
        return
    try:
        key = problem_key(rec)
        config = tuple(rec[f] for f in config_fields(rec["mode"], impl=str(rec_impl)))
    except (KeyError, TypeError):
        return
    if key not in best.ms or ms < best.ms[key]:
        best.ms[key] = float(ms)
        best.config[key] = ((str(rec["mode"]), str(rec_impl)), config)


def _winners(src: Source, impl: str, kind: Any) -> _Best:
    best = _Best()
    doc_kind = (document_env(src.doc) or {}).get("device_kind")
    with paused_gc():
        for batch in scan(src.path, role=src.role).batches:
            for rec in batch:
                _offer(best, rec, impl, kind, doc_kind)
    return best


def _why_none(src: Source, best: _Best, impl: str, kind: Any) -> str:
    """The line that says why a source gave the portfolio nothing."""
    what = []
    if best.other_impl:
        what.append(f"kernel implementation {', '.join(sorted(best.other_impl))} (this sweep's: {impl})")
    if best.other_device:
        what.append(f"device {', '.join(sorted(best.other_device))} (this sweep's: {kind})")
    measured = f"its records are of {' and '.join(what)}" if what else "it holds no timed forced record"
    return f"{src.path}: not used as the search's portfolio: {measured}; the search starts without its winners"


def portfolio(sources: Iterable[Source], impl: str, env: Mapping[str, Any] | None) -> Portfolio:
    """The winners of the sources' problems, measured by ``impl`` on the device kind of ``env``
    (the environment reuse checks records against; None: any device). A source that gives none
    is named once in ``ignored`` and logged as a warning."""
    device_kind = (env or {}).get("device_kind")
    out = Portfolio()
    wins: dict[Family, list[Config]] = {}
    for src in sources:
        try:
            best = _winners(src, impl, device_kind)
        except ResultsError as exc:  # damaged past its head: the reuse warning named it already
            log.info("%s; no portfolio from it", exc.message)
            continue
        if not best.config:
            if best.other_impl or best.other_device:
                line = _why_none(src, best, impl, device_kind)
                out.ignored.append(line)
                log.warning("%s", line)
            continue
        out.sources.append(src.path)
        for family, config in best.config.values():
            wins.setdefault(family, []).append(config)
    for family, configs in wins.items():
        out.configs[family] = ranked(configs)
        counts: dict[Config, int] = {}
        for c in configs:
            counts[c] = counts.get(c, 0) + 1
        out.wins[family] = counts
    return out
