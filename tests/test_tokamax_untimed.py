"""``export --format tokamax`` of a halving sweep stopped after its round 1, or during its round 2:
a problem whose configs are not all timed in full is in no table, as in no tuned table, and the
export says so and what to do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernels import devices
from kernels import tokamax_meta as meta
from tests.helpers import assert_one_line_error, run_cli

pytest.importorskip("tokamax", reason=meta.missing("tests of tokamax's tables"))

from kernels import tokamax_ops  # noqa: E402  (needs tokamax)

H200 = devices.get("NVIDIA H200")
MOSAIC = meta.Problem(batch=4, seq=2048, heads=8, head_dim=128, dtype="bfloat16")
TRITON = meta.Problem(batch=2, seq=512, heads=4, head_dim=64, dtype="float32")


def _records(impl: str, p: meta.Problem, **marks: Any) -> list[dict[str, Any]]:
    """A record of every config of tokamax's own search of ``p`` (fwd), with made-up times."""
    shape = {"dtype": p.dtype, "head_dim": p.head_dim, "seq": p.seq, "batch": p.batch, "heads": p.heads, "tag": "t"}
    out = []
    for k, fields in enumerate(tokamax_ops.search_space(impl, "fwd", p, H200)):
        ms = 1.0 + k / 100
        timing = {"rel_err": 1e-3, "median_ms": ms, "q1_ms": ms, "q3_ms": ms, "samples_ms": [ms]}
        out.append({**shape, "mode": "fwd", "impl": impl, "config": "forced", **fields, **timing, **marks})
    return out


def test_a_problem_whose_configs_are_only_screened_is_left_out_and_said_to_be_not_timed_in_full_yet(
    tmp_path: Path,
) -> None:
    """A halving sweep stopped after its round 1 screened tokamax-triton's configs: no config is
    timed in full, so none goes to tokamax. The export says so and what to do (not that the
    document holds no record of tokamax's kernels): alone, in its one-line refusal; beside another
    document's tables, in a line of what it left out."""
    screened, timed = _records("tokamax-triton", TRITON, screened=True), _records("tokamax-mosaic", MOSAIC)
    docs = []
    for name, rs in (("screened", screened), ("timed", timed)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"device": {"device_kind": H200.name}, "config": {}, "results": rs}))
        docs.append(str(path))
    out = tmp_path / "out"
    said = assert_one_line_error(run_cli("export", docs[0], "--format", "tokamax", "--out", str(out)))
    assert said == (
        f"tilesweep: error: {docs[0]}: nothing to write as tokamax's tables: the configs of 1 problem are not all "
        "timed in full yet, so their best is not known (resume their sweep to time them, then export again)"
    )
    assert not out.exists()
    r = run_cli("export", *docs, "--format", "tokamax", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert (
        f"{H200.name}: left out 1 problem whose configs are not all timed in full yet, so their best is not known "
        "(resume their sweep to time them, then export again)"
    ) in r.stdout.splitlines(), r.stdout
    assert [p.name for p in (out / meta.device_dir(H200.name)).iterdir()] == ["pallas_mosaic_gpu_flash_attention.json"]


def test_a_problem_whose_screen_survivors_wait_for_round_2_is_left_out_as_the_tuned_table_leaves_it_out(
    tmp_path: Path,
) -> None:
    """A halving sweep of tokamax-triton (replayed) merged while round 2 has timed the survivors
    of one of its units: the problem has configs timed in full, but the survivors still waiting
    may beat them. tokamax's tables leave it out, as the tuned table does, and say why in one line
    (of the document alone, or combined with a copy); once round 2 timed every survivor, both
    export it."""
    from orchestrator.control import dispatch
    from orchestrator.control.rounds import advance
    from orchestrator.control.sweeps import prepare_sweep
    from orchestrator.store import synthetic
    from orchestrator.store.merge import merge
    from orchestrator.store.sweepdir import SweepDir

    src, doc, spec = tmp_path / "src.json", tmp_path / "results.json", tmp_path / "spec.json"
    shape = {"dtypes": ["float16"], "head_dims": [64], "seq_lens": [1024], "modes": ["fwd"]}
    kernel = {"impl": "tokamax-triton", "device_kind": "NVIDIA H100"}
    src.write_text(json.dumps(synthetic.document({**shape, "output": str(src), "kernel": kernel})))
    replay = {"source": str(src), "impl": "tokamax-triton"}
    halving = {"timing": {"strategy": "halving"}, "sharding": {"units": 3}, "executor": {"kind": "debug"}}
    data = {**shape, "output": str(doc), "kernel": {**kernel, "impl": "replay"}, "replay": replay, **halving}
    spec.write_text(json.dumps(data))
    sd, unit_ids, _ = prepare_sweep(str(spec), str(tmp_path / "sweep"), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    second = advance(sd, sd.spec.executor)
    assert second is not None and len(second.units) > 1
    first, *rest = [u.id for u in second.units]
    assert all(o.ok for o in dispatch.run_units_locally(sd, [first], kind="debug"))
    merge(SweepDir.open(sd.root))  # merged here, as `tilesweep merge` merges it
    copy, out = tmp_path / "copy.json", tmp_path / "tables"
    copy.write_bytes(doc.read_bytes())
    tuned = assert_one_line_error(
        run_cli("export", str(doc), "--include-replays", "--out", str(tmp_path / "tuned.json")), "not timed in full"
    )
    assert "the configs of 1 problem in " in tuned, tuned
    for given in ([doc], [doc, copy]):
        r = run_cli("export", *map(str, given), "--format", "tokamax", "--include-replays", "--out", str(out))
        said = assert_one_line_error(r, "nothing to write as tokamax's tables")
        assert said.endswith(
            "the configs of 1 problem are not all timed in full yet, so their best is not known (resume their sweep "
            "to time them, then export again)"
        ), said
        assert not out.exists()
    assert all(o.ok for o in dispatch.run_units_locally(sd, rest, kind="debug"))
    merge(SweepDir.open(sd.root))  # merged here, as `tilesweep merge` merges it
    r = run_cli("export", str(doc), "--format", "tokamax", "--include-replays", "--out", str(out))
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {out}/nvidia_h100/"), r.stdout + r.stderr
