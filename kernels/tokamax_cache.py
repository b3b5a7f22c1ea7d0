"""tokamax's autotuning tables, written and read through tokamax itself.

``texts`` writes the tables of one device kind in tokamax's cache format, each key made by
tokamax's own key function (the op bound for the problem: ``kernels.tokamax_ops.bound``) and
each value a ``BenchmarkData`` (``AutotuningResult.dump_cache_str``, one file per op).

tokamax reads tables from its package data only (``<site-packages>/tokamax/data/autotuning/
<device dir>/<op>.json``) and logs a damaged file, then reads it as empty. So tilesweep checks a
table with tokamax's own parser first (``check``: one line naming the file), and offers two ways
to put a folder of tables in front of tokamax in a process:

- ``overlay(folder)``: tokamax's public ``AutotuningResult`` context manager, one per device
  kind and op, entered together: inside it every tokamax call of those shapes runs the table's
  winner (it takes the device kind's own name, which tilesweep knows for ``kernels.devices``'
  kinds only: another kind's folder is left out, said in a warning);
- ``install(folder)``: the folder read after tokamax's own tables (its entries win), for the rest
  of the process. tokamax has no public way to add a folder: this replaces the cache object
  tokamax keeps per op (``tokamax._src.ops.op._AUTOTUNING_CACHE``), a private name of tokamax 0.0.17.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kernels import devices, tokamax_ops
from kernels import tokamax_meta as meta

log = logging.getLogger(__name__)


def _stand_in(device_kind: str, fam: str) -> devices.DeviceKind:
    """The device kind to bind problems under: the known one, else one of the config family's arch."""
    known = devices.KINDS.get(device_kind)
    if known is not None:
        return known
    arch = (10, 0) if fam == "sm100" else (9, 0)
    return devices.DeviceKind(device_kind, arch, 132, devices.SM90_SMEM_LIMIT_BYTES, "a stand-in for binding only")


def _tokamax() -> Any:
    import tokamax
    from tokamax._src import benchmarking
    from tokamax._src.autotuning import autotuner

    return tokamax, benchmarking, autotuner


def _data(entry: meta.KeyEntry, fam: str) -> Any:
    """tokamax's ``AutotuningData`` of one key: config object -> ``BenchmarkData``."""
    _, benchmarking, autotuner = _tokamax()
    out = {}
    for m in entry.configs:
        config = tokamax_ops._checked(entry.impl, entry.half, fam, m.fields)
        out[config] = benchmarking.BenchmarkData(
            compile_time_ms=float(m.compile_time_ms),
            lower_time_ms=float(m.lower_time_ms),
            evaluation_times_ms=tuple(float(t) for t in m.evaluation_times_ms),
            metadata=dict(m.metadata),
            peak_memory_mb=None,
        )
    return autotuner.AutotuningData(out)


def texts(device_kind: str, entries: Iterable[meta.KeyEntry]) -> dict[str, str]:
    """File name (``<op>.json``) -> its text in tokamax's cache format, for one device kind."""
    tokamax, _, _ = _tokamax()
    per_stem: dict[str, list[tuple[Any, Any]]] = {}
    for e in entries:
        k = meta.kernel(e.impl)
        fam = k.family_of(e.configs[0].fields) if e.half == "fwd" else _vjp_family(k, e.configs[0].fields)
        ba = tokamax_ops.bound(e.impl, e.half, e.problem, _stand_in(device_kind, fam), residuals=e.residuals)
        per_stem.setdefault(e.stem, []).append((ba, _data(e, fam)))
    return {
        stem + ".json": tokamax.AutotuningResult(device_kind, tuple(d)).dump_cache_str() for stem, d in per_stem.items()
    }


def _vjp_family(k: meta.Kernel, fields: dict[str, Any]) -> str:
    return next((fam for fam, c in k.vjp.items() if set(c.fields) == set(fields)), "sm90")


# ---------------------------------------------------------------------------- reading


def _op_of(path: Path) -> Any:
    """tokamax's op whose table ``path`` is named as, as a call binds it: the forward op with its
    vjp op attached, or the vjp op (tokamax's overlays key on that op; its caches on the op
    without its vjp)."""
    found = meta.by_stem(path.stem)
    if found is None:
        names = ", ".join(f"{k.stem}.json, {k.vjp_stem}.json" for k in meta.KERNELS.values())
        raise ValueError(f"{path}: not named as a table of tokamax's attention ops ({names})")
    kernel, half = found
    op = tokamax_ops.stock_op(kernel.impl)
    return op if half == "fwd" else op.vjp


def check(path: str | Path) -> dict[Any, Any]:
    """The table at ``path`` parsed by tokamax's own cache parser (key -> ``AutotuningData``), or
    ValueError in one line naming the file (where tokamax would log it and read nothing)."""
    from tokamax._src.autotuning import cache

    p = Path(path)
    op = _op_of(p).replace(vjp=None)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        parsed: dict[Any, Any] = cache._get_cache_adapter(op).validate_json(text)
    except Exception as exc:  # pydantic's ValidationError, whatever tokamax's parser refuses
        raise ValueError(
            f"{p}: damaged tokamax autotuning table ({tokamax_ops.one_line(exc, whole='the file')[:300]})"
        ) from None
    return parsed


def _found(folder: str | Path) -> list[Path]:
    """Every table file of tokamax's attention ops under ``folder`` (``<device dir>/<op>.json``),
    unchecked; ValueError in one line where ``folder`` is not a folder of them (a typo would
    otherwise leave tokamax untuned without a word)."""
    where = "the folder `tilesweep export DOC --format tokamax --out DIR` wrote"
    folder = Path(folder)
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        if folder.is_file() and meta.by_stem(folder.stem) is not None:
            what = f"is one of tokamax's tables (give {folder.parent.parent}, the folder above its device kind's)"
        raise ValueError(f"{folder} {what}: give {where}")
    found = sorted(p for p in folder.glob("*/*.json") if meta.by_stem(p.stem) is not None)
    held = sorted(p.name for p in folder.glob("*.json") if meta.by_stem(p.stem) is not None)
    if not found and held:  # a device kind's folder: tokamax's tables are found one folder below DIR
        raise ValueError(
            f"{folder} is one device kind's folder (it holds {held[0]}): give {folder.parent}, the folder above it, "
            f"{where}"
        )
    if not found:
        raise ValueError(f"{folder} holds no tokamax table (<device dir>/<op>.json): give {where}")
    return found


def tables(folder: str | Path) -> list[Path]:
    """Every table file of tokamax's attention ops under ``folder``, checked (``check``)."""
    found = _found(folder)
    for p in found:
        check(p)
    return found


def _known_dirs() -> str:
    return ", ".join(f"{meta.device_dir(n)} ({n})" for n in devices.KINDS)


def device_kind_of(device_dir: str) -> str | None:
    """The jax device kind whose tables tokamax keeps in ``device_dir``, of the kinds
    ``kernels.devices`` knows (None for another: a folder's name, lower case, does not give
    back the kind's own)."""
    return next((name for name in devices.KINDS if meta.device_dir(name) == device_dir), None)


def _of_known_kinds(folder: str | Path) -> list[tuple[Path, str]]:
    """(table, its device kind) of the tables under ``folder`` in the folders of kinds tilesweep
    knows, checked. One warning names the folders of other kinds, left out; ValueError in one
    line where no folder is of a kind it knows."""
    kinds = {p: device_kind_of(p.parent.name) for p in _found(folder)}
    other = sorted({str(p.parent) for p, kind in kinds.items() if kind is None})
    known = [(p, kind) for p, kind in kinds.items() if kind is not None]
    if not known:
        raise ValueError(
            f"{folder} has no folder of a device kind tilesweep knows ({', '.join(other)}): tokamax's overlay "
            f"needs the kind's own name; known: {_known_dirs()}"
        )
    if other:
        log.warning(
            "left out the tokamax tables in %s: no device kind tilesweep knows keeps its tables there, and tokamax's "
            "overlay needs the kind's own name (known: %s)",
            ", ".join(other),
            _known_dirs(),
        )
    for p, _ in known:
        check(p)
    return known


@contextlib.contextmanager
def overlay(folder: str | Path) -> Iterator[None]:
    """Inside the block tokamax looks up the tables under ``folder`` first (module docstring),
    those of the device kinds ``kernels.devices`` knows (another's folder is left out, said)."""
    tokamax, _, _ = _tokamax()
    with contextlib.ExitStack() as stack:
        for p, kind in _of_known_kinds(folder):
            op = _op_of(p)
            data = tuple((op.bind(**dict(key)), value) for key, value in check(p).items())
            stack.enter_context(tokamax.AutotuningResult(kind, data))
        yield


def install(folder: str | Path) -> list[Path]:
    """For the rest of the process tokamax reads the tables under ``folder`` after its own (module
    docstring: a private name of tokamax); returns the tables it found."""
    from tokamax._src.autotuning import cache
    from tokamax._src.ops import op as op_lib

    found = tables(folder)
    for p in found:
        op = _op_of(p).replace(vjp=None)
        op_lib._AUTOTUNING_CACHE[op] = cache.AutotuningCache(op, paths=[cache.CACHE_PATH, str(Path(folder).resolve())])
    return found


def uninstall() -> None:
    """Forget what ``install`` put in front of tokamax's tables (tokamax reloads its own on next use)."""
    from tokamax._src.ops import op as op_lib

    for impl in meta.KERNELS:
        op = tokamax_ops.stock_op(impl)
        for o in (op.replace(vjp=None), op.vjp.replace(vjp=None)):
            op_lib._AUTOTUNING_CACHE.pop(o, None)
