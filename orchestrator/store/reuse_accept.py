"""What a sweep accepts of an earlier document's records, and why it refuses the others: the
counters ``store.reuse`` fills per source, and the verdict on the tilesweep block that measured a
record (its environment and measurement settings, through ``spec.compat``: the one home of the
rule of compatibility).

Replayed records (``store.replayed``: a replay's, drawn on a virtual clock) are no
measurements. A replay takes them as it takes any record (they are what it would write); a
measured sweep refuses them, counted apart so the command says so, unless asked
(``--include-replays``, ``reuse.replays``): then a replayed record stands for the measurement of
the kernel its replay replayed (``replay.impl``), timed as its spec says on this sweep's backend,
and is carried marked (``timer: virtual``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.planning import RUN, WorkItem
from orchestrator.planning.halving import HALVING
from orchestrator.spec.compat import env_differences, env_fingerprint, impl_of, measurement_differences, measurement_key
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import key_head
from orchestrator.spec.sections import REPLAY
from orchestrator.store.carry import flags_of
from orchestrator.store.provenance import TilesweepBlock

REFUSALS = (
    "other_device",
    "other_env",
    "other_measurement",
    "unknown",
    "errors_left",
    "screened_left",
    "damaged",
    "replayed",
)


# how a line of ``SourceCount.why`` begins, by the count it explains: where the count is said,
# the rest of the line is its detail (``say``)
WHY_OF = {
    "other_env": "another environment",
    "other_measurement": "measured with other settings",
    "damaged": "damaged records",
}


@dataclass
class SourceCount:
    """What one source document gave, and why the rest of its records of this plan were not taken."""

    path: str
    role: str  # "output", "--reuse" or "reuse.documents"
    records: int = 0  # records of this plan's items that can be measured (the rest is not counted)
    reused: int = 0
    errors: int = 0  # of the reused, error records
    replayed_reused: int = 0  # of the reused, replayed records (asked: --include-replays)
    other_device: int = 0
    other_env: int = 0  # jax or jaxlib differ
    other_measurement: int = 0
    unknown: int = 0  # no tilesweep block says how they were measured
    errors_left: int = 0  # error records, measured again (reuse errors not asked)
    screened_left: int = 0  # screened records a full sweep cannot use
    damaged: int = 0
    replayed: int = 0  # replayed records a measured sweep does not take unless asked
    superseded: int = 0  # compatible, but another record of the item was preferred
    device_kind: Any = None
    why: list[str] = field(default_factory=list)  # one line per kind of refusal


@dataclass
class Wanted:
    """What this sweep accepts: its items by id and, where a source is matched by key
    (``reuse_sources``), by ``record_key``; whether records are reused at all (costs are taken
    either way), its environment and measurement keys."""

    by_id: dict[str, WorkItem]
    items: dict[tuple[Any, ...], WorkItem]
    reuse: bool
    env: dict[str, Any]
    full: tuple[Any, ...]
    screen: tuple[Any, ...] | None  # halving: the key of a screen; None in a full sweep
    errors: bool
    mix_devices: bool
    tag: str = ""  # the plan's
    replay_sweep: bool = False  # this sweep replays: replayed records are like for like
    replays: bool = False  # a measured sweep takes replayed records too (asked)
    # by item: the first record of it met, with its document's (repeats, warmup)
    priced: dict[int, tuple[Mapping[str, Any], tuple[int, int], WorkItem]] = field(default_factory=dict)
    heads: set[tuple[Any, ...]] = field(default_factory=set)  # ``records.key_head`` of every item's key

    @property
    def backend(self) -> str | None:
        return self.env.get("backend")

    def marks_replayed(self, replayed: bool) -> bool:
        """Whether a record taken must be marked replayed itself (a measured sweep's replayed one)."""
        return replayed and not self.replay_sweep


def wanted(
    spec: SweepSpec,
    items: list[WorkItem],
    env: dict[str, Any] | None,
    *,
    errors: bool,
    reuse: bool,
    replays: bool,
    keyed: bool = True,
) -> Wanted:
    """What ``spec``'s sweep of ``items`` accepts, in the environment ``env`` (None: unknown, so
    nothing is reused); ``keyed``: a source is matched by key (its items by ``record_key``, which
    a million items take seconds to make, are needed)."""
    dumped = spec.model_dump(mode="json")
    backend = (env or {}).get("backend")
    runs = [it for it in items if it.kind == RUN]
    want = Wanted(
        {it.id: it for it in runs},
        {it.record_key(): it for it in runs} if keyed else {},
        reuse and env is not None,
        env or {},
        measurement_key(dumped, False, backend),
        measurement_key(dumped, True, backend) if spec.timing.strategy == HALVING else None,
        errors,
        spec.merge.mix_devices,
        spec.tag,
        replay_sweep=spec.kernel.impl == REPLAY,
        replays=replays,
    )
    want.heads = {key_head(key) for key in want.items}
    return want


def judge_block(
    block: TilesweepBlock | None,
    doc_env: dict[str, Any] | None,
    want: Wanted,
    screened: bool,
    replayed: bool,
    count: SourceCount,
) -> str | None:
    """Which counter a record measured by ``block`` (``replayed``: a replayed one) falls in, or
    None when it is compatible."""
    if want.marks_replayed(replayed) and not want.replays:
        return "replayed"
    if block is None:
        return "unknown"
    block_env = block.get("env")
    env = env_fingerprint(block_env) if isinstance(block_env, dict) else doc_env or {}
    spec = block.get("spec")
    dumped: dict[str, Any] = spec if isinstance(spec, dict) else {}
    if not want.mix_devices and other_device(env.get("device_kind"), want):
        count.device_kind = env.get("device_kind")
        return "other_device"
    diff = env_differences(env, want.env, ignore_device=True, impl=impl_of(dumped))
    if diff:
        say(count, f"{WHY_OF['other_env']} ({', '.join(diff)})")
        return "other_env"
    mine = want.screen if screened else want.full
    if mine is None:  # a screen, and this sweep times in full
        return "screened_left"
    if want.marks_replayed(replayed):  # asked: it stands for what its replay replayed, timed here
        key = measurement_key(_replayed_kernel(dumped), screened, want.backend)
    else:
        key = measurement_key(dumped, screened, env.get("backend"))
    if key != mine:
        say(count, f"{WHY_OF['other_measurement']}: {', '.join(measurement_differences(key, mine))}")
        return "other_measurement"
    return None


def _replayed_kernel(dumped: Mapping[str, Any]) -> dict[str, Any]:
    """A replay's spec as the measured sweep it stands for: ``kernel.impl`` the replayed kernel."""
    kernel = dumped.get("kernel")
    replay = dumped.get("replay")
    impl = replay.get("impl") if isinstance(replay, Mapping) else None
    if not isinstance(kernel, Mapping) or not isinstance(impl, str):
        return dict(dumped)
    return {**dumped, "kernel": {**kernel, "impl": impl}}


def other_device(kind: Any, want: Wanted) -> bool:
    """Whether ``kind`` is a device kind other than this sweep's (unknown ones are not)."""
    return kind is not None and want.env.get("device_kind") is not None and kind != want.env["device_kind"]


def say(count: SourceCount, text: str) -> None:
    """Add one line on why records were refused (three at most per source)."""
    if text not in count.why and len(count.why) < 3:
        count.why.append(text)


# The records chosen for items, by plan index: (the record, held compactly; its source's path)
Chosen = dict[int, tuple[Mapping[str, Any], str]]


@dataclass
class Judge:
    """The verdict on each record of one source for one sweep: its tilesweep blocks (by unit, and
    the document's own), the environment and device kind it names; verdicts per (block,
    screened, replayed) are made once."""

    want: Wanted
    count: SourceCount
    units: dict[str, TilesweepBlock]
    own: TilesweepBlock | None
    doc_env: dict[str, Any]
    verdicts: dict[tuple[int, bool, bool], str | None] = field(default_factory=dict)

    @property
    def doc_kind(self) -> Any:
        return self.doc_env.get("device_kind")

    def __call__(self, unit: Any, screened: bool, replayed: bool, kind: Any, error: bool) -> str | None:
        """Which counter a record falls in (None: compatible): measured by the unit ``unit``
        (None: no unit), on device ``kind``, an error record or not."""
        block = None if unit is None else self.units.get(unit, self.own)
        vkey = (id(block), screened, replayed)
        verdicts = self.verdicts
        if vkey in verdicts:
            why = verdicts[vkey]
        else:
            why = verdicts[vkey] = judge_block(block, self.doc_env, self.want, screened, replayed, self.count)
        want = self.want
        if why is None and kind != self.doc_kind and not want.mix_devices and other_device(kind, want):
            why = "other_device"  # carried into a document of mixed devices
            self.count.device_kind = kind
        if why is None and error and not want.errors:
            why = "errors_left"
        return why

    def refuse(self, why: str) -> None:
        setattr(self.count, why, getattr(self.count, why) + 1)


def rank(rec: Mapping[str, Any]) -> int:
    """Of two compatible records of an item, the higher rank wins (ties: the earlier source)."""
    screened, error = flags_of(rec)
    return (0 if screened else 2) + (0 if error else 1)


def offer(chosen: Chosen, want: Wanted, index: int, body: Mapping[str, Any], path: str) -> None:
    """Take ``body`` for the item at ``index`` unless a record of it already taken ranks as high
    (counted as superseded by ``find_reuse``); an item carried is not priced."""
    prev = chosen.get(index)
    if prev is not None and rank(prev[0]) >= rank(body):
        return
    want.priced.pop(index, None)  # let go of its record
    chosen[index] = (body, path)
