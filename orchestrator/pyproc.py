"""How tilesweep starts Python processes of its own (a merge's parse workers, a local unit's
worker and its controller, a worker's compile processes): ``python -P -m MODULE``, with the
folder tilesweep itself was imported from first on the path.

A plain ``python -m`` puts the current folder first on the path, so a command typed in a folder
that holds another ``orchestrator`` or ``jobs`` package (an old checkout, a user's own module
of that name) would run that code in its processes instead of tilesweep's. ``-P`` leaves the
current folder out; ``PYTHONPATH`` then names the folder this process imported tilesweep from,
where that is not a site-packages folder already on every interpreter's path (a checkout run
without installing it, an editable install).
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path


def module_command(module: str, *args: str, unbuffered: bool = False) -> list[str]:
    """The command that runs ``module`` with ``args`` in a new interpreter (module docstring)."""
    return [sys.executable, *(["-u"] if unbuffered else []), "-P", "-m", module, *args]


def module_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with tilesweep's folder first on ``PYTHONPATH``."""
    out = dict(os.environ if env is None else env)
    root = _import_root()
    if root is not None:
        out["PYTHONPATH"] = os.pathsep.join([root, *([out["PYTHONPATH"]] if out.get("PYTHONPATH") else [])])
    return out


@cache
def _import_root() -> str | None:
    """The folder holding the ``orchestrator`` package this process runs; None where it is a
    site-packages folder (every interpreter of this environment finds it there)."""
    import orchestrator

    root = Path(orchestrator.__file__).resolve().parent.parent
    sites = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    return None if root in sites else str(root)
