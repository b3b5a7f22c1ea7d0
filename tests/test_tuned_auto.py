"""A tuned table's "use auto" entries: what ``config_for`` answers where auto won.

Our kernel called with ``config=None`` runs ``AttentionConfig()``, not the config its ``auto``
record ran (``kernels.config.auto_config``: shrunk to fit shared memory, the backward's warps);
so export names auto's config beside a null ``config`` and ``config_for`` answers it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from kernels.tuned import Environment, TunedTable, TunedTableError
from tests.report_helpers import make_doc, rec, run_handler, write

SAME_ENV = Environment(device_kind="NVIDIA H100", jax_version="0.11.2")


def load(path: Path) -> TunedTable:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a matching environment must not warn
        return TunedTable.load(path, env=SAME_ENV)


def _table(tmp_path: Path, entries: list[dict[str, Any]]) -> Path:
    path = tmp_path / "t.json"
    table = {"format": "tilesweep-tuned", "version": 2, "device": {"device_kind": "NVIDIA H100", "jax": "0.11.2"}}
    path.write_text(json.dumps({**table, "entries": entries}))
    return path


def test_use_auto_answers_the_config_auto_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Where auto won, ``config_for`` answers the config auto ran, not None: our kernel called
    with None runs ``AttentionConfig()`` (2 stages, 128 x 128 backward tiles), which at float32
    head_dim 128 is not what auto ran (1 stage, bwd_inner 64: what fits an H100's shared memory)."""
    from kernels.config import AttentionConfig

    records = [rec("fwd_bwd", auto=True, ms=0.9, dtype="float32", head_dim=128)]  # auto wins
    records.append(rec("fwd_bwd", ms=1.0, dtype="float32", head_dim=128))
    doc = make_doc(records, config={"tag": "t", "smem_limit_bytes": 232448})
    out = tmp_path / "tuned.json"
    rc, stdout, _ = run_handler(["export", str(write(tmp_path, doc)), "--out", str(out)], capsys)
    assert rc == 0 and "(0 tuned, 1 use auto)" in stdout
    (entry,) = json.loads(out.read_text())["entries"]
    assert entry["config"] is None  # the table still says "use auto"
    ran = AttentionConfig(block_q=128, block_k=128, bwd_outer=128, bwd_inner=64, num_warps=8, num_stages=1)
    t = load(out)
    for seq in (2048, 4096):  # the measured seq, and a neighbour auto's tiles divide
        assert t.config_for(dtype="float32", head_dim=128, seq=seq, mode="fwd_bwd") == ran != AttentionConfig()
    assert t.config_for(dtype="float32", head_dim=128, seq=96, mode="fwd_bwd") is None  # 128 does not divide 96
    assert t.lookup(dtype="float32", head_dim=128, seq=2048, mode="fwd_bwd") is None  # lookup: "use auto"
    # an auto_config the kernel cannot take is refused at load, named
    bad = {**entry, "auto_config": {**entry["auto_config"], "num_stages": 0}}
    with pytest.raises(TunedTableError, match=r"entries\[0\]: auto_config.num_stages=0 must be a positive integer"):
        load(_table(tmp_path, [bad]))
    # a table without auto_config (an earlier export) has no answer there
    del entry["auto_config"]
    t = load(_table(tmp_path, [entry]))
    assert t.config_for(dtype="float32", head_dim=128, seq=2048, mode="fwd_bwd") is None
