"""The crash trials' oracle: what a sweep must hold after kills, resume and merge, judged with
the standard library only, so it shares no code with tilesweep (``tests.crash_trials`` says
what it counts and why).

The plan is what ``tilesweep plan SPEC --dry-run --json`` prints (one object per planned item),
a record's identity is its identity and config field values (``ORACLE_FIELDS``, spelled out
here), the document is ``json.loads``ed and must equal ``json.dumps(doc, indent=1)`` byte for
byte, and every record line complete in a partial at any kill (``json.loads`` of each line)
must be in the document unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
ORACLE_FIELDS = (
    "dtype",
    "head_dim",
    "seq",
    "batch",
    "heads",
    "tag",
    "mode",
    "config",
    "block_q",
    "block_k",
    "fwd_block_q",
    "fwd_block_k",
    "bwd_outer",
    "bwd_inner",
    "num_stages",
    "num_warps",
)


def key(rec: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(rec.get(k) for k in ORACLE_FIELDS)


def plan_of(spec_data: dict[str, Any], folder: Path) -> list[dict[str, Any]]:
    """The planned items as ``tilesweep plan --dry-run --json`` prints them."""
    path = folder / "oracle-spec.json"
    path.write_text(json.dumps(spec_data))
    r = subprocess.run(
        [PY, "-m", "orchestrator", "plan", str(path), "--dry-run", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line) for line in r.stdout.splitlines()]


def complete_records(partials: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every record line now complete (newline-terminated, parsable) in the partials."""
    out = {}
    for p in sorted(partials.glob("*.jsonl")) if partials.is_dir() else []:
        for line in p.read_bytes().split(b"\n")[:-1]:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("record"), dict):
                out[key(obj["record"])] = obj["record"]
    return out


def judge(
    plan: list[dict[str, Any]], doc_path: Path, finished: dict[tuple[Any, ...], dict[str, Any]]
) -> dict[str, Any]:
    text = doc_path.read_text(encoding="utf-8")
    doc = json.loads(text)
    problems = [] if json.dumps(doc, indent=1) == text else ["document is not json.dumps(doc, indent=1)"]
    keys = Counter(key(r) for r in doc["results"])
    by_key = {key(r): r for r in doc["results"]}
    planned = {key(p): p for p in plan}
    changed = [
        k
        for k, rec in finished.items()
        if {f: v for f, v in by_key.get(k, {}).items() if f not in ("unit", "attempt")} != rec
    ]
    false = [
        r
        for r in doc["results"]
        if "error" in r and key(r) in planned and "error" not in planned[key(r)] and not planned[key(r)]["pruned"]
    ]
    return {
        "lost": len(planned.keys() - keys.keys()) + len(changed),
        "duplicated": sum(n - 1 for n in keys.values()),
        "foreign": len(keys.keys() - planned.keys()),
        "false_errors": len(false),
        "problems": problems + [f"false error: {r['error'][:100]}" for r in false[:2]],
    }


def check_document(path: Path) -> dict[str, Any]:
    """The document must parse and be exactly what json.dumps(indent=1) writes."""
    text = path.read_text(encoding="utf-8")
    doc = json.loads(text)
    if json.dumps(doc, indent=1) != text:
        raise AssertionError(f"{path} is not byte-identical to json.dumps(doc, indent=1)")
    return doc
