"""Turn a results document into the tuned table ``kernels.tuned`` loads.

One entry per (impl, dtype, head_dim, seq, batch, heads, causal, kv_heads, mode); ``kv_heads``
is ``heads`` for multi-head attention, ``impl`` the kernel implementation measured.
``config`` carries exactly the fields of ``kernels.attention.AttentionConfig`` for either
Triton implementation: for fwd_bwd the record's fwd_block_q/fwd_block_k become block_q/block_k
and bwd_outer/bwd_inner are taken as they are; for fwd, bwd_outer/bwd_inner stay at the
implementation's default (``kernels.impls``: 128 for ours, the stock kernel's 32; the forward
never reads them). Another implementation's config is its record's config fields as they are
(jax's Mosaic GPU kernel: its ``TuningConfig`` fields). ``wins`` says, per problem and mode,
which implementation's entry is the fastest the table holds (the one to call).

``config`` is ``null`` where the measurement says "use auto": auto was faster than the best
forced config, the best forced config is auto's own (``report``: two timings of one kernel), or
every forced config failed while auto ran. ``median_ms`` is the time of what the entry answers:
the forced config's, or auto's where ``config`` is ``null``. Keeping the entry (rather than
dropping it) stops the kernel's nearest-seq fallback from borrowing a neighbour's config for
a seq where auto is known to win. Beside a null ``config`` of our kernel, ``auto_config`` names
the config auto ran (``kernels.tuned.TunedTable.config_for`` answers it: our kernel called with
no config runs ``AttentionConfig()``, not auto); beside one of jax's Mosaic GPU kernel, which has
no default config, the config its auto runs, found by lowering for the document's device kind
(``analysis.auto.lowered_auto_config``; ``TunedTable.lookup`` answers it), or none where it
cannot be lowered here (``ExportSummary.auto_unknown``: the CLI notes it). The stock kernel and
tokamax's ops called untuned run their auto, so their "use auto" needs no config.
``keep_slower=True`` exports the best forced config anyway.
Problems where nothing ran at all get no entry, and neither do problems whose forced configs are
still to be timed in full (``untimed``: a halving sweep stopped before its round 2 timed every
survivor, a sweep stopped before it measured them): neither auto nor a best timed so far is
known to win there. A problem with a best and planned configs without a record (``unmeasured``)
gets the best measured so far; the CLI notes it.
A problem's best is ``report``'s, which ``ranking`` picks: where two configs tie on the median, the
lower q3 wins, then the config first in config order, never the order of the records. If a
document holds several tags for one shape, the faster best wins, a tie broken the same way (then
the tag's name). A problem whose entry
``kernels.tuned`` would refuse at load gets none either (``refusal``, the loader's own check): a
Triton kernel's tile below tl.dot's 16, recorded in interpret mode, which runs any power of two, is
no config a GPU runs; the CLI names it in one line.

An entry whose best or auto timing was replayed rather than measured (``store.replayed``; such
records enter only when asked: ``combine``'s ``include_replays``) says ``"replayed": true``, and
the table counts them in its top-level ``replayed``; ``kernels.tuned`` reads neither.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernels import impl_triton, impls
from kernels.tuned import CONFIG_FIELDS, FORMAT, VERSION
from kernels.tuned_entries import TunedEntry, TunedTableError, read_entry
from orchestrator.analysis.auto import LOWERED_AUTO, lowered_auto_config
from orchestrator.analysis.ranking import pick
from orchestrator.analysis.report import ProblemSummary, best_table
from orchestrator.spec.records import kernel_kwargs
from orchestrator.store.document import ResultsDoc
from orchestrator.store.files import remove_dead_temps
from orchestrator.store.sweepdir import atomic_open

if TYPE_CHECKING:
    from orchestrator.analysis.combine import Combined

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportSummary:
    """What an export decided, for the CLI to tell the user."""

    entries: int
    tuned: int  # entries with a forced config
    use_auto: int  # entries with config null
    skipped: int  # problems with nothing measured at all
    replayed: int = 0  # entries whose timings were replayed, not measured
    # problems left out because ``kernels.tuned`` refuses their entry (``refusal``): each one's label and why
    refused: tuple[tuple[str, str], ...] = ()
    unrecorded: int = 0  # of the skipped problems, those with no record at all (planned, not measured)
    untimed: int = 0  # of the skipped problems, those whose forced configs are still to be timed in full
    searching: int = 0  # entries of problems whose search has not ended: the best of what it measured so far
    # entries of problems with planned configs not measured yet (``unmeasured``): the best of what was measured so far
    unmeasured: int = 0
    # "use auto" entries of an implementation with no default config (``auto.LOWERED_AUTO``) whose auto
    # config could not be found here (``TunedTable.lookup`` has no config there): their labels, and why
    auto_unknown: tuple[str, ...] = ()
    auto_unknown_why: str = ""


def kernel_config(best_config: dict[str, Any], mode: str, impl: str = impls.DEFAULT_IMPL) -> dict[str, int]:
    """A Triton kernel's record's config fields as every field of ``AttentionConfig``
    (``records.kernel_kwargs``; the tiles a mode does not sweep keep the implementation's
    defaults); another implementation's as its record has them (``kernels.tuned`` says which)."""
    if impl not in impl_triton.BY_NAME:
        return dict(best_config)
    defaults = impl_triton.get(impl).defaults
    cfg = dataclasses.asdict(dataclasses.replace(defaults, **kernel_kwargs(mode, best_config)))
    return {k: int(cfg[k]) for k in CONFIG_FIELDS}


def untimed(s: ProblemSummary) -> bool:
    """Whether a problem's best is not known because its forced configs are still to be timed in
    full: survivors of its screen waiting for round 2 (any of them may beat those timed already),
    or, with no forced config timed in full, screens alone or planned configs without a record,
    not configs that failed. Nothing says auto wins there, nor the best timed so far."""
    if s.auto_only:
        return False
    if s.n_waiting > 0:
        return True
    if s.best_config is not None:
        return False
    missing = s.coverage is not None and bool(s.coverage.missing)
    return s.n_configs > s.n_failed or missing


def unmeasured(s: ProblemSummary) -> bool:
    """Whether a problem has planned forced configs without a record (a sweep stopped, then
    merged; ``coverage``'s missing): where it has a best, that is the best of what was measured so
    far, which those may beat."""
    return s.coverage is not None and bool(s.coverage.missing)


def _entry(s: ProblemSummary, keep_slower: bool, device_kind: Any = None) -> dict[str, Any] | None:
    if (s.best_ms is None and s.auto_ms is None) or untimed(s):
        return None
    config = None
    if s.best_config is not None and (keep_slower or not s.use_auto):
        config = kernel_config(s.best_config, s.key.mode, s.key.impl or impls.DEFAULT_IMPL)
    k = s.key
    replayed: dict[str, Any] = {"replayed": True} if s.replayed else {}
    auto = _auto_config(s, device_kind) if config is None else None
    return {
        "impl": k.impl,
        "dtype": k.dtype,
        "head_dim": k.head_dim,
        "seq": k.seq,
        "batch": k.batch,
        "heads": k.heads,
        "causal": k.causal,
        "kv_heads": k.heads if k.kv_heads is None else k.kv_heads,
        "mode": k.mode,
        "config": config,
        "median_ms": s.best_ms if config is not None else s.auto_ms,
        "auto_ms": s.auto_ms,
        **({"auto_config": auto} if auto is not None else {}),
        **replayed,
    }


def _auto_config(s: ProblemSummary, device_kind: Any = None) -> dict[str, Any] | None:
    """What a "use auto" entry answers where an untuned call does not run auto: the config auto
    ran (None where it cannot be known). Our kernel called untuned runs ``AttentionConfig()``,
    not auto, whose config the document's rule names (``analysis.auto``); jax's Mosaic GPU
    kernel has no default config at all, and its auto is found by lowering for the document's
    device kind (``auto.lowered_auto_config``). The stock kernel's auto is its own defaults,
    which ``mha`` called untuned runs, and tokamax's is what its untuned op runs: neither needs one."""
    impl = s.key.impl or impls.DEFAULT_IMPL
    if impl in LOWERED_AUTO:
        k = s.key
        config, _ = lowered_auto_config(
            impl, device_kind, mode=k.mode, dtype=k.dtype, head_dim=k.head_dim, seq=k.seq, causal=k.causal
        )
        return config
    auto = s.auto_config
    if (s.key.impl or impls.DEFAULT_IMPL) != impls.DEFAULT_IMPL or auto is None or None in auto.values():
        return None
    return kernel_config(auto, s.key.mode)


def tuned_table(
    doc: ResultsDoc, *, keep_slower: bool = False, combined: Combined | None = None
) -> tuple[dict[str, Any], ExportSummary]:
    """The tuned-table document for ``doc`` and a summary of what went in. ``combined``: what
    ``combine`` kept of the documents ``doc`` was made of (it has no block of its own): their
    plans, their problems whose search has not ended, and the survivors of their screens."""
    chosen: dict[tuple, tuple[dict[str, Any], ProblemSummary]] = {}  # per entry's problem: it, and its summary
    refused: dict[tuple, tuple[str, str]] = {}
    skipped = unrecorded = waiting = 0
    kind = doc.device.get("device_kind") if combined is None else combined.device_kind  # what auto is lowered for
    for s in best_table(doc) if combined is None else best_table(doc, combined.plans, combined.survivors):
        e = _entry(s, keep_slower, kind)
        if e is None:
            skipped += 1
            if s.n_configs == 0 and s.auto_status == "absent":
                unrecorded += 1
            elif (s.auto_ms is not None or s.best_ms is not None) and untimed(s):  # else it has no timing at all
                waiting += 1
            continue
        k = tuple(e[f] for f in ("impl", "dtype", "head_dim", "seq", "batch", "heads", "causal", "kv_heads", "mode"))
        why = refusal(e)
        if why is not None:
            refused[k] = (s.key.label(), why)
            continue
        prev = chosen.get(k)
        if prev is None or _pick(e, s) < _pick(*prev):
            if prev is not None:
                log.info("several tags measured %s; keeping the faster best", k)
            chosen[k] = (e, s)
    entries = [e for e, _ in chosen.values()]
    _mark_winners(list(chosen.values()))
    replayed = sum(1 for e in entries if e.get("replayed"))
    table = {
        "format": FORMAT,
        "version": VERSION,
        "device": dict(doc.device),
        **({"replayed": replayed} if replayed else {}),
        "entries": entries,
    }
    tuned = sum(1 for e in entries if e["config"] is not None)
    left_out = tuple(why for k, why in refused.items() if k not in chosen)
    unended = sum(1 for _, s in chosen.values() if _searching(s))
    partial = sum(1 for _, s in chosen.values() if unmeasured(s) and not _searching(s))
    unknown = [
        s for e, s in chosen.values() if e["config"] is None and e["impl"] in LOWERED_AUTO and "auto_config" not in e
    ]
    return table, ExportSummary(
        len(entries),
        tuned,
        len(entries) - tuned,
        skipped,
        replayed,
        left_out,
        unrecorded,
        waiting,
        unended,
        partial,
        tuple(s.key.label() for s in unknown),
        _why_no_auto(unknown[0], kind) if unknown else "",
    )


def _why_no_auto(s: ProblemSummary, device_kind: Any) -> str:
    """Why the auto config of a "use auto" entry of ``auto.LOWERED_AUTO`` could not be found here."""
    k = s.key
    _, why = lowered_auto_config(
        k.impl or impls.DEFAULT_IMPL,
        device_kind,
        mode=k.mode,
        dtype=k.dtype,
        head_dim=k.head_dim,
        seq=k.seq,
        causal=k.causal,
    )
    return why or ""


def _searching(s: ProblemSummary) -> bool:
    """Whether a problem's search has not ended: its entry is the best of what it measured so far
    (a search's own note says so, beside which ``unmeasured`` says nothing)."""
    return s.coverage is not None and s.coverage.searching


def refusal(entry: dict[str, Any]) -> str | None:
    """Why ``kernels.tuned`` would refuse ``entry`` at load (its config is one the implementation's
    kernel does not take: a Triton tile below tl.dot's 16, recorded in interpret mode, which runs
    any power of two), or None. The loader's own check, so export never writes a table it refuses;
    what an implementation's kernel takes is its own (tokamax's Triton kernel takes tiles below 16)."""
    try:
        read_entry(entry, 0, "", VERSION)
    except TunedTableError as exc:
        return str(exc).removeprefix(": entries[0]").removeprefix(": ")
    return None


def _mark_winners(chosen: list[tuple[dict[str, Any], ProblemSummary]]) -> None:
    """``wins``: whether an entry's implementation is the fastest of the table's for its problem
    (its best or auto, as the table answers it; a tie as ``_pick`` breaks it)."""
    best: dict[tuple[Any, ...], tuple[dict[str, Any], ProblemSummary]] = {}
    for e, s in chosen:
        k = tuple(e[f] for f in ("dtype", "head_dim", "seq", "batch", "heads", "causal", "kv_heads", "mode"))
        if k not in best or _pick(e, s) < _pick(*best[k]):
            best[k] = (e, s)
    winners = {id(e) for e, _ in best.values()}
    for e, _ in chosen:
        e["wins"] = id(e) in winners


def _pick(e: dict[str, Any], s: ProblemSummary) -> tuple[Any, ...]:
    """Where an entry comes among those the table chooses from for one problem (the first is
    kept): several tags that measured it, or, for ``wins``, its implementations. The faster time
    it answers (its best's or auto's), then ``ranking``'s rules: the lower q3 of that timing, then
    config order (a "use auto" entry first); then its implementation and tag by name, so that no
    tie goes by the order of the records."""
    t = min(x for x in (e["median_ms"], e["auto_ms"], float("inf")) if x is not None)
    q3 = s.best_q3_ms if e["config"] is not None and t == s.best_ms else s.auto_q3_ms
    return pick(t, q3, e["config"], str(e["impl"] or ""), str(s.key.tag or ""))


@dataclass(frozen=True)
class Replaced:
    """What a tuned table written over an earlier one did to the earlier one's entries."""

    same: int = 0  # entries of problems the new table holds too, as the new table has them (config, timings)
    changed: int = 0  # entries of problems the new table holds too, with another config or other timings
    new: int = 0  # entries of the new table of problems the earlier one did not hold
    dropped: int = 0  # entries of problems the new table does not hold (or that no loader reads): gone


def replaced(before: bytes, table: dict[str, Any]) -> Replaced:
    """What writing ``table`` over the tuned table ``before`` does to its entries. A problem is an
    entry's identity as ``kernels.tuned`` reads it (its kernel, dtype, shape, causal and mode; a
    version 1 table's defaults filled in), and an entry is the same where the loader reads the
    same config and timings from it; an entry the loader refuses counts as dropped."""
    try:
        old = json.loads(before)
    except (ValueError, UnicodeDecodeError):
        return Replaced(new=len(table["entries"]))
    entries = old.get("entries") if isinstance(old, dict) else None
    if not isinstance(entries, list):
        return Replaced(new=len(table["entries"]))
    version = old.get("version", VERSION)
    fresh = dict(_read(e, VERSION) for e in table["entries"])
    kept = [_read(e, version if isinstance(version, int) else VERSION) for e in entries]
    again = [(k, e) for k, e in kept if k is not None and k in fresh]
    same = sum(1 for k, e in again if fresh[k] == e)
    held = {k for k, _ in again}
    return Replaced(same=same, changed=len(again) - same, new=len(fresh.keys() - held), dropped=len(kept) - len(again))


def _read(raw: Any, version: int) -> tuple[tuple[Any, ...] | None, TunedEntry | None]:
    """A tuned-table entry's problem, as ``kernels.tuned`` reads it, and the entry it reads
    (None, None: it refuses the entry)."""
    try:
        e = read_entry(raw, 0, "", version)
    except TunedTableError:
        return None, None
    return (e.impl, e.dtype, e.head_dim, e.seq, e.batch, e.heads, e.causal, e.kv_heads, e.mode), e


def write_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON next to ``path`` and ``os.replace`` it in: a reader never sees half a file (and
    the temp file of a writer killed before, here, goes)."""
    remove_dead_temps(Path(path), min_age_s=0)
    with atomic_open(Path(path)) as fh:
        json.dump(obj, fh, indent=1)
        fh.write("\n")
