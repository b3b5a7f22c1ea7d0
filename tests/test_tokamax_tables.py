"""tokamax's autotuning tables read without tokamax (``store.tokamax_table``): as records that
price a plan (``--costs``) and seed a search, a damaged table named in one line; and the tokamax
version in the environment part of reuse's key, for tokamax's kernels only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from kernels import tokamax_meta as meta
from orchestrator.errors import ResultsError
from orchestrator.spec.compat import env_differences, env_fingerprint
from orchestrator.store import document
from tests.helpers import assert_one_line_error, run_cli

# what tokamax's Mosaic tables of the fixture's H100 time (bf16, batch 4, 8 heads, head_dim 128, seq 2048)
SPEC: dict[str, Any] = {"dtypes": ["bfloat16"], "head_dims": [128], "seq_lens": [2048], "batch": 4, "heads": 8}
SPEC["kernel"] = {"impl": "tokamax-mosaic", "device_kind": "NVIDIA H100 80GB HBM3"}
MASK = {"bool_mask": None, "causal_mask": None, "q_start": None, "q_end": None, "k_start": None, "k_end": None}


def _key(seq: int, head_dim: int, *, residuals: bool, vjp: bool = False, **over: Any) -> str:
    """A key as tokamax 0.0.17 writes it (bf16, batch 4, 8 heads)."""
    arr = f"bf16[4,{seq},8,{head_dim}]"
    head: dict[str, Any] = {"residuals": [f"f32[4,8,{seq}]"] * 2, "out": arr, "dout": arr} if vjp else {}
    key = {
        **head,
        "q": arr,
        "k": arr,
        "v": arr,
        "precision": [["DEFAULT", "DEFAULT"], ["DEFAULT", "DEFAULT"]],
        "logits_dtype": "float32",
        "logits_scale": 1 / math.sqrt(head_dim),
        "bias": None,
        "logits_soft_cap": None,
        "mask": MASK,
        "dropout_mask": None,
        "dropout_rate": 0.0,
        "paging_info": None,
        "q_indices": None,
        "k_indices": None,
        "normalize_output": True,
        "return_residuals": residuals and not vjp,
    }
    return json.dumps({**key, **over}, separators=(",", ":"))


def _fwd(block_kv: int) -> str:
    cfg = {"block_q": 64, "block_kv": block_kv, "num_stages": 2, "fold_q_sequence_heads": False, "split_k": 1}
    return json.dumps({**cfg, "persistent": False}, separators=(",", ":"))


VJP = json.dumps(
    {"block_q_dkv": 64, "block_kv_dkv": 64, "block_q_dq": 64, "block_kv_dq": 64, "num_stages": 2, "compute_wgs": 2},
    separators=(",", ":"),
)


def _data(times: list[float]) -> dict[str, Any]:
    return {"compile_time_ms": 900.0, "lower_time_ms": 100.0, "evaluation_times_ms": times, "metadata": {}}


@pytest.fixture
def table(tmp_path: Path) -> Path:
    """An H100 Mosaic table: a forward key, a forward-with-residuals key and its vjp key, and a key with a bias."""
    folder = tmp_path / "nvidia_h100_80gb_hbm3"
    folder.mkdir()
    fwd = {
        _key(2048, 128, residuals=False): {_fwd(64): _data([2.0, 2.2, 2.1]), _fwd(128): _data([1.5, 1.4, 1.6])},
        _key(2048, 128, residuals=True): {_fwd(128): _data([1.7, 1.8, 1.6])},
        _key(2048, 128, residuals=False, bias="bf16[4,8,2048,2048]"): {_fwd(64): _data([9.0])},
    }
    vjp = {_key(2048, 128, residuals=True, vjp=True): {VJP: _data([4.0, 4.5, 4.2])}}
    (folder / "pallas_mosaic_gpu_flash_attention.json").write_text(json.dumps(fwd, indent=2))
    (folder / "pallas_mosaic_gpu_flash_attention_vjp.json").write_text(json.dumps(vjp, indent=2))
    return folder / "pallas_mosaic_gpu_flash_attention.json"


def test_a_table_is_records_of_its_kernel(table: Path, caplog: pytest.LogCaptureFixture) -> None:
    doc = document.load(table, tokamax=True)
    fwd = [r for r in doc.results if r["mode"] == "fwd"]
    (both,) = [r for r in doc.results if r["mode"] == "fwd_bwd"]
    assert len(fwd) == 2 and {r["impl"] for r in doc.results} == {"tokamax-mosaic"}
    best = min(fwd, key=lambda r: r["median_ms"])
    assert best["block_kv"] == 128 and best["median_ms"] == 1.5 and best["samples_ms"] == [1.5, 1.4, 1.6]
    assert (best["batch"], best["seq"], best["heads"], best["head_dim"], best["dtype"]) == (4, 2048, 8, 128, "bfloat16")
    assert best["compile_s"] == pytest.approx(1.0) and "causal" not in best and "kv_heads" not in best
    # forward with residuals + vjp: one record of the pair, its times the sum of the two ops'
    assert both["median_ms"] == pytest.approx(1.7 + 4.2) and both["vjp_compute_wgs"] == 2
    assert set(meta.KERNELS["tokamax-mosaic"].fields("fwd_bwd", "sm90")) <= set(both)
    # said: whose times they are, and what was left out; no device kind to take an environment from
    assert "tokamax's own, measured on that GPU" in caplog.text and "1 keys of problems" in caplog.text
    assert "device_kind" not in doc.device and "tilesweep" not in doc.extra
    costs = document.load_costs(table)
    assert len(costs) == 3


def test_a_damaged_table_is_one_line_naming_it(table: Path, tmp_path: Path) -> None:
    text = table.read_text()
    table.write_text(text[: len(text) // 2])
    with pytest.raises(ResultsError, match="damaged tokamax autotuning table: not valid JSON") as e:
        document.load(table, tokamax=True)
    assert str(table) in e.value.message
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"output": str(tmp_path / "out.json"), "dtypes": ["float32"], "head_dims": [64]}))
    r = run_cli("plan", str(spec), "--dry-run", "--costs", str(table))
    assert_one_line_error(r, "--costs", str(table), "damaged tokamax autotuning table")
    table.write_text(json.dumps({_key(2048, 128, residuals=False): {'{"block_x":1}': _data([1.0])}}))
    with pytest.raises(ResultsError, match="does not have the fields of tokamax-mosaic's fwd configs"):
        document.load(table, tokamax=True)


def test_the_tokamax_version_counts_for_tokamax_records_only() -> None:
    base = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "backend": "gpu", "device_kind": "NVIDIA H200"}
    assert env_fingerprint(base) == base  # an environment without tokamax keeps its fingerprint
    old, new = env_fingerprint({**base, "tokamax": "0.0.17"}), env_fingerprint({**base, "tokamax": "0.0.18"})
    assert env_differences(old, new, impl="tokamax-mosaic") == ['tokamax "0.0.17" vs "0.0.18"']
    assert env_differences(old, new, impl="tokamax-triton") == ['tokamax "0.0.17" vs "0.0.18"']
    assert env_differences(old, new, impl="tilesweep") == []
    assert env_differences(old, env_fingerprint(base), impl="tokamax-mosaic") == []  # not installed: not compared


def test_a_vjp_table_without_its_forward_table_says_where_that_is_expected(table: Path, tmp_path: Path) -> None:
    """tokamax times the vjp op alone: its table holds no record without the forward table's times."""
    vjp = table.with_name("pallas_mosaic_gpu_flash_attention_vjp.json")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**SPEC, "output": str(tmp_path / "out.json"), "modes": ["fwd_bwd"]}))
    beside = document.load(vjp, tokamax=True).results  # with the forward table beside it: their pair
    assert [r["median_ms"] for r in beside if r["mode"] == "fwd_bwd"] == [pytest.approx(1.7 + 4.2)]
    table.unlink()
    for option in ("--reuse", "--costs"):
        r = run_cli("plan", str(spec), "--dry-run", option, str(vjp))
        line = assert_one_line_error(r, f"{option} {vjp}", f"forward table, expected beside it at {table}, ")
        assert "is missing" in line and "cannot be used on its own" in line and "times the vjp op alone" in line


def test_a_forward_table_with_residuals_without_its_vjp_table_says_where_that_is_expected(
    table: Path, tmp_path: Path
) -> None:
    """A forward key with residuals is the forward of a fwd_bwd: without the vjp op's times beside
    it, it gives no record. A table of such keys alone is refused in one line; beside plain forward
    keys (read as fwd records), one warning says so."""
    vjp = table.with_name("pallas_mosaic_gpu_flash_attention_vjp.json")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**SPEC, "output": str(tmp_path / "out.json"), "modes": ["fwd", "fwd_bwd"]}))
    vjp.unlink()
    r = run_cli("plan", str(spec), "--dry-run", "--costs", str(table))
    assert r.returncode == 0, r.stderr
    (said,) = [line for line in r.stderr.splitlines() if "with residuals" in line]
    assert f"--costs {table}: its key with residuals (the forward of a fwd_bwd) gives no fwd_bwd record" in said
    assert f"the vjp table, expected beside it at {vjp}, which is missing; put that table there" in said
    only = {k: v for k, v in json.loads(table.read_text()).items() if json.loads(k)["return_residuals"]}
    table.write_text(json.dumps(only))
    for option in ("--reuse", "--costs"):
        r = run_cli("plan", str(spec), "--dry-run", option, str(table))
        line = assert_one_line_error(r, f"{option} {table}: its key with residuals", f"expected beside it at {vjp}, ")
        assert "is missing" in line and "cannot be used on its own" in line and "times the vjp op alone" in line
    # a vjp table beside it that has no key of its problem: said the same way, naming that table
    vjp.write_text(json.dumps({_key(1024, 128, residuals=True, vjp=True): {VJP: _data([4.0])}}))
    with pytest.raises(ResultsError, match="its key with residuals") as e:
        document.load(table, tokamax=True)
    assert f"the vjp table beside it, {vjp}, has no key of its problem" in e.value.message
