"""The values a results document's records may hold, checked over every record at load.

A document edited by hand must be refused in one line naming the record, the field, the value
as the file gives it and what the field allows, before report, export or compare trip on it (a
list where an int is expected is unhashable, an unknown implementation raises) or report it
wrong (a negative best, a block_q of 96 exported to a tuned table). The rules are the spec's and
the kernels' own, from their constants:

- identity: dtype and mode as ``kernels.smem`` names them; config ``auto`` or ``forced``; head_dim
  the spec's MIN_HEAD_DIM..MAX_HEAD_DIM; seq, batch, heads (and kv_heads) positive integers below
  2**63 (orjson's integers; anything larger overflows a FLOP count); tag a string; impl one of
  ``kernels.impls.IMPL_NAMES``; causal true or false;
- a forced record's config fields: every tunable of its implementation and mode
  (``tilesweep impls``), each a value the tunable allows (``Tunable.refusal``: the rule a spec's
  grid is held to); an auto record's are the kernel's pick and not read;
- error (a failed config's record): a string;
- timings: median_ms, q1_ms, q3_ms (absent or null where a config failed) and each of samples_ms
  a number of milliseconds from MIN_MS (a nanosecond: no kernel is faster) to MAX_MS (11 days):
  positive, finite, and such that a speedup or TFLOP/s of them is finite too;
- and they add up as every writer's do (the worker, a replay and a tokamax table's import take
  them as ``np.percentile`` of the samples; merge and reuse carry them as they are):
  q1_ms <= median_ms <= q3_ms, and median_ms is the median of samples_ms where a record keeps
  them (between their middle two, for an even count: numpy's interpolation stays there).

Speed (a million records): a document has few distinct identities (its problems) and configs
(its grid), so each distinct one is checked once and remembered by its JSON text (orjson's, at C
speed; ``repr`` without orjson): the text tells 64 from 64.0 and 1 from true, which the values'
own equality does not. Per record the fast path is a few C-level reads, two set look-ups, float
compares and a sort of its few samples (for their middle); the samples of all records are checked
at once (min, max and sum of them all); any record the fast path cannot pass is checked field by
field, which names what is wrong.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kernels import impls
from kernels.impl_base import Tunable
from kernels.smem import DTYPES, MAX_HEAD_DIM, MIN_HEAD_DIM, MODES
from kernels.spelling import one_of
from orchestrator.errors import ResultsError
from orchestrator.spec.records import IDENTITY_FIELDS
from orchestrator.store import jsonline

__all__ = ["CONFIG_KINDS", "MAX_MS", "MIN_MS", "ValueRefused", "check_values"]

CONFIG_KINDS = ("auto", "forced")
MIN_MS = 1e-6  # a nanosecond
MAX_MS = 1e9  # 11.6 days
_MAX_INT = 2**63  # orjson reads a larger integer as a float
_COUNTS = ("head_dim", "seq", "batch", "heads")
_TIMINGS = ("median_ms", "q1_ms", "q3_ms")
_IDENT = operator.itemgetter(*IDENTITY_FIELDS)  # dtype, head_dim, seq, batch, heads, tag, mode, config
_TIMES = operator.itemgetter(*_TIMINGS)
_ALLOWED = {"dtype": DTYPES, "mode": MODES, "config": CONFIG_KINDS}
_MS = f"a number of milliseconds from {MIN_MS:g} to {MAX_MS:g}"
# the JSON text of a tuple of values, exact as to their types (a value orjson cannot write raises
# TypeError): orjson where the store's one switch (``store.jsonline``) has it
_exact: Callable[[Any], Any] = jsonline._orjson.dumps if jsonline._orjson is not None else repr


class ValueRefused(ResultsError):
    """A record's value refused; ``value`` is the value as parsed (``document.load`` names a float
    that was an integer too large for orjson as the file gives it)."""

    def __init__(self, message: str, value: Any, why: str = "") -> None:
        super().__init__(message)
        self.value = value
        self.why = why  # the field, its value and what it allows, without the document's name


@dataclass(eq=False)
class _Config:
    """How a forced record of one mode and implementation holds its config: its tunables, read
    by one getter, and the JSON texts of the value tuples already found good."""

    tunables: tuple[Tunable, ...]
    get: Callable[[dict[str, Any]], Any]
    good: set[Any] = field(default_factory=set)


_UNSEEN = _Config((), tuple)  # what ``_fast`` finds for an identity not seen yet


@dataclass
class _Seen:
    """What ``check_values`` has found good so far: identity texts -> their config check (None: an
    auto record), and the samples of the records passed fast, in one list, checked all at once at the end."""

    identities: dict[Any, _Config | None] = field(default_factory=dict)
    samples: list[Any] = field(default_factory=list)


def check_values(results: list[dict[str, Any]], name: str) -> None:
    """Refuse (``ValueRefused``, naming ``results[i].field``) the first record holding a value the
    module docstring's rules do not allow. Records ``document.check_records`` passed."""
    seen = _Seen()
    i = 0
    while i < len(results):
        i = _fast(results, i, seen)
        if i < len(results):
            _record(results[i], i, name, seen)
            i += 1
    flat = seen.samples
    try:
        ok = not flat or (MIN_MS <= min(flat) and max(flat) <= MAX_MS and sum(flat) < MAX_MS * len(flat))
    except TypeError:  # not lists of numbers
        ok = False
    if not ok:
        for i, rec in enumerate(results):
            _samples(rec.get("samples_ms"), i, name)


def _fast(results: list[dict[str, Any]], start: int, seen: _Seen) -> int:
    """Pass the records from ``start`` on whose identity and config were found good before and
    whose timings are plain; the index of the first that is not so (``len(results)``: none)."""
    ident, times, exact, identities, samples = _IDENT, _TIMES, _exact, seen.identities, seen.samples.extend
    lo, hi = MIN_MS, MAX_MS
    i = start
    try:
        for i in range(start, len(results)):
            rec = results[i]
            key = ident(rec)
            if "impl" in rec or "causal" in rec or "kv_heads" in rec:
                key = (key, rec.get("impl"), rec.get("causal"), rec.get("kv_heads"))
            kind = identities.get(exact(key), _UNSEEN)
            if kind is _UNSEEN or (kind is not None and exact(kind.get(rec)) not in kind.good):
                return i
            s = rec.get("samples_ms")
            if "error" in rec:
                if not (
                    type(rec["error"]) is str
                    and rec.get("median_ms") is None
                    and rec.get("q1_ms") is None
                    and rec.get("q3_ms") is None
                ):
                    return i
            else:
                m, q1, q3 = times(rec)
                if not (type(m) is float and type(q1) is float and type(q3) is float and lo <= q1 <= m <= q3 <= hi):
                    return i
                if s is not None:
                    t = sorted(s)  # a value that is no list of numbers: a TypeError here or in the compare
                    k = len(t)
                    if not (k and t[(k - 1) // 2] <= m <= t[k // 2]):
                        return i
            if s is not None:
                samples(s)  # a value that is not a list: a TypeError here, or a str or a key among the numbers
    except (KeyError, TypeError):  # a field absent, a value orjson cannot write: checked by ``_record``
        return i
    return len(results)


def _record(rec: dict[str, Any], i: int, name: str, seen: _Seen) -> None:
    """Check one record field by field (``ValueRefused`` naming the first wrong one) and remember
    its identity and config as good for ``_fast``."""
    key = _IDENT(rec)
    for k, v in zip(IDENTITY_FIELDS, key, strict=True):
        _identity_value(k, v, i, name)
    impl = rec.get("impl", impls.DEFAULT_IMPL)
    if type(impl) is not str or impl not in impls.IMPLS:
        _refuse(name, i, "impl", impl, f"one of {one_of(impls.IMPL_NAMES)} (tilesweep impls lists them)")
    if "causal" in rec and type(rec["causal"]) is not bool:
        _refuse(name, i, "causal", rec["causal"], "true or false")
    if "kv_heads" in rec:
        _count(name, i, "kv_heads", rec["kv_heads"])
    kind = None if rec["config"] == "auto" else _config_kind(rec["mode"], impl)
    if kind is not None:
        _config(rec, kind, i, name)
    if "error" in rec and type(rec["error"]) is not str:
        _refuse(name, i, "error", rec["error"], "a string (what went wrong)")
    for k in _TIMINGS:
        v = rec.get(k)
        if v is not None and (type(v) not in (float, int) or not MIN_MS <= v <= MAX_MS):
            _refuse(name, i, k, v, f"{_MS}, or null" if type(v) in (float, int) else "a number or null")
    _samples(rec.get("samples_ms"), i, name)
    _spread(rec, i, name)
    if "impl" in rec or "causal" in rec or "kv_heads" in rec:
        key = (key, rec.get("impl"), rec.get("causal"), rec.get("kv_heads"))
    seen.identities[_exact(key)] = kind


def _identity_value(k: str, v: Any, i: int, name: str) -> None:
    if k == "head_dim" and type(v) is int and v >= 1 and not MIN_HEAD_DIM <= v <= MAX_HEAD_DIM:
        _refuse(name, i, k, v, f"an integer from {MIN_HEAD_DIM} to {MAX_HEAD_DIM} (the spec's head_dims)")
    if k in _COUNTS:
        _count(name, i, k, v)
        return
    if type(v) is not str:
        _refuse(name, i, k, v, "a string")
    allowed = _ALLOWED.get(k)
    if allowed is not None and v not in allowed:
        _refuse(name, i, k, v, f"one of {one_of(allowed)}")


# (mode, impl) -> the config check of its forced records; the configs found good are kept across
# loads (a grid's configs: a few hundred short texts)
_CONFIGS: dict[tuple[str, str], _Config] = {}


def _config_kind(mode: str, impl: str) -> _Config:
    """The config check of forced records of ``mode`` and ``impl``."""
    kind = _CONFIGS.get((mode, impl))
    if kind is None:
        tunables = tuple(t.as_recorded() for t in impls.get(impl).tunables(mode))
        getter = operator.itemgetter(*(t.name for t in tunables))
        kind = _CONFIGS[mode, impl] = _Config(tunables, getter if len(tunables) > 1 else lambda rec: (getter(rec),))
    return kind


def _config(rec: dict[str, Any], kind: _Config, i: int, name: str) -> None:
    names = [t.name for t in kind.tunables]
    lacking = [n for n in names if n not in rec]
    if lacking:
        what = f"a forced {rec['mode']} record of {rec.get('impl', impls.DEFAULT_IMPL)} holds {', '.join(names)}"
        raise ResultsError(
            f"{name}: results[{i}] lacks config field(s) {', '.join(lacking)} ({what}); correct or remove that record"
        )
    try:
        if _exact(kind.get(rec)) in kind.good:  # another problem's record of a config found good
            return
    except TypeError:  # an integer orjson cannot write: refused below
        pass
    for t in kind.tunables:
        v = rec[t.name]
        if t.refusal(v) is not None:
            whose = f" ({t.rule_source})" if t.rule_source else ""
            _refuse(name, i, t.name, v, f"{t.rule}{whose}")
        if type(v) is int and v >= _MAX_INT:
            _refuse(name, i, t.name, v, f"{t.rule} below 2**63")
    kind.good.add(_exact(kind.get(rec)))


def _count(name: str, i: int, k: str, v: Any) -> None:
    if type(v) is not int or v < 1:
        _refuse(name, i, k, v, "a positive integer")
    if v >= _MAX_INT:
        _refuse(name, i, k, v, "a positive integer below 2**63")


def _samples(samples: Any, i: int, name: str) -> None:
    if samples is None:
        return
    if type(samples) is not list:
        _refuse(name, i, "samples_ms", samples, f"a list of {_MS}")
    for j, v in enumerate(samples):
        if type(v) not in (float, int) or not MIN_MS <= v <= MAX_MS:
            _refuse(name, i, f"samples_ms[{j}]", v, _MS)


def _spread(rec: dict[str, Any], i: int, name: str) -> None:
    """A timed record's numbers add up as every writer's do (``np.percentile`` of its samples):
    q1_ms <= median_ms <= q3_ms, and median_ms the median of samples_ms where it has them (between
    their middle two, for an even count). Values ``_record`` checked already."""
    m = rec.get("median_ms")
    if m is None:
        return
    q1, q3 = rec.get("q1_ms"), rec.get("q3_ms")
    if q1 is not None and q1 > m:
        _refuse(name, i, "q1_ms", q1, f"at most its median_ms, {_shown(m)}")
    if q3 is not None and q3 < m:
        _refuse(name, i, "q3_ms", q3, f"at least its median_ms, {_shown(m)}")
    samples = rec.get("samples_ms")
    if samples is None:
        return
    t = sorted(samples)
    k = len(t)
    if not k:
        _refuse(name, i, "samples_ms", samples, "the samples its median_ms is the median of (at least one)")
    lo, hi = t[(k - 1) // 2], t[k // 2]
    if not lo <= m <= hi:
        middle = _shown(lo) if lo == hi else f"from {_shown(lo)} to {_shown(hi)}, between the middle two"
        _refuse(name, i, "median_ms", m, f"the median of its {k} samples_ms ({middle})")


def _refuse(name: str, i: int, field: str, value: Any, expected: str) -> NoReturn:
    why = f"{field} is {_shown(value)}, expected {expected}"
    raise ValueRefused(f"{name}: results[{i}].{why}; correct or remove that record", value, why)


def refused_values(results: list[dict[str, Any]]) -> dict[int, str]:
    """The records of ``results`` holding a value ``check_values`` refuses, each with why (its
    field, value and what it allows): for a reader that takes the others (reuse, which measures
    their items again). The batch is checked at once; one record at a time only where it holds
    such a record."""
    try:
        check_values(results, "")
        return {}
    except ValueRefused:
        pass
    out = {}
    for i, rec in enumerate(results):
        try:
            check_values([rec], "")
        except ValueRefused as exc:
            out[i] = exc.why
    return out


def _shown(value: Any) -> str:
    """The value as JSON (NaN and infinities as Python's json writes them), cut at 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
