"""What a merge keeps of the document it replaces, as a user meets it (a new process per
command, real sweep directories and files): a document another sweep measured is kept as
``.prev`` even where this sweep measured the same items again, and a merge with no record at all
leaves a document that holds records as it is."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import assert_one_line_error, run_cli


def _records(path: Path) -> list[dict]:
    return json.loads(path.read_text())["results"]


def test_a_document_of_another_sweep_replaced_by_the_same_items_is_kept_as_prev(tmp_path: Path) -> None:
    a, _ = build_sweep(tmp_path / "a", small_spec(n_seqs=1), 2, output=tmp_path / "a.json")
    b, _ = build_sweep(tmp_path / "b", small_spec(n_seqs=2), 2, output=tmp_path / "b.json", seed=1)
    assert run_cli("merge", str(a.root)).returncode == 0
    out = tmp_path / "copy.json"
    shutil.copy(tmp_path / "a.json", out)  # A's document, where B is now merged
    before = out.read_bytes()
    r = run_cli("merge", str(b.root), "--output", str(out))
    assert r.returncode == 0, r.stderr  # every record of A's is an item of B's plan: nothing foreign
    assert f"kept as {out}.prev" in r.stdout, r.stdout
    assert (tmp_path / "copy.json.prev").read_bytes() == before
    assert len(_records(out)) == b.planned
    # A's own document, its key index beside it (judged through the index, its head alone read)
    before = (tmp_path / "a.json").read_bytes()
    r = run_cli("merge", str(b.root), "--output", str(tmp_path / "a.json"))
    assert r.returncode == 0 and f"kept as {tmp_path / 'a.json'}.prev" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "a.json.prev").read_bytes() == before
    # B merged again over its own output: nothing set aside again
    (tmp_path / "copy.json.prev").unlink()
    r = run_cli("merge", str(b.root), "--output", str(out))
    assert r.returncode == 0 and "kept as" not in r.stdout and not (tmp_path / "copy.json.prev").exists()


def test_another_sweep_directory_of_the_same_spec_keeps_the_document_it_replaces(tmp_path: Path) -> None:
    """Two directories of one spec (a second run, a --remeasure) measured the same items apart:
    neither's merge silently replaces the other's measurements."""
    out = tmp_path / "results.json"
    first, _ = build_sweep(tmp_path / "first", small_spec(n_seqs=1), 2, output=out)
    second, _ = build_sweep(tmp_path / "second", small_spec(n_seqs=1), 2, output=out, seed=1)
    assert run_cli("merge", str(first.root)).returncode == 0
    before = out.read_bytes()
    r = run_cli("merge", str(second.root))
    assert r.returncode == 0 and f"kept as {out}.prev" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "results.json.prev").read_bytes() == before
    assert json.loads(out.read_text())["tilesweep"]["sweep_dir"] == str(second.root)
    (tmp_path / "results.json.prev").unlink()
    r = run_cli("merge", "second", cwd=tmp_path)  # the same sweep named from its folder: nothing set aside
    assert r.returncode == 0 and "kept as" not in r.stdout and not (tmp_path / "results.json.prev").exists()


def test_a_merge_with_no_record_leaves_a_document_with_records_as_it_is(tmp_path: Path) -> None:
    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, output=tmp_path / "results.json")
    assert run_cli("merge", str(sd.root)).returncode == 0
    out = tmp_path / "results.json"
    before = out.read_bytes()
    for partial in (sd.root / "partials").glob("*.jsonl"):  # lost, as a user may lose them
        partial.unlink()
    r = run_cli("merge", str(sd.root))
    assert_one_line_error(r, "no partial of", f"{out} holds {sd.planned}", "left as it is", "--overwrite")
    assert out.read_bytes() == before and not (tmp_path / "results.json.prev").exists()
    r = run_cli("merge", str(sd.root), "--overwrite")  # asked for: emptied, the old one kept
    assert r.returncode == 0 and _records(out) == [] and (tmp_path / "results.json.prev").read_bytes() == before


def test_a_second_shrinking_merge_keeps_the_first_documents_records(tmp_path: Path) -> None:
    """Partials purged one after another: the first shrinking merge keeps the whole document as
    ``.prev``; the next would replace that ``.prev`` with a smaller one, so it is refused."""
    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=2), 3, output=tmp_path / "results.json")
    out, prev = tmp_path / "results.json", tmp_path / "results.json.prev"
    assert run_cli("merge", str(sd.root)).returncode == 0
    whole = out.read_bytes()
    first, second, *_ = sorted((sd.root / "partials").glob("*.jsonl"))
    first.unlink()
    r = run_cli("merge", str(sd.root))
    assert r.returncode == 0 and prev.read_bytes() == whole, r.stderr
    shrunk = out.read_bytes()
    second.unlink()
    r = run_cli("merge", str(sd.root))
    assert_one_line_error(r, f"{out} holds {len(_records(out))} records", "already keeps an earlier document")
    assert out.read_bytes() == shrunk and prev.read_bytes() == whole
    r = run_cli("merge", str(sd.root), "--overwrite")  # asked for: the .prev is the document before
    assert r.returncode == 0 and prev.read_bytes() == shrunk, r.stderr


def test_a_merge_output_that_is_a_device_a_link_or_no_file(tmp_path: Path) -> None:
    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 1, output=tmp_path / "results.json")
    r = run_cli("merge", str(sd.root), "--output", os.devnull)  # renamed into place, it would replace the node
    assert_one_line_error(r, f"the output {os.devnull} is a device, not a regular file")
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)
    for name in ("", f"{tmp_path}/new-folder/"):
        assert_one_line_error(run_cli("merge", str(sd.root), "--output", name), "names no file")
    assert not (tmp_path / "new-folder").exists()
    (tmp_path / "kept").mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "kept" / "results.json")
    assert run_cli("merge", str(sd.root), "--output", str(link)).returncode == 0
    assert link.is_symlink() and len(_records(tmp_path / "kept" / "results.json")) == sd.planned


def test_a_prev_that_is_a_directory_leaves_the_document_as_it_was(tmp_path: Path) -> None:
    """The document a merge replaces is kept as ``.prev``; where a directory has that name, the
    merge is refused before it writes, not after (the document was replaced, then the rename of
    the old one failed and left it under a hidden temp name)."""
    a, _ = build_sweep(tmp_path / "a", small_spec(n_seqs=1), 2, output=tmp_path / "a.json")
    b, _ = build_sweep(tmp_path / "b", small_spec(n_seqs=2), 2, output=tmp_path / "b.json", seed=1)
    out = tmp_path / "b.json"
    assert run_cli("merge", str(b.root)).returncode == 0
    before = out.read_bytes()
    (tmp_path / "b.json.prev").mkdir()
    r = run_cli("merge", str(a.root), "--output", str(out), "--overwrite")  # fewer records: the old is kept
    assert_one_line_error(r, f"{out}.prev is a directory, where the merge keeps the document it replaces")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".b.json.prev")) == []
