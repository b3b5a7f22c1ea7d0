"""Pre-flight lowering's verdicts in a sweep directory: ``lowering.jsonl``, its one writer and
its reader, and what the verdicts make of the sweep's items.

``tilesweep plan SPEC --lower --sweep-dir DIR`` lowers every runnable config for the spec's
target GPU (``kernel.device_kind``) on this machine's CPUs (``jobs.lowering``) and appends one
verdict line per config, after a header naming the sweep (its fingerprint), the target and the
jax that lowered (written once: a rerun of the same sweep, target and jax appends its verdicts
under the header already there)::

    {"lowering": 1, "sweep": FINGERPRINT, "device_kind": "NVIDIA H200", "jax": ..., "jaxlib": ..., ...}
    {"id": ID, "verdict": "lowered", "kernels": [["entry", 198744]], "smem_bytes": 198744, ...}
    {"id": ID, "verdict": "refused", "error": "ValueError: Mosaic GPU kernel exceeds ...", "smem_bytes": 657560}

``verdict``: ``lowered``; ``refused`` (the kernel or its compiler said no: jax's checks, the
shared-memory limit, Pallas's verifier; ``smem_bytes`` where it gave a count); ``crashed``
(anything else: a lowering that crashes is a record of the error, never a stopped sweep).
Lines are flushed as they come and fsynced in batches; a torn last line is skipped, a config
lowered twice keeps its last verdict, and lines under a header of another sweep or target
count for nothing (a rerun of ``plan --lower`` lowers only what has no verdict). With
``executor.lower_partition`` the tasks of a CPU job array each append to a file of their own,
``lowering-task<N>.jsonl`` (never two writers on one file), read with ``lowering.jsonl``; a
task's last line says it ended (``{"lowering_end": N}``: N configs lowered).

Every reader of a sweep's items sees the verdicts (``SweepDir.items`` applies them): a refused
config becomes ``pruned`` with the compiler's reason and bytes, a crashed one ``invalid`` with its
error, so ``submit`` and the workers record them at once and never compile them on a GPU.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, TypedDict

from orchestrator.planning import INVALID, PRUNED, RUN, WorkItem
from orchestrator.store.filekinds import holds_file
from orchestrator.store.files import naming, now_iso, open_append, open_file, read_text

if TYPE_CHECKING:
    from orchestrator.spec.model import SweepSpec

FILE = "lowering.jsonl"
TASK_FILES = "lowering-task*.jsonl"  # one per task of a lowering job array
FORMAT_VERSION = 1
SYNC_EVERY = 32  # verdict lines per fsync: a lost verdict is lowered again, cheaply
Kind = Literal["lowered", "refused", "crashed"]


class LoweringHeader(TypedDict):
    """The line before the verdicts of a sweep, target and jax (``VerdictWriter``)."""

    lowering: int
    sweep: str
    device_kind: str
    jax: str | None
    jaxlib: str | None
    started: str


@dataclass(frozen=True)
class Verdict:
    """What lowering one config said."""

    id: str
    verdict: Kind
    kernels: list[tuple[str, int | None]] = field(default_factory=list)  # launches in program order
    smem_bytes: int | None = None  # the refusal's count, or the most any launch uses
    limit: int | None = None  # the target's shared memory per block
    error: str | None = None  # "Type: message" of a refusal or crash
    lower_s: float = 0.0

    def line(self) -> dict[str, Any]:
        out = asdict(self)
        out["kernels"] = [list(k) for k in self.kernels]
        return out

    @classmethod
    def from_line(cls, obj: Any) -> Verdict | None:
        """A verdict line as written, or None for anything else (a damaged line)."""
        if not isinstance(obj, dict) or obj.get("verdict") not in ("lowered", "refused", "crashed"):
            return None
        try:
            kernels = [(str(n), None if b is None else int(b)) for n, b in obj.get("kernels") or []]
            return cls(
                id=str(obj["id"]),
                verdict=obj["verdict"],
                kernels=kernels,
                smem_bytes=obj.get("smem_bytes"),
                limit=obj.get("limit"),
                error=obj.get("error"),
                lower_s=float(obj.get("lower_s") or 0.0),
            )
        except (KeyError, TypeError, ValueError):
            return None


def lowering_header(sweep: str, device_kind: str, env: dict[str, Any]) -> LoweringHeader:
    return {
        "lowering": FORMAT_VERSION,
        "sweep": sweep,
        "device_kind": device_kind,
        "jax": env.get("jax"),
        "jaxlib": env.get("jaxlib"),
        "started": now_iso(),
    }


REFUSED = "LoweringRefused"  # how the reason of an item lowering refused begins


def task_file(index: int) -> str:
    """The verdict file of task ``index`` of a lowering job array."""
    return f"lowering-task{index}.jsonl"


def verdict_files(root: Path) -> list[Path]:
    """The sweep's verdict files: the job array's tasks', then this machine's (read last, so a
    rerun here has the last word)."""
    return [*sorted(Path(root).glob(TASK_FILES)), Path(root) / FILE]


class VerdictWriter:
    """Appends a run's verdicts to ``root/lowering.jsonl`` (or ``name``), under its header: one
    header per stretch of runs of one sweep, target and jax (a rerun under the same ones appends
    its verdicts to the stretch, without a header of its own), written before its first line, so
    a rerun with nothing to lower writes nothing. A torn last line (a run killed mid-line) is
    ended first, so the next line is whole."""

    def __init__(self, root: Path, header: LoweringHeader, name: str = FILE) -> None:
        self._path = Path(root) / name
        self._header: dict[str, Any] | None = None if _same_run(last_header(self._path), dict(header)) else dict(header)
        self._torn = _torn_end(self._path)
        self._fh: IO[str] | None = None  # opened with the first line
        self._unsynced = 0

    def __enter__(self) -> VerdictWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, verdict: Verdict) -> None:
        self._write(verdict.line())
        self._unsynced += 1
        if self._unsynced >= SYNC_EVERY:
            self._sync()

    def end(self, lowered: int) -> None:
        """The last line of a job array's task: it ended, having lowered ``lowered`` configs."""
        self._write({"lowering_end": lowered})

    def close(self) -> None:
        if self._fh is not None and not self._fh.closed:
            try:
                self._sync()
            finally:
                with naming(self._path):  # its buffer, which a full disk took none of, is dropped
                    self._fh.close()

    def _write(self, obj: dict[str, Any]) -> None:
        """Write ``obj``'s line; an OSError of it (a full disk) names this file, for its one line."""
        with naming(self._path):
            if self._fh is None:
                self._fh = open_append(self._path)
            head = "\n" if self._torn else ""
            if self._header is not None:
                head += json.dumps(self._header) + "\n"
            self._fh.write(head + json.dumps(obj) + "\n")
            self._fh.flush()
        self._header, self._torn = None, False

    def _sync(self) -> None:
        if self._fh is not None:
            with naming(self._path):
                os.fsync(self._fh.fileno())
        self._unsynced = 0


HEADER_FIELDS = ("lowering", "sweep", "device_kind", "jax", "jaxlib")  # what a header's stretch of verdicts is of


def _same_run(found: dict[str, Any] | None, header: dict[str, Any]) -> bool:
    """Whether the verdicts of ``header``'s run belong under the header ``found``."""
    return found is not None and all(found.get(k) == header[k] for k in HEADER_FIELDS)


def last_header(path: Path) -> dict[str, Any] | None:
    """The header the last lines of the verdict file ``path`` are under (None: no file, or none)."""
    found = None
    try:
        with io.TextIOWrapper(open_file(path), encoding="utf-8", errors="replace") as fh:
            for text in fh:
                if text.startswith('{"lowering":'):
                    with contextlib.suppress(json.JSONDecodeError):
                        found = json.loads(text)
    except FileNotFoundError:
        return None
    return found if isinstance(found, dict) else None


def _torn_end(path: Path) -> bool:
    """Whether the file at ``path`` ends inside a line."""
    try:
        with open_file(path) as fh:
            if fh.seek(0, os.SEEK_END) == 0:
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except FileNotFoundError:
        return False


def read_verdicts(root: Path, sweep: str, device_kind: str) -> dict[str, Verdict]:
    """The last verdict per config under headers of this sweep and target (none: no file)."""
    out: dict[str, Verdict] = {}
    for path in verdict_files(root):
        if holds_file(path):
            out.update(read_lines(read_text(path).splitlines(), sweep, device_kind))
    return out


def read_lines(lines: Iterable[str], sweep: str, device_kind: str, ours: bool = False) -> dict[str, Verdict]:
    """The verdicts of one file's ``lines`` under headers of this sweep and target (``ours``:
    whether the lines before the first header count)."""
    out: dict[str, Verdict] = {}
    for text in lines:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            continue  # a torn last line after a kill
        if isinstance(obj, dict) and "lowering" in obj:
            ours = obj.get("sweep") == sweep and obj.get("device_kind") == device_kind
            continue
        verdict = Verdict.from_line(obj) if ours else None
        if verdict is not None:
            out[verdict.id] = verdict
    return out


def reason(verdict: Verdict, device_kind: str) -> str:
    """What the record of a config lowering refused (or crashed on) says."""
    what = REFUSED if verdict.verdict == "refused" else "LoweringCrashed"
    return f"{what}: {verdict.error} (pre-flight lowering for {device_kind}; not run)"


def apply_from(items: Iterable[WorkItem], root: Path, spec: SweepSpec) -> int:
    """``apply`` the verdicts the sweep directory ``root`` holds for ``spec`` and its target
    (none where it holds no verdict file): what planning and ``SweepDir.items`` both do."""
    target = spec.kernel.target.name
    return apply(items, read_verdicts(root, spec.fingerprint(), target), target)


def apply(items: Iterable[WorkItem], verdicts: dict[str, Verdict], device_kind: str) -> int:
    """Mark the runnable items lowering refused as pruned (with the compiler's reason and bytes),
    those it crashed on as invalid, and give the ones it lowered their shared-memory bytes where
    the module holds them. Returns how many items it took out of the run."""
    taken = 0
    for it in items:
        v = verdicts.get(it.id)
        if v is None or it.kind != RUN:
            continue
        if v.verdict == "lowered":
            if v.smem_bytes is not None:
                it.smem_bytes = v.smem_bytes
            continue
        it.kind = PRUNED if v.verdict == "refused" else INVALID
        it.reason = reason(v, device_kind)
        it.smem_bytes = v.smem_bytes
        taken += 1
    return taken
