"""The search strategy against the full sweep (and halving), by replaying the reference excerpt.

Every figure comes from real sweeps (plan, units, workers, partials, the rounds, merge, report)
whose workers replay (``kernel.impl: replay``): per config, samples drawn from the measured
record's spread, times on a virtual clock. The search and the full sweep of one input and seed
use the same seed, so a config both measure draws the same samples (common random numbers):
what differs is only which configs the search measures.

Inputs (each swept with ``strategy: full`` and ``strategy: search`` at default settings, the
shared-memory pruning on):

- ``excerpt``: the reference excerpt's problems as they were measured (bf16 d64 s2048 fwd and
  fwd_bwd in one sweep, f32 d128 s2048 fwd in another, as ``bench/halving.py`` sweeps them),
  ``--seeds`` seeds (default 20);
- ``ref16``: the whole reference config (16 problems, 832 items) and ``big32`` (seq 1024 to
  8192: 32 problems), sources built by ``orchestrator.store.scaled`` from the excerpt,
  ``--scaled-seeds`` seeds each (default 5);
- ``history``: ``ref16`` again with a portfolio: the full sweep's document of the seq 1024 and
  4096 problems (another seed, the same device kind) given as ``reuse.documents``, so round 1
  starts from the configs that won those problems.

Figures, over the problem-seeds of each input and over all inputs (``_all``):

- ``search_same_winner``: share of problem-seeds whose best (the report's) under the search is
  the full sweep's best, or has a median inside the full best's q1-q3;
- ``search_measured_share``: forced configs the search measured (compiled and timed, or failed
  at it) / those the full sweep measured (pruned configs count in neither);
- ``search_gpu_s_ratio``: virtual compile + timed seconds (the workers' markers), search / full;
  ``search_gpu_s_round1`` the part of it round 1 spent (the design and ``auto``), the rest is
  the later rounds';
- ``search_rounds``: the median number of rounds of the search per problem;
- ``search_round1_configs``: forced configs round 1 measured per problem (the design), with
  how many came from the portfolio;
- ``gpu_s_{full,halving,search}_excerpt``: the virtual GPU-node seconds of the excerpt's sweeps
  under each strategy (seed 0; halving with its defaults), and the same for ``tilesweep run``
  replaying the reference config in a new process (``replay_832_*``, with its wall time).

What the figures leave out: the scaled problems rank their configs as their template problem
does (a real sweep's problems differ more, which helps the search's design less and its
neighbours more); a replay has no compile cache, so a config compiled twice costs twice.

Run: ``.venv/bin/python -m bench.search [--seeds 20] [--scaled-seeds 5] [--first-seed 0]`` (about
5 minutes; seeds counted from ``--first-seed``).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.halving import agree, bests, problem_specs, run_replay

REPO = Path(__file__).resolve().parent.parent
EXCERPT = REPO / "tests" / "data" / "attention_tiles.sample.json"


@dataclass
class Ran:
    """One sweep: its document, its virtual GPU seconds (and those of its round-1 units: a
    search's design and ``auto``; a full sweep's everything), and its sweep directory."""

    doc: dict[str, Any]
    gpu_s: float
    root: Path
    round1_gpu_s: float = 0.0


def sweep(spec: dict[str, Any], folder: Path) -> Ran:
    """Run a spec in this process (debug executor) through all its rounds."""
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
    rounds = {u["id"]: int(u.get("round", 1)) for u in sd.unit_index()}
    spent = {p.stem: json.loads(p.read_text()) for p in sd.done.glob("*.json")}
    seconds = {uid: m.get("compile_sum_s", 0.0) + m.get("timed_s", 0.0) for uid, m in spent.items()}
    first = sum(s for uid, s in seconds.items() if rounds.get(uid, 1) == 1)
    return Ran(json.loads(Path(summary.output).read_text()), sum(seconds.values()), sd.root, first)


def measured(doc: dict[str, Any]) -> int:
    """Forced configs a sweep compiled (timed, or failed at it): pruned ones were never run."""
    return sum(1 for r in doc["results"] if r["config"] == "forced" and not r.get("pruned"))


def rounds_per_problem(doc: dict[str, Any]) -> list[int]:
    """Per problem, the rounds of the search that measured a config of it."""
    return [len(p["measured_in"]) for p in doc["tilesweep"]["search"]["problems"]]


def round1(root: Path) -> list[dict[str, Any]]:
    """Round 1's account per problem (``search/round1.json``)."""
    return json.loads((root / "search" / "round1.json").read_text())["problems"]


@dataclass
class Tally:
    """What the searches of one input added up to."""

    same: int = 0
    problems: int = 0
    measured: int = 0
    measured_full: int = 0
    gpu_s: float = 0.0
    gpu_s_full: float = 0.0
    gpu_s_round1: float = 0.0
    rounds: list[int] = field(default_factory=list)
    design: list[int] = field(default_factory=list)
    portfolio: list[int] = field(default_factory=list)

    def add(self, full: Ran, search: Ran) -> None:
        full_best, search_best = bests(full.doc), bests(search.doc)
        for key, best in full_best.items():
            if best.best_ms is not None:
                self.problems += 1
                self.same += agree(search_best[key], best)
        self.measured += measured(search.doc)
        self.measured_full += measured(full.doc)
        self.gpu_s += search.gpu_s
        self.gpu_s_full += full.gpu_s
        self.gpu_s_round1 += search.round1_gpu_s
        self.rounds += rounds_per_problem(search.doc)
        for p in round1(search.root):
            self.design.append(int(p.get("portfolio", 0)) + int(p.get("space_filling", 0)))
            self.portfolio.append(int(p.get("portfolio", 0)))

    def merged(self, other: Tally) -> Tally:
        return Tally(
            self.same + other.same,
            self.problems + other.problems,
            self.measured + other.measured,
            self.measured_full + other.measured_full,
            self.gpu_s + other.gpu_s,
            self.gpu_s_full + other.gpu_s_full,
            self.gpu_s_round1 + other.gpu_s_round1,
            self.rounds + other.rounds,
            self.design + other.design,
            self.portfolio + other.portfolio,
        )

    def lines(self, suffix: str) -> list[str]:
        return [
            f"search_problem_seeds_{suffix}={self.problems}",
            f"search_same_winner_{suffix}={self.same / max(1, self.problems):.3f}",
            f"search_measured_share_{suffix}={self.measured / max(1, self.measured_full):.3f}",
            f"search_gpu_s_ratio_{suffix}={self.gpu_s / max(1e-9, self.gpu_s_full):.3f}",
            f"search_gpu_s_round1_{suffix}={self.gpu_s_round1 / max(1e-9, self.gpu_s_full):.3f}",
            f"search_rounds_{suffix}={statistics.median(self.rounds) if self.rounds else 0:g}",
            f"search_round1_configs_{suffix}={statistics.median(self.design) if self.design else 0:g}",
            f"search_round1_portfolio_{suffix}={statistics.median(self.portfolio) if self.portfolio else 0:g}",
        ]


def base_spec(source: Path, **axes: Any) -> dict[str, Any]:
    """The reference config replayed from ``source`` (the shared-memory pruning on)."""
    config = json.loads(EXCERPT.read_text())["config"]
    return {
        **{k: v for k, v in config.items() if k != "output"},
        **axes,
        "kernel": {"impl": "replay"},
        "replay": {"source": str(source)},
        "executor": {"kind": "debug"},
    }


def scaled_source(tmp: Path, name: str, **axes: Any) -> Path:
    """A replay source for every item of the reference config with ``axes``, scaled from the excerpt."""
    from orchestrator.spec.files import spec_from_data
    from orchestrator.store.document import load
    from orchestrator.store.scaled import scaled_document

    excerpt = load(EXCERPT)
    path = tmp / f"{name}.source.json"
    spec = spec_from_data({**{k: v for k, v in excerpt.config.items() if k != "output"}, **axes})
    path.write_text(json.dumps(scaled_document(spec, excerpt)))
    return path


def with_timing(spec: dict[str, Any], strategy: str, seed: int) -> dict[str, Any]:
    return {**spec, "timing": {"strategy": strategy, "seed": seed}}


def compare(specs: list[dict[str, Any]], seeds: range, tmp: Path, name: str) -> Tally:
    """Full against search, for every spec of an input and every seed."""
    tally = Tally()
    for seed in seeds:
        for k, spec in enumerate(specs):
            where = tmp / f"{name}-s{seed}-p{k}"
            full = sweep(with_timing(spec, "full", seed), where / "full")
            tally.add(full, sweep(with_timing(spec, "search", seed), where / "search"))
    return tally


def excerpt_specs() -> list[dict[str, Any]]:
    """The excerpt's problems as ``bench/halving.py`` sweeps them, pruning on, units by default."""
    doc = json.loads(EXCERPT.read_text())
    return [{**s, "kernel": {"impl": "replay"}, "sharding": {}} for s in problem_specs(doc, EXCERPT)]


def strategy_costs(tmp: Path) -> list[str]:
    """Virtual GPU-node seconds of the excerpt's sweeps under each strategy (seed 0)."""
    lines = []
    for strategy in ("full", "halving", "search"):
        total = sum(
            sweep(with_timing(s, strategy, 0), tmp / f"cost-{strategy}-{k}").gpu_s
            for k, s in enumerate(excerpt_specs())
        )
        lines.append(f"gpu_s_{strategy}_excerpt={total:.1f}")
    return lines


def replay_reference(tmp: Path, source: Path, strategy: str) -> tuple[float, float]:
    """(wall s, virtual compile + timed s) of `tilesweep run` replaying the reference config."""
    spec = {
        **base_spec(source),
        "output": str(tmp / f"replay-832-{strategy}.json"),
        "timing": {"strategy": strategy},
        "executor": {"kind": "local"},
    }
    return run_replay(tmp, spec, strategy)


def history_tally(tmp: Path, ref: Path, seeds: range) -> Tally:
    """``ref16`` with a portfolio: the winners of a full sweep of other problems (seq 1024, 4096)."""
    other = scaled_source(tmp, "history", seq_lens=[1024, 4096])
    earlier = sweep(with_timing(base_spec(other, seq_lens=[1024, 4096]), "full", 999), tmp / "history-doc")
    spec = {**base_spec(ref), "reuse": {"documents": [str(earlier.root.parent / "results.json")]}}
    return compare([spec], seeds, tmp, "history")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20, help="seeds of the excerpt's problems")
    ap.add_argument("--scaled-seeds", type=int, default=5, help="seeds of each scaled input")
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds counted from this one (others than tuned on)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # submitit's debug executor warns once per unit
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-search-") as name:
        tmp = Path(name)
        ref = scaled_source(tmp, "ref16")
        big = scaled_source(tmp, "big32", seq_lens=[1024, 2048, 4096, 8192])
        first = args.first_seed
        scaled = range(first, first + args.scaled_seeds)
        tallies = {
            "excerpt": compare(excerpt_specs(), range(first, first + args.seeds), tmp, "excerpt"),
            "ref16": compare([base_spec(ref)], scaled, tmp, "ref16"),
            "big32": compare([base_spec(big, seq_lens=[1024, 2048, 4096, 8192])], scaled, tmp, "big32"),
            "history": history_tally(tmp, ref, scaled),
        }
        total = Tally()
        for key, tally in tallies.items():
            print("\n".join(tally.lines(key)))
            total = total.merged(tally)
        print(f"search_same_winner={total.same / max(1, total.problems):.3f}")
        print(f"search_measured_share={total.measured / max(1, total.measured_full):.3f}")
        print(f"search_gpu_s_ratio={total.gpu_s / max(1e-9, total.gpu_s_full):.3f}")
        print(f"search_gpu_s_round1={total.gpu_s_round1 / max(1e-9, total.gpu_s_full):.3f}")
        print(f"search_rounds={statistics.median(total.rounds):g}")
        print("\n".join(strategy_costs(tmp)))
        for strategy in ("full", "halving", "search"):
            wall, virtual = replay_reference(tmp, ref, strategy)
            print(f"replay_832_{strategy}_s={wall:.1f}")
            print(f"replay_832_{strategy}_virtual_s={virtual:.1f}")
    print(f"bench_search_wall_s={time.perf_counter() - t0:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
