"""The parts every tilesweep page shares: the document shell, provenance, and the summary table.

A page is one self-contained file: its style and its few lines of script are inline, its plots
are inline SVG, and its Content-Security-Policy allows nothing else: no fetch, no font, no image,
and no script but the page's own (by hash). So a string from a results document that
slipped past ``esc`` as a ``<script>`` still could not run; ``esc`` is applied to every such
string all the same, and the CSP is the second wall.

The summary table is sorted and filtered in the browser by ``assets/page.js``: a header with a
``data-key`` sorts (``data-num``: numerically, ``data-desc``: largest first on the first
click), a ``<select data-col>`` filters on a column's values, and the query string sets both
on load (``?sort=speedup&order=desc&dtype=bfloat16``), so a sorted view is a link to share.
The filters and the line saying how to sort start hidden and the script shows them, so a page
opened with JavaScript off offers nothing that does not work: the table in document order, and
every card below it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from orchestrator.analysis.origins import carried_text, sweep_rows
from orchestrator.analysis.svg import DEFS, esc
from orchestrator.analysis.tables import fmt_ms
from orchestrator.store.document import ResultsDoc
from orchestrator.store.page_file import GENERATOR
from orchestrator.store.replayed import describe


@cache
def _asset(name: str) -> str:
    return resources.files("orchestrator.analysis").joinpath("assets", name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def shell(title: str, body: str) -> str:
    """The whole page around ``body`` (already escaped HTML)."""
    css, js = _asset("page.css"), _asset("page.js")
    csp = f"default-src 'none'; style-src {_sha256(css)}; script-src {_sha256(js)}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{GENERATOR}"
        f"<title>{esc(title)}</title><style>{css}</style></head>\n<body>{DEFS}\n{body}\n"
        f"<script>{js}</script></body></html>\n"
    )


# --------------------------------------------------------------------------- provenance


def _device(dev: dict[str, Any]) -> str | None:
    """The device kind, and jax's backend where it says more (``NVIDIA H100 (backend gpu)``;
    the CPU's kind is its backend: ``cpu``)."""
    kind, backend = dev.get("device_kind"), dev.get("backend")
    if kind and backend and str(backend).lower() != str(kind).lower():
        return f"{kind} (backend {backend})"
    return str(kind or backend) if kind or backend else None


def _value(v: Any) -> str:
    """A provenance value, escaped: several lines (a list) one under the other."""
    return "<br>".join(map(esc, v)) if isinstance(v, list) else esc(v)


def provenance(doc: ResultsDoc, counts: dict[str, int]) -> str:
    """Where the numbers come from: device, software, sweep, dates, GPU-hours, the spec."""
    dev, block = doc.device, doc.extra.get("tilesweep")
    block = block if isinstance(block, dict) else {}
    env = found if isinstance(found := block.get("env"), dict) else {}
    rows: list[tuple[str, Any]] = [
        ("document", doc.name),
        ("replayed", describe(doc)),
        ("device", _device(dev)),
        ("devices", ", ".join(map(str, dev["devices"])) if isinstance(dev.get("devices"), list) else None),
        ("jax", dev.get("jax") or env.get("jax")),
        ("jaxlib", dev.get("jaxlib") or env.get("jaxlib")),
        ("python", dev.get("python")),
        ("records", ", ".join(f"{v} {k.removesuffix('s') if v == 1 else k}" for k, v in counts.items())),
        ("reused", carried_text(doc)),
        *sweep_rows(doc.extra.get("tilesweep")),
    ]
    items = "".join(f"<dt>{esc(k)}</dt><dd>{_value(v)}</dd>" for k, v in rows if v not in (None, "", []))
    spec = block.get("spec") if isinstance(block.get("spec"), dict) else None
    last = "the last sweep's" if isinstance(block.get("earlier"), list) and block["earlier"] else "the sweep's"
    what = f"{last} spec (tilesweep block)" if spec is not None else "the document's config block"
    shown = spec if spec is not None else doc.config
    return (
        f'<dl class="prov">{items}</dl><details class="list"><summary>{what}</summary>'
        f'<pre class="spec">{esc(json.dumps(shown, indent=1, ensure_ascii=False))}</pre></details>'
    )


# --------------------------------------------------------------------------- summary table


@dataclass(frozen=True)
class Column:
    """A summary column. ``key`` names it in the query string (``?sort=KEY``) and, for a
    filter column, is the filter's name (``?KEY=VALUE``)."""

    key: str
    title: str
    left: bool = False
    num: bool = False
    desc_first: bool = False
    filter: bool = False
    hint: str = ""


def td(text: Any, v: Any = None, cls: str = "", raw: bool = False) -> str:
    """One cell: ``text`` is escaped unless ``raw`` (HTML this package built); ``v`` is the
    value sorting and filtering use when it differs from the text."""
    attrs = f' data-v="{esc(v)}"' if v is not None else ""
    attrs += f' class="{cls}"' if cls else ""
    return f"<td{attrs}>{text if raw else esc(text)}</td>"


def num(x: float | None, fmt: str, cls: str = "") -> str:
    """A numeric cell: formatted text, the full value to sort on, '-' (sorted last) for none."""
    return td("-") if x is None else td(format(x, fmt), repr(float(x)), cls)


def ms_cell(x: float | None) -> str:
    """A time cell, written as the text tables write it (``tables.fmt_ms``), the full value to sort on."""
    return td("-") if x is None else td(fmt_ms(x), repr(float(x)))


def table(columns: Sequence[Column], rows: Iterable[tuple[list[str], list[str]]], total: int) -> str:
    """The summary table with its filter selects. ``rows`` yields (cells, filter values): the
    values of the filter columns in column order, as plain text, to list in the selects."""
    fcols = [c for c in columns if c.filter]
    body: list[str] = []
    seen: dict[str, set[str]] = {c.key: set() for c in fcols}
    for cells, fvals in rows:
        body.append("<tr>" + "".join(cells) + "</tr>")
        for c, v in zip(fcols, fvals, strict=True):
            seen[c.key].add(v)
    selects = []
    for c in fcols:
        col = columns.index(c)
        opts = "".join(
            f'<option value="{esc(v)}">{esc(v)}</option>'
            for v in sorted(seen[c.key], key=lambda s: (len(s), s) if s.isdigit() else (0, s))
        )
        selects.append(
            f'<label>{esc(c.title)} <select name="{esc(c.key)}" data-col="{col}">'
            f'<option value="">all</option>{opts}</select></label>'
        )
    heads = []
    for c in columns:
        attrs = f' data-key="{esc(c.key)}"' + (" data-num" if c.num else "") + (" data-desc" if c.desc_first else "")
        attrs += ' class="l"' if c.left else ""
        attrs += f' title="{esc(c.hint)}"' if c.hint else ""
        heads.append(f"<th{attrs}>{esc(c.title)}</th>")
    return (
        f'<div class="controls" hidden>{"".join(selects)}<span>showing <b id="shown">{total}</b> of {total} '
        f"problem{'s' if total != 1 else ''}; click a column to sort, again to reverse</span></div>"
        f'<div class="tablewrap"><table class="sum" id="summary"><thead><tr>{"".join(heads)}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )
