"""A tuned table's "use auto" entries of jax's Mosaic GPU kernel: what ``lookup`` answers where
auto won.

jax's ``attention`` has no default config (called without one it raises), so "use auto" is no
call a user's kernel can make: the ``auto`` record ran tilesweep's choice (``kernels.mosaic``:
the first block_kv that lowers within the GPU's shared memory). Export names that config beside
the null ``config``, found by lowering for the document's device kind here, and ``lookup``
answers it; where it cannot be found here, the export says so in one note."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernels import devices, preflight
from kernels.tuned import TunedTable
from orchestrator.store.synthetic import document
from tests.helpers import MOSAIC_SPEC, run_cli

mosaic = pytest.importorskip("kernels.mosaic")
try:
    mosaic.check_available()
except mosaic.MosaicUnavailable as exc:  # scripts/setup-venv.sh installs both
    pytest.skip(f"cannot lower jax's Mosaic GPU kernel here: {exc}", allow_module_level=True)

SHAPE: dict[str, Any] = {"dtype": "float16", "head_dim": 64, "seq": 256}
SPEC: dict[str, Any] = {**MOSAIC_SPEC, "kernel": {**MOSAIC_SPEC["kernel"], "device_kind": "NVIDIA H100"}}
# what auto runs at float16 d64 s256 on an H100: block_kv 256 lowers within its shared memory
FWD = {"block_q": 64, "block_kv": 256, "max_concurrent_steps": 2, "use_schedule_barrier": True}
BWD = {"compute_wgs_bwd": 2, "block_q_dkv": 64, "block_kv_dkv": 64, "block_q_dq": 64, "block_kv_dq": 64}


def _auto_wins(tmp_path: Path, device_kind: str) -> Path:
    """A mosaic document measured on ``device_kind`` whose auto records beat every forced config."""
    path = tmp_path / "mosaic.json"
    doc = document({**SPEC, "output": str(path)}, seed=3)
    doc["device"]["device_kind"] = device_kind
    fastest = {
        m: min(r["median_ms"] for r in doc["results"] if r["mode"] == m and "median_ms" in r) for m in SPEC["modes"]
    }
    for rec in doc["results"]:
        rec.pop("device", None)
        if rec["config"] == "auto":
            ms = fastest[rec["mode"]] / 2
            rec.update(median_ms=ms, q1_ms=ms, q3_ms=ms, samples_ms=[ms])
    path.write_text(json.dumps(doc))
    return path


def test_lookup_of_a_mosaic_use_auto_entry_answers_the_config_auto_ran(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    r = run_cli("export", str(_auto_wins(tmp_path, "NVIDIA H100")), "--out", str(out))
    assert r.returncode == 0 and "(0 tuned, 2 use auto)" in r.stdout and "note" not in r.stderr, r.stdout + r.stderr
    assert all(e["config"] is None for e in json.loads(out.read_text())["entries"])  # still "use auto"
    table = TunedTable.load(out, check_env=False)
    fwd = table.lookup(impl="mosaic", mode="fwd", **SHAPE)
    fwd_bwd = table.lookup(impl="mosaic", mode="fwd_bwd", **SHAPE)
    assert (fwd, fwd_bwd) == (FWD, {**FWD, **BWD})
    for mode, config in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):  # each a config jax's kernel takes on an H100
        lowered = preflight.lower("mosaic", mode, config, batch=1, heads=2, device=devices.get("NVIDIA H100"), **SHAPE)
        assert lowered and all(isinstance(smem, int) for _, smem in lowered), lowered  # sized: it fits
    assert table.lookup(impl="mosaic", mode="fwd", dtype="float16", head_dim=64, seq=320) is None  # 256 ∤ 320
    doc = tmp_path / "mosaic.json"  # combined with another document, the same answer
    copy = tmp_path / "copy.json"
    copy.write_bytes(doc.read_bytes())
    r = run_cli("export", str(doc), str(copy), "--out", str(out))
    assert r.returncode == 0 and "note" not in r.stderr, r.stdout + r.stderr
    assert TunedTable.load(out, check_env=False).lookup(impl="mosaic", mode="fwd_bwd", **SHAPE) == {**FWD, **BWD}


def test_an_export_that_cannot_lower_mosaics_auto_says_lookup_has_no_config_there_and_why(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    r = run_cli("export", str(_auto_wins(tmp_path, "Some GPU")), "--out", str(out))
    assert r.returncode == 0 and "(0 tuned, 2 use auto)" in r.stdout, r.stdout + r.stderr
    (note,) = r.stderr.splitlines()
    assert note.startswith(
        'tilesweep: note: the "use auto" entry of float16 d64 s256 b1 h2 fwd [mosaic] (and 1 other) '
    )
    assert "TunedTable.lookup has no config there" in note and 'the device kind "Some GPU" is not one' in note, note
    assert note.endswith("--keep-slower exports the best forced config there instead"), note
    assert TunedTable.load(out, check_env=False).lookup(impl="mosaic", mode="fwd", **SHAPE) is None


def test_a_causal_mosaic_entry_answers_jaxs_tuning_config_causal_as_asked(tmp_path: Path) -> None:
    """jax's ``TuningConfig`` holds ``causal`` beside the tiles, default false: built from the
    lookup's fields alone it runs a causal problem's tiles as full attention, without a word.
    ``mosaic_config`` answers the ``TuningConfig`` of the call, ``causal`` as asked."""
    path, out = tmp_path / "causal.json", tmp_path / "tuned.json"
    spec = {**SPEC, "modes": ["fwd"], "causal": [True], "output": str(path)}
    path.write_text(json.dumps(document(spec, seed=5)))
    assert run_cli("export", str(path), "--out", str(out)).returncode == 0
    table = TunedTable.load(out, check_env=False)
    fields = table.lookup(impl="mosaic", mode="fwd", causal=True, **SHAPE)
    cfg = table.mosaic_config(mode="fwd", causal=True, **SHAPE)
    assert fields is not None and cfg is not None and cfg.causal is True
    assert {k: getattr(cfg, k) for k in fields} == fields
    assert table.mosaic_config(mode="fwd", causal=False, **SHAPE) is None  # no entry of that problem
    with pytest.raises(ValueError, match='mosaic_config answers for impl="mosaic"'):
        table.mosaic_config(impl="jax", mode="fwd", causal=True, **SHAPE)
