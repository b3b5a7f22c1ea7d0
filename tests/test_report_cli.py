"""report's input and command line: what is not a results document, and the text, JSON and
markdown a user gets, with one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from html import escape
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ResultsError, TilesweepError
from orchestrator.store import document as results_doc
from tests.conftest import REPO
from tests.helpers import assert_one_line_error, run_cli
from tests.report_helpers import make_doc, parser, rec, run_handler, write

# --------------------------------------------------------------------------- not a results document


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ("", "not a results document: the file is empty"),
        (  # cut short inside a string, and after its last value
            json.dumps(make_doc([rec(ms=1.0), rec(ms=2.0, block_q=64)]))[:150],
            "not a results document: the file ends before its JSON does, after 150 bytes: cut short by a copy or a "
            "write that stopped; copy it again, or write a sweep's document again with `tilesweep merge SWEEP_DIR`",
        ),
        (json.dumps(make_doc([rec(ms=1.0)]))[:-1], "the file ends before its JSON does, after "),
        ('{"device": "a\nb"}', "not valid JSON: Invalid control character at line 1 column 14"),
        (" \n", "not a results document: the file is empty"),
        (b"\x89PNG\r\n", "not a results document: not text (byte 0x89 at offset 0 is not UTF-8)"),
        ("<!DOCTYPE html>\n<html>", "not valid JSON: it opens with <, as an HTML or XML file does"),
        ("[1, 2]", "top level is a JSON array"),
        (json.dumps({"device": {}, "results": []}), "missing top-level key(s) config"),
        (json.dumps({f"k{i}": i for i in range(9)}), "(has: k0, k1, k2, k3, k4, k5 and 3 more)"),
        (json.dumps({"format": "tilesweep-tuned", "version": 2, "entries": []}), "is a tuned table"),
        (
            json.dumps({"dtypes": ["bfloat16"], "output": "results/mine.json"}),
            "is a sweep spec, not a results document; pass the document its sweep writes (the spec's output, "
            "results/mine.json): `tilesweep run SPEC` measures the spec and writes it",
        ),
        (json.dumps({"seq_lens": [256]}), "(the spec's output, attention_tiles.json)"),
        (json.dumps({'{"q": "bf16[1,256,1,64]"}': []}), "is one of tokamax's autotuning tables"),
        (json.dumps({"device": {}, "config": {}, "results": {}}), '"results" is a JSON object'),
        (json.dumps({"device": {}, "config": {}, "results": [3]}), "results[0] is a JSON number"),
        (
            json.dumps(make_doc([rec(ms=1.0), {"dtype": "bfloat16", "seq": 1}])),
            "results[1] lacks identity field(s) head_dim, batch, heads, tag, mode, config",
        ),
    ],
)
def test_not_a_results_document(tmp_path: Path, content: str | bytes, fragment: str) -> None:
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):  # a file that is not text (a PNG of `report --plots`)
        path.write_bytes(content)
    else:
        write(tmp_path, content, "bad.json")
    with pytest.raises(ResultsError) as info:
        results_doc.load(path)
    msg = info.value.message
    assert msg.startswith(str(path)) and fragment in msg and "\n" not in msg
    assert "char " not in msg and "codec" not in msg  # Python's parser's words are not a user's
    assert " at at " not in msg and "Unterminated" not in msg
    assert isinstance(info.value, TilesweepError)


def test_report_of_an_empty_file_or_its_own_page_says_what_the_file_is(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert_one_line_error(run_cli("report", str(empty)), f"{empty}: not a results document: the file is empty")
    page = write(tmp_path, "<!DOCTYPE html>\n<html><head></head></html>\n", "report.html")
    assert_one_line_error(
        run_cli("compare", str(page), str(empty)), f"{page}: not a results document: not valid JSON: it opens with <"
    )


def test_an_empty_json_object_for_a_results_document_is_named_as_one_with_what_to_pass(tmp_path: Path) -> None:
    empty = write(tmp_path, "{}\n", "results.json")
    said = assert_one_line_error(
        run_cli("report", str(empty)),
        f"{empty}: not a results document: it is an empty JSON object ({{}}); pass the results document a sweep "
        "wrote (the spec's output: `tilesweep run SPEC` writes it, `tilesweep merge SWEEP_DIR` writes it again)",
    )
    assert "missing top-level key" not in said and "has: nothing" not in said, said


def test_a_spec_given_for_a_results_document_is_named_as_one(tmp_path: Path) -> None:
    spec = write(tmp_path, {"dtypes": ["bfloat16"], "output": "results/mine.json"}, "my_sweep.json")
    for args in (["report", str(spec)], ["export", str(spec), "--out", str(tmp_path / "t.json")]):
        assert_one_line_error(run_cli(*args), f"{spec} is a sweep spec", "results/mine.json", "tilesweep run SPEC")
    assert not (tmp_path / "t.json").exists()


def test_a_spec_given_for_a_document_names_the_document_its_sweep_writes(tmp_path: Path) -> None:
    """The spec file where report, compare and --reuse read a results document (JSON or TOML):
    one line that says it is a spec and names the spec's output, the document to pass."""
    spec = REPO / "examples" / "small.json"
    doc = write(tmp_path, make_doc([rec(ms=1.0)]), "doc.json")
    output = json.loads(spec.read_text())["output"]
    for argv in (["report", str(spec)], ["compare", str(doc), str(spec), "--html", str(tmp_path / "c.html")]):
        assert_one_line_error(run_cli(*argv), f"{spec} is a sweep spec, not a results document", output)
    assert not (tmp_path / "c.html").exists()
    toml = write(tmp_path, 'output = "out/tiles.json"\ndtypes = ["float32"]\nseq_lens = [256]\n', "spec.toml")
    assert_one_line_error(run_cli("report", str(toml)), f"{toml} is a sweep spec", "out/tiles.json")
    untitled = write(tmp_path, json.dumps({"dtypes": ["float32"], "seq_lens": [256]}), "s.json")
    assert_one_line_error(run_cli("report", str(untitled)), "is a sweep spec", "attention_tiles.json")  # the default


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no such file"):
        results_doc.load(tmp_path / "nope.json")
    with pytest.raises(ResultsError, match="is a directory, not a results document; pass the document's file"):
        results_doc.load(tmp_path)
    (tmp_path / "sweep.json").write_text("{}")  # a sweep directory: its merge writes the document
    with pytest.raises(
        ResultsError, match=f"is a sweep directory, not a results document; `tilesweep merge {tmp_path}`"
    ):
        results_doc.load(tmp_path)


def test_stdlib_parser_gives_same_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, make_doc([rec(ms=1.25), rec(auto=True, ms=None)]))
    fast = results_doc.load(path)
    monkeypatch.setattr(results_doc, "_orjson", None)
    slow = results_doc.load(path)
    assert (fast.device, fast.config, fast.results) == (slow.device, slow.config, slow.results)


# --------------------------------------------------------------------------- CLI


def test_cli_report_text_json_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write(tmp_path, make_doc([rec(auto=True, ms=2.0), rec(ms=1.0), rec(ms=1.5, block_q=64)])))
    rc, out, _ = run_handler(["report", path], capsys)
    assert rc == 0 and "bq128 bk128 s2 w4" in out and "2.00x" in out
    rc, out, _ = run_handler(["report", path, "--json"], capsys)
    data = json.loads(out)
    assert rc == 0 and isinstance(data, list) and data[0]["speedup"] == 2.0
    rc, out, _ = run_handler(["report", path, "--markdown"], capsys)
    assert rc == 0 and out.startswith("| dtype |")
    with pytest.raises(SystemExit):
        parser().parse_args(["report", path, "--json", "--markdown"])


def test_cli_report_bad_file_raises_results_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ResultsError, match="no such file"):
        run_handler(["report", str(tmp_path / "missing.json")], capsys)


def test_cli_subprocess_one_line_error_exit_2(tmp_path: Path) -> None:
    bad = write(tmp_path, "[]", "bad.json")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.analysis", "report", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "not a results document" in proc.stderr
    good = write(tmp_path, make_doc([rec(ms=1.0)]), "good.json")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.analysis", "report", str(good)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0 and "bq128 bk128 s2 w4" in proc.stdout


@pytest.mark.parametrize(
    ("field", "value", "fragment", "readers"),
    [
        ("dtype", None, "results[1].dtype is null, expected a string", ("report", "compare", "export")),
        ("head_dim", "64", 'results[1].head_dim is "64", expected a positive integer', ("report",)),
        ("seq", True, "results[1].seq is true, expected a positive integer", ("report",)),
        ("median_ms", "fast", 'results[1].median_ms is "fast", expected a number or null', ("report",)),
    ],
)
def test_a_record_with_a_value_of_the_wrong_type_is_named_by_every_reader(
    tmp_path: Path, sample_doc: dict[str, Any], field: str, value: Any, fragment: str, readers: tuple[str, ...]
) -> None:
    """report, compare and export load a document through one loader: all three say one value's line."""
    sample_doc["results"][1][field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(sample_doc, indent=1))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({**sample_doc, "results": sample_doc["results"][2:]}, indent=1))
    every = {
        "report": ["report", str(bad)],
        "compare": ["compare", str(good), str(bad)],
        "export": ["export", str(bad), "--out", str(tmp_path / "tuned.json")],
    }
    for args in (every[reader] for reader in readers):
        r = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip() == f"tilesweep: error: {bad}: {fragment}; correct or remove that record", r.stderr
    assert not (tmp_path / "tuned.json").exists()


def test_tokamaxs_auto_is_said_as_tokamaxs_own_choice_not_a_question_mark(tmp_path: Path) -> None:
    """tokamax runs its own config for auto, which the document does not name: the report, its
    JSON and its page say whose choice it is instead of "?"."""
    tokamax: dict[str, Any] = {"impl": "tokamax-mosaic", "block_q": 64, "block_kv": 128, "persistent": True}
    tokamax.update(fold_q_sequence_heads=False, split_k=1)
    forced = {k: v for k, v in rec(ms=0.9).items() if k not in ("block_k", "num_warps")} | tokamax
    results = write(tmp_path, json.dumps(make_doc([{**rec(auto=True, ms=1.0), "impl": "tokamax-mosaic"}, forced])))
    page = tmp_path / "page.html"
    text = run_cli("report", str(results), "--html", str(page))
    assert text.returncode == 0, text.stderr
    (row,) = [line for line in text.stdout.splitlines() if "tokamax-mosaic" in line]
    assert "auto (tokamax's own choice)" in row and " ? " not in row, row
    (problem,) = json.loads(
        subprocess.check_output([sys.executable, "-m", "orchestrator", "report", str(results), "--json"], cwd=REPO)
    )
    assert problem["auto_label"] is None and problem["auto_choice"] == "tokamax's own choice"
    html = page.read_text()
    assert "auto (tokamax&#x27;s own choice)" in html and "(auto's config: <b>tokamax&#x27;s own choice</b>" in html


def test_the_legend_says_only_the_words_its_table_uses(tmp_path: Path) -> None:
    """A sweep of our kernel measured in full, with its shared-memory limit named, reads no
    words of halving, search, tokamax or a document that names no limit, in the text and the page."""
    limit = {"tag": "t", "smem_limit_bytes": 232448}
    plain = write(tmp_path, json.dumps(make_doc([rec(auto=True, ms=2.0), rec(ms=1.0, block_q=64)], config=limit)))
    page = tmp_path / "page.html"
    said = run_cli("report", str(plain), "--html", str(page))
    assert said.returncode == 0, said.stderr
    legend = said.stdout.strip().splitlines()[-1]
    assert legend.startswith("TFLOP/s of the best config") and "auto config: what auto runs there" in legend
    unused = ("screened out", "never measured", "not measured yet", "tokamax", "names no limit", "noise")
    for words in unused:
        assert words not in legend and words not in page.read_text(), words
    # a document that names no limit shows "?" for auto's config, and its legend says what that is
    unknown = write(tmp_path, json.dumps(make_doc([rec(auto=True, ms=2.0), rec(ms=1.0)])), "unknown.json")
    text = subprocess.check_output([sys.executable, "-m", "orchestrator", "report", str(unknown)], cwd=REPO, text=True)
    assert "? where the document names no limit" in text.strip().splitlines()[-1]


# --------------------------------------------------------------------------- a document of several devices


def _mixed_devices(tmp_path: Path) -> Path:
    """A document appended into with ``merge.mix_devices``: its device block the H100's, every
    record carrying its device; the A100's timings faster than the H100's for each config."""
    tiles = [(64, 32), (64, 64), (128, 32), (128, 64)]
    records = [{**rec(ms=0.3 + i, block_q=q, block_k=k), "device": "NVIDIA A100"} for i, (q, k) in enumerate(tiles)]
    records += [{**rec(ms=0.5 + i, block_q=q, block_k=k), "device": "NVIDIA H100"} for i, (q, k) in enumerate(tiles)]
    records.append({**rec(ms=9.0, seq=4096), "device": "NVIDIA A100"})
    return write(tmp_path, make_doc(records), "mixed.json")


def test_report_and_compare_of_a_document_of_several_devices_show_one_device_and_say_what_they_left_out(
    tmp_path: Path,
) -> None:
    doc = _mixed_devices(tmp_path)
    r = run_cli("report", str(doc), "--html", str(tmp_path / "page.html"))
    assert r.returncode == 0, r.stderr
    (row,) = [line for line in r.stdout.splitlines() if line.startswith("bfloat16")]  # the A100's seq 4096 is not
    assert "0.5000" in row and "0.3000" not in row and row.split()[-2:] == ["4", "0"], row  # 4 configs, 0 failed
    assert (
        f'{doc} holds records of 2 device kinds (merge.mix_devices): this report shows its 4 of "NVIDIA H100", '
        "leaving out 5 of \"NVIDIA A100\"; --device 'NVIDIA A100' picks another"
    ) in r.stderr
    page = (tmp_path / "page.html").read_text()
    assert ">0.5</text>" in page and ">0.3</text>" not in page and "4 records" in page
    # the page, sent on without the command's stderr, says what it left out too
    assert '<p class="note">' + escape(f"{doc} holds records of 2 device kinds") in page

    a100 = run_cli("report", str(doc), "--device", "NVIDIA A100", "--json", "--html", str(tmp_path / "a100.html"))
    assert a100.returncode == 0, a100.stderr
    assert sorted(p["best_ms"] for p in json.loads(a100.stdout)) == [0.3, 9.0]
    # the page's command for a tuned table exports the device it shows
    assert (
        f"tilesweep export {doc} --device &#x27;NVIDIA A100&#x27; --out tuned.json"
        in (tmp_path / "a100.html").read_text()
    )
    assert 'shows its 5 of "NVIDIA A100", leaving out 4 of "NVIDIA H100"' in a100.stderr
    assert_one_line_error(
        run_cli("report", str(doc), "--device", "NVIDIA B200"),
        f'{doc} holds no record of device "NVIDIA B200"; its records are of "NVIDIA A100", "NVIDIA H100": '
        "pass --device with one of those",
    )

    h100 = write(tmp_path, make_doc([rec(ms=1.0, block_q=64, block_k=32)]), "h100.json")
    c = run_cli("compare", str(h100), str(doc), "--json", "--html", str(tmp_path / "c.html"))
    assert c.returncode == 0, c.stderr
    assert (
        escape(f'{doc} holds records of 2 device kinds (merge.mix_devices): compare reads its 4 of "NVIDIA H100"')
        in (tmp_path / "c.html").read_text()
    )
    (both,) = [p for p in json.loads(c.stdout)["problems"] if p["presence"] == "both"]
    assert both["ratio_b_over_a"] == 0.5 and 'compare reads its 4 of "NVIDIA H100"' in c.stderr
    c = run_cli("compare", str(h100), str(doc), "--device", "NVIDIA A100")
    assert_one_line_error(c, f'{h100} holds no record of device "NVIDIA A100"')


def test_export_of_a_document_of_several_devices_tunes_its_own_device_only(tmp_path: Path) -> None:
    doc, out = _mixed_devices(tmp_path), tmp_path / "tuned.json"
    r = run_cli("export", str(doc), "--out", str(out))
    assert r.returncode == 0, r.stderr
    table = json.loads(out.read_text())
    assert table["device"]["device_kind"] == "NVIDIA H100"
    assert [(e["seq"], e["median_ms"]) for e in table["entries"]] == [(2048, 0.5)]
    assert 'dropped 5 of another device ("NVIDIA A100": 5 in' in r.stdout


def test_a_record_of_no_named_device_is_left_out_in_json_words(tmp_path: Path) -> None:
    doc = write(tmp_path, make_doc([{**rec(ms=1.0), "device": None}, rec(ms=2.0, block_q=64)]), "odd.json")
    r = run_cli("report", str(doc))
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == (
        f"tilesweep: note: {doc} holds records of 2 device kinds (merge.mix_devices): this report shows its 1 of "
        '"NVIDIA H100", leaving out 1 of null'
    )


def test_a_file_of_a_sweep_directory_given_for_a_document_names_the_document_its_merge_writes(tmp_path: Path) -> None:
    from tests.report_helpers import SMALL_SPEC

    out = tmp_path / "results" / "mine.json"
    spec = write(tmp_path, {**SMALL_SPEC, "modes": ["fwd"], "output": str(out)}, "spec.json")
    sweep = tmp_path / "sweep"
    planned = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
    assert planned.returncode == 0, planned.stderr
    (unit,) = (sweep / "units").glob("*.json")
    for given in (sweep / "sweep.json", sweep / "units.json", unit):
        for args in (["report", str(given)], ["compare", str(given), str(given)]):
            assert_one_line_error(
                run_cli(*args),
                f"{given} is a file of the sweep directory {sweep}, not a results document; pass its results "
                f"document, {out}, which `tilesweep merge {sweep}` writes",
            )


# --------------------------------------------------------------------------- implementations compared


def _tokamax(ms: float, spread: float, **shape: Any) -> dict[str, Any]:
    """A forced record of tokamax's Mosaic kernel, of ``rec``'s problem (``shape`` changed)."""
    tokamax: dict[str, Any] = {"impl": "tokamax-mosaic", "block_q": 64, "block_kv": 128, "persistent": True}
    tokamax.update(fold_q_sequence_heads=False, split_k=1)
    mine = rec(ms=ms, spread=spread, **shape)
    return {k: v for k, v in mine.items() if k not in ("block_k", "num_warps")} | tokamax


def test_implementations_timed_equal_or_within_their_spread_are_a_tie_not_a_win(tmp_path: Path) -> None:
    """Two implementations whose times are equal, or whose q1-q3 ranges overlap, are said to tie in
    the text, the markdown, the page and ``--json``; one whose range lies clear of the other's wins."""
    records = [rec(ms=1.0), _tokamax(1.0, 0.01)]  # equal
    records += [rec(ms=2.0, seq=4096), _tokamax(2.04, 0.05, seq=4096)]  # 2% apart, ranges overlapping
    records += [rec(ms=3.0, seq=8192, spread=0.001), _tokamax(3.3, 0.001, seq=8192)]  # 10% apart, clear
    results = write(tmp_path, make_doc(records))
    page = tmp_path / "page.html"
    said = run_cli("report", str(results), "--html", str(page))
    assert said.returncode == 0, said.stderr
    rows = {line.split()[2]: line for line in said.stdout.split("implementations compared")[1].splitlines()[2:5]}
    for seq in ("2048", "4096"):
        assert " tie " in rows[seq] and "tilesweep: bq128 bk128 s2 w4; tokamax-mosaic: 64/128" in rows[seq], rows[seq]
    assert " tie " not in rows["8192"] and " tilesweep " in rows["8192"], rows["8192"]
    assert "tie: the implementations' q1-q3 ranges overlap" in said.stdout
    markdown = run_cli("report", str(results), "--markdown").stdout
    assert markdown.count("| tie |") == 2, markdown
    html = page.read_text()
    assert html.count(" tie ") >= 2 and "tie: the implementations&#x27; q1-q3 ranges overlap" in html
    problems = json.loads(run_cli("report", str(results), "--json").stdout)
    for p in problems:
        tied = p["seq"] in (2048, 4096)
        assert p["winner_impl"] == (None if tied else "tilesweep"), p
        assert p["impl_tie"] == (["tilesweep", "tokamax-mosaic"] if tied else []), p


def test_implementations_tied_on_the_median_are_ranked_as_export_ranks_them_whatever_the_record_order(
    tmp_path: Path,
) -> None:
    """Two implementations whose best times are equal: the report ranks them by the tuned table's
    rule (``ranking.pick``), the lower q3 first, then config order, never by the order of the
    records: its text, markdown and ``--json`` rank them the same in both orders."""
    wide, steady = rec(ms=1.0, spread=0.05), _tokamax(1.0, 0.01)  # tilesweep's q3 is the higher
    level = [rec(ms=2.0, seq=4096), _tokamax(2.0, 0.01, seq=4096)]  # equal q3: config order (block_k < block_kv)
    said = []
    for name, records in (("ab", [wide, steady, *level]), ("ba", [steady, wide, *level[::-1]])):
        (tmp_path / name).mkdir()
        results = write(tmp_path / name, make_doc(records))
        text = run_cli("report", str(results)).stdout.split("implementations compared")[1]
        markdown = [
            row for row in run_cli("report", str(results), "--markdown").stdout.splitlines() if "| tie |" in row
        ]
        ties = {p["seq"]: p["impl_tie"] for p in json.loads(run_cli("report", str(results), "--json").stdout)}
        said.append((text, markdown, ties))
    assert said[0] == said[1], said
    assert said[0][2] == {2048: ["tokamax-mosaic", "tilesweep"], 4096: ["tilesweep", "tokamax-mosaic"]}, said[0][2]
    assert "tokamax-mosaic: 64/128/num_stages=2/persistent; tilesweep: bq128 bk128 s2 w4" in said[0][0], said[0][0]
