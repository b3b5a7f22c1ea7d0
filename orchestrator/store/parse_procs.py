"""Partials parsed side by side for a large merge: a segment (``segments``) for each partial
the merge cache does not hold as it is, made by the merge's own process and by worker processes,
one per CPU it may use (at most ``MAX_PROCS`` in all). The workers write their segments into the
merge cache, from which the merge then loads them as it loads any cached segment (their CRC
checked). What a worker would warn of, the merge says; a partial a worker could not parse
(unreadable, another sweep's, damaged beyond a line) is parsed again by the merge itself, which
says why in its own words. So the document, the warnings and the refusals are those of a merge
in one process, sooner on a login node's cores (``bench/merge.py``).

Nobody is handed a fixed share: every process goes down one list of the partials, the biggest
first, and parses each one it is the first to claim (a file made once in a folder of claims), so
they all end together whatever each one's speed (the merge's process is the slower one: it also
loads what the workers parsed). A worker names each partial on its stdout once its segment is
in the cache, and the merge loads it between two of its own, so little is left to load at the
end.

Below ``PARALLEL_MIN_BYTES`` to parse, or with one CPU, or where the cache cannot be written,
the merge parses in its own process. ``TILESWEEP_MERGE_PROCS`` sets the number of processes (1:
none; at most ``MAX_PROCS``). Each worker is a new interpreter running this module
(``orchestrator.pyproc``: ``python -P -m``), handed the list in a file, beside which it writes
what it would warn of: never a fork of a merge that may hold a lock's heartbeat thread, and
never a re-run of the caller's own script, as multiprocessing's spawn would do.

A Ctrl-C stops the workers with the merge (they die of it, silently; the merge kills those left
when it stops, and removes the temp files they were writing); a worker killed otherwise leaves
at most a temp file in the cache, which the next merge removes, and its claimed partials to the
merge. A worker stopped (a SIGSTOP, a Ctrl-Z of its process group, a debugger) is found so in
/proc once it has been silent a while (``WATCH_S``): the merge says so in one line, parses the
partials it claimed itself, and ends it, instead of waiting for it in silence. A killed merge
leaves its folder of claims in the cache, which the next merge removes (``remove_dead_shares``);
its workers end at their next line to it (a broken pipe).

    python -P -m orchestrator.store.parse_procs SWEEP_DIR UNITS_JSON SAID_FILE   # one worker
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kernels.spelling import as_json
from orchestrator.cpus import usable_cpus
from orchestrator.errors import ResultsError
from orchestrator.pyproc import PipeLines, module_command, module_env
from orchestrator.store.files import folder_refuses, read_text, remove_dead_temps
from orchestrator.store.pidspace import STOPPED, pid_alive, process_state
from orchestrator.store.segments import CACHE_DIR, UNCACHED, current, segment, uncached
from orchestrator.store.sweepdir import SweepDir

log = logging.getLogger(__name__)

ENV = "TILESWEEP_MERGE_PROCS"
PARALLEL_MIN_BYTES = 64 << 20  # below this a worker's start costs more than it parses
MAX_PROCS = 8
WATCH_S = 1.0  # a worker silent this long is looked at: stopped, it is waited for no more (``_rest``)
SHARES = ".shares"  # a merge's folder in the cache: the list its processes go down, their claims, what they said


def parse_ahead(sd: SweepDir, units: list[str], here: Callable[[str], object]) -> set[str]:
    """Parse the partials of ``units`` that the merge cache does not hold as they are, in
    worker processes where that pays (module docstring), the merge's own process taking turns
    with them: ``here(unit)`` is called for each partial it claims (to parse it there) and for
    each a worker has put into the cache (to load it), as they come; the units the workers parsed."""
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
    order = [unit for _, unit in sorted(todo, reverse=True)]  # the biggest first: the last ones taken are small
    with tempfile.TemporaryDirectory(dir=cache, prefix=f"{SHARES}.{socket.gethostname()}.{os.getpid()}.") as folder:
        listing, claims = Path(folder) / "units.json", Path(folder) / "claims"
        listing.write_text(json.dumps(order))
        claims.mkdir()
        children: list[subprocess.Popen[bytes]] = []
        try:
            for k in range(procs - 1):
                children.append(_start(sd.root, listing, Path(folder) / f"{k}.said"))
            theirs = _take_turns(order, claims, children, here)
        finally:  # a Ctrl-C (or a bug) here: no worker outlives the merge, nor the temp file it was writing
            killed = False
            for child in children:
                if child.poll() is None:
                    child.kill()
                    killed = True
                child.wait()
                if child.stdout is not None:
                    child.stdout.close()
            if killed:
                remove_dead_temps(cache, min_age_s=0)
        said_before: set[str] = set()
        for k in range(len(children)):
            _say(Path(folder) / f"{k}.said", said_before)
    return theirs


def remove_dead_shares(cache: Path) -> list[Path]:
    """Remove the folders (``SHARES``) left in ``cache`` by merges on this host that were killed
    (a live merge's is kept); the folders removed."""
    pattern = re.compile(rf"{re.escape(SHARES)}\.{re.escape(socket.gethostname())}\.(\d+)\..+")
    removed: list[Path] = []
    try:
        folders = list(cache.glob(f"{SHARES}.*"))
    except OSError:
        return removed
    for folder in folders:
        m = pattern.fullmatch(folder.name)
        if m is not None and folder.is_dir() and not pid_alive(int(m.group(1)), None):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _take_turns(
    order: list[str], claims: Path, children: list[subprocess.Popen[bytes]], here: Callable[[str], object]
) -> set[str]:
    """The merge's own turns: each partial of ``order`` it claims first it parses (``here``),
    and before each one it loads the segments the workers have finished since (``here`` too), so
    no process waits for another's share and few segments are left to load at the end."""
    done = [PipeLines(child.stdout.fileno()) for child in children if child.stdout is not None]
    theirs: set[str] = set()

    def load(lines: list[bytes]) -> None:  # the units a worker names once their segments are in the cache
        for line in lines:
            unit = line.decode()
            theirs.add(unit)
            here(unit)

    for unit in order:
        for d in done:
            load(d.ready())
        if claim(claims, unit):
            here(unit)
    _rest(dict(zip(done, children, strict=True)), load)
    return theirs


def _rest(waiting: dict[PipeLines, subprocess.Popen[bytes]], load: Callable[[list[bytes]], None]) -> None:
    """The workers' lines (``load``) until each one ends; a worker that has said nothing for
    ``WATCH_S`` is looked at, and one found stopped (state ``T`` or ``t``: a SIGSTOP, a Ctrl-Z of
    its process group, a debugger) is waited for no more: the partials it claimed and did not
    name are the merge's to parse (``merge.collect`` parses what no worker named), and the merge
    ends it when its turns are over. Said in one line, naming the process."""
    heard = dict.fromkeys(waiting, time.monotonic())
    while waiting:
        readable, _, _ = select.select([d.fd for d in waiting], [], [], WATCH_S)
        now = time.monotonic()
        for d in [d for d in waiting if d.fd in readable]:
            load(d.ready())
            heard[d] = now
            if d.ended:
                del waiting[d]
        for d, child in list(waiting.items()):
            state = process_state(child.pid) if now - heard[d] >= WATCH_S else None
            if state in STOPPED:
                log.warning(
                    "parse worker %d of this merge is stopped (state %s in /proc/%d/stat: a SIGSTOP, a Ctrl-Z or a "
                    "debugger); the merge parses the partials it claimed itself and ends it",
                    child.pid,
                    state,
                    child.pid,
                )
                del waiting[d]


def claim(claims: Path, unit: str) -> bool:
    """Whether this process is the first to claim ``unit`` (a file made there, once)."""
    try:
        os.close(os.open(claims / unit, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def _start(root: Path, listing: Path, said: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        module_command(__name__, str(root), str(listing), str(said)),
        env=module_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,  # the units it finished, a line each
        stderr=subprocess.DEVNULL,  # a worker that fails leaves its partials to the merge, which says why
    )


def _say(said: Path, said_before: set[str]) -> None:
    """A worker's warnings (its listing's ``.said`` file), as the merge would have logged them;
    those another worker said (``said_before``, which grows) once."""
    try:
        text = read_text(said)
    except OSError:  # it warned of nothing (or never started)
        return
    for line in text.splitlines():
        try:
            level, name, message = json.loads(line)
        except (ValueError, TypeError):
            continue
        if message in UNCACHED.values() or message in said_before:  # said already, by this merge or another worker
            continue
        said_before.add(message)
        logging.getLogger(str(name)).log(int(level), "%s", message)


def requested() -> int | None:
    """The processes ``TILESWEEP_MERGE_PROCS`` asks for (at most ``MAX_PROCS``), None where it
    is unset (or set but empty); ``ResultsError`` where it is no number of processes. Commands
    that end in a merge ask first, so a bad value is said before anything is measured."""
    given = os.environ.get(ENV, "").strip()
    if not given:
        return None
    if not (given.isascii() and given.isdigit()) or int(given) < 1:
        raise ResultsError(f"{ENV}={as_json(given)}: write a number of processes to parse partials with (1: no others)")
    return min(int(given), MAX_PROCS)


def _procs(size: int) -> int:
    """Processes to parse ``size`` bytes of partials with (1: this one)."""
    given = requested()
    if given is not None:
        return given
    if size < PARALLEL_MIN_BYTES:
        return 1
    return min(len(usable_cpus()), MAX_PROCS)


def _writable(folder: Path) -> bool:
    """Whether the workers can write their segments into ``folder`` (made if missing): a file
    made there is the proof, which root's ``os.access`` is not (an immutable or read-only one).
    Where it is not, that is said once (``segments.uncached``)."""
    try:
        folder.mkdir(exist_ok=True)
    except OSError as exc:
        uncached(folder, exc)
        return False
    refused = folder_refuses(folder / "segment")
    if refused is not None:
        uncached(folder, OSError(refused[1] or "not a directory"))
    return refused is None


class _Said(logging.Handler):
    """What a worker would have warned of, one JSON line each in ``path``, for the merge to say."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps([record.levelno, record.name, record.getMessage()]) + "\n")


def main(argv: list[str]) -> int:
    """One worker: each partial of the units listed in ``argv[1]`` that it claims first into
    the merge cache, its unit named on stdout once there; what it would warn of into ``argv[2]``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends it at once, without a traceback
    root, listing, said = Path(argv[0]), Path(argv[1]), Path(argv[2])
    logging.basicConfig(level=logging.WARNING, handlers=[_Said(said)])
    sd = SweepDir(root)
    claims = listing.parent / "claims"
    gc.disable()  # as in the merge (``document.paused_gc``): records make no cycles, and the worker ends soon
    for unit in json.loads(read_text(listing)):
        if not claim(claims, unit):
            continue
        path = sd.partial_path(unit)
        try:
            segment(root, unit, path, use_cache=True)
        except Exception:  # noqa: S112 - the merge parses it again, and says why in its own words
            continue
        if current(root, unit, path):  # else (not cached: another sweep's, say) the merge parses it itself
            sys.stdout.write(unit + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
