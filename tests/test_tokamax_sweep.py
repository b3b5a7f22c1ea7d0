"""Sweeps of tokamax's kernels (``kernel.impl: tokamax-mosaic`` / ``tokamax-triton``) on a CPU:
``"grid": "tokamax"`` plans exactly tokamax's own search for H100 and H200, the spec's bad input
is one line in tokamax's words, and a replayed tokamax sweep runs, reports, exports in tokamax's
format and is chosen from by tokamax itself. Lowering: ``tests/kernels/test_tokamax_lowering.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernels import devices, impls
from kernels import tokamax_meta as meta
from orchestrator.errors import PlanError, SpecError
from orchestrator.planning import RUN, expand
from orchestrator.planning import tokamax_grid as grid
from orchestrator.spec.files import spec_from_data
from orchestrator.store.synthetic import document
from tests.helpers import TOKAMAX_SPEC, assert_one_line_error, run_cli

pytest.importorskip("tokamax", reason=meta.missing("tests of tokamax's kernels"))

from kernels import tokamax_cache, tokamax_ops  # noqa: E402  (needs tokamax)
from tests.kernels.test_tokamax import _tokamax_list  # noqa: E402  (tokamax's own list, asked directly)

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")


def _spec(**over: Any) -> Any:
    return spec_from_data({**TOKAMAX_SPEC, **over})


@pytest.mark.parametrize(
    ("kind", "planned"),
    [("NVIDIA H100 80GB HBM3", 2 + 17 + 32), ("NVIDIA H200", 2 + 17 + 32), ("NVIDIA B200", 2 + 86 + 87)],
    ids=["H100", "H200", "B200"],
)
def test_grid_tokamax_plans_tokamaxs_own_search_per_problem(kind: str, planned: int) -> None:
    spec = _spec(kernel={"impl": "tokamax-mosaic", "device_kind": kind})
    items = expand(spec)
    p = meta.Problem(batch=4, seq=2048, heads=8, head_dim=128, dtype="bfloat16")
    device = devices.get(kind)
    fam = meta.family(device.arch)  # B200: tokamax's sm100 config classes, and records named for them
    fwd_cls, vjp_cls = (tokamax_ops.config_class("tokamax-mosaic", h, fam) for h in ("fwd", "vjp"))
    assert {it.impl for it in items} == {"tokamax-mosaic-sm100" if fam == "sm100" else "tokamax-mosaic"}
    by_mode = {m: [it for it in items if it.mode == m and it.config == "forced"] for m in TOKAMAX_SPEC["modes"]}
    assert all(it.kind == RUN for it in items) and len(items) == planned
    assert all(tuple(it.fields() or {}) == meta.kernel("tokamax-mosaic").fields(it.mode, fam) for it in items[2:])
    assert {repr(fwd_cls(**it.fields())) for it in by_mode["fwd"]} == _tokamax_list(  # type: ignore[arg-type]
        "tokamax-mosaic", "fwd", p, device, False
    )
    halves = [meta.split("tokamax-mosaic", "fwd_bwd", it.fields() or {}) for it in by_mode["fwd_bwd"]]
    assert {repr(fwd_cls(**f)) for f, _ in halves} == _tokamax_list("tokamax-mosaic", "fwd", p, device, True)
    assert {repr(vjp_cls(**v)) for _, v in halves} == _tokamax_list("tokamax-mosaic", "vjp", p, device, True)
    assert len({it.id for it in items}) == len(items)


@pytest.mark.parametrize(
    ("over", "needles"),
    [
        ({"grid": {"fwd": {"block_x": [64]}}}, ('"block_x" is not a tunable', "block_q, block_kv, num_stages")),
        ({"grid": {"fwd": {"block_q": [96]}}}, ("grid.fwd: block_q: Input should be a multiple of 64",)),
        ({"kernel": {"impl": "mosaic"}, "dtypes": ["float16"]}, ('grid "tokamax"', '"tokamax-mosaic" or')),
        ({"fwd_block_q": [64]}, ("fwd_block_q is a field of the Triton kernels' grid",)),
        ({"grid": "tokamaxx"}, ('"tokamaxx" is not a grid', '"tokamax"')),
    ],
)
def test_a_spec_tokamax_refuses_is_one_line(over: dict[str, Any], needles: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as err:
        _spec(**over)
    assert "\n" not in err.value.message
    for n in needles:
        assert n in err.value.message, err.value.message


def test_the_spec_rules_are_tokamaxs_pydantic_validation_in_its_words() -> None:
    import pydantic

    for name in meta.IMPL_NAMES:
        impl = impls.get(name)
        fam = meta.family(impl.capabilities.archs[0]) if impl.capabilities.archs else "sm90"
        for half, tunables in (
            ("fwd", impl.tunables("fwd")),
            ("vjp", impl.tunables("fwd_bwd")[len(impl.tunables("fwd")) :]),
        ):
            cls = tokamax_ops.config_class(name, half, fam)
            base = {t.name.removeprefix(meta.VJP_PREFIX): t.default[0] for t in tunables}
            for t in (t for t in tunables if t.kind is int):
                for value in (0, -1, 3, 96):
                    try:
                        pydantic.TypeAdapter(cls).validate_python({**base, t.name.removeprefix(meta.VJP_PREFIX): value})
                        theirs = None
                    except pydantic.ValidationError as exc:
                        theirs = tokamax_ops.one_line(exc, meta.VJP_PREFIX if half == "vjp" else "")
                    mine = t.refusal(value)
                    assert (mine is None) == (theirs is None), (name, t.name, value, mine, theirs)
                    assert theirs is None or (mine or "").startswith(theirs), (mine, theirs)


def test_a_b200_spec_takes_the_sm100_fields_and_a_missing_tokamax_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SpecError, match='"tokamax-mosaic", "tokamax-triton" or "replay"'):
        _spec(kernel={"impl": "tokamax-mosaic-sm100"})  # what tokamax-mosaic runs as on a B200, not a spec's name
    with pytest.raises(SpecError, match="grid.fwd: collective: Input should be a valid boolean"):
        _spec(kernel={"impl": "tokamax-mosaic", "device_kind": "NVIDIA B200"}, grid={"fwd": {"collective": [1]}})
    b200 = _spec(
        kernel={"impl": "tokamax-mosaic", "device_kind": "NVIDIA B200"}, grid={"fwd": {"persistent": ["static"]}}
    )
    fwd = [it for it in expand(b200) if it.config == "forced" and it.mode == "fwd"]
    assert {(it.fields() or {}).get("persistent") for it in fwd} == {"static"}
    again = spec_from_data(b200.reference_config())  # a B200 document's config block, loaded as a spec
    assert (again.kernel.impl, again.measured_impl) == ("tokamax-mosaic", "tokamax-mosaic-sm100")
    assert again.fingerprint() == b200.fingerprint()
    monkeypatch.setattr(meta, "version", lambda: None)  # as where tokamax is not installed
    with pytest.raises(PlanError) as err:
        expand(_spec(seq_lens=[1024]))  # a problem not enumerated yet in this process
    assert err.value.message == 'grid "tokamax" needs tokamax, which is not installed here: ' + meta.INSTALL
    from orchestrator.cli.lower import _check_can_lower

    with pytest.raises(PlanError) as err:
        _check_can_lower(_spec(grid=None))
    assert "\n" not in err.value.message and err.value.message.endswith(meta.INSTALL)


def test_a_replayed_tokamax_sweep_runs_reports_exports_and_tokamax_chooses_its_best(tmp_path: Path) -> None:
    kind = "NVIDIA H100"  # the synthetic document's GPU: the tables are written for the records' device kind
    spec_data = {**TOKAMAX_SPEC, "kernel": {"impl": "tokamax-mosaic", "device_kind": kind}}
    source = tmp_path / "source.json"
    source.write_text(json.dumps(document({**spec_data, "output": "measured.json"}, seed=5)))
    out = tmp_path / "replayed.json"
    spec = tmp_path / "replay.json"
    kernel = {"impl": "replay", "device_kind": kind}
    replay = {"source": str(source), "impl": "tokamax-mosaic"}
    spec.write_text(json.dumps({**spec_data, "output": str(out), "kernel": kernel, "replay": replay}))
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"), "--executor", "debug")
    assert r.returncode == 0, r.stderr
    recs = json.loads(out.read_text())["results"]
    assert len(recs) == 51 and {rec["impl"] for rec in recs} == {"tokamax-mosaic"}
    assert "| vjp " in r.stdout  # the report names the best fwd_bwd config by tokamax's fields
    tables = tmp_path / "tables"
    r = run_cli("export", str(out), "--format", "tokamax", "--out", str(tables), "--include-replays")
    assert r.returncode == 0, r.stderr
    p = grid.problem(_spec(), "bfloat16", 128, 2048, False, None)
    fwd = [x for x in recs if x["mode"] == "fwd" and x["config"] == "forced"]
    best = min(fwd, key=lambda x: x["median_ms"])
    with tokamax_cache.overlay(tables):
        chosen = tokamax_ops.chosen("tokamax-mosaic", "fwd", p, devices.get(kind))
    assert chosen == {f: best[f] for f in meta.kernel("tokamax-mosaic").fields("fwd", "sm90")}


def test_a_tokamax_run_without_a_gpu_is_refused_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "t.json"
    spec.write_text(json.dumps({**TOKAMAX_SPEC, "modes": ["fwd"], "output": str(tmp_path / "out.json")}))
    sweep = tmp_path / "sweep"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--executor", "debug")
    lower = f"`tilesweep plan {spec} --lower --sweep-dir {sweep}`"  # the spec and sweep the plan's note names
    assert_one_line_error(r, 'kernel.impl "tokamax-mosaic"', lower, "replay")


def test_the_planned_lists_are_kept_so_the_plan_is_reread_without_tokamax(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.errors import MismatchError, SweepDirError
    from orchestrator.store import tokamax_lists
    from orchestrator.store.sweepdir import SweepDir

    spec = tmp_path / "t.json"
    kernel = {"impl": "tokamax-mosaic", "device_kind": "NVIDIA H200"}
    spec.write_text(
        json.dumps({**TOKAMAX_SPEC, "modes": ["fwd"], "kernel": kernel, "output": str(tmp_path / "out.json")})
    )
    sweep = tmp_path / "sweep"
    r = run_cli("plan", str(spec), "--sweep-dir", str(sweep))  # another process plans, with tokamax
    assert r.returncode == 0, r.stderr
    assert (sweep / tokamax_lists.FILE).is_file()
    planned = expand(_spec(modes=["fwd"], kernel=kernel))
    monkeypatch.setattr(grid, "_known", {})
    monkeypatch.setattr(meta, "version", lambda: None)  # as on a node without tokamax
    grid._search.cache_clear()
    sd = SweepDir.open(sweep)
    assert [(it.id, it.fields()) for it in sd.items()] == [(it.id, it.fields()) for it in planned]
    unit = sd.unit_index()[0]["id"]
    (sweep / tokamax_lists.FILE).write_text('{"impl": "tokamax-mosaic"')
    with pytest.raises(SweepDirError, match=f"{tokamax_lists.FILE} is unreadable"):
        SweepDir.open(sweep).items()
    (sweep / tokamax_lists.FILE).unlink()  # planned without the lists, and this process's tokamax lists others
    p = grid.problem(_spec(), "bfloat16", 128, 2048, False, None)
    mine = grid.configs(planned_spec := _spec(modes=["fwd"], kernel=kernel), "fwd", p)
    grid.remember(planned_spec, {("fwd", p): mine[::-1]})
    with pytest.raises(MismatchError) as err:
        SweepDir.open(sweep).unit_items(unit)
    assert "another tokamax than this one" in err.value.message and "\n" not in err.value.message


def test_a_config_tokamax_refuses_as_a_whole_is_planned_invalid_with_its_reason() -> None:
    """A rule of tokamax's config class across its fields (sm100: block_q per CTA at least 128
    without ``collective``), which no field's own rule sees at spec time: planned invalid with
    tokamax's words, so no GPU runs it, without ``plan --lower``; the rest runs."""
    b200 = _spec(
        kernel={"impl": "tokamax-mosaic", "device_kind": "NVIDIA B200"},
        grid={"fwd": {"block_q": [64, 128], "block_kv": [64, 128], "num_stages": [2], "persistent": [True]}},
    )
    forced = [it for it in expand(b200) if it.config == "forced"]
    bad = [it for it in forced if (it.fields() or {}).get("block_q") == 64]
    assert bad and all(it.kind == "invalid" for it in bad)
    assert all("block_q per CTA must be at least 128" in (it.reason or "") for it in bad), bad[0].reason
    assert all(it.kind == RUN for it in forced if it not in bad)
