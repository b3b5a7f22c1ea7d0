"""A tokamax autotuning table read as a results document, without tokamax: its winners seed a
search's portfolio and its times price a plan (``--costs``, ``--reuse``, ``reuse.documents``).

tokamax keeps one table per device kind and op, ``<device dir>/<op>.json``
(``kernels.tokamax_meta``): ``{KEY: {CONFIG: {compile_time_ms, lower_time_ms,
evaluation_times_ms, metadata, peak_memory_mb}}}``, KEY and CONFIG being JSON objects written as
strings (the bound arguments of one call; one config's fields). Each key of a problem tilesweep
sweeps becomes records of the table's implementation (``tokamax-mosaic``, ``tokamax-triton``):

- a forward key (``return_residuals`` false): one fwd record per config, its median and quartiles
  those of ``evaluation_times_ms`` (kept as ``samples_ms``), ``compile_s`` its lowering and
  compiling;
- a forward key with residuals and the vjp key of the same problem (the op's other file, next to
  it): one fwd_bwd record per pair of their configs, its times the sums of the two ops' (tokamax
  times each op alone, so a vjp table without its forward table beside it gives no record: it is
  refused in one line naming where that table is expected; so is a forward table whose keys all
  return residuals without the vjp table beside it, and keys with residuals beside others say
  in one warning that they give no fwd_bwd record, and where the vjp table is expected).

Keys of problems tilesweep does not sweep (a bias, a soft cap, dropout, paging, other masks or
scales, q and k of different lengths) are counted and left out. ``inner`` is what tilesweep's
default timing would size for that median (``kernels.config.inner_for``), so a plan is priced as
tilesweep would time it.

Its times are tokamax's own, measured on the table's GPU (the folder names it): one warning says
so when a table is read. The document has no tilesweep block, so reuse never takes its records
for measurements (``store.reuse``: no block says how they were measured) and its device block
names no device kind, so no sweep takes its environment from it. tokamax itself logs a damaged
table and reads it as empty; here it is one line naming the file.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernels import tokamax_meta as meta
from kernels.config import inner_for
from kernels.spelling import as_json
from orchestrator.errors import ResultsError
from orchestrator.spec.sections import TimingSettings

log = logging.getLogger(__name__)

TAG = "tokamax"
TIMER = "tokamax"  # the records' timer: tokamax's own benchmark, not tilesweep's
DEFAULT_KEY = {
    "bias": None,
    "logits_soft_cap": None,
    "dropout_mask": None,
    "dropout_rate": 0.0,
    "paging_info": None,
    "q_indices": None,
    "k_indices": None,
    "normalize_output": True,
    "logits_dtype": "float32",
}
DEFAULT_PRECISION = [["DEFAULT", "DEFAULT"], ["DEFAULT", "DEFAULT"]]


def is_table(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is named as tokamax names an attention op's table."""
    p = Path(path)
    return p.suffix == ".json" and meta.by_stem(p.stem) is not None


@dataclass
class _Timed:
    """One config of one key: its fields and what tokamax measured."""

    fields: dict[str, Any]
    samples: list[float]
    compile_s: float


def _damaged(name: str, what: str) -> ResultsError:
    return ResultsError(f"{name}: damaged tokamax autotuning table: {what}")


def _json_object(text: Any, name: str, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise _damaged(name, f"{what} {as_json(str(text)[:80])} is not a JSON object")
    return obj


def _shape(text: Any) -> tuple[str, list[int]] | None:
    """("bfloat16", [4, 2048, 8, 128]) of "bf16[4,2048,8,128]"; None for anything else."""
    if not isinstance(text, str) or not text.endswith("]") or "[" not in text:
        return None
    short, dims = text[:-1].split("[", 1)
    try:
        sizes = [int(d) for d in dims.split(",")]
    except ValueError:
        return None
    dtype = meta.SHORT_DTYPES.get(short)
    return (dtype, sizes) if dtype is not None else None


def _causal(mask: Any) -> bool | None:
    """True or False for the masks tilesweep sweeps (none, or plain causal), else None."""
    if not isinstance(mask, dict) or any(mask.get(k) is not None for k in mask if k != "causal_mask"):
        return None
    causal = mask.get("causal_mask")
    if causal is None:
        return False
    return True if causal == {"offset": 0, "window_size": None} else None


def problem_of(key: Mapping[str, Any]) -> tuple[meta.Problem, bool] | None:
    """(problem, return_residuals) of a key tilesweep can sweep, else None."""
    q, k, v = (_shape(key.get(n)) for n in ("q", "k", "v"))
    if q is None or k is None or k != v or q[0] != k[0] or len(q[1]) != 4 or len(k[1]) != 4:
        return None
    (batch, seq, heads, head_dim), (kb, ks, kv_heads, kd) = q[1], k[1]
    if (kb, ks, kd) != (batch, seq, head_dim) or heads % kv_heads:
        return None
    if any(key.get(n, d) != d for n, d in DEFAULT_KEY.items()) or key.get("precision") != DEFAULT_PRECISION:
        return None
    scale = key.get("logits_scale")
    if not isinstance(scale, (int, float)) or not math.isclose(scale, meta.default_logits_scale(head_dim)):
        return None
    causal = _causal(key.get("mask"))
    if causal is None:
        return None
    kv = None if kv_heads == heads else kv_heads
    problem = meta.Problem(batch, seq, heads, head_dim, q[0], kv_heads=kv, causal=causal)
    return problem, bool(key.get("return_residuals"))


def _timed(config: str, data: Any, kernel: meta.Kernel, half: str, name: str) -> _Timed | None:
    """One config of a key and its times; None for a config that sets a field tilesweep does not sweep."""
    fields = _json_object(config, name, "config")
    classes = [c for c in (kernel.fwd if half == "fwd" else kernel.vjp).values() if set(c.fields) == set(fields)]
    if not classes:
        shown = as_json(config[:80])
        raise _damaged(name, f"config {shown} does not have the fields of {kernel.impl}'s {half} configs")
    if any(fields[f] is not None for f in classes[0].untuned):
        return None
    fields = {f: fields[f] for f in classes[0].tuned}
    times = data.get("evaluation_times_ms") if isinstance(data, dict) else None
    if not isinstance(times, list) or not times or not all(isinstance(t, (int, float)) for t in times):
        raise _damaged(name, f"config {as_json(config[:80])} has no evaluation_times_ms")
    compile_ms = sum(float(data.get(k) or 0.0) for k in ("compile_time_ms", "lower_time_ms"))
    return _Timed(fields, [float(t) for t in times], compile_ms / 1e3)


def read_table(path: Path, name: str) -> tuple[dict[tuple[meta.Problem, bool], list[_Timed]], int]:
    """The keys of one table that tilesweep sweeps, by (problem, return_residuals; True for the vjp's,
    whose forward returns them), and how many keys it left out."""
    found = meta.by_stem(path.stem)
    assert found is not None, path
    kernel, half = found
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ResultsError(f"{name}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _damaged(name, f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise _damaged(name, "the top level is not a JSON object")
    out: dict[tuple[meta.Problem, bool], list[_Timed]] = {}
    skipped = 0
    for key_text, configs in obj.items():
        key = _json_object(key_text, name, "key")
        if not isinstance(configs, dict):
            raise _damaged(name, f"key {as_json(key_text[:80])} does not map configs to measurements")
        timed = [t for c, d in configs.items() if (t := _timed(c, d, kernel, half, name)) is not None]
        bound = problem_of(key)
        if bound is None or not timed:
            skipped += 1
            continue
        problem, residuals = bound
        out.setdefault((problem, residuals or half == "vjp"), []).extend(timed)
    return out, skipped


def _record(
    kernel: meta.Kernel, mode: str, p: meta.Problem, fields: dict[str, Any], parts: list[_Timed]
) -> dict[str, Any]:
    """A record of one config (fwd: one part; fwd_bwd: the forward's and the vjp's)."""
    q1, median, q3 = (sum(float(np.percentile(t.samples, pc)) for t in parts) for pc in (25, 50, 75))
    t = TimingSettings.model_fields
    rec: dict[str, Any] = {"dtype": p.dtype, "head_dim": p.head_dim, "seq": p.seq, "batch": p.batch, "heads": p.heads}
    if p.causal:
        rec["causal"] = True
    if p.kv_heads is not None:
        rec["kv_heads"] = p.kv_heads
    rec.update(tag=TAG, mode=mode, impl=kernel.record_impl(fields), config="forced", **fields)
    rec.update(
        compile_s=sum(part.compile_s for part in parts),
        inner=inner_for(median, target_ms=t["target_ms"].default, max_inner=t["max_inner"].default),
        median_ms=median,
        q1_ms=q1,
        q3_ms=q3,
        timer=TIMER,
    )
    if len(parts) == 1:
        rec["samples_ms"] = parts[0].samples
    return rec


def _records(kernel: meta.Kernel, fwd: dict[Any, list[_Timed]], vjp: dict[Any, list[_Timed]]) -> list[dict[str, Any]]:
    out = []
    for (p, residuals), timed in fwd.items():
        if not residuals:
            out += [_record(kernel, "fwd", p, t.fields, [t]) for t in timed]
            continue
        for v in vjp.get((p, True), []):
            out += [_record(kernel, "fwd_bwd", p, meta.join(f.fields, v.fields), [f, v]) for f in timed]
    return out


def _unpaired(
    fwd: dict[Any, list[_Timed]], vjp: dict[Any, list[_Timed]], records: list[Any], name: str, vjp_path: Path
) -> None:
    """Say what a forward table's keys with residuals (tokamax's forward of a fwd_bwd) lack where
    no vjp key of their problem is beside them: refused in one line where they were all it held
    (it gives no record), else one warning (its fwd records are read)."""
    unpaired = [p for p, residuals in fwd if residuals and (p, True) not in vjp]
    if not unpaired:
        return
    one = len(unpaired) == 1
    keys = f"its {'key' if one else f'{len(unpaired)} keys'} with residuals (the forward of a fwd_bwd)"
    keys += " gives" if one else " give"
    if vjp_path.is_file():
        where = f"the vjp table beside it, {vjp_path}, has no key of {'its problem' if one else 'their problems'}"
        fix = f"autotune the vjp op of {'that problem' if one else 'those problems'} with tokamax into it"
    else:
        where = f"the vjp op's times come from the vjp table, expected beside it at {vjp_path}, which is missing"
        fix = "put that table there (then give either: the other is read with it)"
    if not records:
        raise ResultsError(
            f"{name}: {keys} no record, so it cannot be used on its own: tokamax times the vjp op alone, "
            f"and {where}; {fix}"
        )
    log.warning(
        "%s: %s no fwd_bwd record (its fwd records are read): tokamax times the vjp op alone, and %s; %s",
        name,
        keys,
        where,
        fix,
    )


@dataclass(frozen=True)
class Table:
    """A table as a results document's parts (``store.document`` makes the document)."""

    device: dict[str, Any]
    records: list[dict[str, Any]]
    extra: dict[str, Any]


def read(path: str | os.PathLike[str], name: str) -> Table:
    """The records of the table at ``path`` (and of its op's other table beside it, for fwd_bwd)."""
    path = Path(path)
    found = meta.by_stem(path.stem)
    assert found is not None, path
    kernel, half = found
    other = path.with_name((kernel.vjp_stem if half == "fwd" else kernel.stem) + ".json")
    if half == "vjp" and not other.is_file():
        raise ResultsError(
            f"{name}: a vjp table alone gives no record, so it cannot be used on its own: tokamax times the vjp op "
            "alone, and each fwd_bwd record adds the forward op's times from the forward table, expected beside it "
            f"at {other}, which is missing; put that table there (then give either: the other is read with it)"
        )
    tables = {half: read_table(path, name)}
    if other.is_file():
        tables["vjp" if half == "fwd" else "fwd"] = read_table(other, str(other))
    fwd, skipped_fwd = tables.get("fwd", ({}, 0))
    vjp, skipped_vjp = tables.get("vjp", ({}, 0))
    records = _records(kernel, fwd, vjp)
    if half == "fwd":
        _unpaired(fwd, vjp, records, name, other)
    else:
        _unpaired(fwd, vjp, records, str(other), path)
    impl = str(records[0]["impl"]) if records else kernel.impl  # the family of the table's configs
    device_dir = path.parent.name
    log.warning(
        "%s: read as tokamax's autotuning table of %s for %s (%d records; %d keys of problems tilesweep does not "
        "sweep left out): its times are tokamax's own, measured on that GPU, not by this sweep: they seed a search "
        "and price a plan, and no record of it is reused",
        name,
        impl,
        device_dir,
        len(records),
        skipped_fwd + skipped_vjp,
    )
    extra = {"impl": impl, "device_dir": device_dir, "left_out": skipped_fwd + skipped_vjp}
    return Table(device={"tokamax_table": device_dir}, records=records, extra={"tokamax_table": extra})
