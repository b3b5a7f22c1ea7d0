"""One problem's row of the report: what ``report.best_table`` found for it (``ProblemSummary``),
and what its note says of it in words: how the best was chosen, what was not measured and why.

``report`` computes the rows from a document's records; this module holds the row and its words,
which the text table, ``--json``, the page, ``compare``, ``export`` and ``winners`` all read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.analysis.coverage import Coverage
from orchestrator.analysis.labels import config_label
from orchestrator.analysis.problems import ProblemKey

FWD_FLOPS_FORMULA = "4*B*H*S*S*D"
FLOPS_FORMULAS = {
    "fwd": f"{FWD_FLOPS_FORMULA} (fwd: two matmuls, non-causal)",
    "fwd_bwd": f"3.5*{FWD_FLOPS_FORMULA} (fwd + bwd, bwd = 2.5x fwd, non-causal)",
}
CAUSAL_FLOPS_FORMULAS = {
    "fwd": f"0.5*{FWD_FLOPS_FORMULA} (fwd: two matmuls, causal: the computed lower half)",
    "fwd_bwd": f"0.5*3.5*{FWD_FLOPS_FORMULA} (fwd + bwd, bwd = 2.5x fwd, causal: the computed lower half)",
}

# a problem whose only record is its auto's, where its sweep did not ask for auto alone
ONLY_AUTO = "only the kernel's own choice (auto) was measured; no tile config was"


# the note of a problem whose auto beat every forced config: what ``export`` writes there
AUTO_FASTER = "auto faster: use auto"


def within_noise(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two timings' q1-q3 ranges overlap (equal times included): the sweep has not
    separated them, so neither is faster than the other as measured. The report says it of a best
    config and its runner-up, ``winners`` of two implementations."""
    return max(a[0], b[0]) <= min(a[1], b[1])


def tflops_text(tflops: float) -> str:
    """TFLOP/s to one decimal, and to three significant digits below one (a CPU's or a tiny
    problem's, which one decimal would show as 0.0)."""
    return f"{tflops:.1f}" if tflops >= 1 or tflops == 0 else f"{tflops:.3g}"


@dataclass(frozen=True)
class ProblemSummary:
    """One row of the best-config table. Times in ms; ``None`` where there is nothing to show."""

    key: ProblemKey
    best_config: dict[str, Any] | None
    best_label: str | None
    best_ms: float | None
    best_q1_ms: float | None
    best_q3_ms: float | None
    auto_ms: float | None
    auto_status: str  # "ok", "failed" or "absent"
    speedup: float | None
    flops: float | None
    tflops: float | None
    n_configs: int  # distinct forced configs with at least one record
    n_failed: int  # of those, how many never produced a timing
    n_pruned: int  # of the failed, how many were marked pruned (refused before running)
    n_screened: int  # configs screened out: only a screening sample, never timed in full (halving)
    runner_up_label: str | None
    runner_up_ms: float | None
    within_noise: bool
    first_error: str | None  # one failure message, to show what went wrong where all failed
    coverage: Coverage | None = None  # its planned configs and the missing ones (None: no plan known)
    auto_config: dict[str, Any] | None = None  # what auto ran, as record config fields (None: unknown)
    auto_config_from: str | None = None  # "spec", "inferred" (no tilesweep block), None: unknown
    best_is_auto: bool = False  # the best forced config is auto's own: two timings of one kernel
    n_waiting: int = 0  # screened configs that survived and are not timed in full yet (halving stopped in round 2)
    auto_error: str | None = None  # why auto has no timing, where it failed
    replayed: bool = False  # its best or auto timing is replayed, not measured (store.replayed)
    auto_only: bool = False  # the document's sweep measured auto alone (``auto_only: true``)
    auto_choice: str | None = None  # whose choice auto's config is, where the document cannot name it
    auto_q1_ms: float | None = None  # q1 and q3 of auto's timing, where it has one
    auto_q3_ms: float | None = None

    @property
    def n_planned(self) -> int | None:
        """Forced configs the document's plans have for the problem (None: no plan known)."""
        return None if self.coverage is None else len(self.coverage.planned)

    @property
    def auto_missing(self) -> bool:
        """Whether the problem's auto, which every plan measures, has no record (a plan known)."""
        return self.coverage is not None and self.auto_status == "absent"

    @property
    def n_missing(self) -> int | None:
        """Of the planned configs, auto among them, how many have no record (those a search never
        measured aside): what ``merge`` counts missing and ``resume`` redoes."""
        return None if self.coverage is None else len(self.coverage.missing) + self.auto_missing

    @property
    def n_never_measured(self) -> int | None:
        """Of the planned configs, how many a search chose never to measure."""
        return None if self.coverage is None else len(self.coverage.never_measured)

    @property
    def auto_label(self) -> str | None:
        """auto's config as ``config_label`` names it, or None where it is not known."""
        if self.auto_config is None:
            return None
        warps = self.auto_config.get("num_warps")  # None: the implementation's own rule per launch
        return config_label({**self.auto_config, "num_warps": "(own rule)" if warps is None else warps}, self.key.mode)

    @property
    def auto_cell(self) -> str:
        """auto's config in the tables: its label, else whose choice it is (``auto (tokamax's own
        choice)``), else ``?`` (a document that names no shared-memory limit)."""
        if self.auto_label is not None:
            return self.auto_label
        return f"auto ({self.auto_choice})" if self.auto_choice else "?"

    @property
    def timing_ratio(self) -> float | None:
        """auto ms / best ms as measured, also where they are one config (then it is noise)."""
        if self.auto_ms is None or not self.best_ms:
            return None
        return self.auto_ms / self.best_ms

    @property
    def auto_faster(self) -> bool:
        """auto ran faster than the best forced config (another config than its own)."""
        return self.auto_ms is not None and self.best_ms is not None and self.auto_ms < self.best_ms

    @property
    def use_auto(self) -> bool:
        """The measurement says "use auto": auto was faster than the best forced config, or that
        best is auto's own config (two timings of one kernel). ``export`` writes config null there."""
        return self.best_config is not None and (self.auto_faster or self.best_is_auto)

    @property
    def unmeasured(self) -> str:
        """What was measured of a problem without any forced config's record: nothing, auto alone
        as its sweep asked (``auto_only: true``), or only auto where tile configs were to be timed
        too (a document without a plan, whose forced configs are absent, or planned ones missing)."""
        if self.auto_status == "absent":
            return "nothing measured"
        return "auto only (auto_only: true)" if self.auto_only else ONLY_AUTO

    @property
    def note(self) -> str:
        notes = ["replayed"] if self.replayed else []
        timed = self.n_configs - self.n_failed  # a best chosen among a minority of what was to be measured:
        meant = None if self.n_planned is None else self.n_planned - (self.n_never_measured or 0)
        if meant is not None and self.best_ms is not None and 2 * timed < meant:
            notes.append(f"best of {timed}/{meant} timed")
        if self.n_never_measured:
            searching = self.coverage is not None and self.coverage.searching
            notes.append(
                f"{self.n_never_measured} {'not measured yet (search not ended)' if searching else 'never measured'}"
            )
        if self.n_configs == 0:
            notes.append(self.unmeasured)
        elif self.best_ms is None and self.n_failed < self.n_configs:  # halving between its rounds
            notes.append(f"no full timing yet: {self.n_screened} screened, round 2 times the survivors")
        elif self.best_ms is None:
            notes.append("all failed")
        notes += [f"{self.n_screened} screened out"] if self.n_screened and self.best_ms is not None else []
        waiting = "survivor" if self.n_waiting == 1 else "survivors"
        notes += [f"{self.n_waiting} {waiting} of the screen not timed in full yet"] if self.n_waiting else []
        notes += [f"{self.n_pruned} of the failed pruned, not run"] if self.n_pruned else []
        notes += [self.noise_note] if self.within_noise or self.best_is_auto else []
        notes += [AUTO_FASTER] if self.auto_faster and not self.best_is_auto else []
        if self.auto_status == "failed":
            notes.append("auto failed")
        return ", ".join(notes)

    @property
    def noise_note(self) -> str:
        """The note's words on noise, said once: the best overlapping the runner-up (``noise``), the
        best being auto's own config (its two timings' ratio is noise, not a speedup), or both."""
        ratio = self.timing_ratio
        if not self.best_is_auto:
            return "noise"
        if ratio is None:
            return "noise, best is auto's config" if self.within_noise else "best is auto's config"
        apart = f"its two timings {ratio:.2f}x apart"
        if self.within_noise:
            return f"noise: best is auto's config ({apart}) and overlaps the runner-up"
        return f"best is auto's config: {apart}, noise"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self.key)
        out.update(
            (f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in ("key", "coverage")
        )
        if self.coverage is not None:  # a plan is known: how much of it has a record
            out["n_planned"] = self.n_planned
            out["n_missing"] = self.n_missing
            if self.coverage.never_measured:
                out["n_never_measured"] = self.n_never_measured
                out["search_ended"] = not self.coverage.searching
        out["auto_label"] = self.auto_label
        out["timing_ratio"] = self.timing_ratio
        out["flops_formula"] = (CAUSAL_FLOPS_FORMULAS if self.key.causal else FLOPS_FORMULAS).get(self.key.mode)
        out["note"] = self.note
        return out
