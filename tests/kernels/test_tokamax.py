"""tokamax's flash-attention ops from tilesweep's side, on a CPU, against the installed tokamax
itself: the names tilesweep gives their configs, the search spaces it enumerates for a named GPU,
tokamax's refusals of a config in one line, and lowering for a named GPU (with the Mosaic GPU
compiler's own shared-memory refusal).
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from kernels import devices, standin
from kernels import tokamax_meta as meta

tokamax = pytest.importorskip("tokamax", reason=meta.missing("tests of tokamax's kernels"))

from kernels import tokamax_ops as ops  # noqa: E402  (needs tokamax)

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

H100, H200, B200 = (devices.get(k) for k in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200"))
# The reference config's shapes at seq 2048 (tokamax's lists are the same at 8192: the note)
REFERENCE = [meta.Problem(batch=4, seq=2048, heads=8, head_dim=d, dtype="bfloat16") for d in (64, 128)]


def test_config_fields_and_table_names_are_tokamaxs() -> None:
    for k in meta.KERNELS.values():
        op = ops.stock_op(k.impl)
        assert (tokamax.snake_case_name(op), tokamax.snake_case_name(op.vjp)) == (k.stem, k.vjp_stem)
        for half, classes in (("fwd", k.fwd), ("vjp", k.vjp)):
            for fam, c in classes.items():
                cls = ops.config_class(k.impl, half, fam)
                assert tuple(f.name for f in dataclasses.fields(cls)) == c.fields, (k.impl, half, fam)


def _tokamax_list(impl: str, half: str, p: meta.Problem, device: devices.DeviceKind, residuals: bool) -> set[str]:
    """tokamax's own autotuning configs of one op, asked directly (the standin device, no tilesweep code between)."""
    op = ops.stock_op(impl)
    q, k = ops.shapes(p)
    with standin.default_device(device.name, device.arch, device.cores):
        ba = op.bind(q, k, k, return_residuals=residuals)
        if half == "vjp":
            ba = op.vjp.bind(
                **op.replace(config=op._get_heuristics_config(ba)).bind(q, k, k, return_residuals=True).vjp_arg_spec
            )
        return {repr(c) for c in ba.autotuning_configs}


@pytest.mark.parametrize("device", [H100, H200], ids=["H100", "H200"])
def test_search_space_is_tokamaxs_own_per_problem(device: devices.DeviceKind) -> None:
    counts = {}
    for p in REFERENCE:
        for impl in meta.KERNELS:
            fwd = ops.search_space(impl, "fwd", p, device)
            both = ops.search_space(impl, "fwd_bwd", p, device)
            fwd_cls = ops.config_class(impl, "fwd", "sm90")
            vjp_cls = ops.config_class(impl, "vjp", "sm90")
            assert {repr(fwd_cls(**f)) for f in fwd} == _tokamax_list(impl, "fwd", p, device, False)
            halves = [meta.split(impl, "fwd_bwd", f) for f in both]
            assert {repr(fwd_cls(**f)) for f, _ in halves} == _tokamax_list(impl, "fwd", p, device, True)
            assert {repr(vjp_cls(**v)) for _, v in halves} == _tokamax_list(impl, "vjp", p, device, True)
            assert len({repr(sorted(f.items())) for f in both}) == len(both)  # each pair once
            counts[impl, p.seq, p.head_dim] = (len(fwd), len(both))
    assert counts["tokamax-mosaic", 2048, 64] == (31, 31 + 16 - 1)
    assert counts["tokamax-mosaic", 2048, 128] == (17, 17 + 16 - 1)
    assert counts["tokamax-triton", 2048, 128] == (256, 256 + 201 - 1)


def test_b200_takes_tokamaxs_sm100_configs() -> None:
    space = ops.search_space("tokamax-mosaic", "fwd", REFERENCE[1], B200)
    assert tuple(space[0]) == meta.KERNELS["tokamax-mosaic"].fields("fwd", "sm100") and len(space) == 86


def test_a_refused_config_is_tokamaxs_message_in_one_line() -> None:
    assert ops.refusal("tokamax-mosaic", "fwd", {"block_q": 96}) == "block_q: Input should be a multiple of 64"
    unknown = ops.refusal("tokamax-mosaic", "fwd", {"block_x": 64})
    assert unknown is not None and unknown.startswith(
        "block_x is not a field of tokamax's pallas_mosaic_gpu_kernel_sm90"
    )
    assert "its fields: block_q, block_kv, num_stages, fold_q_sequence_heads, split_k, persistent" in unknown
    bwd = {"block_q": 64, "block_k": 64, "num_stages": 2, "num_warps": 4}
    bwd |= {"vjp_block_m1": 32, "vjp_block_n1": 32, "vjp_block_m2": 32, "vjp_block_n2": 32}
    bwd |= {"vjp_num_stages": 0, "vjp_num_warps": 3}
    assert ops.refusal("tokamax-triton", "fwd_bwd", bwd) == (
        "vjp_num_stages: Input should be greater than 0; vjp_num_warps: Value error, Integer is not a power of two: 3"
    )
    assert ops.refusal("tokamax-triton", "fwd_bwd", {**bwd, "vjp_num_stages": 1, "vjp_num_warps": 4}) is None


def test_lowering_for_a_named_gpu_and_the_compilers_shared_memory_refusal() -> None:
    p = REFERENCE[1]  # S2048 D128
    space = ops.search_space("tokamax-mosaic", "fwd", p, H200)
    text = ops.lower("tokamax-mosaic", "fwd", space[0], p, H200).as_text()
    assert text.count("mosaic_gpu_v2") == 1 and standin.active() is None
    big = {**space[0], "vjp_block_q_dkv": 128, "vjp_block_kv_dkv": 128, "vjp_block_q_dq": 128, "vjp_block_kv_dq": 128}
    big |= {"vjp_num_stages": 2, "vjp_compute_wgs": 2}
    with pytest.raises(ValueError, match="exceeds available shared memory") as refused:
        ops.lower("tokamax-mosaic", "fwd_bwd", big, p, H200)
    found = re.search(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)", str(refused.value))
    assert found is not None and int(found.group(1)) > int(found.group(2)) == devices.SM90_SMEM_LIMIT_BYTES


def test_a_shape_of_tokamaxs_shipped_h100_tables_is_run_as_their_winner() -> None:
    shipped = meta.Problem(batch=8, seq=2048, heads=32, head_dim=64, dtype="bfloat16")  # bench/gpu_tokamax.py's
    for impl in meta.KERNELS:
        for mode in ("fwd", "fwd_bwd"):
            assert ops.in_tables(impl, mode, shipped, H100) and not ops.in_tables(impl, mode, REFERENCE[0], H100)
            winner = ops.chosen(impl, mode, shipped, H100)
            assert winner != ops.chosen(impl, mode, shipped, H200)  # no H200 table: its heuristics
