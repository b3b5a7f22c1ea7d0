"""Several results documents as one, for a tuned table from many sweeps (``export A B ...``).

Sweeps of one model's shapes come from several runs, dates and clusters. Per record identity
(``records.item_id``) the newest record of the chosen device kind is kept: newest by when its
attempt started (the documents' tilesweep blocks say, per unit and attempt, and for a record
carried by reuse, when its source measured it: ``store.append.measured_times``), a record whose
time no block names counting as older than any
that has one, and between equals the later document on the command line. What is dropped is
counted and said: records of another device kind, and records superseded by a newer one of the
same identity (those measured with an older jax than the record that replaced them are counted
apart: that is the usual reason to rerun).

Replayed records (``store.replayed``: a replay's, on a virtual clock) are not measurements:
they are left out unless asked (``include_replays``), and then they fill only identities no
measured record has; a measured record replaces a replayed one whatever their times. A replayed
record kept carries ``timer: virtual`` (the rule reads it there once the documents' blocks are
gone), and the device block comes from a document of measurements where one has the kind.
The combined document has no tilesweep block: what the documents it takes records from planned,
the problems whose search has not ended there and the screened configs they name survivors of
are kept apart (``Combined.plans``, ``Combined.survivors``), so a table of it tells a problem
not timed in full yet (a round still to run, configs still to measure) from a finished one, as
a table of each document alone does. Each record's output is judged by its own document's
limit (its sweep's ``check.max_rel_err``, or its dtype's default): one wrong there carries the
``WrongResult`` error the worker would have recorded, and the combined document judges no other.
"""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kernels.spelling import as_json
from orchestrator.analysis import coverage, screens
from orchestrator.analysis.coverage import Plans, plans_of
from orchestrator.analysis.devices import kind_of, kinds
from orchestrator.analysis.screens import Survivors, survivors_of
from orchestrator.spec import tolerance
from orchestrator.spec.records import item_id
from orchestrator.store.append import measured_times
from orchestrator.store.document import ResultsDoc
from orchestrator.store.replayed import VIRTUAL, Replayed, replayed_of


@dataclass
class Combined:
    """What combining kept and dropped, per reason and per document."""

    device_kind: Any
    kept: int = 0
    other_device: Counter = field(default_factory=Counter)  # document -> records of another named device kind
    other_kinds: set = field(default_factory=set)
    unnamed: Counter = field(default_factory=Counter)  # document -> records that name no device kind (left out)
    picked: bool = False  # the kind was not asked for (``--device``): the first the documents name
    older_jax: int = 0  # superseded by a record measured with a newer jax
    superseded: int = 0  # superseded by a newer record of the same jax (or of unknown jax)
    replayed_left: Counter = field(default_factory=Counter)  # document -> replayed records left out (not asked)
    replayed_kept: int = 0  # replayed records kept (asked, and no measured record of their identity)
    replayed_replaced: int = 0  # replayed records a measured record of the same identity replaced
    # what the documents that hold records of the kind planned (and which of their problems' search
    # goes on) and which screened configs they name survivors of: the combined document has no
    # tilesweep block to say it, and ``report.best_table`` takes them in its place
    plans: Plans = field(default_factory=lambda: Plans(()))
    survivors: Survivors | None = None


def _version(v: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(v or "")))


def _jax_of(doc: ResultsDoc) -> dict[Any, Any]:
    """Unit -> the jax version its tilesweep block names (None: the document's device block)."""
    ts = doc.extra.get("tilesweep")
    out: dict[Any, Any] = {None: doc.device.get("jax")}
    if not isinstance(ts, dict):
        return out
    earlier = ts.get("earlier")
    for block in [*(e for e in (earlier if isinstance(earlier, list) else []) if isinstance(e, dict)), ts]:
        env = found if isinstance(found := block.get("env"), dict) else {}
        attempts = block.get("attempts")
        for unit in attempts if isinstance(attempts, dict) else ():
            out[unit] = env.get("jax") or doc.device.get("jax")
    return out


@dataclass
class _Kept:
    """The record chosen for one identity so far, and what ranks it."""

    rank: tuple[int, str, int]  # (measured 1 / replayed 0, when its attempt started, document position)
    version: Any  # the jax it was measured with
    rec: dict[str, Any]


def combine(
    docs: list[ResultsDoc], device_kind: Any = None, *, include_replays: bool = False
) -> tuple[ResultsDoc, Combined]:
    """One document of the newest record per identity of ``device_kind`` (default: the first
    document's) over ``docs``, replayed records only where asked and no measured record has the
    identity; its device block is that of the document of that kind with the newest jax, of
    the documents of measurements where one has the kind (the stack the table is mostly
    measured on)."""
    kind = device_kind if device_kind is not None else default_kind(docs)
    summary = Combined(kind, picked=device_kind is None)
    chosen: dict[str, _Kept] = {}
    order: list[str] = []
    rules = [replayed_of(doc) for doc in docs]
    taken: list[ResultsDoc] = []  # the documents a record of the kind is taken from: their plans are the table's
    for pos, (doc, rule) in enumerate(zip(docs, rules, strict=True)):
        ts = doc.extra.get("tilesweep")
        times = measured_times(ts if isinstance(ts, dict) else {})
        jax, limit = _jax_of(doc), doc.max_rel_err
        for rec in doc.results:
            rkind = kind_of(rec, doc)
            if rkind != kind:
                if isinstance(rkind, str):
                    summary.other_device[doc.name] += 1
                    summary.other_kinds.add(rkind)
                else:
                    summary.unnamed[doc.name] += 1
                continue
            replayed = rule(rec)
            if replayed and not include_replays:
                summary.replayed_left[doc.name] += 1
                continue
            try:
                iid = item_id(rec)
            except (KeyError, TypeError):
                continue
            if not taken or taken[-1] is not doc:
                taken.append(doc)
            rank = (0 if replayed else 1, times.of(rec) or "", pos)
            rec = _judged(rec, limit)
            new = _Kept(rank, jax.get(rec.get("unit"), jax[None]), _marked(rec) if replayed else rec)
            prev = chosen.get(iid)
            if prev is None:
                order.append(iid)
            if prev is None or _keep(summary, prev, new):
                chosen[iid] = new
    summary.kept = len(chosen)
    summary.plans = coverage.joined(map(plans_of, taken))
    summary.survivors = screens.joined(map(survivors_of, taken))
    summary.replayed_kept = sum(1 for k in chosen.values() if k.rank[0] == 0)
    results = [chosen[iid].rec for iid in order]
    device = _device(docs, rules, kind)
    combined = ResultsDoc(dict(device), dict(docs[0].config), results, path="combined", judged_by=math.inf)
    return combined, summary


def default_kind(docs: list[ResultsDoc]) -> Any:
    """The device kind combining takes where none is asked for: the first document's, where it
    names one, else the first any record names (a document whose device block names none, an
    earlier tilesweep's or one edited by hand, does not make the table a table of no device);
    None where no record names one."""
    own = docs[0].device.get("device_kind")
    if isinstance(own, str):
        return own
    named = kinds(docs)
    return named[0] if named else own


def _judged(rec: dict[str, Any], max_rel_err: float | None) -> dict[str, Any]:
    """A record as its own document judges its output (``spec.tolerance``: its sweep's
    ``check.max_rel_err``, or its dtype's default): one whose output is wrong there says so as
    the worker records it (a ``WrongResult`` error), so the combined document, which has no
    block to hold each document's limit, takes the others as they are (``judged_by``)."""
    if "error" in rec:
        return rec
    wrong = tolerance.wrong_result(rec.get("rel_err"), rec.get("dtype"), max_rel_err)
    return rec if wrong is None else {**rec, "error": wrong}


def _keep(summary: Combined, prev: _Kept, new: _Kept) -> bool:
    """Whether ``new`` replaces ``prev`` (the higher rank wins; a tie: the later one), counting
    the one dropped."""
    wins = new.rank >= prev.rank
    loser, winner = (prev, new) if wins else (new, prev)
    if loser.rank[0] < winner.rank[0]:  # a replayed record, set aside for a measured one
        summary.replayed_replaced += 1
    elif _version(loser.version) and _version(winner.version) and _version(loser.version) < _version(winner.version):
        summary.older_jax += 1
    else:
        summary.superseded += 1
    return wins


def _marked(rec: dict[str, Any]) -> dict[str, Any]:
    """A replayed record that says so itself (``timer: virtual``), for readers of the combined
    document, which has no tilesweep block."""
    return rec if rec.get("timer") == VIRTUAL else {**rec, "timer": VIRTUAL}


def _device(docs: list[ResultsDoc], rules: list[Replayed], kind: Any) -> dict[str, Any]:
    """The device block of the document of ``kind`` with the newest jax: of the documents whose
    own sweep measured, where one has the kind; else of any (a replay's says backend replay)."""
    of_kind = [(doc, rule) for doc, rule in zip(docs, rules, strict=True) if doc.device.get("device_kind") == kind]
    measured = [doc for doc, rule in of_kind if not rule.by_default]
    device: dict[str, Any] = {}
    for doc in measured or [doc for doc, _ in of_kind]:
        if _version(doc.device.get("jax")) >= _version(device.get("jax")):
            device = doc.device
    return device


# how a tuned table of records that name no device kind is made: their document exported alone
UNNAMED_ALONE = "export {which} alone, without --device, for a table of them"


def describe(summary: Combined, n_docs: int, unnamed_fix: str = UNNAMED_ALONE) -> str:
    """One line: how many records from how many documents went in, and what was dropped and why
    (``unnamed_fix``: how to export the records that name no device kind, ``{which}`` their documents)."""
    documents = f"{n_docs} document{'s' if n_docs != 1 else ''}"
    kind = as_json(summary.device_kind)
    text = f"combined {documents}: kept the newest of {summary.kept} identities of device {kind}"
    if summary.picked and (summary.other_device or summary.unnamed):
        text += " (the first device kind they name)"
    if summary.replayed_kept:
        text += f" ({summary.replayed_kept} of them replayed, not measured: --include-replays)"
    dropped = []
    if summary.other_device:
        per = ", ".join(f"{n} in {name}" for name, n in summary.other_device.items())
        others = sorted(summary.other_kinds)
        pick = f"; --device {shlex.quote(others[0])} picks {'it' if len(others) == 1 else 'another'}"
        kinds = ", ".join(map(as_json, others))
        dropped.append(f"{sum(summary.other_device.values())} of another device ({kinds}: {per}{pick})")
    if summary.unnamed:
        dropped.append(_unnamed(summary.unnamed, unnamed_fix))
    if summary.older_jax:
        dropped.append(f"{summary.older_jax} superseded by a record measured with a newer jax")
    if summary.superseded:
        dropped.append(f"{summary.superseded} superseded by a newer record")
    if summary.replayed_replaced:
        dropped.append(f"{summary.replayed_replaced} replayed records set aside for a measured one")
    if summary.replayed_left:
        per = ", ".join(f"{n} in {name}" for name, n in summary.replayed_left.items())
        dropped.append(
            f"{sum(summary.replayed_left.values())} replayed records ({per}: a replay's times, drawn on a "
            "virtual clock, not measured; --include-replays takes them where no measurement is)"
        )
    return text + (f"; dropped {'; '.join(dropped)}" if dropped else "")


def _unnamed(unnamed: Counter, fix: str) -> str:
    """The records combining left out because they name no device kind (their document's device
    block has no ``device_kind``), and how to make a table of them (``fix``)."""
    per = ", ".join(f"{n} in {name}" for name, n in unnamed.items())
    which = "it" if len(unnamed) == 1 else "each of those documents"
    return (
        f"{sum(unnamed.values())} that name no device kind ({per}: no device_kind in the device block or the records; "
        f"{fix.format(which=which)})"
    )
