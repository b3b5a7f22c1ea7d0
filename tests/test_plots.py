"""plots: heatmap data (no matplotlib needed) and real PNG files (skipped without matplotlib)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import plots, report
from orchestrator.analysis.heatmap import heatmap_data
from orchestrator.errors import TilesweepError
from orchestrator.store import document as results_doc
from tests.conftest import SAMPLE, run_cli
from tests.helpers import assert_one_line_error, contrast
from tests.report_helpers import make_doc, merged_from_nothing, rec, run_handler, write

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
needs_mpl = pytest.mark.skipif(
    not HAVE_MPL, reason="matplotlib not installed (optional extra: pip install 'tilesweep[plots]')"
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def mixed_records() -> list[dict[str, Any]]:
    """fwd: bq32 row all failed, (64, 128) not run, (128, 128) half failed; fwd_bwd varying fwd blocks."""
    r = [rec(auto=True, ms=1.0)]
    for bq in (32, 64, 128):
        for bk in (64, 128):
            if (bq, bk) == (64, 128):
                continue
            for s in (1, 2):
                failed = bq == 32 or (bq, bk, s) == (128, 128, 2)
                r.append(
                    rec(ms=None if failed else bq / 100 + bk / 1000 + s / 10000, block_q=bq, block_k=bk, num_stages=s)
                )
    r += [
        rec("fwd_bwd", ms=3.0, bwd_outer=64, bwd_inner=32),
        rec("fwd_bwd", ms=2.5, bwd_outer=64, bwd_inner=32, fwd_block_q=64),
        rec("fwd_bwd", ms=None, bwd_outer=128, bwd_inner=32),
    ]
    return r


def test_heatmap_data_cells() -> None:
    groups = report.group_by_problem(mixed_records())
    (fk, fwd), (bk, bwd) = groups.items()
    d = heatmap_data(report.ProblemKey(*fk), fwd)
    assert d is not None
    assert (d.row_axis, d.col_axis, d.rows, d.cols) == ("block_q", "block_k", [32, 64, 128], [64, 128])
    assert [c.status for c in d.cells[0]] == ["failed", "failed"]
    assert (d.cells[0][0].n_failed, d.cells[0][0].n_total) == (2, 2)
    assert [c.status for c in d.cells[1]] == ["ok", "absent"]
    cell = d.cells[2][1]
    assert (cell.status, cell.detail, cell.n_failed) == ("ok", "s1 w4", 1)
    assert cell.median_ms == pytest.approx(1.28 + 0.128 + 0.0001)
    assert d.auto_ms == 1.0 and d.folded == "stages, warps"
    b = heatmap_data(report.ProblemKey(*bk), bwd)
    assert b is not None
    assert (b.row_axis, b.col_axis, b.rows, b.cols) == ("bwd_outer", "bwd_inner", [64, 128], [32])
    assert b.cells[0][0].median_ms == 2.5 and b.cells[0][0].detail.startswith("f64/128")
    assert b.cells[1][0].status == "failed" and "fwd blocks" in b.folded and b.auto_ms is None


def test_heatmap_data_none_without_forced_records() -> None:
    ((k, recs),) = report.group_by_problem([rec(auto=True, ms=1.0)]).items()
    assert heatmap_data(report.ProblemKey(*k), recs) is None


def test_missing_matplotlib_is_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    doc = results_doc.from_obj(make_doc([rec(ms=1.0)]))
    with pytest.raises(TilesweepError) as info:
        plots.write_plots(doc, tmp_path / "plots")
    assert info.value.message == "plots need matplotlib: pip install 'tilesweep[plots]'"


@needs_mpl
def test_plots_from_sample(sample_doc: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "plots"
    told: list[tuple[int, int]] = []  # progress: each problem as its heatmap is done
    written = plots.write_plots(results_doc.from_obj(sample_doc), out, on_problem=lambda *c: told.append(c)).files
    n = len(report.best_table(results_doc.from_obj(sample_doc)))
    assert told == [(k, n) for k in range(1, n + 1)]
    names = sorted(p.name for p in written)
    assert names == sorted(p.name for p in out.iterdir())
    assert "speedup_over_auto.png" in names
    assert "heatmap_bfloat16_d64_s2048_b4_h8_fwd_bwd.png" in names
    assert len(names) == 1 + len(report.best_table(results_doc.from_obj(sample_doc)))
    for p in written:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 10_000


@needs_mpl
def test_plots_failed_auto_only_and_tags(tmp_path: Path) -> None:
    records = mixed_records() + [rec(auto=True, ms=2.0, seq=4096, tag="other"), rec(ms=None, seq=4096, tag="other")]
    written = plots.write_plots(results_doc.from_obj(make_doc(records)), tmp_path).files
    names = {p.name for p in written}
    assert "heatmap_bfloat16_d64_s2048_b4_h8_fwd_t.png" in names  # several tags: tag in the name
    assert "heatmap_bfloat16_d64_s4096_b4_h8_fwd_other.png" in names
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in written)
    auto_only = plots.write_plots(results_doc.from_obj(make_doc([rec(auto=True, ms=1.0)])), tmp_path / "auto").files
    assert [p.name for p in auto_only] == ["speedup_over_auto.png"]


@needs_mpl
def test_cli_report_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path, make_doc([rec(auto=True, ms=2.0), rec(ms=1.0)]))
    rc, out, err = run_handler(["report", str(src), "--json", "--plots", str(tmp_path / "p")], capsys)
    assert rc == 0 and out.lstrip().startswith("[") and "wrote 2 plots" in err
    assert (tmp_path / "p" / "speedup_over_auto.png").exists()


@needs_mpl
def test_plots_of_a_document_with_no_record_say_why_none_was_drawn_and_what_measures_them(tmp_path: Path) -> None:
    """A sweep planned and never run, merged: no plot, and the line says why and names the
    commands of the sweep that wrote it; a document naming no sweep names `run`."""
    doc = merged_from_nothing(tmp_path, ["fwd", "fwd_bwd"])
    r = run_cli("report", str(doc), "--plots", str(tmp_path / "p"))
    assert r.returncode == 0 and "wrote 0 plots" not in r.stderr, r.stderr
    sweep = tmp_path / "sweep"
    assert r.stderr.splitlines()[-1] == (
        f"tilesweep: note: no plot written to {tmp_path / 'p'}: {doc} holds no record: none of its 2 planned "
        f"problems was measured; `tilesweep status {sweep}` says why, `tilesweep resume {sweep}` measures them"
    )
    bare = write(tmp_path, make_doc([]), "bare.json")
    r = run_cli("report", str(bare), "--plots", str(tmp_path / "q"))
    assert r.returncode == 0 and r.stderr.splitlines()[-1].endswith(
        "holds no record; measure its problems first (`tilesweep run SPEC`)"
    ), r.stderr


@needs_mpl
def test_cli_plots_cap_says_what_it_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_handler(["report", str(SAMPLE), "--plots", str(tmp_path / "p"), "--max-plots", "1"], capsys)
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "heatmap_bfloat16_d64_s2048_b4_h8_fwd.png",
        "speedup_over_auto.png",
    ]
    assert "plotted the first 1 of 3 problems (--max-plots 1); 2 not plotted: --max-plots 0 plots all" in err
    assert "--html OUT.html shows every problem" in err
    assert_one_line_error(
        run_cli("report", str(SAMPLE), "--plots", str(tmp_path), "--max-plots", "-1"), "--max-plots", "0 or more"
    )


def test_max_plots_without_plots_is_refused_not_dropped() -> None:
    r = run_cli("report", str(SAMPLE), "--max-plots", "2")
    assert_one_line_error(r, "--max-plots caps what --plots DIR draws: add --plots DIR, or drop --max-plots")
    assert r.stdout == ""


def test_a_plot_cut_short_leaves_the_earlier_file_whole_and_no_temp_beside_it(tmp_path: Path) -> None:
    """A full disk (or a stop) while a PNG is written: the earlier PNG at that path is whole, and
    no half-written file or temp file is left."""
    import errno
    from types import SimpleNamespace

    earlier = tmp_path / "heatmap.png"
    earlier.write_bytes(b"\x89PNG whole")

    class Full:
        def savefig(self, f: Any, **_: Any) -> None:
            f.write(b"\x89PNG cut")
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        plots._save(SimpleNamespace(canvas=lambda fig: None), Full(), earlier)  # type: ignore[arg-type]
    assert earlier.read_bytes() == b"\x89PNG whole" and [p.name for p in tmp_path.iterdir()] == ["heatmap.png"]


@needs_mpl
def test_a_heatmap_where_no_config_was_timed_draws_no_scale_of_made_up_times() -> None:
    """Every config of the problem failed: its PNG shows the failed cells and says no config was
    timed, with no colour bar beside them (there is no time to scale); a timed problem has one."""
    mpl = plots._matplotlib()
    key = report.ProblemKey("bfloat16", 64, 2048, 4, 8, "fwd", "t")
    for records, timed in (([rec(ms=None), rec(ms=None, block_q=64)], False), ([rec(ms=None), rec(ms=1.5)], True)):
        data = heatmap_data(key, records)
        assert data is not None
        fig = plots._heatmap_figure(mpl, data, False)
        bars = [ax for ax in fig.axes if ax.get_ylabel().startswith("median time per call")]
        assert len(bars) == timed and ("no config timed in full" in fig.axes[0].get_title()) != timed


@needs_mpl
def test_every_label_on_a_plotted_cell_reads_on_its_colour() -> None:
    """The PNG heatmap's texts (a time and its config on each timed cell across the colour scale,
    "not run" on a blank one, a failed cell's boxed label) contrast with what is under them at
    WCAG's 4.5:1, as the page's cells do."""
    from matplotlib.colors import to_rgb

    mpl = plots._matplotlib()
    key = report.ProblemKey("bfloat16", 64, 2048, 4, 8, "fwd", "t")
    tiles = [(q, k) for q in (16, 32, 64, 128) for k in (16, 32, 64, 128)]
    records = [rec(ms=1.0 * 1.3**n, block_q=q, block_k=k) for n, (q, k) in enumerate(tiles[:13])]
    records += [rec(ms=None, block_q=tiles[13][0], block_k=tiles[13][1])]  # two more have no record
    data = heatmap_data(key, records)
    assert data is not None
    fig = plots._heatmap_figure(mpl, data, False)
    ax = fig.axes[0]
    cmap, norm = plots._time_scale(mpl, data)

    def rgb255(colour: Any) -> tuple[int, int, int]:
        r, g, b = to_rgb(colour)
        return round(r * 255), round(g * 255), round(b * 255)

    checked = []
    for t in ax.texts:
        x, y = t.get_position()
        cell = data.cells[round(y)][round(x)]
        box = t.get_bbox_patch()
        if box is not None:
            under = box.get_facecolor()
        elif cell.status == "ok" and cell.median_ms is not None:
            under = cmap(norm(cell.median_ms))
        else:
            under = "white"
        checked.append((t.get_text(), round(contrast(rgb255(t.get_color()), rgb255(under)), 2)))
    assert len(checked) == 2 * 13 + 1 + 2 and "not run" in {text for text, _ in checked}
    assert [(text, ratio) for text, ratio in checked if ratio < 4.5] == []
