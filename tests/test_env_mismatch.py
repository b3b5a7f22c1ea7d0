"""A sweep whose ``env.json`` names another environment than its workers': the worker run by
hand, ``status`` and ``resume`` each say so in one line, naming the fields that differ with their
values as a JSON file spells them (``"0.4.0"``, ``null``), never Python's (``'0.4.0'``, ``None``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import REPO, assert_one_line_error, records_written, replay_specs, run_cli

OTHER = {"jax": "0.4.0", "jaxlib": "0.4.0"}


def test_another_environment_is_said_field_by_field_in_json_spelling(tmp_path: Path) -> None:
    specs = replay_specs(tmp_path, lambda k: 0.0, "local")
    sweep = tmp_path / "sweep"
    r = run_cli("run", str(specs["instant"]), "--sweep-dir", str(sweep), "--units", "2")
    assert r.returncode == 0, r.stderr
    ours = json.loads((sweep / "env.json").read_text())
    assert ours["jaxlib"] is None and ours["jax"] != OTHER["jax"], ours  # a replay imports no jaxlib
    diff = f'jax {json.dumps(ours["jax"])} vs "0.4.0", jaxlib null vs "0.4.0"'
    other = tmp_path / "other"
    shutil.copytree(sweep, other)
    first, second = (u["id"] for u in json.loads((other / "units.json").read_text()))
    (other / "done" / f"{first}.json").unlink()
    (other / "partials" / f"{first}.jsonl").unlink()
    (other / "env.json").write_text(json.dumps({**ours, **OTHER}) + "\n")

    worker = subprocess.run(
        [sys.executable, "-m", "jobs.worker", str(other), first], cwd=REPO, capture_output=True, text=True
    )
    line = assert_one_line_error(worker, f"(this worker's vs the sweep's: {diff}; see {other / 'env.json'})")
    assert "'" not in line.replace("worker's", "").replace("sweep's", ""), line

    shown = run_cli("status", str(other))
    said = next(ln for ln in shown.stdout.splitlines() if ln.strip().startswith(second))
    assert f"measured in another environment (its vs this sweep's: {diff})" in said, shown.stdout

    line = assert_one_line_error(
        run_cli("resume", str(other)),
        f"{second}.jsonl was measured in another environment (its vs the sweep's in {other / 'env.json'}: {diff})",
    )
    assert "None" not in line, line


def test_a_partial_whose_header_names_no_environment_is_said_in_words(tmp_path: Path) -> None:
    """A header without ``env`` (written by hand, or by a tool of its own) is said to name none,
    with the sweep's fields, by status and resume: never ``null vs {...}``, a JSON object dumped."""
    specs = replay_specs(tmp_path, lambda k: 0.0, "local")
    sweep = tmp_path / "sweep"
    assert run_cli("run", str(specs["instant"]), "--sweep-dir", str(sweep), "--units", "2").returncode == 0
    ours = json.loads((sweep / "env.json").read_text())
    first = json.loads((sweep / "units.json").read_text())[0]["id"]
    partial = sweep / "partials" / f"{first}.jsonl"
    lines = [json.loads(line) for line in partial.read_text().splitlines()]
    headers = [line["header"] for line in lines if "header" in line]
    assert headers and all(h.pop("env") == ours for h in headers), lines
    partial.write_text("".join(json.dumps(line) + "\n" for line in lines))
    fields = ", ".join(f"{k} {json.dumps(v)}" for k, v in ours.items())

    shown = run_cli("status", str(sweep))
    said = next(ln for ln in shown.stdout.splitlines() if ln.strip().startswith(first))
    assert f"measured in an environment its header does not name (this sweep's: {fields})" in said, shown.stdout

    line = assert_one_line_error(
        run_cli("resume", str(sweep)),
        f"{first}.jsonl was measured in an environment its header does not name "
        f"(the sweep's in {sweep / 'env.json'}: {fields}); resume refuses to mix them",
    )
    assert "null vs" not in line and "{" not in line, line


def test_a_damaged_env_json_of_a_sweep_with_records_is_said_with_the_command_that_restores_it(tmp_path: Path) -> None:
    """``env.json`` cut short in a sweep whose workers have written records: ``status`` names the
    command that writes back the environment their partial headers name, and once it has run,
    status and merge take every record, none lost."""
    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    env = sd.root / "env.json"
    whole = env.read_text()
    env.write_text(whole[:10])
    said = assert_one_line_error(run_cli("status", str(sd.root)), str(env), "keeps their records")
    assert "delete it" not in said, said
    command = said.split("keeps their records: ", 1)[1]
    assert subprocess.run(["bash", "-c", command], capture_output=True).returncode == 0, command
    assert env.read_text() == whole
    status = run_cli("status", str(sd.root))
    assert "complete, not merged" in status.stdout and not status.stderr, status
    assert run_cli("merge", str(sd.root)).returncode == 0
    assert len(json.loads((tmp_path / "out.json").read_text())["results"]) == records_written(sd.root)
