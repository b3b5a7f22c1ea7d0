"""One pass over a document's records: per problem, what the best-config table is made of.

Per problem (``records.problem_key``, in order of first appearance: plan order) the pass keeps
the auto time and, per forced config (its config field values), the fastest record that is a
measurement (no error, an output within ``spec.tolerance``); configs that only failed, were
pruned or were only screened (a halving sweep's one-sample screens, never candidates) are kept
apart. ``report.best_table`` summarises it.

The loop is written out flat, without helper calls per forced record, because it runs once per
record of documents with a million of them; ``is_success`` is the readable form of its ``ok``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from orchestrator.spec import tolerance
from orchestrator.spec.records import DEFAULT_IMPL, config_fields, problem_key
from orchestrator.store.document import paused_gc

INF = float("inf")


def is_success(record: dict[str, Any], max_rel_err: float | None = None) -> bool:
    """A record counts as a measurement when it has a finite median, no error, and no
    ``rel_err`` that makes its output wrong (``spec.tolerance``; ``max_rel_err``: the
    document's ``check.max_rel_err``)."""
    m = record.get("median_ms")
    return (
        "error" not in record
        and isinstance(m, (int, float))
        and not isinstance(m, bool)
        and math.isfinite(m)
        and tolerance.wrong_result(record.get("rel_err"), record.get("dtype"), max_rel_err) is None
    )


def failure_text(record: dict[str, Any], max_rel_err: float | None = None) -> str:
    """Why a record is no measurement (``is_success`` False): its error, its wrong output, or
    that it has no timing."""
    return str(
        record.get("error")
        or tolerance.wrong_result(record.get("rel_err"), record.get("dtype"), max_rel_err)
        or "no timing recorded"
    )


class ProblemScan:
    """What one pass over a problem's records keeps: the auto time, the best record per config."""

    __slots__ = (
        "fields",
        "cid",
        "auto_ms",
        "auto_rec",
        "auto_error",
        "auto_seen",
        "per_config",
        "pruned",
        "screened",
        "first_error",
        "first_failed",
    )

    def __init__(self, mode: str, impl: str = DEFAULT_IMPL) -> None:
        self.fields = config_fields(mode, impl=impl)
        self.cid = itemgetter(*self.fields)
        self.auto_ms: float | None = None
        self.auto_rec: dict[str, Any] | None = None  # the record of ``auto_ms``
        self.auto_error: str | None = None  # why the first auto record that is no measurement is not
        self.auto_seen = False
        # config identity -> best successful record of that config (None: only failures)
        self.per_config: dict[Any, dict[str, Any] | None] = {}
        self.pruned: set[Any] = set()
        # configs with a screened record, each with its first (a candidate only if timed in full too)
        self.screened: dict[Any, dict[str, Any]] = {}
        self.first_error: str | None = None
        self.first_failed: dict[str, Any] | None = None  # the record of ``first_error``

    def add_auto(self, median_ms: float | None, rec: dict[str, Any]) -> None:
        """An auto record, with its median where it is a measurement (None where it is not)."""
        self.auto_seen = True
        if median_ms is not None and (self.auto_ms is None or median_ms < self.auto_ms):
            self.auto_ms = float(median_ms)
            self.auto_rec = rec

    def recorded(self) -> set[Any]:
        """The forced configs with any record: timed, failed or screened."""
        return self.per_config.keys() | self.screened.keys()


def scan(results: Iterable[dict[str, Any]], max_rel_err: float | None = None) -> dict[tuple[Any, ...], ProblemScan]:
    """One pass over all records, problems in order of first appearance (plan order);
    ``max_rel_err``: the document's ``check.max_rel_err`` (``tolerance.document_limit``)."""
    with paused_gc():
        return _scan(results, max_rel_err)


def _scan(results: Iterable[dict[str, Any]], max_rel_err: float | None) -> dict[tuple[Any, ...], ProblemScan]:
    scans: dict[tuple[Any, ...], ProblemScan] = {}
    get = scans.get
    bounds = tolerance.limits(max_rel_err).get
    other = tolerance.limit(None, max_rel_err)
    for rec in results:
        k = problem_key(rec)
        sc = get(k)
        if sc is None:
            sc = scans[k] = ProblemScan(k[5], k[9])
        m = rec.get("median_ms")
        ok = (m.__class__ is float or m.__class__ is int) and -INF < m < INF and "error" not in rec
        e = rec.get("rel_err")
        if (
            ok
            and e is not None
            and not ((e.__class__ is float or e.__class__ is int) and 0 <= e <= bounds(k[0], other))
        ):
            ok = False  # a wrong output (``tolerance.wrong_result``): failed, however fast
        if rec["config"] == "auto":
            sc.add_auto(m if ok else None, rec)
            if not ok and sc.auto_error is None:
                sc.auto_error = failure_text(rec, max_rel_err)
            continue
        try:
            cid = sc.cid(rec)
        except KeyError:  # a forced record without some config field: still one config
            cid = tuple(map(rec.get, sc.fields))
        per = sc.per_config
        if ok and rec.get("screened") is True:  # a screen, not a measurement: never a candidate
            sc.screened.setdefault(cid, rec)
        elif ok:
            prev = per.get(cid)
            if prev is None or m < prev["median_ms"]:
                per[cid] = rec
        else:
            if cid not in per:
                per[cid] = None
            if rec.get("pruned"):
                sc.pruned.add(cid)
            if sc.first_error is None:
                sc.first_error = failure_text(rec, max_rel_err)
                sc.first_failed = rec
    return scans
