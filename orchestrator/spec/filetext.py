"""A spec file's bytes to the value it holds, and what to say where they are not a spec's text.

A spec is UTF-8 (a byte-order mark before it is taken: some editors write one); a file saved
as UTF-16 or UTF-32 (Windows editors offer it) is named as such, with the fix, not called
binary. JSON's parser says where it stopped in its own grammar's words ("Expecting property
name enclosed in double quotes"); what a user wrote there is said instead where it is a thing
JSON lacks: a comment, a comma after the last item, Python's True/False/None, a string in
single quotes. ``orchestrator.spec.files`` reads spec files through ``spec_text`` and ``parse``.
"""

from __future__ import annotations

import codecs
import json
import tomllib
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError

MAX_DEPTH = 32  # levels of objects and lists a spec file may nest (the deepest field nests 4)

# byte-order marks of the encodings a spec is not in, longest first (UTF-32's starts as UTF-16's)
_OTHER_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _wide_encoding(raw: bytes) -> str | None:
    """ "UTF-16" or "UTF-32" where ``raw`` is text in one of them (its byte-order mark, or, without
    one, the NUL bytes beside each ASCII character of a spec's text), else None."""
    for bom, name in _OTHER_BOMS:
        if raw.startswith(bom):
            return name
    head = raw[:64]
    if len(head) >= 4 and head.count(0) * 2 >= len(head):
        if all(head[i] == 0 for i in range(len(head)) if i % 4 != (0 if head[0] else 3)):
            return "UTF-32"
        if all(head[i] == 0 for i in range(len(head)) if i % 2 != (0 if head[0] else 1)):
            return "UTF-16"
    return None


def spec_text(p: Path, raw: bytes) -> str:
    """The text of the spec file ``p`` (its bytes ``raw``), or a SpecError saying what it is instead."""
    wide = _wide_encoding(raw)
    if wide is not None:
        raise SpecError(
            f"spec file {p} is {wide} text; tilesweep reads UTF-8: save it as UTF-8 "
            "(in most editors: Save As, encoding UTF-8)"
        )
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark (some editors write one) is no text
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"spec file {p} is not text (byte {exc.object[exc.start]:#04x} at offset {exc.start} is not UTF-8); "
            "pass a JSON or TOML spec"
        ) from None
    if "\x00" in text:
        raise SpecError(f"spec file {p} is not text (it holds NUL bytes); pass a JSON or TOML spec")
    return text


def _deeper_than(data: Any, limit: int) -> bool:
    """Whether ``data`` nests objects and lists more than ``limit`` levels (walked without
    recursion: a file nested thousands deep is refused, not a crash)."""
    stack = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth >= limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def parse(p: Path, text: str) -> Any:
    """The spec file's text parsed as TOML (by its suffix) or JSON; one line where it is neither,
    or nests deeper than a spec's fields do (``MAX_DEPTH``)."""
    deep = f"spec file {p} nests its values more than {MAX_DEPTH} levels deep; a spec's fields nest a few at most"
    try:
        if p.suffix.lower() == ".toml":
            data: Any = tomllib.loads(text)
        else:
            data = json.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"spec file {p} is not valid TOML: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SpecError(json_error(p, exc)) from None
    except RecursionError:
        raise SpecError(deep) from None
    if _deeper_than(data, MAX_DEPTH):
        raise SpecError(deep)
    return data


# Python's spellings a JSON file may hold where a value goes, and JSON's
_PYTHON_WORDS = {"True": "true", "False": "false", "None": "null"}


def json_error(p: Path, exc: json.JSONDecodeError) -> str:
    """The line for a spec file JSON's parser refused: what is there, where JSON lacks it."""
    text, pos = exc.doc, exc.pos
    here = text[pos:]
    line = text.count("\n", 0, pos) + 1
    if here.startswith(("//", "/*", "#")):
        return f"spec file {p} line {line}: JSON has no comments; remove it (or write the spec in TOML, which has them)"
    before = text[:pos].rstrip()
    if here[:1] in ("}", "]") and before.endswith(","):
        comma = text.count("\n", 0, len(before)) + 1
        return f"spec file {p} line {comma}: trailing comma after the last item; JSON allows none there: remove it"
    word = next((w for w in _PYTHON_WORDS if here.startswith(w)), None)
    if word is not None:
        return f"spec file {p} line {line}: {word} is Python's spelling; JSON writes {_PYTHON_WORDS[word]}"
    if here.startswith("'"):
        return f'spec file {p} line {line}: JSON strings and keys take double quotes ("..."), not single ones'
    return f"spec file {p} is not valid JSON: {where_json_stopped(exc)}"


def where_json_stopped(exc: json.JSONDecodeError) -> str:
    """The parser's words and where it stopped, read as one phrase: a message of its that ends
    in "at" ("Unterminated string starting at") takes the place without a second one."""
    return f"{exc.msg.removesuffix(' at')} at line {exc.lineno} column {exc.colno}"
