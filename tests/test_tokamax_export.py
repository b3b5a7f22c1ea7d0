"""``tilesweep export DOC... --format tokamax --out DIR``, read back by tokamax itself: its cache
reader with DIR as a path and its ``AutotuningResult`` overlay both make tokamax choose
tilesweep's best config per shape and op (on a B200 too, through tokamax's sm100 config classes);
tilesweep's own reader of tables reads the keys tokamax wrote; records of other kernels, several
device kinds and a damaged table."""

from __future__ import annotations

import json
import random
import re
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernels import devices
from kernels import tokamax_meta as meta
from orchestrator.cli.main import main
from orchestrator.errors import ResultsError
from orchestrator.store import document
from tests.helpers import assert_one_line_error, run_cli

pytest.importorskip("tokamax", reason=meta.missing("tests of tokamax's tables"))

from kernels import tokamax_cache, tokamax_ops  # noqa: E402  (needs tokamax)

H200, H100, B200 = (devices.get(k) for k in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA B200"))
MOSAIC = meta.Problem(batch=4, seq=2048, heads=8, head_dim=128, dtype="bfloat16")
TRITON = meta.Problem(batch=2, seq=512, heads=4, head_dim=64, dtype="float32", causal=True)


def _record(p: meta.Problem, impl: str, mode: str, fields: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    ms = rng.uniform(1.0, 3.0)
    samples = [ms * rng.uniform(0.97, 1.03) for _ in range(5)]
    rec: dict[str, Any] = {"dtype": p.dtype, "head_dim": p.head_dim, "seq": p.seq, "batch": p.batch, "heads": p.heads}
    if p.causal:
        rec["causal"] = True
    rec.update(tag="t", mode=mode, impl=impl, config="forced", **fields)
    rec.update(rel_err=1e-3, compile_s=2.5, inner=10, median_ms=statistics.median(samples))
    rec.update(q1_ms=min(samples), q3_ms=max(samples), timer="profiler_device_time", samples_ms=samples)
    return rec


def _records(device: devices.DeviceKind, seed: int) -> list[dict[str, Any]]:
    """Every config of tokamax's own search, each with made-up times, for two problems."""
    rng = random.Random(seed)
    out = []
    for impl, p, modes in (("tokamax-mosaic", MOSAIC, ("fwd", "fwd_bwd")), ("tokamax-triton", TRITON, ("fwd",))):
        for mode in modes:
            out += [_record(p, impl, mode, f, rng) for f in tokamax_ops.search_space(impl, mode, p, device)]
    return out


def _best(recs: list[dict[str, Any]], impl: str, mode: str) -> dict[str, Any]:
    rec = min((r for r in recs if (r["impl"], r["mode"]) == (impl, mode)), key=lambda r: r["median_ms"])
    return {f: rec[f] for f in meta.kernel(impl).fields(mode, "sm90")}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """An H200 document of tokamax records (a screened, a failed and an untimed-samples one among
    them, and records of tilesweep's kernel), an H100 one, and their export."""
    root = tmp_path_factory.mktemp("tokamax")
    recs = _records(H200, 1)
    screened = {"median_ms": 0.001, "q1_ms": 0.001, "q3_ms": 0.001, "samples_ms": [0.001]}  # its one sample
    extra = [dict(recs[0], **screened, screened=True), dict(recs[1], error="Boom: no")]
    extra += [{k: v for k, v in recs[2].items() if k != "samples_ms"}]
    tilesweep = {**{k: recs[0][k] for k in ("dtype", "head_dim", "seq", "batch", "heads", "tag")}, "mode": "fwd"}
    tilesweep.update(config="forced", block_q=64, block_k=64, num_stages=2, num_warps=4, median_ms=0.5)
    docs = []
    for name, kind, rs in (("h200", H200.name, recs + extra + [tilesweep]), ("h100", H100.name, _records(H100, 2))):
        path = root / f"{name}.json"
        path.write_text(json.dumps({"device": {"device_kind": kind}, "config": {}, "results": rs}))
        docs.append(str(path))
    out = root / "out"
    assert main(["export", *docs, "--format", "tokamax", "--out", str(out)]) == 0
    yield out, recs
    tokamax_cache.uninstall()


def test_one_folder_per_device_kind_in_tokamaxs_format(exported: tuple[Path, list[dict[str, Any]]]) -> None:
    out, recs = exported
    names = {"pallas_mosaic_gpu_flash_attention.json", "pallas_mosaic_gpu_flash_attention_vjp.json"}
    names |= {"pallas_triton_flash_attention.json"}
    for folder in ("nvidia_h200", "nvidia_h100_80gb_hbm3"):
        assert {p.name for p in (out / folder).iterdir()} == names
    parsed = tokamax_cache.check(out / "nvidia_h200" / "pallas_triton_flash_attention.json")  # tokamax's own parser
    (data,) = parsed.values()
    triton = [r for r in recs if r["impl"] == "tokamax-triton"]
    assert len(data) == len(triton) == 256
    by_fields = {json.dumps(tokamax_ops.fields_of(c), sort_keys=True): bd for c, bd in data.items()}
    rec = triton[0]
    bd = by_fields[json.dumps({f: rec[f] for f in meta.kernel("tokamax-triton").fields("fwd", "sm90")}, sort_keys=True)]
    assert list(bd.evaluation_times_ms) == rec["samples_ms"] and bd.compile_time_ms == rec["compile_s"] * 1e3
    assert bd.metadata["tilesweep"]["samples"] == "the record's samples_ms"


def _chosen_all(device: devices.DeviceKind) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        ("tokamax-mosaic", "fwd"): tokamax_ops.chosen("tokamax-mosaic", "fwd", MOSAIC, device),
        ("tokamax-mosaic", "fwd_bwd"): tokamax_ops.chosen("tokamax-mosaic", "fwd_bwd", MOSAIC, device),
        ("tokamax-triton", "fwd"): tokamax_ops.chosen("tokamax-triton", "fwd", TRITON, device),
    }


def test_tokamax_then_chooses_tilesweeps_best(exported: tuple[Path, list[dict[str, Any]]]) -> None:
    out, recs = exported
    best = {(impl, mode): _best(recs, impl, mode) for impl, mode in _chosen_all(H200)}
    untuned = _chosen_all(H200)
    assert untuned != best  # tokamax's heuristics, before it reads the tables
    with tokamax_cache.overlay(out):  # tokamax's public AutotuningResult overlay
        assert _chosen_all(H200) == best
    assert _chosen_all(H200) == untuned
    tokamax_cache.install(out)  # tokamax's cache reader, DIR as a path after its own
    try:
        assert _chosen_all(H200) == best
    finally:
        tokamax_cache.uninstall()
    assert _chosen_all(H200) == untuned


def test_a_problem_where_tokamaxs_own_choice_was_faster_is_left_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An auto record faster than every forced one: tokamax keeps its own choice there (no key
    steers it to a slower config), said in one line; --keep-slower writes the key anyway."""
    recs = _records(H200, 4)
    auto = {k: v for k, v in recs[0].items() if k not in meta.kernel("tokamax-mosaic").fields("fwd", "sm90")}
    fastest = min(r["median_ms"] for r in recs if (r["impl"], r["mode"]) == ("tokamax-mosaic", "fwd"))
    auto.update(config="auto", median_ms=fastest / 2, q1_ms=fastest / 2, q3_ms=fastest / 2, samples_ms=[fastest / 2])
    path = tmp_path / "h200.json"
    path.write_text(json.dumps({"device": {"device_kind": H200.name}, "config": {}, "results": [*recs, auto]}))
    best = {(impl, mode): _best(recs, impl, mode) for impl, mode in _chosen_all(H200)}
    untuned = _chosen_all(H200)
    capsys.readouterr()
    out = tmp_path / "out"
    try:
        assert main(["export", str(path), "--format", "tokamax", "--out", str(out)]) == 0
        said = capsys.readouterr().out
        assert "left 1 problem to tokamax's own choice (auto), which was faster than every" in said, said
        with tokamax_cache.overlay(out):
            chosen = _chosen_all(H200)
        assert chosen[("tokamax-mosaic", "fwd")] == untuned[("tokamax-mosaic", "fwd")]
        assert {k: v for k, v in chosen.items() if k[1] != "fwd" or k[0] != "tokamax-mosaic"} == {
            k: v for k, v in best.items() if k[1] != "fwd" or k[0] != "tokamax-mosaic"
        }
        kept = tmp_path / "kept"
        assert main(["export", str(path), "--format", "tokamax", "--out", str(kept), "--keep-slower"]) == 0
        assert "left out" not in capsys.readouterr().out
        with tokamax_cache.overlay(kept):
            assert _chosen_all(H200) == best
        # where auto won every problem: nothing to hand tokamax, said as that
        alone = [r for r in recs if (r["impl"], r["mode"]) == ("tokamax-mosaic", "fwd")] + [auto]
        path.write_text(json.dumps({"device": {"device_kind": H200.name}, "config": {}, "results": alone}))
        assert main(["export", str(path), "--format", "tokamax", "--out", str(tmp_path / "none")]) == 0
        said = capsys.readouterr().out
        assert "left every problem to tokamax's own choice (auto)" in said and "no timed record" not in said, said
        assert "no tables written" in said and not (tmp_path / "none").exists()
    finally:
        tokamax_cache.uninstall()


def test_documents_of_two_device_kinds_drop_nothing_each_has_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = []
    for kind, seed in ((H200, 5), (H100, 6)):
        path = tmp_path / f"{seed}.json"
        recs = [r for r in _records(kind, seed) if r["impl"] == "tokamax-triton"]
        path.write_text(json.dumps({"device": {"device_kind": kind.name}, "config": {}, "results": recs}))
        docs.append(str(path))
    capsys.readouterr()
    try:
        assert main(["export", *docs, "--format", "tokamax", "--out", str(tmp_path / "out")]) == 0
    finally:
        tokamax_cache.uninstall()
    said = capsys.readouterr().out
    assert said.count("combined 2 documents") == 2 and "dropped" not in said, said
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"nvidia_h200", "nvidia_h100_80gb_hbm3"}


def test_tilesweep_reads_the_keys_tokamax_wrote(exported: tuple[Path, list[dict[str, Any]]]) -> None:
    out, recs = exported
    doc = document.load(out / "nvidia_h200" / "pallas_triton_flash_attention.json", tokamax=True)
    fields = meta.kernel("tokamax-triton").fields("fwd", "sm90")
    mine = {tuple(r[f] for f in fields): r["median_ms"] for r in recs if r["impl"] == "tokamax-triton"}
    back = {tuple(r[f] for f in fields): r["median_ms"] for r in doc.results}
    assert back == pytest.approx(mine)
    assert {(r["seq"], r["head_dim"], r["dtype"], r.get("causal")) for r in doc.results} == {(512, 64, "float32", True)}


def test_records_of_other_kernels_and_damaged_tables_are_one_line(
    exported: tuple[Path, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, recs = exported
    capsys.readouterr()
    plain = tmp_path / "plain.json"
    rec = {"dtype": "float32", "head_dim": 64, "seq": 128, "batch": 1, "heads": 1, "tag": "t", "mode": "fwd"}
    rec.update(config="forced", block_q=64, block_k=64, num_stages=2, num_warps=4, median_ms=1.0)
    plain.write_text(json.dumps({"device": {"device_kind": H200.name}, "config": {}, "results": [rec]}))
    assert main(["export", str(plain), "--format", "tokamax", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "kernel.impl tilesweep" in err[0] and "tokamax-mosaic and tokamax-triton" in err[0]
    assert not (tmp_path / "x").exists()
    table = tmp_path / "nvidia_h200" / "pallas_mosaic_gpu_flash_attention.json"
    table.parent.mkdir()
    text = (out / "nvidia_h200" / table.name).read_text()
    table.write_text(text[:-40])
    with pytest.raises(ValueError, match=f"{table}: damaged tokamax autotuning table") as e:
        tokamax_cache.check(table)
    assert "\n" not in str(e.value)
    with pytest.raises(ResultsError, match="damaged tokamax autotuning table"):
        document.load(table, tokamax=True)
    with pytest.raises(ValueError, match="damaged tokamax autotuning table"), tokamax_cache.overlay(tmp_path):
        pass
    # a path that holds no tables leaves tokamax untuned: said, not silently done
    kind = out / "nvidia_h200"  # a device kind's folder, or a table in it: the folder above is named
    wrong_paths = [(tmp_path / "typo", "does not exist"), (plain, "is a file"), (out.parent, "holds no")]
    wrong_paths += [
        (kind, f"give {out}, the folder above it"),
        (kind / table.name, f"is one of tokamax's tables (give {out}, the folder above"),
    ]
    for wrong, said in wrong_paths:
        with pytest.raises(ValueError, match=re.escape(said)):
            tokamax_cache.install(wrong)
        with pytest.raises(ValueError, match=re.escape(said)), tokamax_cache.overlay(wrong):
            pass


def test_a_b200_document_is_written_with_tokamaxs_sm100_classes_and_chosen_from(tmp_path: Path) -> None:
    rng = random.Random(3)
    recs = []
    for mode in ("fwd", "fwd_bwd"):
        space = tokamax_ops.search_space("tokamax-mosaic", mode, MOSAIC, B200)
        recs += [_record(MOSAIC, meta.kernel("tokamax-mosaic").record_impl(f), mode, f, rng) for f in space]
    assert {r["impl"] for r in recs} == {"tokamax-mosaic-sm100"} and {r["persistent"] for r in recs} >= {"static"}
    path = tmp_path / "b200.json"
    path.write_text(json.dumps({"device": {"device_kind": B200.name}, "config": {}, "results": recs}))
    out = tmp_path / "out"
    assert main(["export", str(path), "--format", "tokamax", "--out", str(out)]) == 0
    names = {"pallas_mosaic_gpu_flash_attention.json", "pallas_mosaic_gpu_flash_attention_vjp.json"}
    assert [p.name for p in out.iterdir()] == ["nvidia_b200"] and {
        p.name for p in (out / "nvidia_b200").iterdir()
    } == names
    best = {}
    for mode in ("fwd", "fwd_bwd"):
        rec = min((r for r in recs if r["mode"] == mode), key=lambda r: r["median_ms"])
        best[mode] = {f: rec[f] for f in meta.kernel("tokamax-mosaic").fields(mode, "sm100")}
    with tokamax_cache.overlay(out):  # tokamax's AutotuningResult overlay, read with the sm100 classes
        assert {m: tokamax_ops.chosen("tokamax-mosaic", m, MOSAIC, B200) for m in best} == best
    back = document.load(out / "nvidia_b200" / "pallas_mosaic_gpu_flash_attention.json", tokamax=True)
    fields = meta.kernel("tokamax-mosaic").fields("fwd", "sm100")
    fwd = {tuple(r[f] for f in fields) for r in recs if r["mode"] == "fwd"}
    assert {r["impl"] for r in back.results} == {"tokamax-mosaic-sm100"}
    assert {tuple(r[f] for f in fields) for r in back.results if r["mode"] == "fwd"} == fwd


def test_replayed_records_are_not_handed_to_tokamax_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay's times are drawn on a virtual clock: exported as tokamax's tables, tokamax
    would run on them as measurements. Refused in one line, taken with --include-replays."""
    recs = _records(H200, 3)
    path = tmp_path / "replayed.json"
    path.write_text(
        json.dumps({"device": {"device_kind": H200.name, "backend": "replay"}, "config": {}, "results": recs})
    )
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["export", str(path), "--format", "tokamax", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "replayed records" in err[0] and f"{path} ({len(recs)})" in err[0], err
    assert "--include-replays" in err[0] and not out.exists()
    for wrong in ("-", str(path)):  # a folder is written: not stdout, not a file (the input, here)
        before = path.read_bytes()
        assert main(["export", str(path), "--format", "tokamax", "--out", wrong, "--include-replays"]) == 2
        assert "--out names that folder" in capsys.readouterr().err and path.read_bytes() == before
    assert main(["export", str(path), "--format", "tokamax", "--out", str(out), "--include-replays"]) == 0
    assert (out / "nvidia_h200").is_dir()
    tokamax_cache.uninstall()


def test_export_refuses_to_replace_a_file_where_a_table_goes_that_is_not_a_tokamax_table(tmp_path: Path) -> None:
    doc = tmp_path / "h200.json"
    data = {"device": {"device_kind": H200.name}, "config": {}, "results": _records(H200, 3)}
    doc.write_text(json.dumps(data))
    out = tmp_path / "out"
    assert main(["export", str(doc), "--format", "tokamax", "--out", str(out)]) == 0
    table = sorted(out.glob("*/*.json"))[0]
    table.write_text(json.dumps(data))  # a results document where a table was
    before = table.read_bytes()
    done = run_cli("export", str(doc), "--format", "tokamax", "--out", str(out))
    assert done.returncode == 2 and "exists and is not a tokamax table" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and table.read_bytes() == before


def test_an_export_into_the_folder_it_wrote_replaces_its_tables_and_keeps_other_shapes(tmp_path: Path) -> None:
    """A second export into a folder holding tables (its own, fwd_bwd's vjp table included, or
    tokamax's shipped ones) writes over them: the shapes it exports replace the same shapes, the
    others the tables held stay, and it says how many; tokamax still parses every table. A vjp
    table handed to ``report`` or ``spec`` is named as one of tokamax's tables."""
    doc = tmp_path / "h200.json"
    doc.write_text(json.dumps({"device": {"device_kind": H200.name}, "config": {}, "results": _records(H200, 4)}))
    out = tmp_path / "out"
    assert main(["export", str(doc), "--format", "tokamax", "--out", str(out)]) == 0
    vjp = out / "nvidia_h200" / "pallas_mosaic_gpu_flash_attention_vjp.json"
    first = {p.name: json.loads(p.read_text()) for p in (out / "nvidia_h200").iterdir()}
    others = {}
    for name, table in first.items():  # a shape the export does not write (a batch of 3), as a shipped table holds
        key, data = next(iter(table.items()))
        others[name] = {re.sub(r"\[\d+,", "[3,", key): data}
        (out / "nvidia_h200" / name).write_text(json.dumps({**others[name], **table}))
    again = run_cli("export", str(doc), "--format", "tokamax", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("kept 1 other shape the table held") == len(first), again.stdout
    assert again.stdout.count("the table held (the same as before); kept") == len(first), again.stdout
    assert "measured again" not in again.stdout, again.stdout  # nothing was: the same document, exported again
    for name, table in first.items():
        now = json.loads((out / "nvidia_h200" / name).read_text())
        assert now == {**others[name], **table}
    tokamax_cache.check(vjp)  # tokamax's own parser
    for command in ("report", "spec"):
        r = run_cli(command, str(vjp))
        assert r.returncode == 2 and "one of tokamax's autotuning tables" in r.stderr, r.stderr


def test_an_export_of_fewer_configs_of_a_shape_the_table_holds_keeps_the_table_before_and_says_so(
    tmp_path: Path,
) -> None:
    """A shape the table holds is replaced whole by a later export of it (one export's ranking per
    shape); the configs it held that the later export did not measure are not lost: the table
    before is kept as ``.prev``, and the line says so. A third such export, with a ``.prev`` there
    already, is refused in one line and writes nothing."""
    recs = [r for r in _records(H200, 6) if (r["impl"], r["mode"]) == ("tokamax-mosaic", "fwd")]
    docs = []
    for name, part in (("first", recs[:10]), ("later", recs[8:12])):
        docs.append(tmp_path / f"{name}.json")
        docs[-1].write_text(json.dumps({"device": {"device_kind": H200.name}, "config": {}, "results": part}))
    out = tmp_path / "out"
    assert main(["export", str(docs[0]), "--format", "tokamax", "--out", str(out)]) == 0  # the table before
    table = out / "nvidia_h200" / "pallas_mosaic_gpu_flash_attention.json"
    first = table.read_bytes()
    later = run_cli("export", str(docs[1]), "--format", "tokamax", "--out", str(out))
    assert later.returncode == 0, later.stderr
    prev = table.with_name(table.name + ".prev")
    (line,) = [x for x in later.stdout.splitlines() if x.startswith("wrote ")]
    assert line.endswith(
        "1 shape, 4 configs of NVIDIA H200; replaced 1 shape the table held (with other configs or timings, "
        f"dropping 8 configs this export did not measure; the table before is kept as {prev.name})"
    ), line
    assert prev.read_bytes() == first and [len(v) for v in json.loads(table.read_text()).values()] == [4]
    tokamax_cache.check(table)  # tokamax's own parser
    written = table.read_bytes()
    again = run_cli("export", str(docs[0]), "--format", "tokamax", "--out", str(out))
    said = assert_one_line_error(again, str(table), "dropping 2 configs", "nothing written", f"move {prev} away")
    assert "Traceback" not in said and table.read_bytes() == written and prev.read_bytes() == first


def test_a_device_no_record_was_measured_on_is_named_with_the_kinds_the_documents_hold(tmp_path: Path) -> None:
    doc = tmp_path / "h200.json"
    doc.write_text(json.dumps({"device": {"device_kind": H200.name}, "config": {}, "results": _records(H200, 5)}))
    r = run_cli("export", str(doc), "--format", "tokamax", "--out", str(tmp_path / "out"), "--device", "NVIDIA H100")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert '--device "NVIDIA H100": no record' in r.stderr and f'they hold "{H200.name}"' in r.stderr
    assert "holds no timed forced record" not in r.stderr and not (tmp_path / "out").exists()


def test_an_overlay_uses_the_folders_of_known_kinds_and_names_the_one_it_leaves_out(
    exported: tuple[Path, list[dict[str, Any]]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder of an A100 beside the export's (tokamax's overlay needs the device kind's own
    name, which tilesweep knows only for its own kinds): left out in one warning naming it."""
    out, recs = exported
    mixed = tmp_path / "tables"
    shutil.copytree(out, mixed)
    a100 = mixed / meta.device_dir("NVIDIA A100-SXM4-80GB")
    shutil.copytree(out / "nvidia_h200", a100)
    best = {(impl, mode): _best(recs, impl, mode) for impl, mode in _chosen_all(H200)}
    with caplog.at_level("WARNING", logger="kernels.tokamax_cache"), tokamax_cache.overlay(mixed):
        assert _chosen_all(H200) == best
    (said,) = [r.getMessage() for r in caplog.records if r.name == "kernels.tokamax_cache"]
    assert str(a100) in said and "nvidia_h200" in said and "\n" not in said  # the kinds it knows
    alone = tmp_path / "a100"
    shutil.copytree(out / "nvidia_h200", alone / a100.name)
    with pytest.raises(ValueError, match="no folder of a device kind") as e, tokamax_cache.overlay(alone):
        pass
    assert str(alone / a100.name) in str(e.value) and "\n" not in str(e.value)
