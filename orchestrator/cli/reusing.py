"""How the commands that plan reuse earlier documents: the options (``--reuse``,
``--remeasure``, ``--reuse-errors``, ``--include-replays``), the request they make, and the lines
that say what planning reused, from where, and what it did not and why."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import counted

if TYPE_CHECKING:
    from orchestrator.control.reuseplan import ReuseRequest

REUSE_HELP = (
    "also reuse the compatible records of these results documents (the output document is always "
    "a source): their items are carried into the document, not measured again"
)


def add_reuse_args(p: argparse.ArgumentParser) -> None:
    """``--reuse``, ``--remeasure``, ``--reuse-errors`` and ``--include-replays`` of the commands that plan."""
    p.add_argument("--reuse", nargs="+", action="extend", default=[], metavar="RESULTS.json", help=REUSE_HELP)
    p.add_argument(
        "--remeasure",
        choices=["all", "errors"],
        help="all: reuse nothing, measure every item; errors: measure configs that failed before even "
        "where the spec's reuse.errors or --reuse-errors would reuse them",
    )
    p.add_argument(
        "--reuse-errors",
        action="store_true",
        help="reuse error records too (default: a config that failed is measured again)",
    )
    p.add_argument(
        "--include-replays",
        action="store_true",
        help="a measured sweep reuses replayed records too (a replay's, drawn on a virtual clock; "
        "carried with timer virtual); default: never",
    )


def reuse_request(args: argparse.Namespace) -> ReuseRequest:
    """The command line's ``ReuseRequest``."""
    from orchestrator.control.reuseplan import ReuseRequest

    return ReuseRequest(
        documents=list(args.reuse),
        remeasure=args.remeasure,
        errors=args.reuse_errors,
        replays=args.include_replays,
        keep_index=not getattr(args, "dry_run", False),
    )


_NOT_REUSED = (
    ("other_device", "of another device kind{dev}"),
    ("other_env", "measured with another jax, jaxlib or tokamax"),
    ("other_measurement", "measured with other settings"),
    ("unknown", "of unknown measurement settings (no tilesweep block names them)"),
    ("errors_left", "errors, measured again (--reuse-errors reuses them)"),
    ("screened_left", "screened only (this sweep times in full)"),
    ("damaged", "damaged"),
    ("replayed", "replayed, not measured (--include-replays reuses them)"),
    ("superseded", "superseded by a better record of the same item"),
)


def _not_reused(source: dict[str, Any]) -> tuple[list[str], str]:
    """A source's counts of records not reused, each with its detail where the source says one
    (``reuse_accept.WHY_OF``: "2 measured with other settings (timing.warmup 0 vs 1 here)"), and
    the reasons no count explains."""
    from kernels.spelling import as_json
    from orchestrator.store.reuse_accept import WHY_OF

    whys = list(source.get("why") or [])
    dev = f" ({as_json(source['device_kind'])})" if source.get("device_kind") else ""
    parts = []
    for k, text in _NOT_REUSED:
        if not source.get(k):
            continue
        part = f"{source[k]} {text.format(dev=dev)}"
        said = next((w for w in whys if k in WHY_OF and w.startswith(WHY_OF[k])), None)
        if said is not None:
            whys.remove(said)
            detail = said.removeprefix(WHY_OF[k]).removeprefix(":").strip()
            part += f" {detail}" if detail.startswith("(") and detail.endswith(")") else f" ({detail})"
        parts.append(part)
    return parts, "; ".join(whys)


def reuse_lines(summary: dict[str, Any] | None) -> list[str]:
    """What planning reused, from where, and what it did not and why (one line per source)."""
    if not summary or not summary.get("sources"):
        return []
    sources = summary["sources"]
    if summary["reused"]:
        where = ", ".join(f"{s['reused']} from {s['path']}" for s in sources if s["reused"])
        replayed = sum(s.get("replayed_reused", 0) for s in sources)
        also = f"; {replayed} of them replayed, not measured" if replayed else ""
        before = "recorded before" if replayed else "measured before"  # a replayed record was never measured
        lines = [f"reused {counted(summary['reused'], 'item')} {before} (not measured again{also}): {where}"]
    else:  # each source's line below says why it gave nothing
        lines = ["nothing reused: every planned item is measured"]
    for s in sources:
        parts, why = _not_reused(s)
        if parts:
            lines.append(f"  not reused from {s['path']}: {', '.join(parts)}{f' [{why}]' if why else ''}")
        elif not s.get("records") and s.get("role") != "output":
            lines.append(
                f"  nothing reused from {s['path']}: none of its records is an item of this plan (other problems or "
                "configs, or another kernel implementation, tag or causal setting than the spec's)"
            )
    return lines
