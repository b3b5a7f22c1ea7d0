"""A value as a JSON file spells it, for the messages that show a user what a spec, a record or
a tuned table holds: ``true``, ``null``, ``"fwd"``, ``[1, 2]``, never Python's ``True``,
``None``, ``'fwd'``. Jax-free, so the kernels' rules and the orchestrator's messages share it.
"""

from __future__ import annotations

import json
from typing import Any


def as_json(value: Any) -> str:
    """``value`` in JSON's spelling; Python's ``repr`` for what JSON has none of (a TOML date)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
