"""Which configs of a sweep pre-flight lowering (``plan --lower``) lowers, and where the others
stand: the one rule ``plan --lower`` lowers by and the notes of ``plan``, ``run`` and ``submit``
speak by.

A config is lowered once, and only where its verdict can still prune something: not where it has
a verdict already (``store.lowering``), nor where no worker will measure it (invalid, pruned,
reused: carried from an earlier document), nor where a worker recorded it already (measured, or
errored: a GPU compiled it, or tried to). A screen, carried or recorded here, is lowered: a
halving round 2 may time it in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import TilesweepError
from orchestrator.planning import RUN, Verdicts, WorkItem, prunes_by_lowering
from orchestrator.spec.model import SweepSpec
from orchestrator.store.carried import ORIGIN as REUSE_ORIGIN
from orchestrator.store.lowering import Verdict, read_verdicts
from orchestrator.store.partials import read_partial
from orchestrator.store.sweepdir import SWEEP_FILE, SweepDir


@dataclass
class ToLower:
    """The configs ``plan --lower`` lowers (``todo``) and how many of the rest it leaves out, why."""

    todo: list[WorkItem]
    settled: int  # invalid, pruned (by the model or by lowering), or lowered before
    reused: int  # carried from earlier documents: never measured
    recorded: int  # with a record of this sweep's workers already (measured or errored)


def to_lower(items: list[WorkItem], before: set[str], reused: set[str], recorded: set[str]) -> ToLower:
    """What of ``items`` to lower: the runnable ones without a verdict (``before``) that a worker
    will measure (not ``reused``) and has not recorded yet (not ``recorded``)."""
    runnable = [it for it in items if it.kind == RUN and it.id not in before]
    measured = [it for it in runnable if it.id not in reused]
    todo = [it for it in measured if it.id not in recorded]
    return ToLower(todo, len(items) - len(runnable), len(runnable) - len(measured), len(measured) - len(todo))


def recorded_ids(root: Path, sweep: str) -> set[str]:
    """The ids of the items the workers of the sweep ``sweep`` recorded in the sweep directory
    ``root`` (none where it is no sweep directory yet): every record of its partials under its
    own headers, a measurement or an error, but the reuse unit's (carried, never measured here)
    and a screen (halving's round 2, or a screened search's next, may time it in full)."""
    if not (Path(root) / SWEEP_FILE).is_file() or not (Path(root) / "units.json").is_file():
        return set()
    sd = SweepDir(root)
    out: set[str] = set()
    for entry in sd.unit_index():
        if entry.get("origin") == REUSE_ORIGIN:
            continue
        content = read_partial(sd.partial_path(entry["id"]), warn=False)
        if all(h.get("sweep") == sweep for h in content.headers):
            out.update(i for i, (_, rec) in content.records.items() if rec.get("screened") is not True)
    return out


def verdicts_of(spec: SweepSpec, items: list[WorkItem], root: Path, reused: set[str], command: str) -> Verdicts | None:
    """Where the ``items`` of the sweep directory ``root`` stand with pre-flight lowering, for the
    plan's notes (``planning.notes``): what its verdicts say of them, and how many ``command``
    (its ``plan --lower``) would lower. None where the spec's configs are not pruned by lowering."""
    if not prunes_by_lowering(spec):
        return None
    verdicts = read_verdicts(root, spec.fingerprint(), spec.kernel.target.name)
    said = [verdicts[it.id] for it in items if it.id in verdicts]
    left = to_lower(items, set(verdicts), reused, recorded_ids(root, spec.fingerprint()))
    return Verdicts(
        lowered=_count(said, "lowered"),
        refused=_count(said, "refused"),
        crashed=_count(said, "crashed"),
        unlowered=len(left.todo),
        command=command,
    )


def sweep_verdicts(sd: SweepDir, spec_file: str | Path) -> Verdicts | None:
    """``verdicts_of`` a sweep directory as its items and reuse unit are (``spec_file``: the spec
    the command was given, for the ``plan --lower`` the note names)."""
    from orchestrator import PROG, word
    from orchestrator.store.carried import carried_ids

    if not prunes_by_lowering(sd.spec):
        return None
    command = f"{PROG} plan {word(spec_file)} --lower --sweep-dir {word(sd.root)}"
    return verdicts_of(sd.spec, sd.items(), sd.root, carried_ids(sd), command)


def lowered_already(spec: SweepSpec, root: Path) -> str | None:
    """What the verdicts of the sweep directory ``root`` of ``spec`` say ("DIR/lowering.jsonl: 2
    lower, 1 refused") where ``plan --lower`` has nothing left to lower there, for a refusal to run
    it here; None where it has, or ``root`` is no planned sweep of ``spec``."""
    if not (root / SWEEP_FILE).is_file():
        return None
    try:
        sd = SweepDir.open(root)
    except TilesweepError:  # the command that goes on says what is wrong with it
        return None
    verdicts = sweep_verdicts(sd, "SPEC") if sd.spec.same_sweep(spec) else None
    if verdicts is None or verdicts.unlowered or not (verdicts.lowered + verdicts.refused + verdicts.crashed):
        return None
    said = f"{verdicts.lowered} lower, {verdicts.refused} refused" + (
        f", {verdicts.crashed} crashed" if verdicts.crashed else ""
    )
    return f"{root / 'lowering.jsonl'}: {said}"


def _count(verdicts: list[Verdict], kind: str) -> int:
    return sum(v.verdict == kind for v in verdicts)
