"""The decoder-model example (examples/decoder.json) end to end, at a size the CPU runs.

The example is what a GPU user submits as it is (SLURM, bfloat16, head_dim 128, causal,
32 query heads on 8 key/value heads, seq 2048 and 8192). Here the problem keeps its axes
(dtype, head_dim, causal, a group of 4 query heads per K/V head) and shrinks what only
costs time in interpret mode: seq, heads, the grid, the executor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernels.tuned import TunedTable
from orchestrator.spec.files import load_spec

from .conftest import REPO, run_cli

EXAMPLE = REPO / "examples" / "decoder.json"


def test_the_example_is_a_slurm_sweep_of_the_decoder_problem() -> None:
    spec = load_spec(EXAMPLE)
    assert spec.executor.kind == "slurm" and spec.executor.gpus_per_node == 1
    assert (spec.dtypes, spec.head_dims, spec.seq_lens, spec.causal) == (["bfloat16"], [128], [2048, 8192], [True])
    assert (spec.heads, spec.kv_heads) == (32, [8])


def test_cpu_sized_decoder_example_end_to_end(tmp_path: Path) -> None:
    data = json.loads(EXAMPLE.read_text())
    data.update(
        output=str(tmp_path / "decoder.json"),
        seq_lens=[64],
        heads=8,
        kv_heads=[2],
        repeats=2,
        fwd_block_q=[32],
        fwd_block_k=[64],
        fwd_stages=[2],
        fwd_warps=[4],
        bwd_outer=[64],
        bwd_inner=[32],
        bwd_stages=[2],
        bwd_warps=[4],
        timing={"target_ms": 1, "max_inner": 2, "warmup": 0},
        sharding={"units": 1},
        kernel={**data["kernel"], "interpret": True},
        executor={"kind": "local"},
    )
    spec = tmp_path / "decoder-cpu.json"
    spec.write_text(json.dumps(data))
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "decoder.json").read_text())
    assert doc["config"]["causal"] == [True] and doc["config"]["kv_heads"] == [2]
    results = doc["results"]
    assert [(x["mode"], x["config"]) for x in results] == [
        ("fwd", "auto"),
        ("fwd_bwd", "auto"),
        ("fwd", "forced"),
        ("fwd_bwd", "forced"),
    ]
    for x in results:
        assert list(x)[:8] == ["dtype", "head_dim", "seq", "batch", "heads", "causal", "kv_heads", "tag"]
        assert (x["causal"], x["kv_heads"], x["head_dim"]) == (True, 2, 128)
        assert "error" not in x and x["rel_err"] < 2e-2, x  # bfloat16 against the float32 reference
    header = r.stdout.splitlines()[0].split()
    assert header[5:8] == ["causal", "KV", "mode"]
    # the tuned table answers for the causal grouped-query problem, and only for it
    r = run_cli("export", str(tmp_path / "decoder.json"), "--out", str(tmp_path / "tuned.json"))
    assert r.returncode == 0, r.stderr
    table = TunedTable.load(tmp_path / "tuned.json", check_env=False)
    ask: dict[str, Any] = {
        "dtype": "bfloat16",
        "head_dim": 128,
        "seq": 64,
        "mode": "fwd_bwd",
        "heads": 8,
        "kv_heads": 2,
    }
    assert table.entry(**ask, causal=True) is not None and table.entry(**ask) is None
