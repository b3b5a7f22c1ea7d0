"""An export onto a disk that fills up, as a user meets it: one line that says the disk is full
and what to do, the tuned table there left as it was and no ``.prev`` of it (which would refuse
the export run again), and once space is freed the same export writes the table. The disk is a
real filesystem of 2 MiB (a tmpfs mounted for the test), filled with a real file."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.store import synthetic
from tests.helpers import TINY_SPEC, assert_one_line_error, run_cli
from tests.test_full_disk import FREE_SPACE, SmallDisk, tmpfs

PAGE = 4096  # what the tmpfs allocates a file's bytes in


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with tmpfs(tmp_path / "disk", "size=2m") as root:
        yield SmallDisk(root)


def _document(tmp_path: Path, name: str, seq_lens: list[int]) -> Path:
    """A finished sweep's results document of the tiny spec at ``seq_lens`` (fwd and fwd_bwd)."""
    path = tmp_path / name
    path.write_text(json.dumps(synthetic.document({**TINY_SPEC, "seq_lens": seq_lens, "output": str(path)})))
    return path


def _tokamax_document(tmp_path: Path, mode: str) -> Path:
    """A synthetic results document of tokamax's Triton kernel on an H100 (float16 d64 s1024,
    ``mode``), written in ``tmp_path`` (not on the small disk)."""
    doc = tmp_path / "tokamax.json"
    spec = {
        "output": str(doc),
        "dtypes": ["float16"],
        "head_dims": [64],
        "seq_lens": [1024],
        "modes": [mode],
        "kernel": {"impl": "tokamax-triton", "device_kind": "NVIDIA H100"},
    }
    doc.write_text(json.dumps(synthetic.document(spec)))
    return doc


def _room_for_one_page(disk: SmallDisk) -> None:
    """Fill the disk, then give back one page: room for a small file (a ``.prev`` of a small
    table), none for a larger one."""
    disk.fill()
    whole = os.path.getsize(disk.filler) // PAGE * PAGE
    os.truncate(disk.filler, max(0, whole - PAGE))


def test_an_export_onto_a_full_disk_says_to_free_space_keeps_the_table_there_and_runs_once_freed(
    disk: SmallDisk, tmp_path: Path
) -> None:
    out = disk.root / "tuned.json"
    small = _document(tmp_path, "small.json", [64])
    assert run_cli("export", str(small), "--out", str(out)).returncode == 0
    table = out.read_bytes()
    other = _document(tmp_path, "other.json", [128 * k for k in range(2, 40)])  # drops the small one's entries
    _room_for_one_page(disk)
    said = assert_one_line_error(run_cli("export", str(other), "--out", str(out)), f"{out}: cannot write", FREE_SPACE)
    assert said.endswith("then export again"), said
    assert sorted(p.name for p in disk.root.iterdir()) == sorted([out.name, disk.filler.name])  # no .prev, no temp
    assert out.read_bytes() == table
    disk.free()
    r = run_cli("export", str(other), "--out", str(out))
    assert r.returncode == 0 and "the table before is kept as tuned.json.prev" in r.stdout, r.stdout + r.stderr
    assert (disk.root / "tuned.json.prev").read_bytes() == table


def test_a_tokamax_export_onto_a_full_disk_says_to_free_space_and_runs_once_freed(
    disk: SmallDisk, tmp_path: Path
) -> None:
    doc = _tokamax_document(tmp_path, "fwd")
    out = disk.root / "tables"
    disk.fill()
    said = assert_one_line_error(run_cli("export", str(doc), "--format", "tokamax", "--out", str(out)), FREE_SPACE)
    assert "cannot write tokamax's table" in said and said.endswith("then export again"), said
    disk.free()
    r = run_cli("export", str(doc), "--format", "tokamax", "--out", str(out))
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {out}/nvidia_h100/"), r.stdout + r.stderr


def test_a_document_copied_onto_a_disk_that_filled_is_said_to_stop_part_way_through(
    disk: SmallDisk, tmp_path: Path
) -> None:
    """``cp`` of a results document onto a disk that fills leaves the first part of it: export says
    the file stops part way through and how to get it whole, not the parser's words alone."""
    doc = _document(tmp_path, "doc.json", [64, 128])
    _room_for_one_page(disk)
    copy = disk.root / "doc.json"
    with pytest.raises(OSError):
        shutil.copyfile(doc, copy)
    assert 0 < copy.stat().st_size < doc.stat().st_size
    said = assert_one_line_error(run_cli("export", str(copy), "--out", str(tmp_path / "tuned.json")))
    assert said.startswith(f"tilesweep: error: {copy}: not a results document: the file ends before its JSON"), said
    assert said.endswith("copy it again, or write a sweep's document again with `tilesweep merge SWEEP_DIR`"), said


def test_a_tokamax_export_whose_vjp_table_finds_the_disk_full_writes_neither_and_names_both(
    disk: SmallDisk, tmp_path: Path
) -> None:
    """A fwd_bwd export writes two tables, the forward's and its vjp's; a disk with room for the
    forward's alone: the line names the table that could not be written and the one that was not
    written with it, neither is there (tokamax would run a forward ranked with a vjp it cannot
    find), and once space is freed the same export writes both."""
    doc = _tokamax_document(tmp_path, "fwd_bwd")
    elsewhere = tmp_path / "elsewhere"
    assert main(["export", str(doc), "--format", "tokamax", "--out", str(elsewhere)]) == 0  # the tables as they are
    fwd, vjp = (
        elsewhere / "nvidia_h100" / name
        for name in ("pallas_triton_flash_attention.json", "pallas_triton_flash_attention_vjp.json")
    )
    assert fwd.stat().st_size > PAGE  # the forward's table is the larger: room for it is none for both
    out = disk.root / "tables"
    disk.fill()
    whole = os.path.getsize(disk.filler) // PAGE * PAGE
    os.truncate(disk.filler, max(0, whole - -(-fwd.stat().st_size // PAGE) * PAGE))  # room for the forward's only
    said = assert_one_line_error(run_cli("export", str(doc), "--format", "tokamax", "--out", str(out)), FREE_SPACE)
    folder = out / "nvidia_h100"
    assert said.startswith(f"tilesweep: error: {folder / vjp.name}: cannot write tokamax's table"), said
    assert f"{folder / fwd.name} is not written either" in said and said.endswith("then export again"), said
    assert not folder.exists() or sorted(p.name for p in folder.iterdir()) == []
    disk.free()
    r = run_cli("export", str(doc), "--format", "tokamax", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split(":")[0] for line in r.stdout.splitlines()] == [
        f"wrote {folder / fwd.name}",
        f"wrote {folder / vjp.name}",
    ]
    assert (folder / fwd.name).read_bytes() == fwd.read_bytes() and (folder / vjp.name).read_bytes() == vjp.read_bytes()
