"""The merger's record texts: many records written in one orjson call and fixed up are, byte for
byte, what ``json.dumps(doc, indent=1)`` writes, whatever the values (floats of every magnitude,
non-ASCII and control characters, integers past 64 bits, NaN)."""

from __future__ import annotations

import json
import math
import random
import struct
from typing import Any

import pytest

from orchestrator.store.texts import non_finite, record_text, record_texts

ODD = [1e-05, 5e-05, 0.0001, 1.5e-07, 1e16, 1e22, 5e-324, 1.7976931348623157e308, -0.0, 10.00001, -5e-05]
STRINGS = ["é ✓ \u2028 \U0001f600", "a\x7fb\x00\x1f", 'q"0.00001', 'x\\": 1e-7', "e-5", 'say "hi",\n   "x": 1},\n  {']


def as_document(recs: list[dict[str, Any]]) -> str:
    return json.dumps({"results": recs}, indent=1)


def test_one_call_writes_each_record_as_the_stdlib_does() -> None:
    rng = random.Random(3)
    recs: list[dict[str, Any]] = []
    for k in range(3000):
        exponent = rng.randint(-320, 305)
        floats = [rng.random() * 10.0 ** max(exponent, -300) * 10.0 ** min(0, exponent + 300) for _ in range(3)]
        bits = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        recs.append(
            {
                "dtype": "bfloat16",
                "tag": STRINGS[k % len(STRINGS)],
                "odd": ODD[k % len(ODD)],
                "a": floats[0],
                "b": -floats[1],
                "c": floats[2],
                "bits": bits if math.isfinite(bits) else 0.5,
                "int": rng.randint(-(2**63), 2**64 - 1),
                "none": None,
                "flag": k % 2 == 0,
            }
        )
    texts = record_texts(recs)
    assert texts == [record_text(r) for r in recs]
    assert as_document(recs) == '{\n "results": [\n  ' + b",\n  ".join(texts).decode() + "\n ]\n}"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 2**70, -(2**64)])
def test_what_orjson_cannot_write_is_written_by_the_stdlib(value: float) -> None:
    recs = [{"dtype": "float32", "rel_err": value}, {"dtype": "float32", "rel_err": 1e-06}]
    text = json.dumps(recs[0]).encode()
    assert record_texts(recs, stdlib=non_finite(text)) == [record_text(r) for r in recs]


def test_a_record_holding_a_list_is_written_as_the_stdlib_does() -> None:
    recs: list[dict[str, Any]] = [
        {"seq": 128, "samples_ms": [0.5, 2.5e-05, 1e-07], "median_ms": 0.5},
        {"seq": 256, "median_ms": 1.0},
    ]
    assert record_texts(recs) == [json.dumps(r, indent=1).replace("\n", "\n  ").encode() for r in recs]
