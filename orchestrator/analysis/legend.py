"""The legend below a report's table (text, Markdown, the page): each word the table uses, said
only where a row shows it. A sweep of one kernel, measured in full, reads a few lines, not the
words of halving, search, tokamax and documents without a shared-memory limit as well."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.summary import AUTO_FASTER, ProblemSummary

FLOPS_LEGEND = (
    "TFLOP/s of the best config: fwd = 4*B*H*S*S*D FLOPs, fwd_bwd = 3.5x that (bwd = 2.5x fwd), causal = half "
    "(only the computed lower triangle counts); H = query heads. speedup = auto ms / best ms."
)
REPLAYED_LEGEND = (
    "replayed: times drawn on a virtual clock from another document's records (kernel.impl replay), not measured."
)


def table_legend(summaries: Sequence[ProblemSummary]) -> str:
    """The legend of a table of ``summaries``."""
    parts = [FLOPS_LEGEND]
    if any(s.within_noise for s in summaries):
        parts.append("noise: best's q1-q3 overlaps the runner-up's.")
    if any(s.n_screened and s.best_ms is not None for s in summaries):
        parts.append("screened out: configs a halving sweep timed by one screening sample only (never a best).")
    parts.append(_auto_legend(summaries))
    if any(s.auto_faster and not s.best_is_auto for s in summaries):
        parts.append(
            f'"{AUTO_FASTER}": auto\'s config (auto config) was faster than every forced config (speedup below 1); '
            "`tilesweep export` writes config null there, which kernels.tuned answers with auto's config."
        )
    never = [s for s in summaries if s.n_never_measured and s.coverage is not None]
    if any(not s.coverage.searching for s in never if s.coverage is not None):
        parts.append("never measured: configs a search did not need (neither missing nor failed).")
    if any(s.coverage.searching for s in never if s.coverage is not None):
        parts.append(
            "not measured yet: a search that has not ended may still measure them (resume plans its next round)."
        )
    if any(s.replayed for s in summaries):
        parts.append(REPLAYED_LEGEND)
    return " ".join(parts)


def _auto_legend(summaries: Sequence[ProblemSummary]) -> str:
    """What the auto config column shows: the kernel's rule, and the ways a row names no config."""
    how = ["the kernel's rule at the sweep's shared-memory limit, as `tilesweep impls` says it"]
    if any(s.auto_config_from == "inferred" for s in summaries):
        how[0] += ", inferred the same way for a document without a tilesweep block"
    cells = {s.auto_cell for s in summaries}
    if "?" in cells:
        how.append("? where the document names no limit")
    if any(s.auto_label is None and s.auto_choice for s in summaries):
        how.append("auto (tokamax's own choice) where the implementation picks it and the document does not name it")
    text = f"auto config: what auto runs there ({'; '.join(how)})"
    if any(s.best_is_auto for s in summaries):
        text += "; where the best is that config, speedup is 1.00 and the two timings' ratio is noise"
    return text + "."
