"""Writing partial lines: each line's typed form, the one builder of each, and the writer that
appends them to a unit's partial.

What the five kinds of line mean (a header, then start, abandon, hung and record lines) and how
they are read back, ``partials`` says. Every writer of partials (the worker, the reuse unit
written at plan time, the synthetic sweeps of benches and tests) builds its lines here, so their
keys and key order are spelled once. The types are TypedDicts, not dataclasses: a line is a JSON
object on both sides (built here and encoded as it is; parsed back by ``partials.classify`` as a
plain dict, millions of times in a merge), so a TypedDict types both paths at no cost, where a
dataclass would need converting on the way out and an object built for every line read back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, NotRequired, TypedDict, Unpack

from orchestrator.spec.schema import SCHEMA_VERSION
from orchestrator.store.files import naming


class DeviceBlock(TypedDict, total=False):
    """Where records were measured: the reference document's ``device`` block plus jaxlib, and
    tokamax's version where it is installed (a reuse unit's header names the device kind alone)."""

    jax: str | None
    backend: str | None
    devices: list[str] | None
    python: str | None
    device_kind: str | None
    jaxlib: str | None
    tokamax: str


def document_device(device: Mapping[str, Any]) -> DeviceBlock:
    """The device block a results document holds, as the reference run wrote it: a header's
    device block less jaxlib (which only the environment fingerprint needs)."""
    return {
        "jax": device.get("jax"),
        "backend": device.get("backend"),
        "devices": device.get("devices"),
        "python": device.get("python"),
        "device_kind": device.get("device_kind"),
    }


class MeasureBlock(TypedDict):
    """How a worker's attempt measured (its header's ``measure``; the merger sums them up in the
    document's ``tilesweep.measurement``)."""

    impl: str
    strategy: str
    round: int
    timer: str  # the ``timer`` its records carry (kernels.timing.TIMERS, or "virtual")
    flush_l2: bool
    clock: str  # "real", or "virtual" for a replay


class PartialHeader(TypedDict):
    """The first line of each attempt: which sweep, unit and environment its records belong to
    and where they were measured. Read back, ``partials.classify`` checks a header's schema,
    attempt and start time only; readers take the rest with ``.get``."""

    schema: int
    unit: str
    sweep: str  # the spec's fingerprint
    attempt: int
    device: DeviceBlock
    env: dict[str, Any] | None  # spec.compat.env_fingerprint of the device block
    host: str
    pid: int
    slurm_job_id: str | None
    gpu: NotRequired[str | None]  # a worker's: the GPUs its task was given (CUDA_VISIBLE_DEVICES)
    started: str
    measure: NotRequired[MeasureBlock]  # a worker's: how it measured
    reuse: NotRequired[dict[str, int]]  # a reuse unit's: records carried from each source document


class ReadHeader(PartialHeader, total=False):
    """A header as readers hold it: with the number of the line it was read from."""

    line: int


class HeaderLine(TypedDict):
    header: PartialHeader


class StartLine(TypedDict):
    start: str
    attempt: int
    alone: NotRequired[bool]  # no other config was in flight (or its compile process died with it)


class AbandonLine(TypedDict):
    abandon: str
    attempt: int


class HungLine(TypedDict):
    hung: str
    attempt: int


class RecordLine(TypedDict):
    id: str
    attempt: int
    record: dict[str, Any]  # the layout spec.records names (layouts.check_record)


PartialLine = HeaderLine | StartLine | AbandonLine | HungLine | RecordLine


class HeaderParts(TypedDict, total=False):
    """What only some headers hold (``PartialHeader``): a key given, even as None, is written."""

    gpu: str | None
    measure: MeasureBlock
    reuse: dict[str, int]


def partial_header(
    *,
    unit: str,
    sweep: str,
    attempt: int,
    device: DeviceBlock,
    env: dict[str, Any] | None,
    host: str,
    pid: int,
    slurm_job_id: str | None,
    started: str,
    **parts: Unpack[HeaderParts],
) -> PartialHeader:
    """An attempt's header, its keys in the order every partial has them."""
    placed: HeaderParts = {"gpu": parts["gpu"]} if "gpu" in parts else {}
    measured: HeaderParts = {}
    if "measure" in parts:
        measured["measure"] = parts["measure"]
    if "reuse" in parts:
        measured["reuse"] = parts["reuse"]
    return {
        "schema": SCHEMA_VERSION,
        "unit": unit,
        "sweep": sweep,
        "attempt": attempt,
        "device": device,
        "env": env,
        "host": host,
        "pid": pid,
        "slurm_job_id": slurm_job_id,
        **placed,
        "started": started,
        **measured,
    }


def header_line(header: PartialHeader) -> HeaderLine:
    return {"header": header}


def start_line(item_id: str, attempt: int, *, alone: bool = False) -> StartLine:
    """``alone``: the config is the only one in flight, so a death now counts against it."""
    line: StartLine = {"start": item_id, "attempt": attempt}
    if alone:
        line["alone"] = True
    return line


def abandon_line(item_id: str, attempt: int) -> AbandonLine:
    return {"abandon": item_id, "attempt": attempt}


def hung_line(item_id: str, attempt: int) -> HungLine:
    return {"hung": item_id, "attempt": attempt}


def record_line(item_id: str, attempt: int, record: dict[str, Any]) -> RecordLine:
    return {"id": item_id, "attempt": attempt, "record": record}


_encode_line = json.JSONEncoder(separators=(",", ":")).encode


def encode_line(line: PartialLine) -> str:
    """One partial line, without its newline: compact JSON (one object per line, so a torn
    write damages only the last line, which ``classify`` then names)."""
    return _encode_line(line)


class PartialWriter:
    """Appends lines to one unit's partial; each line is flushed (a killed worker loses none
    it wrote) and fsynced, unless the caller writes with ``sync=False``: a replay, whose records
    cost nothing to redo, syncs a batch at a time (``sync()``, and on close), since one fsync
    per record made a replayed sweep wait on the disk (5 ms a line here)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._unsynced = False
        self._f: IO[str] = open(path, "a+", encoding="utf-8")
        # A previous attempt killed mid-line leaves no trailing newline: end that torn
        # line so our first line is not glued onto it.
        self._f.seek(0, os.SEEK_END)
        if self._f.tell() > 0:
            self._f.seek(self._f.tell() - 1)
            last = self._f.read(1)
            self._f.seek(0, os.SEEK_END)
            if last != "\n":
                self._f.write("\n")

    def write(self, line: PartialLine, *, sync: bool = True) -> None:
        with naming(self.path):  # a full disk says which file
            self._f.write(encode_line(line) + "\n")
            self._f.flush()
        self._unsynced = True
        if sync:
            self.sync()

    def sync(self) -> None:
        """fsync what was written (a no-op when nothing is pending)."""
        if self._unsynced:
            with naming(self.path):
                os.fsync(self._f.fileno())
            self._unsynced = False

    def close(self) -> None:
        with naming(self.path):
            if not self._f.closed:
                self.sync()
            self._f.close()

    def __enter__(self) -> PartialWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
