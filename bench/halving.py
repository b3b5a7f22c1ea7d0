"""Successive halving against the full sweep, by replaying the reference run's excerpt.

Every figure comes from real sweeps (plan, units, worker, partials, round 2, merge, report)
whose workers replay the excerpt (``kernel.impl: replay``): per config, samples drawn from the
measured record's spread, times on a virtual clock.

- For each of ``--seeds`` seeds, each problem of the excerpt (bf16 d64 s2048 fwd and fwd_bwd,
  f32 d128 s2048 fwd) is swept twice: ``strategy: full`` and ``strategy: halving`` (4 units
  per round, the default ``keep``/``noise``/``screen_ms``). Both use the same seed, so a config
  timed in full draws the same samples in either (common random numbers): what differs is only
  which configs the screening lets through.
- ``halving_same_winner``: share of (problem, seed) whose best config (the report's) under
  halving is the full sweep's best, or has a median inside the full best's q1-q3.
  ``full_vs_full_same_winner`` is the same share between two full sweeps of different seeds:
  how often plain noise alone changes the pick (the floor any strategy is judged against).
- ``halving_timed_work_ratio``: virtual seconds spent timing (warm-up, probes, samples;
  ``jobs.worker`` summaries), halving / full, summed over everything.
- ``replay_832_s``: wall time of ``tilesweep run`` (a new process, local executor, as a user
  runs it) replaying the whole reference config (832 items) from a source built by
  ``orchestrator.store.scaled.scaled_document`` out of the excerpt (measured records as they
  are, the other problems scaled from them, shared-memory failures from the model);
  ``replay_832_halving_s`` the same with halving, ``replay_832_virtual_s`` the compile and
  timing seconds the replayed full sweep accounts for (the reference run took ~660 s).

What the figures leave out: a screening sample on a GPU is shorter than a full sample and so
noisier than one draw from the record's spread (the replay cannot know how much); the scaled
problems of the 832 source rank their configs as their template problems do.

Run: ``.venv/bin/python -m bench.halving [--seeds 20]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.analysis.report import ProblemKey, ProblemSummary

REPO = Path(__file__).resolve().parent.parent
EXCERPT = REPO / "tests" / "data" / "attention_tiles.sample.json"


def problem_specs(doc: dict[str, Any], source: Path) -> list[dict[str, Any]]:
    """One replay spec per (dtype, head_dim, seq) of the excerpt, with the modes it measured."""
    groups: dict[tuple, list[str]] = {}
    for r in doc["results"]:
        modes = groups.setdefault((r["dtype"], r["head_dim"], r["seq"]), [])
        if r["mode"] not in modes:
            modes.append(r["mode"])
    base = {k: v for k, v in doc["config"].items() if k != "output"}
    return [
        {
            **base,
            "dtypes": [dt],
            "head_dims": [d],
            "seq_lens": [s],
            "modes": modes,
            "kernel": {"impl": "replay", "prune_smem": "off"},
            "replay": {"source": str(source)},
            "sharding": {"units": 4},
            "executor": {"kind": "debug"},
        }
        for (dt, d, s), modes in groups.items()
    ]


def sweep(spec: dict[str, Any], folder: Path) -> tuple[dict[str, Any], float]:
    """Run a spec in this process (debug executor) through both rounds; (document, timed s)."""
    from orchestrator.control import dispatch
    from orchestrator.control.rounds import run_rounds_here
    from orchestrator.control.sweeps import prepare_sweep
    from orchestrator.store import merge

    folder.mkdir(parents=True)
    path = folder / "spec.json"
    path.write_text(json.dumps({**spec, "output": str(folder / "results.json")}))
    sd, unit_ids, _ = prepare_sweep(str(path), str(folder / "sweep"), None, None)
    run = functools.partial(dispatch.run_units_locally, sd, kind="debug")
    run(unit_ids)
    run_rounds_here(sd, sd.spec.executor, run)
    summary = merge.merge(sd)
    timed = sum(json.loads(p.read_text())["timed_s"] for p in sd.done.glob("*.json"))
    return json.loads(Path(summary.output).read_text()), timed


def bests(doc: dict[str, Any]) -> dict[ProblemKey, ProblemSummary]:
    from orchestrator.analysis.report import best_table
    from orchestrator.store.document import from_obj

    return {s.key: s for s in best_table(from_obj(doc))}


def agree(chosen: ProblemSummary, full: ProblemSummary) -> bool:
    """The chosen best is the full sweep's best, or its median lies inside that one's q1-q3."""
    if chosen.best_label == full.best_label:
        return True
    low, high = full.best_q1_ms, full.best_q3_ms
    return chosen.best_ms is not None and low is not None and high is not None and low <= chosen.best_ms <= high


def compare_strategies(seeds: int, tmp: Path) -> None:
    doc = json.loads(EXCERPT.read_text())
    specs = problem_specs(doc, EXCERPT)
    same = floor = n = 0
    timed = {"full": 0.0, "halving": 0.0}
    t0 = time.perf_counter()
    for seed in range(seeds):
        for k, spec in enumerate(specs):
            got = {}
            for strategy, s in (("full", seed), ("halving", seed), ("other", seed + 1000)):
                timing = {"seed": s, "strategy": "full" if strategy == "other" else strategy}
                out, t = sweep({**spec, "timing": timing}, tmp / f"s{seed}-p{k}-{strategy}")
                got[strategy] = bests(out)
                if strategy in timed:
                    timed[strategy] += t
            for key, full in got["full"].items():
                if full.best_ms is None:
                    continue
                n += 1
                same += agree(got["halving"][key], full)
                floor += agree(got["other"][key], full)
    print(f"problem_seeds={n}")
    print(f"halving_same_winner={same / n:.3f}")
    print(f"full_vs_full_same_winner={floor / n:.3f}")
    print(f"halving_timed_work_ratio={timed['halving'] / timed['full']:.3f}")
    print(f"timed_virtual_s_full={timed['full']:.1f}")
    print(f"timed_virtual_s_halving={timed['halving']:.1f}")
    print(f"strategy_sweeps_wall_s={time.perf_counter() - t0:.1f}")


def replay_reference(tmp: Path, strategy: str) -> tuple[float, float]:
    """(wall s, virtual compile + timed s) of `tilesweep run` replaying the reference config."""
    from orchestrator.spec.files import spec_from_data
    from orchestrator.store.document import load
    from orchestrator.store.scaled import scaled_document

    excerpt = load(EXCERPT)
    source = tmp / "reference-832.json"
    if not source.exists():
        source.write_text(json.dumps(scaled_document(spec_from_data(dict(excerpt.config)), excerpt), indent=1))
    spec = {
        **excerpt.config,
        "output": str(tmp / f"replay-832-{strategy}.json"),
        "timing": {"strategy": strategy},
        "kernel": {"impl": "replay", "prune_smem": "off"},
        "replay": {"source": str(source)},
    }
    return run_replay(tmp, spec, strategy)


def run_replay(tmp: Path, spec: dict[str, Any], strategy: str) -> tuple[float, float]:
    """(wall s, virtual compile + timed s of its units) of `tilesweep run` of the replay ``spec``
    under ``strategy``, in a sweep directory of its own under ``tmp``."""
    path = tmp / f"replay-832-{strategy}.spec.json"
    path.write_text(json.dumps(spec))
    sweep_dir = tmp / f"replay-832-{strategy}"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", str(path), "--sweep-dir", str(sweep_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"replay of the reference config ({strategy}) failed:\n{proc.stderr[-3000:]}")
    markers = [json.loads(p.read_text()) for p in (sweep_dir / "done").glob("*.json")]
    return wall, sum(m.get("compile_sum_s", 0.0) + m.get("timed_s", 0.0) for m in markers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # submitit's debug executor warns once per unit
    with tempfile.TemporaryDirectory(prefix="bench-halving-") as tmp:
        compare_strategies(args.seeds, Path(tmp))
        wall, virtual = replay_reference(Path(tmp), "full")
        print(f"replay_832_s={wall:.1f}")
        print(f"replay_832_virtual_s={virtual:.1f}")
        wall_h, virtual_h = replay_reference(Path(tmp), "halving")
        print(f"replay_832_halving_s={wall_h:.1f}")
        print(f"replay_832_halving_virtual_s={virtual_h:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
