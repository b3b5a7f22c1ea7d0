"""How tilesweep starts Python processes of its own (a merge's parse workers, a local unit's
worker and its controller, a worker's compile processes): ``python -P -m MODULE``, with the
folder tilesweep itself was imported from first on the path; and how it reads the lines such a
process writes to it on a pipe, as they come (``PipeLines``).

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


class PipeLines:
    """The whole lines a child process writes on the pipe ``fd`` (set non-blocking here), read
    as they come; a line that is not whole yet waits for the next read."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._buf = b""
        self.ended = False  # the writer has closed its end (or ended): nothing more will come

    def ready(self) -> list[bytes]:
        """The lines written since the last call, without waiting."""
        try:
            while chunk := os.read(self.fd, 65536):
                self._buf += chunk
            self.ended = True
        except (BlockingIOError, InterruptedError):  # nothing more written yet
            pass
        *lines, self._buf = self._buf.split(b"\n")
        return [line for line in lines if line.strip()]

    def rest(self) -> list[bytes]:
        """The lines written until the writer closes its end (or ends)."""
        os.set_blocking(self.fd, True)
        while chunk := os.read(self.fd, 65536):
            self._buf += chunk
        lines, self._buf = self._buf.split(b"\n"), b""
        return [line for line in lines if line.strip()]


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
