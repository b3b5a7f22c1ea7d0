"""Load a results document fast and refuse anything that is not one, naming the file.

A results document is ``{"device": {...}, "config": {...}, "results": [records]}``; extra
top-level keys and extra record fields are tolerated (tilesweep appends documented ones such
as ``timer`` or ``attempt``; other tools may add more), so a document written by a newer
tilesweep still reports.

Records are checked for the identity fields only, by a set inclusion per record, rather than
through a pydantic model: a million records must load in seconds, and the report needs the
identity, not a full schema check (the merger validates what it writes). Parsing uses orjson
when it is installed and the stdlib ``json`` otherwise (and for a document orjson refuses:
NaN, which the stdlib writes for a broken kernel's rel_err); both give the same objects.
This is the one reader of results documents: report, compare, export, ``--costs`` and the
merger's ``append`` all read through ``load``.
Measured with ``bench/report.py`` (1M records, 444 MB): load 2.8 s with orjson vs 6.8 s
stdlib (2.4x), load + best_table 4.3 s vs 7.3 s (1.7x).
"""

from __future__ import annotations

import gc
import json
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from orchestrator.errors import ResultsError
from orchestrator.planning.costs import CostTable, cost_table
from orchestrator.spec.records import IDENTITY_FIELDS

_orjson: ModuleType | None
try:  # optional speed-up; the stdlib parser gives identical results
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

log = logging.getLogger(__name__)

__all__ = ["ResultsDoc", "from_obj", "load", "load_costs", "paused_gc"]

TOP_LEVEL_FIELDS: tuple[str, ...] = ("device", "config", "results")

_IDENTITY = frozenset(IDENTITY_FIELDS)


@dataclass(frozen=True)
class ResultsDoc:
    """A loaded results document. ``extra`` keeps unknown top-level keys untouched."""

    device: dict[str, Any]
    config: dict[str, Any]
    results: list[dict[str, Any]]
    extra: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    @property
    def name(self) -> str:
        return self.path if self.path is not None else "<document>"


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for a burst of acyclic allocations.

    A million records are millions of new containers; every few hundred allocations the
    collector would walk the ones made so far, again and again. Parsed JSON and the tuples
    built from it cannot form cycles, so reference counting frees them all the same
    (measured on 1M records: orjson parse 5.3 s -> 1.8 s). Nested use is fine.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse(data: bytes, path: str) -> Any:
    try:
        with paused_gc():
            if _orjson is not None:
                try:
                    return _orjson.loads(data)
                except ValueError:  # NaN or Infinity (a broken kernel's rel_err): the stdlib reads them
                    pass
            return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        # json.JSONDecodeError derives from ValueError.
        raise ResultsError(f"{path}: not a results document: not valid JSON ({exc})") from None


def load(path: str | os.PathLike[str], *, role: str | None = None) -> ResultsDoc:
    """Read and validate the results document at ``path``; raise ``ResultsError`` if it is not
    one. ``role`` (e.g. ``"--costs"``) prefixes the file name in messages, to say which
    argument named it."""
    spath = os.fspath(path)
    name = f"{role} {spath}" if role else spath
    try:
        with open(spath, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise ResultsError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise ResultsError(f"{name}: is a directory, not a results document") from None
    except OSError as exc:
        raise ResultsError(f"{name}: cannot read ({exc.strerror or exc})") from None
    doc = from_obj(_parse(data, name), name=name)
    log.debug("loaded %s: %d records", spath, len(doc.results))
    return doc


def load_costs(path: str | os.PathLike[str]) -> CostTable:
    """Measured seconds per config from a results document (``--costs``)."""
    doc = load(path, role="--costs")
    return cost_table(doc.results, doc.config, source=doc.name)


def from_obj(obj: Any, *, name: str = "<document>") -> ResultsDoc:
    """Validate an already parsed document (tests, the merger's in-memory result)."""
    if not isinstance(obj, Mapping):
        raise ResultsError(
            f"{name}: not a results document: top level is a JSON {_json_type(obj)}, "
            "expected an object with device, config, results"
        )
    missing = [k for k in TOP_LEVEL_FIELDS if k not in obj]
    if missing:
        raise ResultsError(
            f"{name}: not a results document: missing top-level key(s) {', '.join(missing)} "
            f"(has: {', '.join(map(str, obj)) or 'nothing'})"
        )
    for key, want in (("device", Mapping), ("config", Mapping), ("results", list)):
        if not isinstance(obj[key], want):
            expected = "an object" if want is Mapping else "an array"
            raise ResultsError(
                f"{name}: not a results document: {key!r} is a JSON {_json_type(obj[key])}, expected {expected}"
            )
    results = obj["results"]
    _check_records(results, name)
    extra = {k: v for k, v in obj.items() if k not in TOP_LEVEL_FIELDS}
    return ResultsDoc(
        device=dict(obj["device"]),
        config=dict(obj["config"]),
        results=results,
        extra=extra,
        path=name,
    )


def _check_records(results: list[Any], name: str) -> None:
    ident = _IDENTITY
    for i, rec in enumerate(results):
        # The fast path is one type check and one set inclusion per record.
        if type(rec) is dict and ident <= rec.keys():
            continue
        if not isinstance(rec, Mapping):
            raise ResultsError(
                f"{name}: not a results document: results[{i}] is a JSON {_json_type(rec)}, expected an object"
            )
        lacking = [k for k in IDENTITY_FIELDS if k not in rec]
        if lacking:
            raise ResultsError(
                f"{name}: results[{i}] lacks identity field(s) {', '.join(lacking)} "
                f"(a record needs {', '.join(IDENTITY_FIELDS)})"
            )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__
