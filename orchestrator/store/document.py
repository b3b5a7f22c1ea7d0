"""Load a results document fast and refuse anything that is not one, naming the file.

A results document is ``{"device": {...}, "config": {...}, "results": [records]}``; extra
top-level keys and extra record fields are tolerated (tilesweep appends documented ones such
as ``timer`` or ``attempt``; other tools may add more), so a document written by a newer
tilesweep still reports.

Records are checked for the identity fields, by a set inclusion per record, and ``load`` checks
their values (``store.record_values``: identity, config fields, timings, each as the spec and the
kernels allow, a distinct identity or config once) rather than through a pydantic model: a
million records must load in seconds (the merger validates what it writes). Parsing uses orjson
when it is installed and the stdlib ``json`` otherwise (and for a document orjson refuses:
NaN, which the stdlib writes for a broken kernel's rel_err); both give the same objects.
This is the one reader of results documents: report, compare, export, ``--costs`` and the
merger's ``append`` all read through ``load``; reuse, which keeps few of a document's records,
through ``scan`` (the same checks, the records in batches).
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
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, BinaryIO

from kernels.spelling import as_json
from orchestrator import PROG, word
from orchestrator.devicefiles import not_a_file
from orchestrator.errors import ResultsError
from orchestrator.planning.costs import CostTable, cost_table
from orchestrator.spec import tolerance
from orchestrator.spec.files import json_type
from orchestrator.spec.records import IDENTITY_FIELDS
from orchestrator.store.not_a_document import not_a_document, not_json, spec_said, sweep_file_said, toml_of
from orchestrator.store.record_values import ValueRefused, check_values

_orjson: ModuleType | None
try:  # optional speed-up; the stdlib parser gives identical results
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

log = logging.getLogger(__name__)

__all__ = [
    "ResultsDoc",
    "Scanned",
    "check_records",
    "check_values",
    "from_obj",
    "head_of",
    "load",
    "load_costs",
    "parse_json",
    "read_head",
    "paused_gc",
    "read_bytes",
    "results_bounds",
    "scan",
]

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
    # the largest rel_err its records are judged by, where no tilesweep block says it: a document
    # ``analysis.combine`` made, whose records each document judged by its own limit already
    judged_by: float | None = None

    @property
    def name(self) -> str:
        return self.path if self.path is not None else "<document>"

    @property
    def max_rel_err(self) -> float | None:
        """The ``check.max_rel_err`` its records were checked with (``tolerance.document_limit``)."""
        if self.judged_by is not None:
            return self.judged_by
        return tolerance.document_limit(self.extra.get("tilesweep"))


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


def parse_json(data: bytes, path: str) -> Any:
    """JSON text of the document ``path`` parsed (orjson, the stdlib for NaN), or the one-line
    ``ResultsError`` of a file that is not JSON."""
    try:
        with paused_gc():
            if _orjson is not None:
                try:
                    return _orjson.loads(data)
                except ValueError:  # NaN or Infinity (a broken kernel's rel_err): the stdlib reads them
                    pass
            return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        spec = spec_said(toml_of(data), path)
        raise ResultsError(spec or f"{path}: not a results document: {not_json(data, exc)}") from None


def _read(path: str | os.PathLike[str], role: str | None) -> tuple[str, bytes]:
    """(the name messages give the file, its bytes)."""
    name, fh = _open(path, role)
    with fh:
        return name, fh.read()


def check_openable(path: str | os.PathLike[str], role: str | None) -> None:
    """Refuse, as reading it would, a results document path that names no file this user can
    read (``tilesweep spec`` checks the documents a spec names without reading them)."""
    _open(path, role)[1].close()


def _open(path: str | os.PathLike[str], role: str | None) -> tuple[str, BinaryIO]:
    """(the name messages give the file, the file opened for reading); ``ResultsError`` in one
    line where it is not one."""
    spath = os.fspath(path)
    name = f"{role} {spath}" if role else spath
    if not_a_file(spath):
        raise ResultsError(f"{name}: is a device, not a results document; pass the document's file")
    try:
        return name, open(spath, "rb")  # noqa: SIM115 (the caller closes it)
    except FileNotFoundError:
        if spath == "-":  # no command reads a document from standard input
            raise ResultsError(
                f"{name}: {PROG} reads no results document from standard input; save it to a file and pass its path"
            ) from None
        raise ResultsError(
            f"{name}: no such file (a sweep's document is written when it is merged: `{PROG} merge SWEEP_DIR`)"
        ) from None
    except IsADirectoryError:
        if os.path.exists(os.path.join(spath, "sweep.json")):
            raise ResultsError(
                f"{name}: is a sweep directory, not a results document; `{PROG} merge {word(spath)}` writes its "
                "document (to the spec's output), or pass that document"
            ) from None
        raise ResultsError(f"{name}: is a directory, not a results document; pass the document's file") from None
    except OSError as exc:
        raise ResultsError(f"{name}: cannot read ({exc.strerror or exc})") from None


def load(path: str | os.PathLike[str], *, role: str | None = None, tokamax: bool = False) -> ResultsDoc:
    """Read and validate the results document at ``path``; raise ``ResultsError`` if it is not
    one. ``role`` (e.g. ``"--costs"``) prefixes the file name in messages, to say which
    argument named it. ``tokamax``: a file named as tokamax names its attention tables is read
    as one (``store.tokamax_table``: a prior whose times are another GPU's)."""
    if tokamax:
        found = _tokamax_table(path, role)
        if found is not None:
            return found
    name, data = _read(path, role)
    try:
        doc = from_obj(parse_json(data, name), name=name)
    except ResultsError:
        said = sweep_file_said(os.fspath(path), name)  # what a file of a sweep directory is, in its words
        if said is None:
            raise
        raise ResultsError(said) from None
    try:
        check_values(doc.results, name)
    except ValueRefused as exc:
        if _orjson is None or type(exc.value) is not float:
            raise
        # orjson reads an integer too large for 64 bits as a float: name it as the file gives it
        check_values(json.loads(data)["results"], name)
        raise
    log.debug("loaded %s: %d records", name, len(doc.results))
    return doc


# The layout of json.dumps(indent=1), the merger's and the reference run's: each record of
# ``results`` opens with "\n  {" and closes with "\n  }", and the array with the first "\n ]"
# after it (a nested value opens and closes deeper; a JSON string holds no raw newline).
_RESULTS_OPEN = b'"results": [\n  {'
_ARRAY_CLOSE = b"\n ]"
_BETWEEN = b"\n  },\n  {"
BATCH_BYTES = 8 << 20


@dataclass(frozen=True)
class Scanned:
    """A document read by ``scan``: its head (``doc``, with no records) and its records in batches."""

    doc: ResultsDoc
    batches: Iterator[list[dict[str, Any]]]


def _tokamax_table(path: str | os.PathLike[str], role: str | None) -> ResultsDoc | None:
    """The tokamax table at ``path`` as a document, or None where ``path`` is not named as one."""
    from orchestrator.store import tokamax_table

    if not tokamax_table.is_table(path):
        return None
    name = f"{role} {os.fspath(path)}" if role else os.fspath(path)
    table = tokamax_table.read(path, name)
    return ResultsDoc(device=table.device, config={}, results=table.records, extra=table.extra, path=name)


def scan(path: str | os.PathLike[str], *, role: str | None = None, tokamax: bool = False) -> Scanned:
    """``load`` for a reader that keeps few of a document's records (reuse keeps half a million
    of a million): the head is parsed and checked at once, the records come in batches of about
    ``BATCH_BYTES`` of text, each parsed at C speed and checked as ``load`` checks them, so one
    batch of records is alive at a time instead of all of them (3 GB for a million). A document of
    another layout is loaded whole and given as one batch; a tokamax table too (``tokamax``: as ``load``)."""
    found = _tokamax_table(path, role) if tokamax else None
    if found is not None:
        return Scanned(replace(found, results=[]), iter([found.results]))
    name, data = _read(path, role)
    bounds = results_bounds(data)
    if bounds is None:
        doc = from_obj(parse_json(data, name), name=name)
        return Scanned(replace(doc, results=[]), iter([doc.results]))
    first, stop = bounds
    return Scanned(head_of(data, bounds, name), _batches(data, first, stop, name))


def results_bounds(data: bytes) -> tuple[int, int] | None:
    """(where the first record's ``{`` is, where the last record's ``}`` ends) in a document of
    the merger's layout with records; None for another layout (or no records)."""
    start = data.find(_RESULTS_OPEN)
    end = data.find(_ARRAY_CLOSE, start) - 4 if start >= 0 else -1  # the last record's "\n  }"
    if start < 0 or end < start or data[end : end + 4] != b"\n  }":
        return None
    return start + len(_RESULTS_OPEN) - 1, end + 4


def head_of(data: bytes, bounds: tuple[int, int], name: str) -> ResultsDoc:
    """The document without its records (``bounds``: ``results_bounds``), parsed and checked."""
    first, stop = bounds
    return from_obj(parse_json(data[: first - 3] + data[stop:], name), name=name)  # '"results": [' + '\n ]'


def read_head(path: str | os.PathLike[str], bounds: tuple[int, int], *, role: str | None = None) -> ResultsDoc:
    """The head of the document at ``path`` (its records lie within ``bounds``, as
    ``results_bounds`` or a key index says), reading only the bytes around them."""
    spath = os.fspath(path)
    name = f"{role} {spath}" if role else spath
    first, stop = bounds
    try:
        with open(spath, "rb") as fh:
            before = fh.read(first)
            fh.seek(stop)
            after = fh.read()
    except OSError as exc:
        raise ResultsError(f"{name}: cannot read ({exc.strerror or exc})") from None
    return head_of(before + after, (first, first), name)


def read_bytes(path: str | os.PathLike[str], *, role: str | None = None) -> tuple[str, bytes]:
    """(the name messages give the file, its bytes), or the one-line ``ResultsError`` of ``load``."""
    return _read(path, role)


def _batches(data: bytes, pos: int, stop: int, name: str) -> Iterator[list[dict[str, Any]]]:
    done = 0
    while pos < stop:
        cut = data.find(_BETWEEN, min(pos + BATCH_BYTES, stop), stop)
        end = stop if cut < 0 else cut + 4
        records = parse_json(b"[" + data[pos:end] + b"]", name)
        check_records(records, name, done)
        done += len(records)
        yield records
        pos = end + 4  # past ",\n  " to the next record's "{"


def load_costs(path: str | os.PathLike[str]) -> CostTable:
    """Measured seconds per config from a results document (``--costs``), or from a tokamax
    autotuning table (``store.tokamax_table``)."""
    doc = load(path, role="--costs", tokamax=True)
    return cost_table(doc.results, doc.config, source=doc.name)


def from_obj(obj: Any, *, name: str = "<document>") -> ResultsDoc:
    """Validate an already parsed document (tests, the merger's in-memory result)."""
    if not isinstance(obj, Mapping):
        raise ResultsError(
            f"{name}: not a results document: top level is a JSON {json_type(obj)}, "
            "expected an object with device, config, results"
        )
    missing = [k for k in TOP_LEVEL_FIELDS if k not in obj]
    if missing:
        raise ResultsError(not_a_document(obj, name, missing))
    for key, want in (("device", Mapping), ("config", Mapping), ("results", list)):
        if not isinstance(obj[key], want):
            expected = "an object" if want is Mapping else "an array"
            raise ResultsError(
                f"{name}: not a results document: {as_json(key)} is a JSON {json_type(obj[key])}, expected {expected}"
            )
    results = obj["results"]
    check_records(results, name)
    extra = {k: v for k, v in obj.items() if k not in TOP_LEVEL_FIELDS}
    return ResultsDoc(
        device=dict(obj["device"]),
        config=dict(obj["config"]),
        results=results,
        extra=extra,
        path=name,
    )


def check_records(results: list[Any], name: str, first: int = 0) -> None:
    """Refuse (``ResultsError``, naming the record) a record that is not an object with the
    identity fields; ``first``: the number of the first of ``results`` in the document."""
    ident = _IDENTITY
    for i, rec in enumerate(results, first):
        # The fast path is one type check and one set inclusion per record.
        if type(rec) is dict and ident <= rec.keys():
            continue
        if not isinstance(rec, Mapping):
            raise ResultsError(
                f"{name}: not a results document: results[{i}] is a JSON {json_type(rec)}, expected an object"
            )
        lacking = [k for k in IDENTITY_FIELDS if k not in rec]
        if lacking:
            raise ResultsError(
                f"{name}: results[{i}] lacks identity field(s) {', '.join(lacking)} "
                f"(a record needs {', '.join(IDENTITY_FIELDS)})"
            )
