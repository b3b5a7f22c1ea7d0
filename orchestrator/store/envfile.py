"""``env.json`` of a sweep directory: the environment fingerprint (device kind, jax and
kernel versions) of the first worker that ran, which every later worker must match.

The file is written whole or not at all (``files.create_once``): a write a full disk cuts short
leaves no file, so the next worker once space is freed records its own. A damaged one (cut
short by an older writer, not JSON, a directory) is named in one line by every reader.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernels import tokamax_meta
from kernels.spelling import as_json
from orchestrator import word
from orchestrator.errors import MismatchError, SweepDirError, TilesweepError
from orchestrator.store.files import cannot_access, create_once, open_file, read_text, write_advice

ENV_FILE = "env.json"
_FIX = "no partial of the sweep names the environment it was measured in: delete it (the next worker records its own)"


def check(root: Path, env: dict[str, Any]) -> None:
    """Record ``env`` as the sweep's where none is recorded yet; else refuse one that differs."""
    path = root / ENV_FILE
    if not path.exists():
        try:
            if create_once(path, (json.dumps(env) + "\n").encode()):
                return
        except OSError as exc:
            raise SweepDirError(
                f"cannot record this worker's environment in {path} ({exc.strerror or exc}): "
                f"{write_advice(exc)}, then run the unit again"
            ) from None
    found = recorded(root)
    if found is not None and found != env:
        raise MismatchError(
            f"this worker's environment differs from the one the sweep in {root} was measured in "
            f"(this worker's vs the sweep's: {differences(env, found)}; see {path}); run it on the same stack, "
            "or start a new sweep directory"
        )


def differences(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """How an environment (a worker's, a partial header's) differs from ``ours``, field by field
    as a JSON file spells the values (``jax "0.4.30" vs "0.4.31", jaxlib null vs "0.4.31"``; a
    field one of them lacks: absent); ``measured_in`` says a header's that is no object."""

    def shown(env: Mapping[str, Any], key: str) -> str:
        return as_json(env[key]) if key in env else "absent"

    keys = [*ours, *(k for k in theirs if k not in ours)]
    return ", ".join(f"{k} {shown(theirs, k)} vs {shown(ours, k)}" for k in keys if shown(theirs, k) != shown(ours, k))


def measured_in(theirs: Any, ours: Mapping[str, Any], sweeps: str) -> str:
    """What a partial header's environment (``theirs``) is, against the sweep's (``ours``), as a
    refusal says it after "measured in": a header that names none, or one that is not a JSON
    object, in words with the sweep's fields; else the fields that differ (``differences``).
    ``sweeps`` names the sweep's environment ("this sweep's", "the sweep's in PATH")."""
    if theirs is None:
        return f"an environment its header does not name ({sweeps}: {described(ours)})"
    if not isinstance(theirs, dict):
        return f"an environment its header gives as {as_json(theirs)}, not a JSON object ({sweeps}: {described(ours)})"
    return f"another environment (its vs {sweeps}: {differences(theirs, ours)})"


def described(env: Mapping[str, Any]) -> str:
    """An environment's fields as a JSON file spells their values (``jax "0.4.31", jaxlib null``)."""
    return ", ".join(f"{k} {as_json(v)}" for k, v in env.items())


def installed_differences(sweep: Mapping[str, Any]) -> str | None:
    """How the packages this interpreter has installed differ from those the sweep's workers
    recorded (``sweep``: its env.json), in the fields a worker records of them (jax, jaxlib, and
    tokamax where it is installed: ``jobs.node_env``), said as ``differences`` says them (this
    interpreter's first), or None where they do not: a worker started from here refuses the sweep
    on any of them."""
    here: dict[str, str | None] = {}
    for dist in ("jax", "jaxlib"):
        try:
            here[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            here[dist] = None
    if tokamax_meta.version() is not None:
        here["tokamax"] = tokamax_meta.version()
    recorded_here = {k: sweep[k] for k in ("jax", "jaxlib", "tokamax") if k in sweep}
    return differences(here, recorded_here) or None


def recorded(root: Path) -> dict[str, Any] | None:
    """The environment the first worker recorded (None: no worker has run yet)."""
    path = root / ENV_FILE
    for _ in range(50):  # a first writer on a filesystem without hard links may not have filled it yet
        try:
            text = read_text(path)
        except FileNotFoundError:
            return None
        except PermissionError as exc:  # not damaged: this user may not read it
            raise SweepDirError(cannot_access(exc)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SweepDirError(f"{path} is unreadable ({_why(exc)}); {_fix(root)}") from None
        if text.endswith("\n"):
            try:
                found = json.loads(text)
            except ValueError:
                found = None
            if not isinstance(found, dict):
                raise SweepDirError(f"{path} is damaged (not the JSON object a worker writes); {_fix(root)}")
            return found
        time.sleep(0.02)
    raise SweepDirError(f"{path} is damaged (incomplete); {_fix(root)}")


def _fix(root: Path) -> str:
    """What restores a damaged ``env.json`` of the sweep at ``root`` and keeps its records: the
    environment its workers' partial headers name (each worker checked it against ``env.json``
    before it wrote its header), as the command that writes it back; where no header names one,
    no worker has written records, and deleting it loses none."""
    found: list[dict[str, Any]] = []
    for partial in sorted((root / "partials").glob("*.jsonl")):
        env = _header_env(partial)
        if env is not None and env not in found:
            found.append(env)
    if not found:
        return _FIX
    if len(found) > 1:
        named = " or ".join(described(env) for env in found)
        return f"its partials' headers name {len(found)} environments ({named}): start a new sweep directory"
    text = json.dumps(found[0])
    path = root / ENV_FILE
    restore = f"printf '%s\\n' {word(text)} > {word(path)}"
    return f"write back the environment its workers' partial headers name, which keeps their records: {restore}"


def _header_env(partial: Path) -> dict[str, Any] | None:
    """The environment the first header of ``partial`` names (None: no header, none named, or a
    reuse unit's, which names the environment its sources were measured in: ``store.carried``)."""
    try:
        with open_file(partial) as f:
            first = f.readline(1 << 20)
        line = json.loads(first)
    except (OSError, ValueError, TilesweepError):  # unreadable, torn or odd: its readers say so
        return None
    header = line.get("header") if isinstance(line, dict) else None
    env = header.get("env") if isinstance(header, dict) and "reuse" not in header else None
    return env if isinstance(env, dict) else None


def _why(exc: OSError | UnicodeDecodeError) -> str:
    if isinstance(exc, IsADirectoryError):
        return "a directory, not a file"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return exc.strerror or str(exc)
