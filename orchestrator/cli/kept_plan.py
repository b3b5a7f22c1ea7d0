"""``tilesweep plan SPEC --sweep-dir DIR`` of a sweep directory planned before: the plan it keeps.

A planned sweep directory keeps its units and their ids, read from its index (never planned
again: a unit's id is what its records and jobs name), and its items as pre-flight lowering's
verdicts left them. ``plan`` shows that plan, as text or (``--dry-run --json``) one JSON object
per item, and says on stderr what its lowering said and left, as the plan of a new one does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import counted
from orchestrator.cli.common import print_plan_notes, unit_column, units_kept

if TYPE_CHECKING:
    from orchestrator.planning import WorkItem
    from orchestrator.spec.model import SweepSpec
    from orchestrator.store.sweepdir import SweepDir


def print_kept_plan(args: argparse.Namespace, spec: SweepSpec, root: Path) -> bool:
    """Show the plan the sweep directory ``root`` keeps (``--dry-run`` too, writing nothing; without
    it, the directory is reopened as ``plan`` writes it). One whose plan was interrupted before its
    units were written keeps none: this says False, and the caller plans it as the command line
    asks, as it plans a new one (``--dry-run`` shows that plan)."""
    from orchestrator.cli.reusing import reuse_request
    from orchestrator.control.sweeps import prepare_sweep
    from orchestrator.store.lowering_todo import sweep_verdicts

    sd = _kept(root, spec)
    if sd is None:
        return False
    if not (args.dry_run or args.json):
        sd = prepare_sweep(
            args.spec, args.sweep_dir, args.units, None, costs=args.costs, reuse=reuse_request(args), spec=spec
        ).sd
    units_kept(args.units, sd)
    if args.json:
        _write_json(sd)
    else:
        _print_text(sd)
    print_plan_notes(sd.spec, verdicts=sweep_verdicts(sd, args.spec))  # what its lowering said, and left
    return True


def _kept(root: Path, spec: SweepSpec) -> SweepDir | None:
    """The sweep directory ``root`` planned for ``spec``, writing nothing; None where its plan was
    cut short before its units were written (no unit in its index)."""
    from orchestrator.store.sweepdir import SweepDir

    sd = SweepDir.of_spec(root, spec)
    return sd if sd.unit_index() else None


def _print_text(sd: SweepDir) -> None:
    index = sd.unit_index()
    units = counted(len(index), "unit")
    kinds = plan_kinds(sd.spec, sd.items())
    print(f"{sd.root} was planned before: {counted(sd.planned, 'item')} ({kinds}) in the {units} it was planned with")
    for k, entry in enumerate(index):
        print(f"  unit {k:>3} {entry['id']}: {unit_column(entry['n_items'])}  ({entry['origin']})")


def _write_json(sd: SweepDir) -> None:
    """One object per item of the kept plan, as ``plan --dry-run --json`` prints a new plan's: its
    plan line with its ``unit`` (the position in the unit index of the last unit that holds it,
    the one that runs it now), ``reused_from`` for a carried item (the document that measured it),
    and, where pre-flight lowering prunes the sweep's configs, its verdict (``lowering``, ``null``
    for a config without one), as ``plan --lower --json`` prints it."""
    from orchestrator.planning import plan_line, prunes_by_lowering
    from orchestrator.store.carried import carried_from
    from orchestrator.store.lowering import read_verdicts

    unit_of: dict[int, int] = {}
    for k, entry in enumerate(sd.unit_index()):
        unit_of.update((it.index, k) for it in sd.unit_items(entry["id"]))
    carried = carried_from(sd)
    spec = sd.spec
    verdicts = read_verdicts(sd.root, spec.fingerprint(), spec.kernel.target.name)
    lowering = prunes_by_lowering(spec)
    out = sys.stdout
    for it in sd.items():
        line = plan_line(dataclasses.replace(it, unit=unit_of.get(it.index, -1)))
        if it.id in carried:
            line["reused_from"] = carried[it.id]
        if lowering:
            verdict = verdicts.get(it.id)
            line["lowering"] = None if verdict is None else verdict.line()
        out.write(json.dumps(line) + "\n")


def plan_kinds(spec: SweepSpec, items: list[WorkItem]) -> str:
    """What of a plan's items no worker measures, by why: the shared-memory model (of a kernel that
    has one), invalid at their shape, refused by pre-flight lowering (where it refused any)."""
    from orchestrator.planning import INVALID, PRUNED, prunes_by_lowering
    from orchestrator.store.lowering import REFUSED as LOWERING_REFUSED

    n_invalid = sum(it.kind == INVALID for it in items)
    n_lowered = sum(it.kind == PRUNED and (it.reason or "").startswith(LOWERING_REFUSED) for it in items)
    n_pruned = sum(it.kind == PRUNED for it in items) - n_lowered
    model = "" if prunes_by_lowering(spec) and not n_pruned else f"{n_pruned} pruned by the shared-memory model, "
    return f"{model}{n_invalid} invalid" + (f", {n_lowered} refused by pre-flight lowering" if n_lowered else "")
