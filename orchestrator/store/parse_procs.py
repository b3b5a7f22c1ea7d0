"""Partials parsed side by side for a large merge: a segment (``segments``) for each partial
the merge cache does not hold as it is, made by the merge's own process and by worker processes,
one per CPU it may use (at most ``MAX_PROCS`` in all). The workers write their segments into the
merge cache, from which the merge then loads them as it loads any cached segment (their CRC
checked). What a worker would warn of, the merge says; a partial a worker could not parse
(unreadable, another sweep's, damaged beyond a line) is parsed again by the merge itself, which
says why in its own words. So the document, the warnings and the refusals are those of a merge
in one process, sooner on a login node's cores (``bench/merge.py``).

Below ``PARALLEL_MIN_BYTES`` to parse, or with one CPU, or where the cache cannot be written,
the merge parses in its own process. ``TILESWEEP_MERGE_PROCS`` sets the number of processes (1:
none). Each worker is a new interpreter running this module (``python -m``), handed its share of
the partials, the biggest first, in a file, beside which it writes what it would warn of: never
a fork of a merge that may hold a lock's heartbeat thread, and never a re-run of the caller's
own script, as multiprocessing's spawn would do. A Ctrl-C stops the workers with the merge (they
die of it, silently; the merge kills those left when it stops); a killed worker leaves at most a
temp file in the cache, which the next merge removes.

    python -m orchestrator.store.parse_procs SWEEP_DIR UNITS_JSON   # one worker
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from orchestrator.cpus import usable_cpus
from orchestrator.errors import ResultsError
from orchestrator.store.files import folder_refuses
from orchestrator.store.segments import CACHE_DIR, current, segment
from orchestrator.store.sweepdir import SweepDir

log = logging.getLogger(__name__)

ENV = "TILESWEEP_MERGE_PROCS"
PARALLEL_MIN_BYTES = 64 << 20  # below this a worker's start costs more than it parses
MAX_PROCS = 8


def parse_ahead(sd: SweepDir, units: list[str], here: Callable[[str], object]) -> set[str]:
    """Parse the partials of ``units`` that the merge cache does not hold as they are, in
    worker processes where that pays (module docstring), the merge's own process taking a share
    too (``here(unit)`` parses one there, while the workers parse theirs); the units the workers
    parsed."""
    todo = []
    for unit in units:
        path = sd.partial_path(unit)
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        if not current(sd.root, unit, path):
            todo.append((size, unit))
    procs = min(_procs(sum(size for size, _ in todo)), len(todo))
    cache = sd.root / CACHE_DIR
    if procs < 2 or not _writable(cache):
        return set()
    shares: list[list[str]] = [[] for _ in range(procs)]
    loads = [0] * procs
    for size, unit in sorted(todo, reverse=True):  # the biggest first, each to the least loaded
        k = loads.index(min(loads))
        shares[k].append(unit)
        loads[k] += size
    mine, theirs = shares[0], shares[1:]
    with tempfile.TemporaryDirectory(dir=cache, prefix=".shares.") as folder:
        children = []
        try:
            for k, share in enumerate(theirs):
                listing = Path(folder) / f"{k}.json"
                listing.write_text(json.dumps(share))
                children.append(_start(sd.root, listing))
            for unit in mine:
                here(unit)
            for k, child in enumerate(children):
                child.wait()
                _say(Path(folder) / f"{k}.said")
        finally:  # a Ctrl-C (or a bug) here: no worker outlives the merge
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
    return {unit for share in theirs for unit in share}


def _start(root: Path, listing: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", __name__, str(root), str(listing)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # a worker that fails leaves its partials to the merge, which says why
    )


def _say(said: Path) -> None:
    """A worker's warnings (its listing's ``.said`` file), as the merge would have logged them."""
    try:
        text = said.read_text(encoding="utf-8")
    except OSError:  # it warned of nothing (or never started)
        return
    for line in text.splitlines():
        try:
            level, name, message = json.loads(line)
        except (ValueError, TypeError):
            continue
        logging.getLogger(str(name)).log(int(level), "%s", message)


def _procs(size: int) -> int:
    """Processes to parse ``size`` bytes of partials with (1: this one)."""
    given = os.environ.get(ENV)
    if given is not None:
        if not given.strip().isdigit() or int(given) < 1:
            raise ResultsError(f"{ENV}={given!r}: write a number of processes to parse partials with (1: no others)")
        return int(given)
    if size < PARALLEL_MIN_BYTES:
        return 1
    return min(len(usable_cpus()), MAX_PROCS)


def _writable(folder: Path) -> bool:
    """Whether the workers can write their segments into ``folder`` (made if missing): a file
    made there is the proof, which root's ``os.access`` is not (an immutable or read-only one)."""
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        return False
    return folder_refuses(folder / "segment") is None


class _Said(logging.Handler):
    """What a worker would have warned of, one JSON line each in ``path``, for the merge to say."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps([record.levelno, record.name, record.getMessage()]) + "\n")


def main(argv: list[str]) -> int:
    """One worker: each partial of the units listed in ``argv[1]`` into the merge cache."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends it at once, without a traceback
    root, listing = Path(argv[0]), Path(argv[1])
    logging.basicConfig(level=logging.WARNING, handlers=[_Said(listing.with_suffix(".said"))])
    sd = SweepDir(root)
    for unit in json.loads(listing.read_text()):
        try:
            segment(root, unit, sd.partial_path(unit), use_cache=True)
        except Exception:  # noqa: S112 - the merge parses it again, and says why in its own words
            continue
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
