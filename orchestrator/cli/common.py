"""What every command family of the CLI shares: the parser class, argument types, the
progress display (``progress``), and the few lines several commands print the same way
(what a finished sweep prints is ``finish``'s)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Protocol

from kernels.spelling import as_json
from orchestrator import PROG, counted
from orchestrator.cli.progress import Progress
from orchestrator.spec.errorkinds import RETRY_KINDS

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from orchestrator.control.reuseplan import ReuseRequest
    from orchestrator.control.rounds import NextRound
    from orchestrator.control.sweeps import PreparedSweep
    from orchestrator.planning import Verdicts
    from orchestrator.spec.model import SweepSpec
    from orchestrator.store.searchrounds import SearchRound
    from orchestrator.store.sweepdir import SweepDir


class Subparsers(Protocol):
    """What ``add_subparsers()`` returns, as the command families use it (argparse names no
    public type for it, and its private one differs with the parser class)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


__all__ = [
    "OVERWRITE_HELP",
    "PROG",
    "Parser",
    "Progress",
    "RETRY_HELP",
    "RETRY_KINDS",
    "Subparsers",
    "non_negative_int",
    "positive_int",
    "print_plan_notes",
    "round_note",
    "search_plan_line",
    "seconds",
    "warn",
]


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """As argparse's, but a word that is none of the choices (a command, ``--executor``) is said in
        JSON's quotes, with the choice it is closest to: ``unknown "stauts" (did you mean status?)``."""
        if action.choices is not None and value not in action.choices:
            import difflib

            from kernels.spelling import as_json

            names = [str(c) for c in action.choices]
            close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise argparse.ArgumentError(action, f"unknown {as_json(value)}{hint}; choose from {', '.join(names)}")
        super()._check_value(action, value)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse's, but words a command does not take are the command's error, pointing
        at its own help (argparse leaves them to the top parser)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command_parser(getattr(parsed, "command", None))
            (command or self).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _command_parser(self, name: object) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and isinstance(name, str):
                return action.choices.get(name)
        return None


def positive_int(value: str) -> int:
    """argparse type of counts (--units, --workers, --max-array-size); argparse names the flag."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {as_json(value)}")
    return n


def non_negative_int(value: str) -> int:
    """argparse type of caps where 0 means none (--max-plots)."""
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, got {as_json(value)}")
    return n


def seconds(value: str) -> float:
    """argparse type of durations (--interval, --timeout): a positive number of seconds, at
    most ``MAX_SECONDS`` (``nan``, ``inf`` and a number past what a sleep takes are refused)."""
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {as_json(value)}") from None
    if not 0 < v <= MAX_SECONDS:  # False for nan too
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds above 0 and at most {MAX_SECONDS:.0f}, got {as_json(value)}"
        )
    return v


MAX_SECONDS = 1e7  # about 115 days


def folder_path(value: str) -> str:
    """argparse type of a folder to use (``--sweep-dir``): not "" (which would mean the default)."""
    if not value.strip():
        raise argparse.ArgumentTypeError(
            f"{as_json(value)} names no folder; name one, or leave the option out for the default"
        )
    return value


def names_no_file(path: str) -> bool:
    """Whether a path given for a file to write names none: empty, or a folder's (ending in a slash)."""
    return not path.strip() or path.endswith(("/", os.sep))


def file_path(value: str) -> str:
    """argparse type of a file to write (``--output``): a path that names a file (``names_no_file``)."""
    if names_no_file(value):
        raise argparse.ArgumentTypeError(f"{as_json(value)} names no file; name the results document to write")
    return value


def items_in_units(items: int, units: int) -> str:
    """ "3 items in 2 units", plural where it is."""
    return f"{counted(items, 'item')} in {counted(units, 'unit')}"


def unit_column(items: int) -> str:
    """A unit's items in the plan's table: "    1 item ", "   12 items", columns kept."""
    return f"{items:>5} item{'s' if items != 1 else ' '}"


def units_capped(asked: int | None, made: int) -> None:
    """Say where a plan made fewer units than ``--units`` (or ``sharding.units``) asked for: a
    unit holds at least one item to measure (none made: nothing to measure, as the plan says)."""
    if asked is not None and 0 < made < asked:
        warn(f"note: {counted(asked, 'unit')} asked for, {made} made: a unit holds at least one item to measure")


def prepare_run(args: argparse.Namespace, root: Path, kind: str, reuse: ReuseRequest) -> PreparedSweep:
    """The sweep ``run`` runs (``control.sweeps.prepare_sweep``), made or reopened with what the
    command was given: its spec, ``--units``, ``--output``, ``--costs``, ``reuse``
    (``reusing.reuse_request``), ``--overwrite``."""
    from orchestrator.control.sweeps import prepare_sweep

    prepared = prepare_sweep(
        args.spec,
        str(root),
        args.units,
        args.output,
        costs=args.costs,
        reuse=reuse,
        kind=kind,
        overwrite=args.overwrite,
    )
    if prepared.existed:
        units_kept(args.units, prepared.sd)
    wait_for_lowering(prepared.sd.root, "submitted" if kind == "slurm" else "run")
    return prepared


def wait_for_lowering(
    root: Path, started: str, say: Callable[[str], None] | None = None, *, units: str = "unit"
) -> None:
    """Wait while a ``plan --lower`` of ``root`` runs, saying so once (``say``: a line above a
    progress bar; default ``warn``): a unit ``started`` here ("run", "submitted") before its
    verdicts are all written could compile configs it refuses (``units``: which units, as said)."""
    from orchestrator.store.leases import wait_for_lowering as wait

    holders: list[str] = []

    def waiting(holder: str) -> None:
        holders.append(holder)
        (say or warn)(
            f"waiting for the `plan --lower` of {root} ({holder}) to end, so that no {units} {started} here "
            "compiles a config it refuses"
        )

    try:
        wait(root, waiting)
    except KeyboardInterrupt:
        if not holders:
            raise
        raise KeyboardInterrupt(
            f"no {units} was {started}; the `plan --lower` of {root} goes on: rerun this command once it ends"
        ) from None


def units_kept(asked: int | None, sd: SweepDir) -> None:
    """Say where ``--units`` asked for another count than the units a sweep directory was
    planned with, which it keeps (their ids name its records and jobs); none where its plan
    measures nothing."""
    planned = planned_units(sd)
    if asked is not None and planned and asked != planned:
        warn(
            f"note: --units {asked} is not used: {sd.root} keeps the {counted(planned, 'unit')} it was planned "
            "with (plan into a new --sweep-dir for other units)"
        )


def planned_units(sd: SweepDir) -> int:
    """The units the sweep's plan made (not those of reuse, a resume or a later round)."""
    return sum(entry.get("origin") == "plan" for entry in sd.unit_index())


def warn(text: str) -> None:
    """``tilesweep: TEXT`` on stderr (TEXT starts with "warning:", "note:", or says what failed)."""
    print(f"{PROG}: {text}", file=sys.stderr)


def print_plan_notes(
    spec: SweepSpec, *, lowering: bool = False, verdicts: Verdicts | None = None, command: str | None = None
) -> None:
    """Say once what the plan does differently from the spec's lists because of the kernel
    implementation (a tunable it ignores is swept at the one value it runs), a search
    section that does nothing (no ``timing.strategy: search``), a search's screen that
    keeps every config it screens (``timing.keep`` at or above ``search.per_round``), a halving
    screen that does (``timing.keep`` at or above the grid), a strategy
    with no forced config to choose from (``auto_only``), and screen settings where nothing screens.
    ``lowering``: for ``plan --lower``, which lowers what the plan holds (``planning.notes``);
    ``verdicts``: what pre-flight lowering of the sweep directory said already
    (``store.lowering_todo``), for a kernel pruned by lowering."""
    from orchestrator.planning import notes
    from orchestrator.planning.grids import LOWER_COMMAND
    from orchestrator.planning.halving import keeps_all
    from orchestrator.planning.search import idle_settings, screen_keeps_all

    said = notes(spec, lowering=lowering, verdicts=verdicts, command=command or LOWER_COMMAND)
    idle = [idle_settings(spec), screen_keeps_all(spec), keeps_all(spec), _nothing_to_choose(spec), _idle_screen(spec)]
    for line in [*said, *filter(None, idle)]:
        warn(f"note: {line}")


def _idle_screen(spec: SweepSpec) -> str | None:
    """The note a spec gets that sets the screen's timing fields (screen_ms, keep, noise) off their
    defaults where nothing screens: timing.strategy full, or a search without search.screen (the
    values, not the keys written: a results document's spec holds every key)."""
    fields = type(spec.timing).model_fields
    given = [f"timing.{k}" for k in ("screen_ms", "keep", "noise") if getattr(spec.timing, k) != fields[k].default]
    strategy = spec.timing.strategy
    if not given or strategy == "halving" or (strategy == "search" and spec.search.screen):
        return None
    fix = '"search": {"screen": true}' if strategy == "search" else '"timing": {"strategy": "halving"}'
    what = " and ".join(given)
    return (
        f"{what} {'is' if len(given) == 1 else 'are'} the screen's, but nothing screens with timing.strategy "
        f"{as_json(strategy)}{' and no search.screen' if strategy == 'search' else ''}: "
        f"{'it does' if len(given) == 1 else 'they do'} nothing; set {fix} to screen"
    )


def _nothing_to_choose(spec: SweepSpec) -> str | None:
    """The note a spec gets that times each problem's auto alone (``auto_only``) with a strategy
    that chooses among forced configs (halving, search): it has none to choose from."""
    if not spec.auto_only or spec.timing.strategy == "full":
        return None
    return (
        f"auto_only: true times each problem's auto config alone, in full, so timing.strategy "
        f'{as_json(spec.timing.strategy)} has no forced config to choose from and runs as "full" does; set '
        "auto_only to false to tune the grid, or drop timing.strategy"
    )


def round_note(nxt: NextRound) -> str:
    """What a round that was just planned does, in one line: halving's round 2 (the survivors of
    the screen, timed in full) or a search's round (its configs, or that the search ended)."""
    s = nxt.summary
    kind = s.get("kind")
    if kind is None:
        return (
            f"round {nxt.number}: {s['survivors']} of {counted(s['screened'], 'screened config')} can still win; "
            f"timing {'it' if s['survivors'] == 1 else 'them'} in full in {counted(len(nxt.units), 'unit')}"
        )
    if kind == "end":
        return (
            f"the search ended after {counted(s['search_round'], 'round')}: no problem has a config left worth "
            "measuring"
        )
    items = sum(len(u.items) for u in nxt.units)
    if kind == "survivors":
        what = f"{counted(items, 'survivor')} of its screen, timed in full"
    else:
        what = f"{counted(items, 'config')} not measured before"
    n = s["searching"]
    of_search = s.get("search_round", nxt.number)  # with search.screen, two rounds of units per round of the search
    which = f" (round {of_search} of the search: {'its survivors' if kind == 'survivors' else 'its screen'})"
    return (
        f"round {nxt.number}{which if of_search != nxt.number else ''}: {n} problem{'s' if n != 1 else ''} "
        f"still search{'' if n != 1 else 'es'}: {what}, in {counted(len(nxt.units), 'unit')}"
    )


def search_plan_line(record: SearchRound, size: int, unrun: int) -> str:
    """What round 1 of a search measures, where its configs came from, and the ``unrun``
    configs it records without a run (pruned or invalid), so that its counts add up to ``size``."""
    problems = record["problems"]
    portfolio = sum(p.get("portfolio", 0) for p in problems)
    filling = sum(p.get("space_filling", 0) for p in problems)
    carried = sum(p.get("carried", 0) for p in problems)
    plural = "s" if len(problems) != 1 else ""
    unrun_said = f", and {counted(unrun, 'config')} pruned or invalid, recorded without a run" if unrun else ""
    return (
        f"search: round 1 records {size} items: per problem auto and its design (over {len(problems)} problem{plural}: "
        f"{portfolio} configs from the portfolio, {filling} space-filling, {carried} carried){unrun_said}; each later "
        "round, planned once the one before is done, measures the winners of other problems and the grid neighbours "
        "of each problem's leaders"
    )


RETRY_HELP = (
    "also redo the error records of this kind: crashed (WorkerCrashed), timeout (WorkerTimeout), or all "
    "(every error of a config that was compiled or run; not pruned or invalid ones); the new records "
    "supersede them"
)
# what the --help of every file or folder tilesweep writes says of one whose folders do not exist yet
MAKES_FOLDERS = "missing folders are made"
OVERWRITE_HELP = (
    "replace the output even if it holds records that are not this sweep's (the old document is kept as OUTPUT.prev)"
)
