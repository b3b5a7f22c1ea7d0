"""export -> kernels.tuned: roundtrip, lookup rule, environment warnings, atomic write."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, TypedDict

import pytest

from kernels.tuned import (
    Environment,
    TunedEntry,
    TunedTable,
    TunedTableError,
    TunedTableMismatchWarning,
    config_for,
)
from orchestrator.analysis import export
from orchestrator.store import document as results_doc
from tests.report_helpers import make_doc, rec, run_handler, write

REPO = Path(__file__).resolve().parent.parent
SAME_ENV = Environment(device_kind="NVIDIA H100", jax_version="0.11.2")


class Query(TypedDict):
    """The keywords of ``TunedTable.lookup`` a test fixes for lookups at several seqs."""

    dtype: str
    head_dim: int
    mode: str


def tuned(t: TunedTable, **query: Any) -> dict[str, int]:
    """The config ``t`` gives for ``query`` (``TunedTable.lookup``'s keywords), where the test expects one."""
    config = t.lookup(**query)
    assert config is not None, f"no tuned config for {query}"
    return config


def picked(t: TunedTable, **query: Any) -> TunedEntry:
    """The entry ``t`` picks for ``query``, where the test expects one."""
    entry = t.entry(**query)
    assert entry is not None, f"no tuned entry for {query}"
    return entry


def export_doc(tmp_path: Path, doc: dict[str, Any], **kw: Any) -> Path:
    table, _ = export.tuned_table(results_doc.from_obj(doc), **kw)
    out = tmp_path / "tuned.json"
    export.write_atomic(out, table)
    return out


def load(path: Path, env: Environment = SAME_ENV) -> TunedTable:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a matching environment must not warn
        return TunedTable.load(path, env=env)


def test_sample_roundtrip(sample_doc: dict[str, Any], tmp_path: Path) -> None:
    table, summary = export.tuned_table(results_doc.from_obj(sample_doc), keep_slower=True)
    out = tmp_path / "tuned.json"
    export.write_atomic(out, table)
    t = load(out)
    assert summary.entries == len(t) == 3 and summary.tuned == 3
    # fwd_bwd: block_q/k come from the record's fwd blocks, bwd tiles as recorded
    bwd = [r for r in sample_doc["results"] if r["mode"] == "fwd_bwd" and r["config"] == "forced" and "error" not in r]
    best = min(bwd, key=lambda r: r["median_ms"])
    cfg = t.lookup(dtype="bfloat16", head_dim=64, seq=2048, mode="fwd_bwd")
    assert cfg == {
        "block_q": best["fwd_block_q"],
        "block_k": best["fwd_block_k"],
        "bwd_outer": best["bwd_outer"],
        "bwd_inner": best["bwd_inner"],
        "num_warps": best["num_warps"],
        "num_stages": best["num_stages"],
    }
    # fwd: bwd tiles stay at 128
    fwd = [
        r
        for r in sample_doc["results"]
        if r["mode"] == "fwd" and r["dtype"] == "float32" and r["config"] == "forced" and "error" not in r
    ]
    best = min(fwd, key=lambda r: r["median_ms"])
    cfg = t.lookup(dtype="float32", head_dim=128, seq=2048, mode="fwd", batch=4, heads=8)
    assert cfg == {
        "block_q": best["block_q"],
        "block_k": best["block_k"],
        "bwd_outer": 128,
        "bwd_inner": 128,
        "num_warps": best["num_warps"],
        "num_stages": best["num_stages"],
    }
    (e,) = [e for e in t.entries if e.dtype == "float32"]
    assert e.median_ms == best["median_ms"]
    assert t.lookup(dtype="float32", head_dim=64, seq=2048, mode="fwd") is None  # never measured


def test_auto_faster_exports_use_auto(tmp_path: Path) -> None:
    records = [
        rec(auto=True, ms=0.9),
        rec(ms=1.0),  # auto wins
        rec(auto=True, ms=2.0, seq=4096),
        rec(ms=1.0, seq=4096),  # tuned wins
        rec(auto=True, ms=2.0, seq=8192),
        rec(ms=None, seq=8192),  # only auto ran
        rec(auto=True, ms=None, seq=512),
        rec(ms=None, seq=512),
    ]  # nothing ran
    table, summary = export.tuned_table(results_doc.from_obj(make_doc(records)))
    assert (summary.entries, summary.tuned, summary.use_auto, summary.skipped) == (3, 1, 2, 1)
    by_seq = {e["seq"]: e for e in table["entries"]}
    assert by_seq[2048]["config"] is None and by_seq[2048]["auto_ms"] == 0.9
    assert by_seq[4096]["config"]["block_q"] == 128
    assert by_seq[8192]["config"] is None and by_seq[8192]["median_ms"] == 2.0  # auto's: what the entry answers
    t = load(export_doc(tmp_path, make_doc(records)))
    assert t.lookup(dtype="bfloat16", head_dim=64, seq=2048, mode="fwd") is None
    assert picked(t, dtype="bfloat16", head_dim=64, seq=2048, mode="fwd").median_ms == 0.9  # not the slower 1.0
    assert t.lookup(dtype="bfloat16", head_dim=64, seq=4096, mode="fwd") is not None
    # the measured "use auto" at 2048 is not overridden by the nearby 4096 entry
    assert picked(t, dtype="bfloat16", head_dim=64, seq=2048, mode="fwd").seq == 2048
    kept, _ = export.tuned_table(results_doc.from_obj(make_doc(records)), keep_slower=True)
    assert {e["seq"]: e for e in kept["entries"]}[2048]["config"] is not None


def _table(tmp_path: Path, entries: list[dict[str, Any]], device: dict[str, Any] | None = None) -> Path:
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {
                "format": "tilesweep-tuned",
                "version": 1,
                "device": device or {"device_kind": "NVIDIA H100", "jax": "0.11.2"},
                "entries": entries,
            }
        )
    )
    return path


def _e(
    seq: int,
    bq: int = 128,
    bk: int = 128,
    mode: str = "fwd",
    batch: int = 4,
    heads: int = 8,
    o: int = 128,
    i: int = 128,
    config: bool = True,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    cfg = (
        {"block_q": bq, "block_k": bk, "bwd_outer": o, "bwd_inner": i, "num_warps": 4, "num_stages": 2}
        if config
        else None
    )
    return {
        "dtype": dtype,
        "head_dim": 64,
        "seq": seq,
        "batch": batch,
        "heads": heads,
        "mode": mode,
        "config": cfg,
        "median_ms": 1.0,
        "auto_ms": 1.1,
    }


def test_nearest_seq_rule(tmp_path: Path) -> None:
    t = load(_table(tmp_path, [_e(1024, bq=64), _e(4096, bq=128, bk=256)]))
    q: Query = {"dtype": "bfloat16", "head_dim": 64, "mode": "fwd"}
    assert tuned(t, seq=1024, **q)["block_q"] == 64  # exact
    assert picked(t, seq=2048, **q).seq == 1024  # log tie -> smaller
    assert t.entry(seq=3000, **q) is None  # 4096 nearest, 256 ∤ 3000
    assert t.lookup(seq=3200, **q) is None  # 4096 nearest, 256 ∤ 3200
    assert tuned(t, seq=6144, **q)["block_k"] == 256  # 4096 nearest, divides
    assert t.lookup(seq=1000, **q) is None  # 1024 nearest, 64 ∤ 1000
    assert tuned(t, seq=512, **q)["block_q"] == 64  # 1024 nearest, divides
    assert t.lookup(seq=2048, dtype="float32", head_dim=64, mode="fwd") is None
    assert t.lookup(seq=2048, dtype="bfloat16", head_dim=128, mode="fwd") is None
    assert t.lookup(seq=2048, dtype="bfloat16", head_dim=64, mode="fwd_bwd") is None


def test_nearest_seq_fwd_bwd_checks_bwd_tiles_and_null_config(tmp_path: Path) -> None:
    t = load(
        _table(tmp_path, [_e(2048, bq=64, bk=64, o=128, i=32, mode="fwd_bwd"), _e(8192, mode="fwd", config=False)])
    )
    assert tuned(t, dtype="bfloat16", head_dim=64, seq=1024, mode="fwd_bwd")["bwd_inner"] == 32
    assert t.lookup(dtype="bfloat16", head_dim=64, seq=1088, mode="fwd_bwd") is None  # 128 ∤ 1088
    assert t.lookup(dtype="bfloat16", head_dim=64, seq=8192, mode="fwd") is None  # "use auto"
    assert t.lookup(dtype="bfloat16", head_dim=64, seq=16384, mode="fwd") is None  # nearest says auto


def test_batch_and_heads_are_soft(tmp_path: Path) -> None:
    t = load(_table(tmp_path, [_e(2048, bq=32, batch=1), _e(2048, bq=64, batch=8, heads=16)]))
    q: Query = {"dtype": "bfloat16", "head_dim": 64, "mode": "fwd"}
    assert tuned(t, seq=2048, **q)["block_q"] == 32  # tie -> smaller batch
    assert tuned(t, seq=2048, batch=8, **q)["block_q"] == 64
    assert tuned(t, seq=2048, heads=16, **q)["block_q"] == 64
    assert tuned(t, seq=2048, batch=2, **q)["block_q"] == 32  # no batch 2: any batch


def test_dtype_objects_accepted(tmp_path: Path) -> None:
    import jax.numpy as jnp
    import numpy as np

    t = load(_table(tmp_path, [_e(2048, dtype="float32"), _e(2048, bq=64)]))
    assert tuned(t, dtype=np.float32, head_dim=64, seq=2048, mode="fwd")["block_q"] == 128
    assert tuned(t, dtype=np.dtype("float32"), head_dim=64, seq=2048, mode="fwd")["block_q"] == 128
    assert tuned(t, dtype=jnp.bfloat16, head_dim=64, seq=2048, mode="fwd")["block_q"] == 64


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        (Environment("NVIDIA A100-SXM4-80GB", "0.11.2"), ['"NVIDIA H100"', '"NVIDIA A100-SXM4-80GB"']),
        (Environment("NVIDIA H100", "0.12.0.1"), ["jax 0.11.2", "running 0.12.0.1"]),
    ],
)
def test_environment_mismatch_warns(tmp_path: Path, env: Environment, fragments: list[str]) -> None:
    path = _table(tmp_path, [_e(2048)])
    with pytest.warns(TunedTableMismatchWarning) as caught:
        t = TunedTable.load(path, env=env)
    msg = str(caught[0].message)
    assert all(f in msg for f in fragments)
    assert t.lookup(dtype="bfloat16", head_dim=64, seq=2048, mode="fwd") is not None  # still loads


def test_environment_check_can_be_skipped(tmp_path: Path) -> None:
    path = _table(tmp_path, [_e(2048)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TunedTable.load(path, env=Environment("other", "0.0"), check_env=False)


def test_default_environment_comes_from_jax(tmp_path: Path) -> None:
    env = Environment.current()
    assert env is not None and env.jax_version and env.device_kind
    import jax

    assert env.jax_version == jax.__version__


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        ({"format": "other"}, "not a tilesweep tuned table"),
        ({"format": "tilesweep-tuned", "version": 99, "device": {}, "entries": []}, "version 99"),
        ({"format": "tilesweep-tuned", "version": 1, "device": {}, "entries": [{"seq": 1}]}, "lacks"),
        (
            {
                "format": "tilesweep-tuned",
                "version": 1,
                "device": {},
                "entries": [{**_e(2048), "config": {"block_q": 64}}],
            },
            "config must be null",
        ),
    ],
)
def test_bad_tuned_table(tmp_path: Path, obj: dict[str, Any], fragment: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(TunedTableError, match=fragment):
        TunedTable.load(path, env=SAME_ENV)
    with pytest.raises(TunedTableError, match="no such file"):
        TunedTable.load(tmp_path / "missing.json", env=SAME_ENV)


def test_config_for_builds_attention_config(tmp_path: Path) -> None:
    from kernels import attention

    path = _table(tmp_path, [_e(2048, bq=64, bk=32)])
    t = load(path)
    cfg = t.config_for(dtype="bfloat16", head_dim=64, seq=2048, mode="fwd")
    assert isinstance(cfg, attention.AttentionConfig)
    assert (cfg.block_q, cfg.block_k, cfg.bwd_outer, cfg.num_warps) == (64, 32, 128, 4)
    assert t.config_for(dtype="bfloat16", head_dim=64, seq=100, mode="fwd") is None
    for wrong, said in (({"seq": 0}, "seq=0 must be a positive integer"), ({"seq": "2048"}, 'seq="2048"')):
        with pytest.raises(ValueError, match=said):
            t.config_for(**{"dtype": "bfloat16", "head_dim": 64, "seq": 2048, "mode": "fwd", **wrong})
    with pytest.raises(ValueError, match="batch=0 must be a positive integer"):
        t.config_for(dtype="bfloat16", head_dim=64, seq=2048, mode="fwd", batch=0)
    with pytest.raises(ValueError, match='mode="fwd-bwd" is not one of "fwd", "fwd_bwd"'):
        t.config_for(dtype="bfloat16", head_dim=64, seq=2048, mode="fwd-bwd")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedTableMismatchWarning)  # the env here is the CPU
        assert config_for(path, dtype="bfloat16", head_dim=64, seq=2048, mode="fwd") == cfg


def test_atomic_write_leaves_no_temp_and_readable_mode(tmp_path: Path) -> None:
    out = export_doc(tmp_path, make_doc([rec(ms=1.0)]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuned.json"]
    assert stat.S_IMODE(os.stat(out).st_mode) & 0o044  # not the 0600 of a bare mkstemp
    before = out.read_text()
    with pytest.raises(TypeError):
        export.write_atomic(out, {"x": object()})  # not serialisable: old file stays whole
    assert out.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuned.json"]


def test_tuned_module_imports_no_orchestrator() -> None:
    code = (
        "import sys, kernels.tuned; "
        "bad = [m for m in sys.modules if m.split('.')[0] == 'orchestrator']; "
        "assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path, make_doc([rec(auto=True, ms=2.0), rec(ms=1.0)]))
    out = tmp_path / "sub" / "tuned.json"
    out.parent.mkdir()
    rc, stdout, _ = run_handler(["export", str(src), "--out", str(out)], capsys)
    assert rc == 0 and "wrote " in stdout and ": 1 entry (1 tuned, 0 use auto)\n" in stdout
    assert tuned(load(out), dtype="bfloat16", head_dim=64, seq=2048, mode="fwd")["block_q"] == 128
    from orchestrator.errors import TilesweepError

    # a missing folder is created, like the merger's output; a path under a file cannot be
    (tmp_path / "a-file").write_text("x")
    rc, _, _ = run_handler(["export", str(src), "--out", str(tmp_path / "newdir" / "t.json")], capsys)
    assert rc == 0 and (tmp_path / "newdir" / "t.json").exists()
    with pytest.raises(TilesweepError, match="a-file is not a directory; name a file in a folder"):
        run_handler(["export", str(src), "--out", str(tmp_path / "a-file" / "t.json")], capsys)


def _sweep_doc(kind: str, jax: str, started: str, unit: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A tilesweep document: its records name their unit, its block when that unit started."""
    for r in records:
        r.update(unit=unit, attempt=1)
    block = {"env": {"jax": jax, "device_kind": kind}, "attempts": {unit: [{"attempt": 1, "started": started}]}}
    return {"device": {"jax": jax, "device_kind": kind}, "config": {"tag": "t"}, "results": records, "tilesweep": block}


def test_export_of_several_documents_keeps_the_newest_record_per_identity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(
        tmp_path,
        _sweep_doc(
            "NVIDIA H100",
            "0.10.0",
            "2026-01-01T00:00:00+00:00",
            "u1",
            [rec(auto=True, ms=2.0), rec(ms=1.0), rec(ms=1.5, block_q=64)],
        ),
        "old.json",
    )
    new = write(
        tmp_path,
        _sweep_doc("NVIDIA H100", "0.11.2", "2026-06-01T00:00:00+00:00", "u2", [rec(ms=1.8), rec(ms=0.9, seq=4096)]),
        "new.json",
    )
    a100 = write(
        tmp_path,
        _sweep_doc(
            "NVIDIA A100",
            "0.5.0",
            "2026-07-01T00:00:00+00:00",
            "u3",
            [rec(ms=0.1), rec(ms=0.1, block_q=64), rec(auto=True, ms=0.1)],
        ),
        "a100.json",
    )
    out = tmp_path / "tuned.json"
    for order in ([old, new, a100], [a100, new, old]):
        rc, stdout, _ = run_handler(["export", *map(str, order), "--device", "NVIDIA H100", "--out", str(out)], capsys)
        assert rc == 0
        assert 'kept the newest of 4 identities of device "NVIDIA H100"' in stdout
        assert f"3 of another device (\"NVIDIA A100\": 3 in {a100}; --device 'NVIDIA A100' picks it)" in stdout
        assert "1 superseded by a record measured with a newer jax" in stdout
        table = load(out)
        # the newer jax measured bq128 slower: bq64 (measured once, by the older jax) is the best
        assert tuned(table, dtype="bfloat16", head_dim=64, seq=2048, mode="fwd")["block_q"] == 64
        entries = json.loads(out.read_text())["entries"]
        assert {(e["seq"], e["median_ms"]) for e in entries} == {(2048, 1.5), (4096, 0.9)}
    from orchestrator.errors import TilesweepError

    with pytest.raises(TilesweepError, match='no record of device "TPU v5"') as refused:
        run_handler(["export", str(old), str(new), "--device", "TPU v5", "--out", str(out)], capsys)
    assert 'they hold "NVIDIA H100"' in refused.value.message  # the kinds to choose from
