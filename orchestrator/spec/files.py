"""Reading spec files (JSON or TOML) into a ``SweepSpec`` with one-line errors.

pydantic's own messages are good but multi-line and do not list the allowed keys for a
typo; users get one line that names the file, the field path and what is allowed.
"""

from __future__ import annotations

import json
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec.model import SweepSpec


def load_spec(path: str | Path) -> SweepSpec:
    """Load a spec file. A results document (``{device, config, results}``) is accepted
    too: its ``config`` block is the spec it was made with."""
    p = Path(path)
    data = read_spec_data(p)
    return with_absolute_paths(spec_from_data(data, source=str(p)))


def with_absolute_paths(spec: SweepSpec) -> SweepSpec:
    """The spec with its replay source made absolute (from the working directory, as ``output``
    is): workers on other nodes, started in other folders, read it."""
    if spec.replay is None or Path(spec.replay.source).is_absolute():
        return spec
    replay = spec.replay.model_copy(update={"source": str(Path(spec.replay.source).resolve())})
    return spec.model_copy(update={"replay": replay})


def with_device_kind(spec: SweepSpec, device_kind: str | None) -> SweepSpec:
    """The spec with ``kernel.device_kind`` replaced (``--device-kind``), checked as a spec file is."""
    if device_kind is None:
        return spec
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["kernel"] = {**data.get("kernel", {}), "device_kind": device_kind}
    return spec_from_data(data, source="--device-kind")


def read_spec_data(p: Path) -> dict[str, Any]:
    if not p.exists():
        raise SpecError(f"spec file {p} does not exist; pass the path of a JSON or TOML spec")
    if p.is_dir():
        raise SpecError(f"spec file {p} is a directory; pass the path of a JSON or TOML spec")
    if p.suffix.lower() in (".yaml", ".yml"):
        raise SpecError(f"spec file {p}: YAML is not supported: use JSON or TOML")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read spec file {p}: {exc}") from None
    if p.suffix.lower() == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"spec file {p} is not valid TOML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(
                f"spec file {p} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
    if not isinstance(data, dict):
        raise SpecError(f"spec file {p} must hold an object of spec fields, got {type(data).__name__}")
    if {"config", "results"} <= data.keys() and isinstance(data["config"], dict):
        data = data["config"]  # a results document: reuse its config block
    return data


def spec_from_data(data: dict[str, Any], source: str = "spec") -> SweepSpec:
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: {describe_validation_error(exc, SweepSpec)}") from None


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """First error of a ValidationError as one line: field path, problem, what is allowed."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = [str(part) for part in first["loc"]]
    where = ".".join(loc) or "spec"
    kind = first["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, first["loc"][:-1])
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        close = _closest(loc[-1], allowed)
        did_you_mean = f" (did you mean {close!r}?)" if close else ""
        msg = f"unknown field {where!r}{did_you_mean}{hint}"
    else:
        text = first["msg"].removeprefix("Value error, ")
        got = first.get("input")
        shown = "" if repr(got) in text or len(repr(got)) > 80 or not loc else f" (got {got!r})"
        msg = f"field {where!r}: {text}{shown}" if loc else text
    more = len(errors) - 1
    return msg + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _closest(name: str, allowed: list[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(name, allowed, n=1, cutoff=0.75)
    return match[0] if match else None
