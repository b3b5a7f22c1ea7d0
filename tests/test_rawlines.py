"""Record lines read on their bytes (``store/rawlines``): the merger's shortcut keeps exactly what
``partials.classify`` keeps, with the text ``texts.record_texts`` writes for it, line by line,
however a line is spelled; it only ever declines a line to the classifier."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from orchestrator.store import rawlines
from orchestrator.store.partials import RECORD, UnitItems, classify
from orchestrator.store.rawlines import RawRecords, Shapes, canonical_floats, starts_checked
from orchestrator.store.segments import Segment, _consume
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import build_sweep, partial_lines, small_spec
from orchestrator.store.texts import compact_texts, non_finite, record_texts


def _set(line: str, field: str, spelled: str) -> str:
    """``line`` with the value of ``field`` spelled as given (the raw text, not re-encoded), where
    it has that field (an error record has no timings)."""
    return re.sub(rf'"{field}":("[^"]*"|[^,}}]*)', lambda _: f'"{field}":{spelled}', line, count=1)


# Each: what is done to a record line's text. The record stays valid for some, not for others;
# the shortcut must read none of them otherwise than the classifier.
MUTATIONS = {
    "as written": lambda s: s,
    "trailing zero": lambda s: _set(s, "rel_err", repr(json.loads(s)["record"].get("rel_err", 0.5)) + "0"),
    "tiny float, repr": lambda s: _set(s, "rel_err", "5e-05"),
    "tiny float, fixed": lambda s: _set(s, "rel_err", "0.00005"),
    "short exponent": lambda s: _set(s, "rel_err", "5e-7"),
    "capital exponent": lambda s: _set(s, "rel_err", "5E-05"),
    "huge float, fixed": lambda s: _set(s, "rel_err", "12345678901234567.0"),
    "huge float, repr": lambda s: _set(s, "rel_err", "1.2345678901234568e+16"),
    "float past the range": lambda s: _set(s, "rel_err", "1e400"),
    "int where a float may be": lambda s: _set(s, "rel_err", "1"),
    "float where an int must be": lambda s: _set(s, "inner", "78.0"),
    "leading zero": lambda s: _set(s, "inner", "078"),
    "negative zero": lambda s: _set(s, "inner", "-0"),
    "int past 64 bits": lambda s: _set(s, "inner", str(2**70)),
    "NaN": lambda s: _set(s, "rel_err", "NaN"),
    "escaped string": lambda s: _set(s, "timer", '"wall\\u005fclock"'),
    "quote in a string": lambda s: _set(s, "timer", '"say \\"hi\\""'),
    "non-ASCII string": lambda s: _set(s, "timer", '"h\u00e9"'),
    "DEL in a string": lambda s: _set(s, "timer", '"a\u007fb"'),
    "string ends with a comma": lambda s: _set(s, "timer", '"wall,"'),
    "string starts with a colon": lambda s: _set(s, "timer", '":wall"'),
    "string of separators": lambda s: _set(s, "timer", '",\\":\\",\\""'),
    "keys reordered": lambda s: (
        s.replace('"rel_err":', '"zz":').replace('"compile_s":', '"rel_err":').replace('"zz":', '"compile_s":')
    ),
    "unknown key": lambda s: s.replace('"timer":', '"timer2":1,"timer":'),
    "key twice": lambda s: s.replace('"timer":', '"inner":3,"timer":'),
    "spaces": lambda s: s.replace(',"', ', "'),
    "id a digit longer": lambda s: s.replace('"id":"', '"id":"0', 1),
    "id off by a digit": lambda s: re.sub(r'"id":"(.)', lambda m: '"id":"' + ("1" if m[1] != "1" else "2"), s, count=1),
    "identity changed": lambda s: _set(s, "batch", "5"),
    "attempt a string": lambda s: _set(s, "attempt", '"1"'),
    "attempt 2": lambda s: _set(s, "attempt", "2"),
    "torn": lambda s: s[: len(s) // 2],
    "a list": lambda s: _set(s, "timer", "[1.5,2.0]"),
    "samples": lambda s: s.replace('"timer":', '"samples_ms":[0.1,2.5e-05],"timer":'),
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[SweepDir, str, list[str]]:
    sd, units = build_sweep(tmp_path_factory.mktemp("raw") / "s", small_spec(n_seqs=2), 1, write_partials=False)
    return sd, units[0].id, partial_lines(sd, units[0], random.Random(4))


def _by_classify(lines: list[bytes], unit: str, items: UnitItems) -> dict[int, bytes]:
    """line number -> the record's text, each line classified alone and encoded alone."""
    out = {}
    for k, raw in enumerate(lines):
        kind, _, iid, attempt, rec = classify(raw, True, True, items)
        if kind == RECORD and rec is not None:
            rec.update(unit=unit, attempt=attempt)
            out[k + 1] = record_texts([rec], stdlib=non_finite(raw))[0]
    return out


def _by_merger(lines: list[bytes], sd: SweepDir, unit: str, items: UnitItems) -> dict[int, bytes]:
    seg = Segment(unit, sd.partial_path(unit))
    _consume(seg, b"\n".join(lines) + b"\n", 1, items, tail_ok=False)
    assert len(seg.ln) == len(seg.texts) == len(seg.ids)
    return dict(zip(seg.ln, seg.texts, strict=True))


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_the_shortcut_keeps_what_the_classifier_keeps_with_its_text(
    sweep: tuple[SweepDir, str, list[str]], name: str
) -> None:
    sd, unit, text_lines = sweep
    items = UnitItems(sd.root, unit)
    records = [k for k, s in enumerate(text_lines) if s.startswith('{"id":')]
    mutated = set(records[5::7])  # a few of each layout, among lines read on their bytes
    lines = [(MUTATIONS[name](s) if k in mutated else s).encode() for k, s in enumerate(text_lines)]
    assert name == "as written" or sum(lines[k] != text_lines[k].encode() for k in mutated) >= 3
    assert _by_merger(lines, sd, unit, items) == _by_classify(lines, unit, items)
    raw = RawRecords(Shapes())
    assert sum(raw.take(lines[k], k, items) for k in records if k not in mutated) > len(records) // 2


@pytest.mark.parametrize("with_orjson", [True, False])
def test_float_spellings_are_checked_against_repr(with_orjson: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not with_orjson:  # what a user without orjson gets
        monkeypatch.setattr(rawlines, "_orjson", None)
    tokens = [b"0.5", b"5e-05", b"0.00005", b"1.50", b"1e+16", b"10000000000000000.0", b"-0.0", b"5e-7", b"0.1"]
    assert canonical_floats(tokens) == [2, 3, 5, 7]
    assert canonical_floats([b"0.1", b"123.456"]) == []
    assert canonical_floats([b"0.1", b"1.2.3"]) == [0, 1]  # not numbers at all: classify says what they are


def test_compact_texts_decline_what_re_spacing_would_get_wrong() -> None:
    assert compact_texts([b'"a":1,"b":"x,"'], "u", [b"1"]) is None
    assert compact_texts([b'"a":":x","b":1'], "u", [b"1"]) is None
    rec = {"a": 1, "b": "x, y: z", "c": 0.5}
    text = compact_texts([json.dumps(rec, separators=(",", ":"))[1:-1].encode()], "u", [b"2"])
    assert text == [json.dumps({**rec, "unit": "u", "attempt": 2}, indent=1).replace("\n", "\n  ").encode()]


def test_a_unit_spelled_oddly_is_encoded_by_the_stdlib(tmp_path: Path) -> None:
    assert compact_texts([b'"a":1'], 'u":1', [b"1"]) is None


def test_start_lines_are_checked_all_at_once() -> None:
    start = b'{"start":"0123456789abcdef","attempt":'
    good = b'{"header":{}}\n' + start + b"1}\n" + start + b'2,"alone":true}\n'
    assert starts_checked(good)
    assert not starts_checked(good + b'{"start":"0123456789abcdef","attempt":01}\n')
    assert not starts_checked(good + b'{"start":"0123456789abcdef","attempt":1} \n')
    assert not starts_checked(good + b'{"start":"0123456789abcdef","attempt":1}')  # no newline yet
