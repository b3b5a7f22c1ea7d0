"""Which of a problem's timed configs is its best: **the one home of the pick**, whatever reads it
(the report's best and runner-up, the tuned table ``export`` writes, tokamax's tables).

The figure a best is picked by is a config's median time. Two configs may tie on it (equal
medians: a replay's virtual clock, a timer's resolution); the pick then never depends on the
order of the records, which a merge, an append or a combination of documents may change:

1. the lower median;
2. then the lower q3, the slower quartile: the steadier timing (a record without a q3 counts
   its median);
3. then config order: the config whose fields, taken in the order of their names, come first,
   each value compared as a number where it is one (the smaller tile first; ``false`` before
   ``true``), else as its JSON text, a missing value (``null``) before any;
4. between implementations, or tags, answering one problem (the tuned table's ``wins`` and its
   choice among tags, the report's winning implementation): then the implementation's name, then
   the tag's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

ValueKey = tuple[int, float, str]
ConfigKey = tuple[tuple[str, ValueKey], ...]


def quartiles(rec: Mapping[str, Any]) -> tuple[float, float]:
    """q1/q3 of a record, falling back to the median where a quartile is missing."""
    m = float(rec["median_ms"])
    q1, q3 = rec.get("q1_ms"), rec.get("q3_ms")
    q1 = float(q1) if isinstance(q1, (int, float)) and math.isfinite(q1) else m
    q3 = float(q3) if isinstance(q3, (int, float)) and math.isfinite(q3) else m
    return min(q1, m), max(q3, m)


def _value_key(value: Any) -> ValueKey:
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, (bool, int, float)):
        return (1, float(value), "")
    return (2, 0.0, json.dumps(value, sort_keys=True))


def config_order(config: Mapping[str, Any] | None) -> ConfigKey:
    """Where a config comes in config order (rule 3 of the module docstring); no config (auto's
    own choice) comes first."""
    given = config or {}
    return tuple((name, _value_key(given[name])) for name in sorted(given))


def rank(rec: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[float, float, ConfigKey]:
    """A timed record's place among its problem's, the best first (the module docstring's rules):
    ``config`` is its config fields."""
    return float(rec["median_ms"]), quartiles(rec)[1], config_order(config)


PickKey = tuple[float, float, ConfigKey, str, str]


def pick(ms: float, q3: float | None, config: Mapping[str, Any] | None, impl: str, tag: str = "") -> PickKey:
    """Where one implementation's (or tag's) answer to a problem comes among the others' (rules 1
    to 4, the best first): its time ``ms`` and that timing's ``q3`` (None: its median), its
    ``config`` (None: auto's own choice), its implementation and tag."""
    return ms, ms if q3 is None else q3, config_order(config), impl, tag
