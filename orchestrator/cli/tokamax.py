"""``tilesweep export DOC... --format tokamax --out DIR``: tokamax's autotuning tables of the
documents' tokamax records (``orchestrator.analysis.tokamax_export`` chooses them,
``kernels.tokamax_cache`` writes them through tokamax), one folder per device kind. Nothing is
written unless every device kind's tables could be made, and the tables are written together:
each into a temp file first, none replacing what is there until all are on disk, so a write that
fails (a full disk) leaves every table as it was, and its line names them all.

A table there already keeps its other problems; a problem it holds that the export writes too is
replaced whole (``tokamax_meta.merged``), and where that drops configs it measured which the
export does not hold, the table before is kept beside it as ``<op>.json.prev`` (tokamax reads
``<op>.json`` only). Each file's line says what became of the table there.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from kernels import devices
from kernels import tokamax_meta as meta
from kernels.spelling import as_json
from orchestrator.analysis import tokamax_export
from orchestrator.analysis.combine import combine, describe
from orchestrator.analysis.devices import kinds
from orchestrator.cli.common import PROG, counted
from orchestrator.cli.outputs import check_output, is_tokamax_table, write_failed
from orchestrator.errors import TilesweepError
from orchestrator.store.document import ResultsDoc
from orchestrator.store.files import atomic_open, write_advice
from orchestrator.store.target import prev_path


def _tables(chosen: tokamax_export.Chosen) -> dict[str, str]:
    """File name -> text of one device kind's tables, made by tokamax."""
    try:
        from kernels import tokamax_cache

        return tokamax_cache.texts(chosen.device_kind, chosen.entries)
    except meta.TokamaxMissing as exc:
        raise TilesweepError(str(exc)) from None
    except ImportError:
        raise TilesweepError(meta.missing("export --format tokamax")) from None
    except ValueError as exc:  # a record's config that tokamax's config classes refuse
        raise TilesweepError(f"a record cannot be written as tokamax's config: {exc}") from None


def _chosen(
    docs: list[ResultsDoc], device: str | None, keep_slower: bool, include_replays: bool = False
) -> list[tokamax_export.Chosen]:
    held, names = kinds(docs), ", ".join(d.name for d in docs)
    if device is not None and device not in held:
        raise TilesweepError(
            f"--device {as_json(device)}: no record of {names} was measured on it; they hold "
            f"{', '.join(map(as_json, held)) or 'no named device kind'}"
        )
    wanted = [device] if device is not None else held
    if not wanted:
        raise TilesweepError(f"{names}: no record names its device kind; pass --device KIND")
    out = []
    for kind in wanted:
        if len(docs) > 1 or device is not None:  # the newest record per identity, as the tuned table takes them
            doc, combined = combine(docs, kind, include_replays=include_replays)
            if device is None:  # every kind gets its own folder: none is dropped
                combined = replace(combined, other_device=Counter(), other_kinds=set())
            print(describe(combined, len(docs), UNNAMED))
            survivors = combined.survivors
        else:
            doc, survivors = tokamax_export.of_kind(docs[0], kind), None
        out.append(tokamax_export.choose(doc, kind, keep_slower=keep_slower, survivors=survivors))
    if not any(c.entries or c.auto_won for c in out):
        if any(c.untimed for c in out):
            raise TilesweepError(
                f"{names}: nothing to write as tokamax's tables: the configs of "
                f"{counted(sum(c.untimed for c in out), 'problem')} are {UNTIMED}"
            )
        impls = sorted({i for c in out for i in c.other_impls})
        found = f"its records are of kernel.impl {', '.join(impls)}" if impls else "it holds no timed forced record"
        raise TilesweepError(
            f"{names}: nothing to write as tokamax's tables: {found}; --format tokamax writes the records of "
            f"kernel.impl {' and '.join(meta.KERNELS)} (tokamax's kernels) only"
        )
    return out


def refuse_kind_folder(given: str) -> None:
    """Refuse an ``--out`` that is one device kind's folder of tables (it holds one of tokamax's
    attention tables, or is named as tokamax names a kind's folder, as ``data/autotuning/nvidia_h200``):
    the export makes that folder itself, so its tables would go one folder too deep, where tokamax
    and ``kernels.tokamax_cache`` never look."""
    out = Path(given)
    held = sorted(p.name for p in out.glob("*.json") if meta.by_stem(p.stem)) if out.is_dir() else []
    if not held and out.name not in {meta.device_dir(kind) for kind in devices.KINDS}:
        return
    what = f"it holds {held[0]}" if held else f"{out.name} is how tokamax names one"
    raise TilesweepError(
        f"--out {given} is a device kind's folder of tokamax's tables ({what}); the export makes that folder "
        f"itself (DIR/<device dir>/<op>.json, where tokamax reads them): pass --out {out.parent}"
    )


# records that name no device kind (``combine.describe``): tokamax files its tables by device kind
UNNAMED = "tokamax files its tables by device kind: name the GPU as device_kind in the device block to export them"

# a halving sweep's problems whose configs are not all timed in full yet (``Chosen.untimed``)
UNTIMED = "not all timed in full yet, so their best is not known (resume their sweep to time them, then export again)"


def _say_left_out(c: tokamax_export.Chosen) -> None:
    """One line per kind of record of a device kind that goes into no table."""
    left = ", ".join(f"{n} of kernel.impl {impl}" for impl, n in sorted(c.other_impls.items()))
    if left:
        print(f"{c.device_kind}: left out {left} (not tokamax's kernels: tokamax has no table for them)")
    if c.auto_won:
        every = "every problem" if not c.entries else counted(c.auto_won, "problem")
        print(
            f"{c.device_kind}: left {every} to tokamax's own choice (auto), which was faster than every measured "
            "config (--keep-slower writes them anyway)"
        )
    if c.untimed and c.entries:
        print(f"{c.device_kind}: left out {counted(c.untimed, 'problem')} whose configs are {UNTIMED}")
    if not c.entries:
        what = "" if c.auto_won else "no timed record of tokamax's kernels to hand it; "
        print(f"{c.device_kind}: {what}no tables written for it")


def _say_searching(docs: list[ResultsDoc], made: list[tuple[tokamax_export.Chosen, dict[str, str]]]) -> None:
    """A note where tables are written for a search that has not ended: they hold the configs it
    measured so far, of which tokamax runs the fastest, and its next rounds may measure faster ones."""
    from orchestrator.analysis.coverage import searching_of

    n = sum(1 for d in docs for problem in searching_of(d) if problem[-1] in meta.IMPL_NAMES)
    if n and made:
        print(
            f"{PROG}: note: the search of {counted(n, 'problem')} has not ended: the tables hold the configs it "
            "measured so far, and its next rounds may measure faster ones (resume its sweep, then export again)",
            file=sys.stderr,
        )


def export_tokamax(
    docs: list[ResultsDoc], out: str, device: str | None, *, keep_slower: bool = False, include_replays: bool = False
) -> int:
    """Write the tables; one line per file written, one per device kind whose records were left out
    (``include_replays``: documents combined keep their replayed records, as one alone does)."""
    chosen = _chosen(docs, device, keep_slower, include_replays)
    made = [(c, _tables(c)) for c in chosen if c.entries]
    targets = {  # each file refused before any is written where it is not one of tokamax's tables
        (c.device_kind, name): check_output(
            str(Path(out) / meta.device_dir(c.device_kind) / name),
            [],
            writes="tokamax table",
            flag="--out",
            of_kind=is_tokamax_table,
        )
        for c, texts in made
        for name in texts
    }
    for c in chosen:
        _say_left_out(c)
    _say_searching(docs, made)
    writes = {key: _over(Path(target), _made_text(made, key)) for key, target in targets.items()}
    _write_together([(Path(targets[key]), text, before) for key, (text, before, _) in writes.items()])
    for c, texts in made:
        folder = Path(out) / meta.device_dir(c.device_kind)
        for name in texts:
            entries = [e for e in c.entries if e.stem + ".json" == name]
            configs = sum(len(e.configs) for e in entries)
            shapes = f"{counted(len(entries), 'shape')}, {counted(configs, 'config')}"
            done = _said(writes[c.device_kind, name][2], prev_path(folder / name).name)
            print(f"wrote {folder / name}: {shapes} of {c.device_kind}{done}")
    return 0


def _write_together(files: list[tuple[Path, str, str | None]]) -> None:
    """Every table (target, text, and the table before where it is kept as ``.prev``) written
    into a temp file beside it, flushed and synced, before any replaces what is there: a write
    that fails (a full disk) leaves every table there as it was, and no ``.prev`` that would
    refuse the export run again. tokamax ranks a fwd_bwd problem's forward configs beside its
    vjp's best, so a forward table without the vjp table of the same export is no answer."""
    if not files:  # every problem left to tokamax's own choice: no table to write
        return
    failed = files[0][0]
    try:
        with contextlib.ExitStack() as stack:
            for target, text, before in files:
                failed = target
                target.parent.mkdir(parents=True, exist_ok=True)
                kept = [(prev_path(target), before)] if before is not None else []
                for path, body in [*kept, (target, text)]:
                    fh = stack.enter_context(atomic_open(path))
                    fh.write(body)
                    fh.flush()
                    os.fsync(fh.fileno())  # a full disk says so here, before any file is replaced
    except OSError as exc:
        raise TilesweepError(_not_written(failed, [t for t, _, _ in files], exc)) from None


def _not_written(failed: Path, targets: list[Path], exc: OSError) -> str:
    """The line of an export none of whose tables was written: the one that could not be, the
    others not written with it, and what to do before it runs again."""
    others = [str(t) for t in targets if t != failed]
    if not others:
        return write_failed(str(failed), "tokamax's table", exc)
    either = f"{', '.join(others)} {'is' if len(others) == 1 else 'are'} not written either"
    return (
        f"{failed}: cannot write tokamax's table ({exc.strerror or exc}), so {either} (an export writes its "
        f"tables together or none; those there are as they were): {write_advice(exc)}, then export again"
    )


def _made_text(made: list[tuple[tokamax_export.Chosen, dict[str, str]]], key: tuple[str, str]) -> str:
    """The text made for the table of ``key`` (device kind, file name)."""
    return next(texts[key[1]] for c, texts in made if c.device_kind == key[0])


def _over(target: Path, text: str) -> tuple[str, str | None, meta.Merged]:
    """What goes into ``target``: the text written over the table there (its other problems kept),
    the table before where that drops configs it measured (kept as ``.prev``), and what became of
    it. Refused in one line, before any file is written, where a ``.prev`` keeps an earlier table."""
    if not target.exists():
        return text, None, meta.Merged()
    before = target.read_text(errors="replace")
    text, done = meta.merged(before, text)
    if not done.dropped:
        return text, None, done
    prev = prev_path(target)
    if prev.exists():
        raise TilesweepError(
            f"{target}: this export replaces {counted(done.replaced, 'shape')} of it, dropping "
            f"{counted(done.dropped, 'config')} it did not measure, and {prev.name} there already keeps an earlier "
            f"table: nothing written; move {prev} away and export again"
        )
    return text, before, done


def _said(done: meta.Merged, prev: str) -> str:
    """What became of the table there, as the file's line ends: its shapes replaced, the same or
    changed (with the configs that dropped, kept in ``prev``), its other shapes kept."""
    out = ""
    if done.replaced:
        changed = done.replaced - done.same
        how = "the same as before" if not changed else "with other configs or timings"
        if done.same and changed:
            how = f"{done.same} the same as before, {changed} with other configs or timings"
        if done.dropped:
            dropped = counted(done.dropped, "config")
            how += f", dropping {dropped} this export did not measure; the table before is kept as {prev}"
        out += f"; replaced {counted(done.replaced, 'shape')} the table held ({how})"
    if done.kept:
        out += f"; kept {counted(done.kept, 'other shape')} the table held"
    return out
