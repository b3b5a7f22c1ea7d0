"""kernels.tuned names dtypes by the kernel's own rule (kernels.smem.dtype_name).

The loading and lookup rules are tested with the exporter in tests/test_export.py; this file
checks only what the shared dtype rule decides for a lookup.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from kernels.tuned import TunedTable, TunedTableError, config_for

CONFIG = {"block_q": 64, "block_k": 64, "bwd_outer": 64, "bwd_inner": 32, "num_warps": 4, "num_stages": 2}


def _table(*dtypes: str, head_dim: int = 64) -> TunedTable:
    entries: list[dict[str, Any]] = [
        {
            "dtype": d,
            "head_dim": head_dim,
            "seq": 1024,
            "batch": 1,
            "heads": 2,
            "mode": "fwd",
            "config": CONFIG,
            "median_ms": 1.0,
            "auto_ms": 1.5,
        }
        for d in dtypes
    ]
    return TunedTable.from_obj({"format": "tilesweep-tuned", "version": 1, "device": {}, "entries": entries})


def test_dtype_given_any_way_the_kernel_accepts_finds_the_entry() -> None:
    table = _table("bfloat16", "float32")
    for dtype in ("float32", np.float32, np.dtype("float32"), jnp.float32, jnp.zeros(1).dtype):
        assert table.lookup(dtype=dtype, head_dim=64, seq=1024, mode="fwd") == CONFIG, dtype
    assert table.lookup(dtype=jnp.bfloat16, head_dim=64, seq=1024, mode="fwd") == CONFIG


def test_dtype_the_kernel_does_not_run_means_auto() -> None:
    """A call in a dtype the kernel does not run has no tuned config; a hand-written entry for
    one is refused at load (the kernel would refuse float64), and a dtype name no library
    knows is a typo, not a quiet "use auto"."""
    table = _table("float32")
    for dtype in ("float64", np.float64, "int8"):
        assert table.lookup(dtype=dtype, head_dim=64, seq=1024, mode="fwd") is None, dtype
    with pytest.raises(TunedTableError, match=r'entries\[0\]: dtype="float64" is not one of "bfloat16"'):
        _table("float64")
    with pytest.raises(ValueError, match='dtype="fp32" is not a dtype name'):
        table.lookup(dtype="fp32", head_dim=64, seq=1024, mode="fwd")


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"causal": "false"}, 'causal="false" must be true or false'),  # bool("false") is True
        ({"causal": 0}, "causal=0 must be true or false"),
        ({"dtype": None}, "dtype=null is not a dtype"),
        ({"dtype": 123}, "dtype=123 is not a dtype"),
        ({"seq": np.int64(0)}, "seq=0 must be a positive integer"),  # numpy's number as the number it is
        ({"heads": 2, "kv_heads": 3}, "kv_heads=3 does not divide heads=2"),
    ],
)
def test_a_lookup_argument_no_call_could_mean_is_an_error_not_a_quiet_answer(kwargs: dict[str, Any], said: str) -> None:
    table = _table("float32")
    call = {"dtype": "float32", "head_dim": 64, "seq": 1024, "mode": "fwd", **kwargs}
    for ask in (table.lookup, table.config_for):
        with pytest.raises(ValueError, match=re.escape(said)):
            ask(**call)


def test_config_for_and_mha_kwargs_refuse_another_implementation_than_theirs() -> None:
    table = _table("float32")
    call = {"dtype": "float32", "head_dim": 64, "seq": 1024, "mode": "fwd"}
    with pytest.raises(ValueError, match='config_for answers for impl="tilesweep", not impl="jax"'):
        table.config_for(**call, impl="jax")
    with pytest.raises(ValueError, match='mha_kwargs answers for impl="jax", not impl="mosaic"'):
        table.mha_kwargs(**call, impl="mosaic")
    assert table.config_for(**call, impl="tilesweep") is not None


@pytest.mark.parametrize("head_dim", [7, 1024])
def test_an_entry_of_a_head_dim_no_kernel_runs_is_refused_at_load(head_dim: int) -> None:
    with pytest.raises(TunedTableError, match=f"head_dim={head_dim} is not one the kernels run"):
        _table("float32", head_dim=head_dim)


def test_stock_kernel_answer_is_ready_to_pass_to_mha() -> None:
    """A table entry measured with ``kernel.impl: "jax"`` becomes ``mha``'s keyword arguments,
    and ``mha`` runs with them (interpret mode) to the reference's numbers."""
    from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha

    from kernels.attention import attention_reference, make_inputs, rel_err

    cfg = {"block_q": 64, "block_k": 32, "bwd_outer": 32, "bwd_inner": 32, "num_warps": 4, "num_stages": 3}
    entry = {
        "impl": "jax",
        "dtype": "float16",
        "head_dim": 96,
        "seq": 128,
        "batch": 1,
        "heads": 2,
        "causal": True,
        "kv_heads": 2,
        "mode": "fwd",
        "config": cfg,
        "median_ms": 1.0,
        "auto_ms": 1.5,
    }
    table = TunedTable.from_obj({"format": "tilesweep-tuned", "version": 2, "device": {}, "entries": [entry]})
    kw = table.mha_kwargs(dtype="float16", head_dim=96, seq=128, mode="fwd", causal=True)
    assert kw is not None and isinstance(kw["block_sizes"], BlockSizes)
    assert table.config_for(dtype="float16", head_dim=96, seq=128, mode="fwd", causal=True) is None  # ours: none
    q, k, v, _ = make_inputs(batch=1, seq=128, heads=2, head_dim=96, dtype="float16")
    out = mha(q, k, v, None, causal=True, sm_scale=96**-0.5, interpret=True, **kw)
    assert rel_err([out], [attention_reference(q, k, v, causal=True)]) < 2e-3


def _entry(**over: Any) -> dict[str, Any]:
    base = {"dtype": "bfloat16", "head_dim": 64, "seq": 2048, "batch": 4, "heads": 8, "mode": "fwd"}
    return {**base, "config": CONFIG, "median_ms": 1.0, "auto_ms": 1.5, **over}


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([_entry(config={**CONFIG, "block_q": 48})], r"entries\[0\]: config.block_q=48 is not a value the tilesweep"),
        ([_entry(mode="bwd")], r'entries\[0\]: mode="bwd" is not one of "fwd", "fwd_bwd"'),
        ([_entry(dtype="int8")], r'entries\[0\]: dtype="int8" is not one of'),
        ([_entry(), _entry(config={**CONFIG, "block_k": 32})], r"entries\[1\] is for the same problem as entries\[0\]"),
        ([_entry(seq=1000)], r"entries\[0\]: config .* is not one the tilesweep kernel runs at seq=1000"),
        ([_entry(heads=4, kv_heads=3)], r"entries\[0\]: kv_heads=3 does not divide heads=4"),
        ([_entry(median_ms=-1)], r"entries\[0\]: median_ms=-1 must be a positive number"),
    ],
)
def test_an_entry_no_export_writes_and_no_kernel_takes_is_refused_naming_it(
    entries: list[dict[str, Any]], fragment: str
) -> None:
    with pytest.raises(TunedTableError, match=fragment):
        TunedTable.from_obj({"format": "tilesweep-tuned", "version": 1, "device": {}, "entries": entries})


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [
        ("num_stages", 99, "num_stages must be at least 1 and at most 8"),
        ("num_warps", 64, "num_warps must be a power of two and at least 1 and at most 32"),
        ("block_q", 7, "block_q must be a power of two and at least 16"),
        ("block_k", 8, "block_k must be a power of two and at least 16"),
    ],
)
def test_a_hand_edited_config_past_the_kernels_limits_is_refused_at_load(
    tmp_path: Path, field: str, value: int, limit: str
) -> None:
    """The limits are the kernel's (``kernels.impl_triton``: MAX_STAGES, MAX_WARPS, tl.dot's
    16): a table holding more is refused where it is loaded, naming the file and the entry,
    not handed to the kernel."""
    path = tmp_path / "tuned.json"
    entry = _entry(config={**CONFIG, field: value})
    path.write_text(json.dumps({"format": "tilesweep-tuned", "version": 1, "device": {}, "entries": [entry]}))
    with pytest.raises(ValueError) as err:
        config_for(path, dtype="bfloat16", head_dim=64, seq=2048, mode="fwd")
    assert str(err.value).startswith(f"{path}: entries[0]: config.{field}={value} is not a value the tilesweep kernel")
    assert limit in str(err.value)


@pytest.mark.parametrize(
    ("what", "said"),
    [
        ({"device": {}, "config": {}, "results": []}, "is a results document, not a tuned table: `tilesweep export"),
        ({'{"q": "bf16[1,256,2,64]"}': [{"config": {}}]}, "is one of tokamax's tables, not a tuned table"),
        ({"entries": []}, 'not a tilesweep tuned table (want format "tilesweep-tuned")'),
    ],
)
def test_a_file_of_another_kind_loaded_as_a_table_is_named_as_what_it_is(
    tmp_path: Path, what: dict[str, Any], said: str
) -> None:
    """A results document (the export's input) or one of tokamax's tables handed to
    ``TunedTable.load`` is named as what it is, with what reads it or makes the table from it."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(what))
    with pytest.raises(TunedTableError, match=re.escape(f"{path}: ")) as e:
        TunedTable.load(path)
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
    if "export" in said:
        assert f"`tilesweep export {path} --out " in str(e.value), str(e.value)
