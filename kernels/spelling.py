"""A value as a JSON file spells it, for the messages that show a user what a spec, a record or
a tuned table holds: ``true``, ``null``, ``"fwd"``, ``[1, 2]``, never Python's ``True``,
``None``, ``'fwd'``. Jax-free, so the kernels' rules and the orchestrator's messages share it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

# a value pydantic shows as Python does: a string in single quotes (a quote inside it escaped),
# True, False or None
_PY_VALUE = re.compile(r"'((?:[^'\\\n]|\\.)*)'|\b(True|False|None)\b")
_PY_NAMES = {"True": "true", "False": "false", "None": "null"}
# the types of pydantic's errors whose words name the values allowed (``json_choices`` respells them)
CHOICE_ERRORS = ("literal_error", "enum")


def as_json(value: Any) -> str:
    """``value`` in JSON's spelling (a numpy scalar as the number or bool it holds: ``0``, not
    ``np.int64(0)``); Python's ``repr`` for what JSON has none of (a TOML date)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        pass
    try:  # a numpy scalar's ``item()`` is the Python value it holds (an array of several refuses)
        return json.dumps(value.item(), ensure_ascii=False)
    except (AttributeError, TypeError, ValueError):
        return repr(value)


def one_of(values: Iterable[Any]) -> str:
    """Allowed values as a message lists them, each as a file spells it: ``"fwd", "fwd_bwd"``."""
    return ", ".join(as_json(v) for v in values)


def json_choices(text: str) -> str:
    """pydantic's words for the values a literal or an enum allows (``Input should be 'fwd' or
    'fwd_bwd'``, ``True``, ``None``) as a JSON or TOML file spells them: ``"fwd"``, ``true``,
    ``null``. Only for those messages: another message's apostrophe is not a quote."""
    return _PY_VALUE.sub(
        lambda m: _PY_NAMES[m.group(2)] if m.group(2) else as_json(m.group(1).replace("\\'", "'")), text
    )
