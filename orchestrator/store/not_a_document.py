"""What a file given for a results document is instead, in a user's words: no JSON (empty, not
text, a page, cut short, where the parser stopped), a sweep spec (JSON or TOML), a file of a sweep
directory itself, one of tokamax's tables, a tuned table, an empty object, or an object of other keys;
``document``'s readers raise the line."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernels.spelling import as_json
from orchestrator import PROG, counted, word
from orchestrator.spec.filetext import where_json_stopped


def not_json(data: bytes, exc: ValueError) -> str:
    """Why ``data``, which JSON's parser refused (``exc``), is no JSON, in a user's words: an empty
    file, bytes that are not text, a page, a file cut short, or where the parser stopped."""
    if not data.strip():
        return "the file is empty"
    if isinstance(exc, UnicodeDecodeError):
        return f"not text (byte {exc.object[exc.start]:#04x} at offset {exc.start} is not UTF-8)"
    if data.lstrip().startswith(b"<"):
        return "not valid JSON: it opens with <, as an HTML or XML file does"
    if isinstance(exc, json.JSONDecodeError):
        if _cut_short(exc):
            return (
                f"the file ends before its JSON does, after {counted(len(data), 'byte')}: cut short by a copy or a "
                f"write that stopped; copy it again, or write a sweep's document again with `{PROG} merge SWEEP_DIR`"
            )
        return f"not valid JSON: {where_json_stopped(exc)}"
    return f"not valid JSON ({exc})"


def _cut_short(exc: json.JSONDecodeError) -> bool:
    """Whether JSON's parser ran into the end of the text: a string it found no end of (a line
    break inside one is refused as such, so only the text's end leaves one open), or a value it
    expected after the last character."""
    return exc.msg.startswith("Unterminated string") or not exc.doc[exc.pos :].strip()


def sweep_file_said(path: str, name: str) -> str | None:
    """Where ``path`` is a file of a sweep directory itself (its sweep.json, a unit file, a partial,
    a log), the line that says so and names the document its merge writes; None otherwise."""
    from orchestrator.errors import TilesweepError
    from orchestrator.store.sweep_paths import own_file
    from orchestrator.store.sweepdir import SweepDir

    for root in list(Path(path).absolute().parents)[:3]:
        if (root / "sweep.json").is_file() and own_file(root, Path(path)):
            try:
                output = f"its results document, {word(SweepDir(root).output)}, which "
            except (TilesweepError, OSError, ValueError, KeyError):  # a sweep.json that names none
                output = "its results document, which "
            return (
                f"{name} is a file of the sweep directory {word(root)}, not a results document; pass {output}"
                f"`{PROG} merge {word(root)}` writes"
            )
    return None


_SPEC_BYTES = 1 << 20  # a larger file that is not JSON is not read as a TOML spec


def toml_of(data: bytes) -> Any:
    """The value a TOML text holds (a spec file in TOML: a few KiB), None where it is none."""
    import tomllib

    if len(data) > _SPEC_BYTES:
        return None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


def spec_said(obj: Any, name: str) -> str | None:
    """Where ``obj`` is a sweep spec (most of its top-level keys are the spec's), the line that
    says so and names the document its sweep writes (the spec's output); None otherwise."""
    from orchestrator.spec.model import SweepSpec

    fields = SweepSpec.model_fields
    if not isinstance(obj, Mapping) or 2 * sum(k in fields for k in obj) <= len(obj):
        return None
    output = obj.get("output")
    output = output if isinstance(output, str) and output else fields["output"].default
    return (
        f"{name} is a sweep spec, not a results document; pass the document its sweep writes (the spec's output, "
        f"{word(output)}): `{PROG} run SPEC` measures the spec and writes it"
    )


def not_a_document(obj: Mapping[str, Any], name: str, missing: list[str]) -> str:
    """Why an object lacking top-level keys is no results document: what it is instead where
    it is a tilesweep file (a spec, a tuned table, tokamax's tables) or empty, else its keys (the first few)."""
    from kernels.tokamax_meta import holds_table

    spec = spec_said(obj, name)
    if spec is not None:
        return spec
    if holds_table(obj):
        return (
            f"{name} is one of tokamax's autotuning tables (`export --format tokamax` writes them), not a results "
            "document; pass the results document it was exported from"
        )
    if isinstance(obj.get("format"), str) and "entries" in obj:
        return (
            f"{name} is a tuned table (format {as_json(obj['format'])}: `export` writes them), not a results document; "
            "pass the results document it was exported from"
        )
    if not obj:
        return (
            f"{name}: not a results document: it is an empty JSON object ({{}}); pass the results document a sweep "
            f"wrote (the spec's output: `{PROG} run SPEC` writes it, `{PROG} merge SWEEP_DIR` writes it again)"
        )
    keys = [str(k) if len(str(k)) <= 40 else str(k)[:37] + "..." for k in list(obj)[:_KEYS_SHOWN]]
    more = f" and {len(obj) - _KEYS_SHOWN} more" if len(obj) > _KEYS_SHOWN else ""
    return (
        f"{name}: not a results document: missing top-level key(s) {', '.join(missing)} (has: {', '.join(keys)}{more})"
    )


_KEYS_SHOWN = 6
