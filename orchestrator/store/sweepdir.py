"""The sweep directory: everything about one sweep, readable hours later by a new process.

Layout::

    sweep.json          frozen spec, its fingerprint, resolved output path
    units.json          index of every unit ever planned (plan, resume, later rounds), in order, with
                        what its unit file must hold (item count, round, items' digest: store.unitfile)
    units/<id>.json     one unit: its items' ids and plan indices (its round, after 1: store.round2)
    partials/<id>.jsonl one per unit, appended by its worker only (header + record lines)
    done/<id>.json      completion marker, written atomically at the end of a unit
    env.json            environment fingerprint of the first worker (later ones must match)
    jobs.jsonl          submission history (executor, job ids, attempt)
    final-merge.json    what the final merge job did last (merged, or refused and why; see final_merge)
    round2.json         halving: what round 2 kept (store.round2)
    tokamax-grid.json   a "tokamax" grid's configs per problem, as planned (store.tokamax_lists)
    search/             a search's rounds (store.searchrounds)
    logs/               submitit's folder (sbatch files, stdout/stderr per task); a local run's
                        worker logs, <unit>.<n>_0_log.err, one per worker it started
    logs/units/<id>.log one per unit: its workers' output on SLURM (a task runs several)
    leases/<id>.lease   held by the live worker of a unit (see leases); run.lease: `tilesweep run`
    merge-cache/        partials parsed for merging (derived; safe to delete, see mergecache)
    status-tally.json   what the last status counted of unfinished partials (derived; safe to delete, see tally)
    quarantine/         partials the merger refused to merge, moved aside (see quarantine)

Files that several processes may write (units.json, env.json, markers, the results
document) are written atomically (``files``: a temp file ``os.replace``d into place).
"""

from __future__ import annotations

import errno
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

from kernels.spelling import as_json
from orchestrator import PROG, word
from orchestrator.errors import MismatchError, SweepDirError
from orchestrator.spec.differences import spec_differences
from orchestrator.spec.schema import SCHEMA_VERSION
from orchestrator.store import envfile, jobfile, unitfile
from orchestrator.store.filekinds import refuse_odd
from orchestrator.store.files import (
    DAMAGED_FIX,
    WRITE_ERRNOS,
    atomic_open,
    atomic_write_json,
    atomic_write_text,
    now_iso,
    read_json,
    remove_dead_temps,
    temp_path,
    write_advice,
)
from orchestrator.store.sweep_paths import FOLDERS, NAME_ONE, file_given, no_sweep_file, unused

if TYPE_CHECKING:  # the planner loads when the items are first expanded (status never expands them)
    from orchestrator.planning import Unit, WorkItem
    from orchestrator.spec.model import SweepSpec

# the file helpers live in ``files``; importable from here too, where the rooms above have them
__all__ = [
    "SWEEP_FILE",
    "SweepDir",
    "atomic_open",
    "atomic_write_json",
    "atomic_write_text",
    "now_iso",
    "read_json",
    "remove_dead_temps",
    "temp_path",
]


SWEEP_FILE = "sweep.json"
FORMAT = "tilesweep-sweep"


class SweepFile(TypedDict):
    """``sweep.json``: the frozen spec, its fingerprint, where the results go."""

    format: str  # FORMAT
    version: int  # SCHEMA_VERSION
    created: str
    fingerprint: str
    output: str
    planned: int  # items the plan holds: the spec's (a search: its round 1's and the carried ones)
    spec_source: str | None
    spec: dict[str, Any]  # SweepSpec.model_dump(mode="json")


class _Round(TypedDict, total=False):
    round: int  # only a unit of a later round than the first says it (store.round2)


class UnitFile(_Round):
    """``units/<id>.json``: one unit's items, as (plan index, item id)."""

    id: str
    items: list[tuple[int, str]]


class UnitEntry(_Round):
    """One unit of ``units.json``, the index of every unit ever planned."""

    id: str
    n_items: int
    origin: str  # what planned it: plan, resume, round2, reuse, ...
    created: str
    items_digest: NotRequired[str]  # unitfile.items_digest of its unit file's items (held to it where kept)


def _wrong_entry(index: list[Any]) -> str | None:
    """What the first entry of ``index`` that is no ``UnitEntry`` lacks (None: all are)."""
    for n, e in enumerate(index):
        if not isinstance(e, dict) or not isinstance(e.get("id"), str):
            return f"entry {n} has no unit id"
        if type(e.get("n_items")) is not int or e["n_items"] < 0 or type(e.get("round", 1)) is not int:
            return f"entry {n} (unit {e['id']}) has no item count or round"
    return None


def _no_one_unit(root: Path, key: str, ids: list[str], matches: list[str]) -> str:
    """Why ``key`` names no one unit of the sweep at ``root`` (``ids``: its units in index order;
    ``matches``: those whose id starts with it), and what names one."""
    shown = f"`{PROG} status {word(root)}` shows their ids"
    if matches:
        named = ", ".join(matches[:3]) + (", ..." if len(matches) > 3 else "")
        return f"unit {as_json(key)} begins {len(matches)} unit ids of {root} ({named}); give more of the id ({shown})"
    if not ids:
        return f"{root} has no unit yet (its unit index, units.json, is empty); `{PROG} resume {word(root)}` plans them"
    positions = "0" if len(ids) == 1 else f"0 to {len(ids) - 1}"
    return (
        f"unit {as_json(key)} is no unit of {root} ({len(ids)} unit{'s' if len(ids) != 1 else ''}): "
        f"pass a unit id, the start of one, or a position in its unit index, {positions} ({shown})"
    )


@dataclass
class SweepDir:
    """A handle on a sweep directory; cheap to create, reads lazily."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._spec: SweepSpec | None = None
        self._meta: SweepFile | None = None
        self._items: list[WorkItem] | None = None

    # ------------------------------------------------------------------ paths
    @property
    def partials(self) -> Path:
        return self.root / "partials"

    @property
    def done(self) -> Path:
        return self.root / "done"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def partial_path(self, unit_id: str) -> Path:
        return self.partials / f"{unit_id}.jsonl"

    def marker_path(self, unit_id: str) -> Path:
        return self.done / f"{unit_id}.json"

    def unit_path(self, unit_id: str) -> Path:
        return self.root / "units" / f"{unit_id}.json"

    def unit_log(self, unit_id: str) -> Path:
        """The log of every worker that ran the unit on SLURM (appended; `tilesweep logs`)."""
        return self.logs / "units" / f"{unit_id}.log"

    @property
    def lock_path(self) -> Path:
        return self.root / "sweep.lock"

    # ------------------------------------------------------------------ create / open
    @classmethod
    def create(
        cls, root: str | Path, spec: SweepSpec, *, output: Path, spec_source: str | None, planned: int
    ) -> SweepDir:
        """Create a new sweep directory; refuses one that holds another sweep."""
        root = Path(root)
        if (root / SWEEP_FILE).exists():
            return cls.of_spec(root, spec)
        cls.check_new(root)
        made = not root.exists()
        try:
            return cls._make(root, spec, output=output, spec_source=spec_source, planned=planned)
        except OSError as exc:
            if made:  # nothing of the user's is in it: a plan cut short leaves no half-made folder
                shutil.rmtree(root, ignore_errors=True)
            fix = write_advice(exc) if exc.errno in WRITE_ERRNOS or exc.errno in (errno.EACCES, errno.EPERM) else ""
            raise SweepDirError(
                f"cannot make the sweep directory {root} ({exc.strerror or exc}): {fix + ', or ' if fix else ''}"
                "pick another --sweep-dir"
            ) from None

    @classmethod
    def of_spec(cls, root: Path, spec: SweepSpec) -> SweepDir:
        """The planned sweep directory ``root`` opened for ``spec``, writing nothing; refused where it
        holds a sweep of another spec."""
        existing = cls.open(root)
        if not existing.spec.same_sweep(spec):
            raise MismatchError(
                f"{root} already holds a sweep of another spec ({spec_differences(spec, existing.spec)}); "
                f"use a new --sweep-dir, or `tilesweep resume {word(root)}`"
            )
        return existing

    @classmethod
    def _make(cls, root: Path, spec: SweepSpec, *, output: Path, spec_source: str | None, planned: int) -> SweepDir:
        for sub in FOLDERS:
            (root / sub).mkdir(parents=True, exist_ok=True)
        meta: SweepFile = {
            "format": FORMAT,
            "version": SCHEMA_VERSION,
            "created": now_iso(),
            "fingerprint": spec.fingerprint(),
            "output": str(output),
            "planned": planned,
            "spec_source": spec_source,
            "spec": spec.model_dump(mode="json"),
        }
        # the index first: sweep.json makes a sweep directory, so a create cut short (Ctrl-C) is redone
        atomic_write_json(root / "units.json", [], indent=None)
        atomic_write_json(root / SWEEP_FILE, meta, indent=1)
        return cls(root)

    @staticmethod
    def check_new(root: Path) -> None:
        """Refuse ``root`` as the folder of a new sweep: a file, or a folder holding other files."""
        if root.exists() and not root.is_dir():
            raise SweepDirError(f"sweep directory {root} exists and is not a directory; pick another --sweep-dir")
        if root.exists() and not unused(root):
            raise SweepDirError(f"{root} is not empty and holds no {SWEEP_FILE}; pick a new or empty --sweep-dir")

    @classmethod
    def open(cls, root: str | Path) -> SweepDir:
        root = Path(root)
        if root.is_file():
            raise SweepDirError(file_given(root))
        if not root.is_dir():
            raise SweepDirError(f"sweep directory {root} does not exist; {NAME_ONE}")
        refuse_odd(root / SWEEP_FILE)  # a pipe there: named as one, not as a folder that holds no sweep
        if not (root / SWEEP_FILE).is_file():
            raise SweepDirError(no_sweep_file(root))
        sd = cls(root)
        meta = sd.meta
        if meta.get("format") != FORMAT:
            raise SweepDirError(f"{root / SWEEP_FILE} is not a tilesweep sweep file")
        if meta.get("version") != SCHEMA_VERSION:
            raise SweepDirError(
                f"{root / SWEEP_FILE} has schema version {meta.get('version')}, this tilesweep reads {SCHEMA_VERSION}; "
                "use the tilesweep version that made it"
            )
        return sd

    @property
    def meta(self) -> SweepFile:
        """``sweep.json`` as written (``open`` checks its format and version)."""
        if self._meta is None:
            meta = read_json(self.root / SWEEP_FILE, "sweep file")
            if not isinstance(meta, dict):
                raise SweepDirError(f"{self.root / SWEEP_FILE} is not a tilesweep sweep file")
            self._meta = cast(SweepFile, meta)
        return self._meta

    def rewrite_meta(self, **changes: Any) -> None:
        """``sweep.json`` with ``changes`` over it, for every command and worker after this one
        (an output moved to, a replay's pace); the caller holds the sweep lock."""
        atomic_write_json(self.root / SWEEP_FILE, {**self.meta, **changes}, indent=1)
        self._meta = self._spec = None

    @property
    def spec(self) -> SweepSpec:
        """The frozen spec, whose ``fingerprint`` is the one the sweep was planned with
        (``SweepSpec.keep_fingerprint``), whatever rule hashes the spec now."""
        if self._spec is None:
            from orchestrator.spec.files import spec_from_data

            spec = spec_from_data(self.meta["spec"], source=str(self.root / SWEEP_FILE), frozen=True)
            planned = self.meta.get("fingerprint")  # whatever rule hashed it (none in a very old sweep.json)
            self._spec = spec.keep_fingerprint(planned) if isinstance(planned, str) else spec
        return self._spec

    @property
    def planned(self) -> int:
        """Number of items the plan holds (stored, so status need not expand the spec): every item
        of the spec, or for a search its round 1's (``searchrounds.planned_total`` adds the later rounds')."""
        return int(self.meta.get("planned") or len(self.items()))

    @property
    def output(self) -> Path:
        return Path(self.meta["output"])

    def items(self) -> list[WorkItem]:
        """The sweep's items in plan order (re-expanded from the frozen spec), with pre-flight
        lowering's verdicts applied (``store.lowering``: what it refused is pruned)."""
        if self._items is None:
            from orchestrator.planning import expand
            from orchestrator.store import lowering, tokamax_lists

            tokamax_lists.load(self.root, self.spec)  # a "tokamax" grid's lists as they were planned
            items = expand(self.spec)
            lowering.apply_from(items, self.root, self.spec)
            self._items = items
        return self._items

    # ------------------------------------------------------------------ units
    def unit_index(self) -> list[UnitEntry]:
        data = read_json(self.root / "units.json", "unit index")
        wrong = "it is not a list" if not isinstance(data, list) else _wrong_entry(data)
        if wrong is not None:
            raise SweepDirError(f"unit index {self.root / 'units.json'} is damaged ({wrong}); {DAMAGED_FIX}")
        return cast(list[UnitEntry], data)

    def add_units(self, units: list[Unit], origin: str) -> list[UnitEntry]:
        """Write unit files and append them to the index (caller holds the sweep lock)."""
        index = self.unit_index()
        known = {u["id"] for u in index}
        added: list[UnitEntry] = []
        for u in units:
            if u.id in known:
                continue
            rnd: _Round = {"round": u.round} if u.round != 1 else {}  # a unit of a later round says so in both
            pairs = [(it.index, it.id) for it in u.items]
            unit_file: UnitFile = {"id": u.id, "items": pairs, **rnd}
            atomic_write_json(self.unit_path(u.id), unit_file)
            entry: UnitEntry = {"id": u.id, "n_items": len(u.items), "origin": origin, "created": now_iso(), **rnd}
            added.append({**entry, "items_digest": unitfile.items_digest(pairs)})
            index.append(added[-1])
            known.add(u.id)
        atomic_write_json(self.root / "units.json", index)
        return added

    def resolve_unit(self, key: str) -> str:
        """A unit id from an id, a unique id prefix or a position in the unit index."""
        index = self.unit_index()
        ids = [u["id"] for u in index]
        if key in ids:
            return key
        if key.isdigit() and int(key) < len(ids):
            return ids[int(key)]
        matches = [i for i in ids if key and i.startswith(key)]
        if len(matches) == 1:
            return matches[0]
        raise SweepDirError(_no_one_unit(self.root, key, ids, matches))

    def unit_items(self, unit_id: str) -> list[WorkItem]:
        from orchestrator.store import tokamax_lists

        listed = unitfile.read_items(self.root, unit_id)
        items = self.items()
        out = []
        for index, iid in listed:
            if index >= len(items) or items[index].id != iid:
                raise MismatchError(
                    f"unit {unit_id} ({self.unit_path(unit_id)}) names item {iid} at plan position {index}, "
                    "which the frozen spec does not expand to; its unit file was edited (restore it from a copy), "
                    "or the sweep was planned by " + tokamax_lists.planned_by(self.root, self.spec)
                )
            out.append(items[index])
        return out

    # ------------------------------------------------------------------ history
    # the sweep directory this process recorded a job of sbatch's in, if any (what a stop of
    # ``submit``, ``resume`` or ``run`` on SLURM says it leaves: those jobs run on)
    recorded_a_job: Path | None = None

    def record_jobs(self, entries: list[dict[str, Any]]) -> None:
        """Append submission records to jobs.jsonl (``jobfile``)."""
        jobfile.append(self.root, entries)

    def record_sbatch_jobs(self, entries: list[dict[str, Any]]) -> None:
        """Append the records of jobs sbatch accepted, which outlive this process."""
        self.record_jobs(entries)
        SweepDir.recorded_a_job = self.root

    def job_history(self) -> list[dict[str, Any]]:
        """The lines of ``jobs.jsonl``, their log paths in this directory (``jobfile``)."""
        return jobfile.read(self.root, self.logs)

    # ------------------------------------------------------------------ environment
    def check_env(self, env: dict[str, Any]) -> None:
        """First worker records its environment; later ones must match it (``envfile``)."""
        envfile.check(self.root, env)

    def recorded_env(self) -> dict[str, Any] | None:
        """The environment the first worker recorded (None: no worker has run yet)."""
        return envfile.recorded(self.root)
