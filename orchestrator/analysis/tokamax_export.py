"""Results documents as tokamax's autotuning tables (``tilesweep export DOC... --format tokamax
--out DIR``): ``DIR/<device dir>/<op>.json`` per device kind and op, in tokamax's cache format.

Which records go in: the timed forced records (no error, no screen) of a tokamax implementation
(``tokamax-mosaic``, ``tokamax-triton``). Records of other implementations have no tokamax op and
are left out, said in one line; a document with none is refused. Records of several device kinds
give one folder each (per kind, the newest record per identity over the documents:
``analysis.combine``).

Where a problem's ``auto`` record (tokamax's own choice, what an untuned call runs) was faster
than every forced record of it, its keys are left out, so tokamax runs its own choice there, as
the tilesweep table's ``config: null`` says; ``keep_slower`` writes them anyway (``Chosen.auto_won``
counts them). A problem whose configs are not all timed in full yet (a halving sweep merged before
or during its round 2: configs only screened, or survivors of the screen still waiting, which may
beat those timed already) is left out and counted (``Chosen.untimed``), as the tuned table leaves
it out (``analysis.export.untimed``): tokamax would take the fastest timed so far for its best.

Per problem and op, each key (built by tokamax's own key function: ``kernels.tokamax_cache``)
holds the measured configs, each with:

- ``evaluation_times_ms``: the record's raw samples (``samples_ms``); a record from before
  tilesweep kept them gives ``[q1_ms, median_ms, q3_ms]``, whose median is its median. tokamax
  runs the config of least median, so it runs tilesweep's best (the configs are written best first,
  as ``analysis.ranking`` ranks them, a tie on the median broken as the tuned table breaks it);
- ``compile_time_ms``: the record's ``compile_s`` (tilesweep times lowering and compiling
  together, so ``lower_time_ms`` is 0 and the metadata says so);
- ``metadata``: the record's id, mode, timer, ``inner``, ``rel_err`` and where the samples come from.

A fwd record goes to the forward op's key (``return_residuals`` false). tokamax tunes a forward
with a backward as two ops, each under its own key: the forward with residuals and its vjp. A
fwd_bwd record times both together, so its times rank one op's configs only among records that
share the other op's config: the forward's key gets the records that share the best record's vjp
config, the vjp's key those that share its forward config. tokamax then runs exactly the best
record's pair. (A ``"grid": "tokamax"`` sweep measures every forward config with the vjp's
heuristic one and every vjp config with the forward's, so the best record's key holds its whole
search and the other key the best alone, unless the best is the heuristics' pair.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kernels import tokamax_meta as meta
from orchestrator.analysis.ranking import rank
from orchestrator.analysis.screens import Survivors, survivors_of
from orchestrator.spec import tolerance
from orchestrator.spec.records import DEFAULT_IMPL, item_id
from orchestrator.store.document import ResultsDoc

SAMPLES_RAW = "the record's samples_ms"
SAMPLES_QUARTILES = "q1_ms, median_ms, q3_ms (the record has no samples_ms)"
COMPILE_NOTE = "compile_time_ms is tilesweep's compile_s, lowering and compiling together (lower_time_ms 0)"


@dataclass
class Chosen:
    """What went into one device kind's tables, and what was left out."""

    device_kind: str
    entries: list[meta.KeyEntry] = field(default_factory=list)
    records: int = 0  # records written (a fwd_bwd record may be in two keys)
    other_impls: Counter = field(default_factory=Counter)  # impl -> records left out
    auto_won: int = 0  # problems (per mode) left to tokamax's own choice, which was faster
    untimed: int = 0  # problems (per mode) whose configs are not all timed in full yet (halving): left out


def _problem(rec: Mapping[str, Any]) -> meta.Problem:
    kv = rec.get("kv_heads")
    return meta.Problem(
        batch=int(rec["batch"]),
        seq=int(rec["seq"]),
        heads=int(rec["heads"]),
        head_dim=int(rec["head_dim"]),
        dtype=str(rec["dtype"]),
        kv_heads=None if kv in (None, rec["heads"]) else int(kv),
        causal=bool(rec.get("causal", False)),
    )


def _timed(rec: Mapping[str, Any], config: str = "forced", max_rel_err: float | None = None) -> bool:
    ms = rec.get("median_ms")
    return (
        rec.get("config") == config
        and "error" not in rec
        and not rec.get("screened")
        and isinstance(ms, (int, float))
        and tolerance.wrong_result(rec.get("rel_err"), rec.get("dtype"), max_rel_err) is None
    )


def _measured(rec: Mapping[str, Any], fields: dict[str, Any]) -> meta.Measured:
    raw = rec.get("samples_ms")
    ok = isinstance(raw, list) and bool(raw) and all(isinstance(x, (int, float)) for x in raw)
    samples = (
        [float(x) for x in raw]
        if isinstance(raw, list) and ok
        else [float(rec[k]) for k in ("q1_ms", "median_ms", "q3_ms")]
    )
    metadata = {
        "tilesweep": {
            "record": _id(rec),
            "mode": rec["mode"],
            "timer": rec.get("timer"),
            "inner": rec.get("inner"),
            "rel_err": rec.get("rel_err"),
            "samples": SAMPLES_RAW if ok else SAMPLES_QUARTILES,
            "compile": COMPILE_NOTE,
        }
    }
    compile_ms = float(rec.get("compile_s") or 0.0) * 1e3
    return meta.Measured(fields, samples, compile_ms, 0.0, metadata)


def _id(rec: Mapping[str, Any]) -> str | None:
    try:
        return item_id(rec)
    except (KeyError, ValueError):  # a layout records.py does not know
        return None


def _fastest(recs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One record per config (the fastest, where several tags measured it), fastest first as
    ``ranking`` ranks them (a tie on the median: the lower q3, then config order), so that the first
    is the tuned table's best, whatever the order of the records."""
    by_config: dict[str, Mapping[str, Any]] = {}
    for r in sorted(recs, key=lambda r: rank(r, _fields(r))):
        by_config.setdefault(repr(sorted(_fields(r).items())), r)
    return list(by_config.values())


def _fields(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A tokamax record's config fields: those of the config family of its ``impl`` that it has all of
    (``kernels.tokamax_meta``)."""
    k = meta.kernel(str(rec["impl"]))
    for fam in (f for f in k.fwd if k.impl_for(f) == rec["impl"]):
        names = k.fields(str(rec["mode"]), fam)
        if all(n in rec for n in names):
            return {n: rec[n] for n in names}
    raise ValueError(f"a {rec['impl']} {rec['mode']} record without the config fields of tokamax's config classes")


def _entries(impl: str, mode: str, p: meta.Problem, recs: list[Mapping[str, Any]]) -> list[meta.KeyEntry]:
    """The keys of one problem's records of one implementation and mode (module docstring)."""
    recs = _fastest(recs)
    if mode == "fwd":
        return [meta.KeyEntry(impl, "fwd", False, p, [_measured(r, _fields(r)) for r in recs])]
    halves = [meta.split(impl, mode, _fields(r)) for r in recs]
    best_fwd, best_vjp = halves[0]
    fwd = [_measured(r, f) for r, (f, v) in zip(recs, halves, strict=True) if v == best_vjp]
    vjp = [_measured(r, v) for r, (f, v) in zip(recs, halves, strict=True) if f == best_fwd]
    return [meta.KeyEntry(impl, "fwd", True, p, fwd), meta.KeyEntry(impl, "vjp", True, p, vjp)]


def choose(
    doc: ResultsDoc, device_kind: str, *, keep_slower: bool = False, survivors: Survivors | None = None
) -> Chosen:
    """The keys of ``doc``'s tokamax records (all of ``device_kind``: ``analysis.combine`` made it);
    a problem whose auto was faster than all of them left out unless ``keep_slower``, and one
    whose configs are not all timed in full (a halving sweep before or during its round 2: only
    screened, or survivors of its screen still waiting, ``analysis.screens``, which may beat those
    timed already) left out and counted, as the tuned table leaves it out (``export.untimed``).
    ``survivors``: those the documents ``doc`` was combined from name (default: ``doc``'s own)."""
    out = Chosen(device_kind)
    groups: dict[tuple[str, str, meta.Problem], list[Mapping[str, Any]]] = {}
    auto_ms: dict[tuple[str, str, meta.Problem], float] = {}
    screened: dict[str | None, tuple[str, str, meta.Problem]] = {}  # a screen's record id -> its problem
    full: set[str | None] = set()  # ids of the records timed in full (or that failed), not screens
    for rec in doc.results:
        impl = str(rec.get("impl", DEFAULT_IMPL))
        if impl not in meta.IMPL_NAMES:
            out.other_impls[impl] += 1
            continue
        key = (impl, str(rec["mode"]), _problem(rec))
        if rec.get("screened"):
            if "error" not in rec:
                screened[_id(rec)] = key
            continue
        full.add(_id(rec))
        if _timed(rec, max_rel_err=doc.max_rel_err):
            groups.setdefault(key, []).append(rec)
        elif _timed(rec, "auto", doc.max_rel_err):
            auto_ms[key] = min(float(rec["median_ms"]), auto_ms.get(key, float("inf")))
    rule = survivors_of(doc) if survivors is None else survivors
    waiting = {key for rid, key in screened.items() if rule is not None and rid in rule.ids and rid not in full}
    untimed = (set(screened.values()) - groups.keys()) | waiting
    for key, recs in groups.items():
        if key in untimed:
            continue
        if not keep_slower and auto_ms.get(key, float("inf")) < min(float(r["median_ms"]) for r in recs):
            out.auto_won += 1
            continue
        out.entries += _entries(*key, recs)
    out.records = sum(len(e.configs) for e in out.entries)
    out.untimed = len(untimed)
    return out


def of_kind(doc: ResultsDoc, device_kind: str) -> ResultsDoc:
    """``doc`` with the records of ``device_kind`` only (a document of mixed devices: ``merge.mix_devices``)."""
    own = doc.device.get("device_kind")
    return replace(doc, results=[r for r in doc.results if r.get("device", own) == device_kind])
