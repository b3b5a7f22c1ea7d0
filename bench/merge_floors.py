"""The floors ``bench.merge`` holds the merge against: the fastest way we know to read the same
records from the same partials (orjson, the collector off, records placed in plan order) and to
write the same document bytes (every candidate writer timed, its bytes compared with the
merge's document), and the raw I/O floor. Each ``child_*`` runs in a fresh subprocess of
``bench.merge`` and returns its figures as a JSON-able dict; ``floor_s`` picks the fastest
byte-identical writer from them. ``bench/merge.py``'s docstring says what the floors leave out.
"""

from __future__ import annotations

import filecmp
import gc
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PLACEHOLDER = "\x00results\x00"


def read_records(sweep: Path) -> list[dict[str, Any]]:
    """Every record of the sweep's partials, with its unit and attempt, in plan order."""
    import orjson

    units = orjson.loads((sweep / "units.json").read_bytes())
    slots: list[dict[str, Any] | None] = [None] * sum(u["n_items"] for u in units)
    for u in units:
        uid = u["id"]
        pos = {iid: index for index, iid in orjson.loads((sweep / "units" / f"{uid}.json").read_bytes())["items"]}
        for line in (sweep / "partials" / f"{uid}.jsonl").read_bytes().split(b"\n"):
            if line.startswith(b'{"id":'):
                obj = orjson.loads(line)
                rec = obj["record"]
                rec["unit"], rec["attempt"] = uid, obj["attempt"]
                slots[pos[obj["id"]]] = rec
    return [r for r in slots if r is not None]


def _head_text(head: dict[str, Any]) -> tuple[str, str]:
    """The document's text before and after its results list (the head is small)."""
    text = json.dumps({**head, "results": _PLACEHOLDER}, indent=1)
    before, after = text.split(json.dumps(_PLACEHOLDER), 1)
    return before, after


def write_record_text(out: Path, head: dict[str, Any], records: list[dict[str, Any]]) -> None:
    from orchestrator.store.texts import record_text

    before, after = _head_text(head)
    with open(out, "wb") as f:
        f.write((before + "[\n  ").encode())
        f.write(b",\n  ".join(map(record_text, records)))
        f.write(("\n ]" + after).encode())


def write_one_encode(out: Path, head: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """One C-encoder call: records are flat and JSON strings hold no raw newline, so
    ``},\\n   {`` occurs only between records."""
    before, after = _head_text(head)
    body = json.JSONEncoder(separators=(",\n   ", ": ")).encode(records)
    with open(out, "w", encoding="utf-8") as f:
        f.write(before + "[\n  {\n   ")
        f.write(body[2:-2].replace("},\n   {", "\n  },\n  {\n   "))
        f.write("\n  }\n ]" + after)


# orjson spells floats below 1e-4 otherwise than repr (0.00005, 5e-7 for 5e-05, 5e-07). A match
# followed by a newline is in a JSON value, never in a string (strings hold no raw newline),
# and a value starts after a space (": " or the indentation). Literal prefixes keep it fast.
_ORJSON_FLOATS = (re.compile(rb"0\.0000[0-9]+(?=,?\n)"), re.compile(rb"e-[0-9](?=,?\n)"))
_NON_ASCII = re.compile(rb"[\x80-\xff]+")


def _respell_floats(data: bytes) -> bytes:
    ends = sorted(m.end() for pattern in _ORJSON_FLOATS for m in pattern.finditer(data))
    parts, last = [], 0
    for end in ends:
        start = data.rfind(b" ", 0, end) + 1
        parts += [data[last:start], repr(float(data[start:end])).encode()]
        last = end
    parts.append(data[last:])
    return b"".join(parts)


def write_orjson(out: Path, head: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """orjson with a fix-up: the records' 4-space field indent made 3 (records are flat, and
    strings hold no raw newline), the floats orjson spells otherwise respelled by repr,
    non-ASCII escaped. Not identical where a record holds NaN or an infinity (orjson: null)."""
    import orjson

    before, after = _head_text(head)
    body = orjson.dumps(records, option=orjson.OPT_INDENT_2).replace(b"\n    ", b"\n   ")
    body = _respell_floats(body[:-1]) + b" ]" if records else b"[]"
    if not body.isascii():
        body = _NON_ASCII.sub(lambda m: json.dumps(m.group().decode())[1:-1].encode(), body)
    with open(out, "wb") as f:
        f.write(before.encode())
        f.write(body)
        f.write(after.encode())


_BATCH = 1000  # records a ``write_batched`` call encodes at once, as the merge does per partial


def write_batched(out: Path, head: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """The merge's own way (``texts.record_texts``: orjson and its fix-ups over a thousand
    records at a time), joined straight into the file: small buffers where one ``orjson.dumps``
    of the whole list allocates the document's size three times over."""
    from orchestrator.store.texts import record_texts

    before, after = _head_text(head)
    with open(out, "wb") as f:
        f.write((before + ("[\n  " if records else "[]")).encode())
        for i in range(0, len(records), _BATCH):
            f.write((b",\n  " if i else b"") + b",\n  ".join(record_texts(records[i : i + _BATCH])))
        f.write((("\n ]" if records else "") + after).encode())


WRITERS: dict[str, Callable[[Path, dict[str, Any], list[dict[str, Any]]], None]] = {
    "record_text": write_record_text,
    "one_encode": write_one_encode,
    "orjson": write_orjson,
    "batched": write_batched,
}


def time_writers(out: Path, head: dict[str, Any], records: list[dict[str, Any]], reference: Path) -> dict[str, Any]:
    """Each writer's seconds and whether its bytes equal ``reference``'s."""
    res = {}
    for name, write in WRITERS.items():
        t0, c0 = time.perf_counter(), time.process_time()
        write(out, head, records)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        res[name] = {"s": dt, "cpu": cpu, "identical": filecmp.cmp(out, reference, shallow=False)}
        out.unlink()
    return res


def _head_of(doc_path: Path) -> dict[str, Any]:
    import orjson

    doc = orjson.loads(doc_path.read_bytes())
    return {k: (None if k == "results" else v) for k, v in doc.items()}


def child_floor(sweep: str, doc: str, out: str) -> dict[str, Any]:
    """Read the partials with orjson, then write the document with every candidate writer."""
    gc.disable()  # a million acyclic dicts: a competent user does not let the collector walk them
    head = _head_of(Path(doc))
    t0, c0 = time.perf_counter(), time.process_time()
    records = read_records(Path(sweep))
    read_s, read_cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"read_s": read_s, "read_cpu": read_cpu, "writers": time_writers(Path(out), head, records, Path(doc))}


def child_docfloor(doc: str, out: str) -> dict[str, Any]:
    """Parse the whole document with orjson, then write it with every candidate writer."""
    import orjson

    gc.disable()
    t0 = time.perf_counter()
    parsed = orjson.loads(Path(doc).read_bytes())
    read_s = time.perf_counter() - t0
    records = parsed["results"]
    parsed["results"] = None
    return {"read_s": read_s, "writers": time_writers(Path(out), parsed, records, Path(doc))}


def child_io(sweep: str, doc: str, out: str) -> dict[str, Any]:
    """Read every partial's bytes, write the document's bytes (held in memory beforehand)."""
    data = Path(doc).read_bytes()
    t0 = time.perf_counter()
    total = 0
    for p in sorted((Path(sweep) / "partials").iterdir()):
        total += len(p.read_bytes())
    Path(out).write_bytes(data)
    dt = time.perf_counter() - t0
    Path(out).unlink()
    return {"s": dt, "read_bytes": total}


# ---------------------------------------------------------------------------- choosing the floor


def floor_s(res: dict[str, Any]) -> tuple[float, str]:
    """Read time plus the fastest byte-identical writer's time, and that writer's name."""
    ok = {name: w["s"] for name, w in res["writers"].items() if w["identical"]}
    if not ok:
        raise SystemExit(f"no floor writer wrote the merge's bytes: {res['writers']}")
    best = min(ok, key=ok.__getitem__)
    return res["read_s"] + ok[best], best


def floor_cpu_s(res: dict[str, Any], best: str) -> float:
    """The CPU seconds of the floor ``floor_s`` chose: its read and its writer ``best``."""
    return float(res["read_cpu"] + res["writers"][best]["cpu"])


def writers_line(res: dict[str, Any]) -> str:
    return " ".join(f"{n}={w['s']:.2f}s{'' if w['identical'] else '(differs)'}" for n, w in res["writers"].items())
