"""Plain tables for the terminal and for GitHub: the one renderer report and compare share."""

from __future__ import annotations

import math

# the significant digits a time shows at least: enough that a ratio printed beside two times to
# three decimals (compare's B/A, the margins) can be checked by eye from them
MS_DIGITS = 4


def fmt_ms(x: float | None) -> str:
    """A time in ms to 4 decimals (0.1234, 12.3456), and to more below 0.1 ms so that it keeps
    ``MS_DIGITS`` significant digits (0.01234, 0.0004140): a sub-microsecond time reads as itself,
    not as 0.0004 beside another 0.0004 whose ratio is 1.035."""
    if x is None:
        return "-"
    decimals = 4
    if math.isfinite(x) and x > 0:
        decimals = max(decimals, MS_DIGITS - 1 - math.floor(math.log10(x)))
    return f"{x:.{decimals}f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def render(
    header: list[str],
    rows: list[list[str]],
    style: str,
    *,
    left: set[str] | frozenset[str] = frozenset(),
    legend: str | None = None,
) -> str:
    """Shared table renderer (also used by compare): ``left`` columns left-aligned, others right."""
    if style not in ("text", "markdown"):
        raise ValueError(f"{style=} must be 'text' or 'markdown'")
    left_aligned = [h in left for h in header]
    if style == "markdown":
        lines = ["| " + " | ".join(header) + " |"]
        lines.append("|" + "|".join(":---" if lft else "---:" for lft in left_aligned) + "|")
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        if legend:
            lines += ["", legend]
        return "\n".join(lines)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        out = [c.ljust(w) if lft else c.rjust(w) for c, w, lft in zip(cells, widths, left_aligned, strict=True)]
        return "  ".join(out).rstrip()

    lines = [line(header)] + [line(r) for r in rows]
    if not rows:
        lines.append("(no records)")
    if legend:
        lines += ["", legend]
    return "\n".join(lines)
