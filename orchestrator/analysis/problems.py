"""What a problem is, as the reports name it: its key (the problem fields of
``records.problem_key`` plus causal, kv_heads and the kernel implementation), its label, and the
optional columns a table of problems needs for the axes that are not at their default.

The report (``report``), the page (``html``), the comparison (``compare``, ``compare_html``),
the heatmaps and the plots all key problems by it; ``report`` names it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.spec.records import DEFAULT_IMPL, PROBLEM_FIELDS


@dataclass(frozen=True, order=True)
class ProblemKey:
    dtype: str
    head_dim: int
    seq: int
    batch: int
    heads: int
    mode: str
    tag: str | None
    causal: bool = False
    kv_heads: int | None = None  # None: multi-head attention
    impl: str | None = DEFAULT_IMPL  # None: matched across implementations (compare)

    def variant(self) -> str:
        """The optional identity in short: `` causal kv2 [jax]``, or nothing for the defaults."""
        text = " causal" if self.causal else ""
        text += f" kv{self.kv_heads}" if self.kv_heads is not None else ""
        return text + (f" [{self.impl}]" if self.impl not in (None, DEFAULT_IMPL) else "")

    def label(self, with_tag: bool = False) -> str:
        text = f"{self.dtype} d{self.head_dim} s{self.seq} b{self.batch} h{self.heads} {self.mode}{self.variant()}"
        return f"{text} [{self.tag or 'no tag'}]" if with_tag else text


def axis_columns(keys: Iterable[ProblemKey]) -> list[str]:
    """The optional columns a table of these problems needs: causal, KV (kv_heads), impl."""
    keys = list(keys)
    cols = ["causal"] if any(k.causal for k in keys) else []
    cols += ["KV"] if any(k.kv_heads is not None for k in keys) else []
    return cols + (["impl"] if any(k.impl not in (None, DEFAULT_IMPL) for k in keys) else [])


def axis_cells(key: ProblemKey, columns: list[str]) -> list[str]:
    """``key``'s cells of the ``axis_columns``."""
    value = {
        "causal": "yes" if key.causal else "no",
        "KV": str(key.heads if key.kv_heads is None else key.kv_heads),
        "impl": str(key.impl or "-"),
    }
    return [value[c] for c in columns]


def astuple_key(key: ProblemKey) -> tuple:
    """The key as ``records.problem_key`` makes it: the problem fields, then causal, kv_heads, impl."""
    return tuple(getattr(key, f) for f in PROBLEM_FIELDS) + (key.causal, key.kv_heads, key.impl)
