"""Plain tables for the terminal and for GitHub: the one renderer report and compare share."""

from __future__ import annotations


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


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
