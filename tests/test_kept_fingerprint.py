"""A sweep directory keeps the fingerprint it was planned with, whatever rule hashes its spec now:
``sweep.json``, its partials' headers and the documents it merged name it, and every command
reads the sweep as the sweep it is. A spec file given for it is held to its spec by this
release's rule, both specs hashed afresh, so the user's own spec file is taken and a spec that
changes what is measured is still refused naming the field. Another rule is simulated: the sweep
is planned and run by a process whose ``SweepSpec.fingerprinted`` counts a grid section as it is
written, a tunable given its default values and an empty grid too (this rule counts neither)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchestrator.spec.files import load_spec
from orchestrator.store.sweepdir import SweepDir
from tests.helpers import MOSAIC_SPEC, REPO, assert_one_line_error, run_cli, sample_replay_spec

# the CLI under another rule: it counts a grid section as written, "grid": {} too
OTHER_RULE = """
import sys
from orchestrator.spec.model import SweepSpec
rule = SweepSpec.fingerprinted
def other(self):
    counted = rule(self)
    if self.grid is not None:
        counted["grid"] = self.model_dump(mode="json")["grid"]
    return counted
SweepSpec.fingerprinted = other
from orchestrator.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _by_another_rule(command: str, spec: Path, sweep: Path) -> str:
    """``tilesweep COMMAND SPEC --sweep-dir SWEEP`` run by the other rule; the fingerprint it
    planned the sweep with (another than this rule's)."""
    args = [sys.executable, "-c", OTHER_RULE, command, str(spec), "--sweep-dir", str(sweep)]
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    kept = json.loads((sweep / "sweep.json").read_text())["fingerprint"]
    assert kept != load_spec(str(spec)).fingerprint()  # the rules differ on this spec
    return str(kept)


def _planned_by_another_rule(tmp_path: Path) -> tuple[Path, Path, str]:
    """bf16 d64 s2048 fwd (55 items) replayed in two units, its spec's grid section empty, planned,
    run and merged by the other rule: the spec file, the sweep directory, its fingerprint."""
    shape = {"dtypes": ["bfloat16"], "head_dims": [64], "seq_lens": [2048], "modes": ["fwd"]}
    spec = sample_replay_spec(tmp_path / "spec.json", tmp_path / "out.json", **shape, sharding={"units": 2}, grid={})
    sweep = tmp_path / "sweep"
    kept = _by_another_rule("run", spec, sweep)
    assert len(json.loads((tmp_path / "out.json").read_text())["results"]) == 55
    return spec, sweep, kept


def test_a_sweep_planned_by_another_rule_is_read_finished_merged_and_resumed_as_it_is(tmp_path: Path) -> None:
    spec, sweep, kept = _planned_by_another_rule(tmp_path)
    # one unit cut short, as by a worker killed mid-unit: a worker run by hand finishes it in its partial
    partial = sorted((sweep / "partials").glob("*.jsonl"))[0]
    unit = partial.stem
    partial.write_text("".join(partial.read_text().splitlines(keepends=True)[:10]))  # header and 9 records
    (sweep / "done" / f"{unit}.json").unlink()
    r = subprocess.run(
        [sys.executable, "-m", "jobs.worker", str(sweep), unit], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0 and "9 already done" in r.stdout, r.stdout + r.stderr
    headers = [json.loads(line)["header"] for line in partial.read_text().splitlines() if line.startswith('{"header"')]
    assert [h["sweep"] for h in headers] == [kept, kept]

    r = run_cli("merge", str(sweep))
    said = r.stdout + r.stderr
    assert r.returncode == 0 and "merged 55 records" in said and "quarantine" not in said, said
    assert not (sweep / "quarantine").exists()
    document = json.loads((tmp_path / "out.json").read_text())
    assert len(document["results"]) == 55 and document["tilesweep"]["fingerprint"] == kept
    r = run_cli("status", str(sweep))
    assert r.returncode == 0 and "55/55 items done (0 error records), complete\n" in r.stdout, r.stdout + r.stderr
    assert "units: 2 (2 done)" in r.stdout, r.stdout
    r = run_cli("resume", str(sweep))
    said = r.stdout + r.stderr
    assert r.returncode == 0 and f"all 55 items of {sweep} have a record; nothing to resubmit" in said, said

    # the user's own spec file is the sweep's spec; one that times each config otherwise is not
    r = run_cli("resume", str(sweep), "--spec", str(spec))
    said = r.stdout + r.stderr
    assert r.returncode == 0 and "nothing to resubmit" in said, said
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    said = r.stdout + r.stderr
    assert r.returncode == 0 and "merged 55 records" in said and "quarantine" not in said, said
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(spec.read_text()), "repeats": 7}))
    said = "(repeats 7 in this spec, 5 in the sweep's)"
    assert_one_line_error(run_cli("resume", str(sweep), "--spec", str(other)), "is not the spec of the sweep", said)
    assert_one_line_error(run_cli("run", str(other), "--sweep-dir", str(sweep)), "another spec", said)
    assert json.loads((sweep / "sweep.json").read_text())["fingerprint"] == kept


def test_a_sweeps_spec_keeps_its_fingerprint_while_it_measures_the_same(tmp_path: Path) -> None:
    """A copy of a sweep directory's spec that changes only where units run keeps the sweep's
    fingerprint; one that changes what is measured is another sweep, of its own fingerprint; a
    sweep.json that names no fingerprint has the one its spec hashes to."""
    _, sweep, kept = _planned_by_another_rule(tmp_path)
    spec = SweepDir.open(sweep).spec
    assert spec.fingerprint() == kept
    slurm = spec.model_copy(update={"executor": spec.executor.model_copy(update={"kind": "slurm"})})
    assert slurm.fingerprint() == kept
    timed_otherwise = spec.model_copy(update={"repeats": 7})
    assert timed_otherwise.fingerprint() not in (kept, load_spec(str(tmp_path / "spec.json")).fingerprint())
    meta = json.loads((sweep / "sweep.json").read_text())
    del meta["fingerprint"]
    (sweep / "sweep.json").write_text(json.dumps(meta))
    assert SweepDir.open(sweep).spec.fingerprint() == load_spec(str(tmp_path / "spec.json")).fingerprint()


def test_plan_lower_into_a_sweep_planned_by_another_rule_writes_verdicts_the_sweep_reads(tmp_path: Path) -> None:
    """The verdicts ``plan --lower`` of the user's spec file writes into such a sweep name the
    fingerprint it keeps: its plan says every config has one, and nothing is left to lower."""
    grid = {"fwd": {"block_q": [64], "block_kv": [64, 128], "max_concurrent_steps": [2, 3, 4]}}  # the last: its default
    spec, sweep = tmp_path / "spec.json", tmp_path / "sweep"
    spec.write_text(json.dumps({**MOSAIC_SPEC, "modes": ["fwd"], "grid": grid, "output": str(tmp_path / "out.json")}))
    kept = _by_another_rule("plan", spec, sweep)
    r = run_cli("plan", "--lower", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0 and "5 lowered" in r.stdout + r.stderr, r.stdout + r.stderr
    header = json.loads((sweep / "lowering.jsonl").read_text().splitlines()[0])
    assert header["sweep"] == kept
    r = run_cli("plan", "--dry-run", str(spec), "--sweep-dir", str(sweep))
    said = r.stdout + r.stderr
    assert r.returncode == 0 and "gave 5 configs a verdict" in said and "nothing left to lower" in said, said
