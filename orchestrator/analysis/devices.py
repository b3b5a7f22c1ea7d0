"""A document's records of one device kind, for the readers that show one device's numbers.

A document appended into with ``merge.mix_devices`` holds records of several device kinds, each
carrying its ``device``; its device block is one of them. The report, the page, the comparison
and the tuned table each speak of one device: a best config chosen over two GPUs' timings would
be neither GPU's, so they read one kind's records and say which ones they left out.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kernels.spelling import as_json
from orchestrator.errors import ResultsError
from orchestrator.store.document import ResultsDoc


def kind_of(rec: dict[str, Any], doc: ResultsDoc) -> Any:
    """The device kind ``rec`` was measured on: its own ``device``, else the document's."""
    return rec.get("device", doc.device.get("device_kind"))


def kinds(docs: Iterable[ResultsDoc]) -> list[str]:
    """The device kinds the documents' records were measured on, in order of first appearance."""
    seen: dict[str, None] = {}
    for doc in docs:
        for rec in doc.results:
            kind = kind_of(rec, doc)
            if isinstance(kind, str):
                seen.setdefault(kind, None)
    return list(seen)


def device_flag(doc: ResultsDoc) -> str:
    """`` --device KIND`` for a command that reads ``doc``'s file again where its records carry their
    device (a document of several kinds: the kind ``doc`` holds the records of), else nothing."""
    kind = doc.device.get("device_kind")
    if not isinstance(kind, str) or not any("device" in rec for rec in doc.results):
        return ""
    return f" --device {shlex.quote(kind)}"


@dataclass(frozen=True)
class OneDevice:
    """``doc`` narrowed to the records of ``kind``, and how many of each other kind it left out."""

    doc: ResultsDoc
    kind: Any
    left_out: Counter[Any]

    def note(self, name: str, reads: str, command: str | None = None) -> str | None:
        """The line saying what was left out (None: nothing); ``reads``: what the command does with
        the records it kept ("this report shows"); ``command``: the one that shows another kind,
        where it is not this command given ``--device``."""
        if not self.left_out:
            return None
        others = ", ".join(f"{n} of {as_json(k)}" for k, n in self.left_out.most_common())
        text = (
            f"{name} holds records of {len(self.left_out) + 1} device kinds (merge.mix_devices): {reads} its "
            f"{len(self.doc.results)} of {as_json(self.kind)}, leaving out {others}"
        )
        named = [k for k, _ in self.left_out.most_common() if isinstance(k, str)]  # --device takes a name
        if not named:
            return text
        pick = f"--device {shlex.quote(named[0])}"
        return text + (f"; `{command} {pick}` shows another" if command else f"; {pick} picks another")


def one_device(doc: ResultsDoc, kind: Any = None) -> OneDevice:
    """``doc``'s records of ``kind`` (default: its device block's kind where records have it, else
    the first record's): the document itself where no record is of another kind. A ``kind`` no
    record has is refused, naming the kinds there are."""
    counts = Counter(kind_of(rec, doc) for rec in doc.results)
    own = doc.device.get("device_kind")
    if kind is None:
        kind = own if own in counts or not counts else next(iter(counts))
    if counts and kind not in counts:
        held = ", ".join(as_json(k) for k in counts)
        raise ResultsError(
            f"{doc.name} holds no record of device {as_json(kind)}; its records are of {held}: pass --device "
            "with one of those"
        )
    left_out = Counter({k: n for k, n in counts.items() if k != kind})
    if not left_out:
        return OneDevice(doc, kind, left_out)
    device = doc.device if kind == own else {"device_kind": kind}
    kept = [rec for rec in doc.results if kind_of(rec, doc) == kind]
    return OneDevice(dataclasses.replace(doc, results=kept, device=dict(device)), kind, left_out)
