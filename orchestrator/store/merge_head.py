"""What a merged document says around its records: its device block and its ``tilesweep``
block (provenance, how the records were measured, what planning reused, what halving's round 2
and a search decided), built from the sweep directory and the partials' headers
(``provenance`` holds the block's layout; ``merge`` writes it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from orchestrator.store.carried import read_summary
from orchestrator.store.files import now_iso
from orchestrator.store.lines import DeviceBlock, document_device
from orchestrator.store.provenance import (
    GpuHours,
    ReusedBlock,
    RoundsBlock,
    TilesweepBlock,
    measurement,
    tilesweep_block,
    unit_attempts,
)
from orchestrator.store.round2 import read_round2
from orchestrator.store.searchrounds import planned_total, search_block
from orchestrator.store.segments import Segment
from orchestrator.store.sweepdir import SweepDir


def tilesweep_of(
    sd: SweepDir, segs: list[Segment], env: dict[str, Any] | None, extra: Mapping[str, Any] | None = None
) -> TilesweepBlock:
    """The document's ``tilesweep`` key: provenance, and how the records were measured."""
    reused = read_summary(sd)
    round2 = read_round2(sd)
    return tilesweep_block(
        sweep_dir=str(sd.root),
        spec=sd.spec,
        env=env,
        merged=now_iso(),
        planned=planned_total(sd),
        attempts={s.unit: unit_attempts(s.headers, s.mtime_ns) for s in segs if s.headers},
        gpu_hours=cast(GpuHours, extra or {}),  # the caller's block keys: control.sweeps.accounting
        measured=measurement(sd.spec, [h for s in segs for h in s.headers]),
        reused=None if reused is None else _reused(reused),
        rounds=None if round2 is None else _rounds(round2),
        search=search_block(sd),
    )


def _reused(summary: Mapping[str, Any]) -> ReusedBlock:
    """What planning carried from earlier documents instead of measuring (``reuse.json``)."""
    block: ReusedBlock = {
        "unit": summary.get("unit"),
        "records": summary.get("reused"),
        "from": {s["path"]: s["reused"] for s in summary.get("sources", []) if s.get("reused")},
    }
    measured = summary.get("measured")
    if isinstance(measured, dict) and measured:
        block["measured"] = measured
    return block


def _rounds(round2: Mapping[str, Any]) -> RoundsBlock:
    """What planning round 2 decided (``round2.json``)."""
    block: RoundsBlock = {
        "screened": round2.get("screened"),
        "survivors": round2.get("survivors"),
        "units": round2.get("units"),
        "planned": round2.get("planned"),
    }
    if isinstance(round2.get("ids"), list):
        block["survivor_ids"] = round2["ids"]
    return block


def device_of(segs: list[Segment]) -> DeviceBlock:
    """The device block of the first worker header; a reuse unit's header (``store.reuse``)
    only where no worker has run yet (it names the device kind alone)."""
    headers = [h for s in segs for h in s.headers if isinstance(h.get("device"), dict)]
    for h in sorted(headers, key=lambda h: "reuse" in h):
        return document_device(h["device"])
    return {}
