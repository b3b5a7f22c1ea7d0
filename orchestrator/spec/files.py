"""Reading spec files (JSON or TOML) into a ``SweepSpec`` with one-line errors.

pydantic's own messages are good but multi-line and do not list the allowed keys for a
typo; users get one line that names the file, the field path and what is allowed.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from kernels.spelling import CHOICE_ERRORS, as_json, json_choices
from kernels.tokamax_meta import holds_table
from orchestrator import PROG, word
from orchestrator.devicefiles import not_a_file
from orchestrator.errors import SpecError
from orchestrator.spec.executor_section import FROZEN
from orchestrator.spec.filetext import parse, spec_text
from orchestrator.spec.model import SweepSpec


def load_spec(path: str | Path) -> SweepSpec:
    """Load a spec file. A results document (``{device, config, results}``) is accepted
    too: the spec in its ``tilesweep`` block where tilesweep wrote it (every section, so a rerun
    of it is the sweep that wrote it), else its ``config`` block (the reference run's)."""
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
    given = spec_from_data(data, source="--device-kind")
    given._source = f"{spec._source} with --device-kind {word(device_kind)}" if spec._source else None
    given._options = {**spec._options, "kernel.device_kind": "--device-kind"}
    return given


def read_spec_data(p: Path) -> dict[str, Any]:
    if str(p) == "-" and not p.exists():  # no command reads a spec from standard input
        raise SpecError(
            "spec file -: tilesweep reads no spec from standard input; save the spec to a file and pass its path "
            f"(`{PROG} spec my_sweep.json`)"
        )
    if not p.exists():
        raise SpecError(f"spec file {p} does not exist; pass the path of a JSON or TOML spec")
    if p.is_dir():
        if (p / _SWEEP_FILE).is_file():
            raise SpecError(f"spec file {p} is a sweep directory, not a spec; {_sweep_commands(p)}")
        raise SpecError(f"spec file {p} is a directory; pass the path of a JSON or TOML spec")
    if not_a_file(p):
        raise SpecError(f"spec file {p} is a device, not a file; pass the path of a JSON or TOML spec")
    if p.suffix.lower() in (".yaml", ".yml"):
        raise SpecError(f"spec file {p}: YAML is not supported: use JSON or TOML")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read spec file {p}: {exc.strerror or exc}") from None
    text = spec_text(p, raw)
    if not text.strip():
        raise SpecError(
            f"spec file {p} is empty; write the spec's fields in it (`{PROG} spec --schema` lists them; "
            "an object with none, {} in JSON, is the reference sweep)"
        )
    data = parse(p, text)
    if not isinstance(data, dict):
        raise SpecError(f"spec file {p} must hold an object of spec fields, {{...}}, not a JSON {json_type(data)}")
    if {"config", "results"} <= data.keys() and isinstance(data["config"], dict):
        own = data.get("tilesweep")
        spec = own.get("spec") if isinstance(own, dict) else None
        if isinstance(spec, dict) and spec:  # tilesweep's document: the whole spec of the sweep that wrote it
            return spec
        if not data["config"]:  # a hand-made or another tool's document: no spec to take
            raise SpecError(
                f"spec file {p} is a results document whose config block is empty, so it names no sweep; "
                "pass the spec the sweep ran"
            )
        return data["config"]  # a results document: reuse its config block
    if data.get("format") == _SWEEP_FORMAT:  # no spec has the key
        raise SpecError(
            f"spec file {p} is the plan of the sweep directory {p.parent}, not a spec; {_sweep_commands(p.parent)}"
        )
    _refuse_an_exported_table(data, p)
    if p.suffix.lower() != ".toml":  # TOML refuses a key given twice; JSON keeps the last
        json.loads(text, object_pairs_hook=lambda pairs: _no_key_twice(pairs, p))
    return data


# a sweep directory's own file and its format (``store.sweepdir`` writes it; the spec, which the
# store imports, names them only to say what a user passed where a spec goes)
_SWEEP_FILE, _SWEEP_FORMAT = "sweep.json", "tilesweep-sweep"


def sweep_dir_given(p: Path) -> Path | None:
    """The sweep directory ``p`` is, or whose plan (its sweep.json) ``p`` is, where a spec file
    was meant; None for anything else."""
    if p.is_dir():
        return p if (p / _SWEEP_FILE).is_file() else None
    if p.name != _SWEEP_FILE or not p.is_file():
        return None
    try:
        data = json.loads(p.read_bytes())
    except (OSError, ValueError):
        return None
    return p.parent if isinstance(data, dict) and data.get("format") == _SWEEP_FORMAT else None


def _sweep_commands(root: Path) -> str:
    """What to run on the sweep directory ``root`` that was passed where a spec goes."""
    return (
        f"`{PROG} resume {word(str(root))}` runs what it has no record of yet, `{PROG} status {word(str(root))}` "
        "says where it stands; pass a spec file to plan or run a sweep"
    )


def _refuse_an_exported_table(data: dict[str, Any], p: Path) -> None:
    """A table ``export`` wrote, passed where a spec goes: said as what it is, not as its keys
    being no spec fields."""
    if "format" in data and data["format"] == _tuned_format():  # no spec has the key
        what = "a tuned table (`export` writes them)"
    elif holds_table(data):
        what = "one of tokamax's autotuning tables (`export --format tokamax` writes them)"
    else:
        return
    raise SpecError(
        f"spec file {p} is {what}, not a spec; pass the spec the sweep ran, or the results document the table "
        "was exported from (its config block is that spec)"
    )


def _tuned_format() -> str:
    from kernels.tuned import FORMAT  # imports numpy: only for a file with a "format" key

    return FORMAT


def json_type(value: Any) -> str:
    """What a parsed JSON (or TOML) value is, in JSON's words ("null", "array", "object", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _no_key_twice(pairs: list[tuple[str, Any]], p: Path) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise SpecError(f"spec file {p} gives the key {as_json(key)} twice in one object; keep the one you mean")
        seen.add(key)
    return dict(pairs)


# The largest integer every JSON reader keeps exactly (a double's 53 bits): a spec is copied into
# sweep.json and the results document, and read back from them (orjson reads a larger one as a float)
JSON_SAFE_INT = 2**53 - 1


def spec_from_data(data: dict[str, Any], source: str | None = None, *, frozen: bool = False) -> SweepSpec:
    """``data`` as a spec, refused in one line naming ``source`` (the file it was read from, which
    the spec keeps for the planner's refusals to name too) and the field. ``frozen``: a spec
    a sweep directory froze when it was planned, whose executor settings may predate a refusal of
    how they were given (``FROZEN`` in the validation context): its sweep stays readable."""
    named = source or "spec"
    where = _too_large(data)
    if where is not None:
        raise SpecError(
            f"{named}: field {as_json(where)}: the number is past {JSON_SAFE_INT:,}, the largest a JSON number keeps "
            "exactly as it is copied into the sweep and its results; write a smaller one"
        )
    try:
        spec = SweepSpec.model_validate(data, context={FROZEN: True} if frozen else None)
    except ValidationError as exc:
        raise SpecError(f"{named}: {describe_validation_error(exc, SweepSpec)}") from None
    spec._source = source
    return spec


def _too_large(value: Any, path: str = "") -> str | None:
    """The dotted path of the first integer in ``value`` past ``JSON_SAFE_INT``, or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (path or "spec") if abs(value) > JSON_SAFE_INT else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        found = _too_large(inner, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


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
        did_you_mean = f" (did you mean {as_json(close)}?)" if close else ""
        msg = f"unknown field {as_json(where)}{did_you_mean}{hint}"
        if loc[:1] == ["executor"] and len(loc) == 2:  # an sbatch option tilesweep does not name
            msg += "; any other sbatch option goes in executor.slurm_additional_parameters"
    else:
        text = first["msg"].removeprefix("Value error, ")
        text = json_choices(text) if kind in CHOICE_ERRORS else text
        if kind in ("model_type", "dict_type"):  # pydantic: "a valid dictionary or instance of TimingSettings"
            text = "Input should be an object"
        got = first.get("input")
        # the rule's own message may say what it got ("got [8]", of the list [8, 32]): not said twice;
        # "greater than 0" does not say the input was 0
        said = (as_json(got) in text or ", got " in text) and kind not in _BOUNDS
        shown = "" if said or len(as_json(got)) > 80 or not loc else f" (got {as_json(got)})"
        instead = _hint(model, first["loc"], kind)
        if got in ("null", "none", "None") and not instead:  # TOML has no null: a string stood in for it
            instead = (
                "a string is not null: in JSON write null, unquoted; TOML has no null: leave the key out for its "
                "default, or write this spec in JSON where the default is not what you mean"
            )
        msg = (f"field {as_json(where)}: {text}{shown}" if loc else text) + (f"; {instead}" if instead else "")
    more = len(errors) - 1
    return msg + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


_BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of")


def _hint(model: type[BaseModel], loc: tuple[Any, ...], kind: str) -> str | None:
    """What to write instead, where pydantic's message does not say what is allowed: the
    values of a list's items and an example, true or false, the keys of a section."""
    annotation, default = _field_at(model, loc)
    if annotation is None:
        return None
    if kind == "list_type":
        items = typing.get_args(annotation)
        what = _values_of(items[0]) if items else None
        example = f", e.g. {json.dumps(default)}" if isinstance(default, list) and default else ""
        return f"write a list{f' of {what}' if what else ''}{example}" if what or example else None
    if kind in ("bool_type", "bool_parsing"):
        return "write true or false"
    if kind in ("model_type", "dict_type") and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"write an object (a table in TOML) with any of: {', '.join(annotation.model_fields)}"
    return None


def _values_of(annotation: Any) -> str | None:
    """The values a type allows, in a spec file's spelling: "fwd" or "fwd_bwd", true or false,
    integers (or null)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        shown = [as_json(a) for a in args]
        return " or ".join([", ".join(shown[:-1]), shown[-1]]) if len(shown) > 1 else shown[0]
    if origin in (typing.Union, types.UnionType):
        parts = [_values_of(a) for a in args]
        return " or ".join(p for p in parts if p) or None
    names = {bool: "true or false", int: "integers", float: "numbers", str: "strings", type(None): "null"}
    return names.get(annotation)


def _field_at(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[Any, Any]:
    """The annotation and default of the field at ``loc`` (a list item's: the item type, no
    default), or (None, None) where the path leaves the models."""
    current: Any = model
    default: Any = None
    for part in loc:
        if isinstance(part, int):
            while typing.get_origin(current) is typing.Annotated:
                current = typing.get_args(current)[0]
            args = typing.get_args(current)
            current, default = (args[0] if args else None), None
            continue
        inner = _model_in(current) if not (isinstance(current, type) and issubclass(current, BaseModel)) else current
        field = inner.model_fields.get(str(part)) if inner is not None else None
        if field is None:
            return None, None
        current, default = field.annotation, field.default
    return current, default


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
