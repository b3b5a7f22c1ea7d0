"""A replay is never taken for a measurement: its virtual records never supersede measured ones,
enter a tuned table or a measured sweep's reuse only when asked (``--include-replays``), and every
command that shows them says they are replayed. Through the CLI, on a replay of the excerpt run
by ``tilesweep run`` itself."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLE, run_cli
from tests.helpers import assert_one_line_error


@dataclass(frozen=True)
class Replayed:
    """A replay of ``source`` run through the CLI: its spec, sweep directory and document."""

    spec: Path
    sweep: Path
    doc: Path
    source: Path


def replay_of(folder: Path, source: Path, spec: dict[str, Any], **over: Any) -> Replayed:
    """Run a replay of ``source`` with ``spec`` (the excerpt's config) as a user would."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        **spec,
        "output": str(folder / "replay.json"),
        "kernel": {"impl": "replay", "prune_smem": "off"},
        "replay": {"source": str(source)},
        "executor": {"kind": "debug"},
        **over,
    }
    path = folder / "replay-spec.json"
    path.write_text(json.dumps(data))
    r = run_cli("run", str(path), "--sweep-dir", str(folder / "sweep"))
    assert r.returncode == 0, r.stderr
    return Replayed(path, folder / "sweep", folder / "replay.json", source)


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    """The excerpt's problems at seq 2048 replayed from the excerpt (416 records, 159 of them of
    configs the excerpt measured)."""
    config = json.loads(SAMPLE.read_text())["config"]
    return replay_of(tmp_path_factory.mktemp("replay"), SAMPLE, {**config, "seq_lens": [2048]})


def _table(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_export_keeps_the_measurements_beside_their_replay(replay: Replayed, tmp_path: Path) -> None:
    measured = tmp_path / "measured.json"
    assert run_cli("export", str(SAMPLE), "--out", str(measured)).returncode == 0
    both = tmp_path / "both.json"
    r = run_cli("export", str(SAMPLE), str(replay.doc), "--out", str(both))
    assert r.returncode == 0, r.stderr
    assert f"dropped 416 replayed records (416 in {replay.doc}: a replay's times" in r.stdout, r.stdout
    assert "superseded" not in r.stdout and "--include-replays" in r.stdout
    assert _table(both) == _table(measured)  # the measurements' table, the measured device block
    assert _table(both)["device"]["backend"] == "gpu"

    asked = tmp_path / "asked.json"
    r = run_cli("export", str(SAMPLE), str(replay.doc), "--out", str(asked), "--include-replays")
    assert r.returncode == 0, r.stderr
    assert "159 replayed records set aside for a measured one" in r.stdout, r.stdout
    assert "(257 of them replayed, not measured: --include-replays)" in r.stdout
    assert _table(asked) == _table(measured)  # the replay measured nothing more that times


def test_a_replay_alone_is_refused_by_export_unless_asked(replay: Replayed, tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    r = run_cli("export", str(replay.doc), "--out", str(out))
    assert_one_line_error(r, str(replay.doc), "is replayed", "--include-replays")
    assert not out.exists()
    r = run_cli("export", str(replay.doc), "--out", str(out), "--include-replays")
    assert r.returncode == 0, r.stderr
    table = _table(out)
    assert table["entries"] and all(e["replayed"] is True for e in table["entries"])
    assert table["replayed"] == len(table["entries"]) and table["device"]["backend"] == "replay"
    assert f"{len(table['entries'])} of them replayed, not measured" in r.stdout


def test_compare_report_page_status_and_ls_say_replayed(replay: Replayed, tmp_path: Path) -> None:
    r = run_cli("compare", str(SAMPLE), str(replay.doc))
    assert r.returncode == 0, r.stderr
    a, b = r.stdout.splitlines()[:2]
    assert a == f"A: {SAMPLE} (NVIDIA H100, jax 0.11.2)"
    assert b.startswith(f"B: {replay.doc} (NVIDIA H100, jax 0.11.2; every record replayed from {SAMPLE}: ")
    both = [line for line in r.stdout.splitlines()[3:] if "only in" not in line and " fwd" in line]
    assert len(both) == 3 and all("B replayed" in line for line in both)
    cmp = json.loads(run_cli("compare", str(SAMPLE), str(replay.doc), "--json").stdout)
    assert cmp["a"]["replayed"] is None and cmp["b"]["replayed"].startswith("every record replayed")
    assert all(p["b"]["replayed"] for p in cmp["problems"] if p["b"] is not None)

    text = run_cli("report", str(replay.doc)).stdout.splitlines()
    rows = text[1:9]
    assert all(row.split("  ")[-1].startswith("replayed") for row in rows), rows
    assert "replayed: times drawn on a virtual clock" in text[-1]
    rows_json = json.loads(run_cli("report", str(replay.doc), "--json").stdout)
    assert all(row["replayed"] for row in rows_json)
    assert not any(row["replayed"] for row in json.loads(run_cli("report", str(SAMPLE), "--json").stdout))
    page = tmp_path / "page.html"
    assert run_cli("report", str(replay.doc), "--html", str(page)).returncode == 0
    assert f"<dt>replayed</dt><dd>every record replayed from {SAMPLE}: times drawn" in page.read_text()

    status = run_cli("status", str(replay.sweep))
    assert status.stdout.splitlines()[1] == (
        f"replayed from {SAMPLE}: its records' times are drawn on a virtual clock, not measured"
    )
    assert json.loads(run_cli("status", str(replay.sweep), "--json").stdout)["replay_of"] == str(SAMPLE)
    (listed,) = run_cli("ls", str(replay.sweep.parent)).stdout.splitlines()
    assert listed.endswith("replayed, not measured")


def test_a_measured_sweep_reuses_a_replay_only_when_asked(tmp_path: Path) -> None:
    """A replay whose source was measured on this machine's stack, so that nothing but being a
    replay keeps its records from standing for this machine's measurements."""
    from jobs.worker import device_block

    source = json.loads(SAMPLE.read_text())
    source["device"] = dict(device_block())
    here = tmp_path / "here.json"
    here.write_text(json.dumps(source, indent=1))
    narrow = {**source["config"], "dtypes": ["bfloat16"], "head_dims": [64], "seq_lens": [2048], "modes": ["fwd"]}
    replay = replay_of(tmp_path / "replay", here, narrow)
    measured = {**narrow, "output": str(tmp_path / "measured.json"), "kernel": {"interpret": True}}
    spec = tmp_path / "measured-spec.json"
    spec.write_text(json.dumps(measured))

    r = run_cli("plan", str(spec), "--dry-run", "--reuse", str(replay.doc))
    assert r.returncode == 0, r.stderr
    assert "nothing reused: every planned item is measured" in r.stdout
    assert f"not reused from {replay.doc}: 55 replayed, not measured (--include-replays reuses them)" in r.stdout
    r = run_cli("plan", str(spec), "--dry-run", "--reuse", str(replay.doc), "--include-replays")
    assert "reused 55 items recorded before (not measured again; 55 of them replayed, not measured)" in r.stdout
    asked = tmp_path / "asked-spec.json"
    asked.write_text(json.dumps({**measured, "reuse": {"documents": [str(replay.doc)], "replays": True}}))

    r = run_cli("run", str(asked), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    assert "reused 55 items recorded before (not measured again; 55 of them replayed, not measured)" in r.stderr
    doc = json.loads((tmp_path / "measured.json").read_text())
    assert len(doc["results"]) == 55 and all(rec["timer"] == "virtual" for rec in doc["results"])
    assert all(rec["reused_from"].endswith("(replayed)") for rec in doc["results"])
    (row,) = json.loads(run_cli("report", str(tmp_path / "measured.json"), "--json").stdout)
    assert row["replayed"] and row["note"].startswith("replayed")
    carried = "55 of 55 records carried from earlier documents (not measured again): 55 from "
    said = f"\nreused: {carried}{replay.doc}; all of them replayed, not measured\n"
    assert said in run_cli("report", str(tmp_path / "measured.json")).stdout
