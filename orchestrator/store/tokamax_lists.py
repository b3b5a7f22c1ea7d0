"""The configs a ``"grid": "tokamax"`` sweep planned per problem, kept in its sweep directory
(``tokamax-grid.json``, written at plan time, before any unit).

tokamax's lists come from tokamax itself (``planning.tokamax_grid``): asking it costs an import
of tokamax and jax (~10 s) and an enumeration per problem (~30 s on a B200 for one mode). Every
process that re-expands the plan (a worker on its node, ``status``, ``merge``, ``resume``, the
final-merge job) reads the planner's lists here instead, so it needs neither tokamax nor the
time, and a node whose tokamax would list other configs still runs the items that were planned.
A sweep directory without the file (planned before it was written) asks tokamax, as the planner did.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kernels import tokamax_meta as meta
from orchestrator.errors import SweepDirError
from orchestrator.planning import tokamax_grid
from orchestrator.spec.grid import TOKAMAX_GRID
from orchestrator.spec.model import SweepSpec
from orchestrator.store.filekinds import holds_file
from orchestrator.store.files import atomic_write_json, read_json

FILE = "tokamax-grid.json"


def write(root: Path, spec: SweepSpec) -> None:
    """Keep the spec's planned lists in the sweep directory ``root`` (nothing for another grid)."""
    if spec.grid != TOKAMAX_GRID:
        return
    lists = [
        {"mode": mode, "problem": dataclasses.asdict(p), "configs": [list(c) for c in configs]}
        for (mode, p), configs in tokamax_grid.planned(spec).items()
    ]
    data = {"tokamax": meta.version(), "impl": spec.measured_impl, "device_kind": spec.kernel.target.name}
    atomic_write_json(root / FILE, {**data, "lists": lists}, indent=None)


def load(root: Path, spec: SweepSpec) -> None:
    """Make the lists kept in ``root`` this process's answer for the spec's problems
    (``tokamax_grid.remember``); nothing where there are none. SweepDirError naming the file
    where it is damaged or of another sweep."""
    path = root / FILE
    if spec.grid != TOKAMAX_GRID or not holds_file(path):
        return
    data = read_json(path, "tokamax's planned configs")
    want = {"impl": spec.measured_impl, "device_kind": spec.kernel.target.name}
    try:
        if {k: data[k] for k in want} != want:
            raise SweepDirError(
                f"{path} holds tokamax's configs of another sweep ({data['impl']} on "
                f"{data['device_kind']}); the sweep directory is damaged: plan it anew"
            )
        lists = {(e["mode"], meta.Problem(**e["problem"])): [tuple(c) for c in e["configs"]] for e in data["lists"]}
    except (KeyError, TypeError, AttributeError) as exc:
        raise SweepDirError(f"{path} is damaged ({type(exc).__name__}: {exc}); plan the sweep anew") from None
    tokamax_grid.remember(spec, lists)


def planned_by(root: Path, spec: SweepSpec) -> str:
    """Who planned a sweep whose units name items this process does not expand to: another
    tilesweep version, or, for a ``"tokamax"`` grid whose lists were not kept, another tokamax
    (its lists are tokamax's own)."""
    if spec.grid == TOKAMAX_GRID and not (root / FILE).is_file():
        return (
            f'another tilesweep version, or another tokamax than this one ({meta.version()}): the "tokamax" '
            "grid's configs are its own list; run it with the planner's tokamax"
        )
    return "another tilesweep version"
