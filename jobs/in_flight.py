"""The configs a worker has in flight, and what stops it without blaming them.

A worker's ``start`` line says a config is about to be compiled and timed; if the worker dies
before its record, the config is suspected of killing it. A worker that is *stopped* (Ctrl-C,
SIGTERM from scancel or the local executor, SIGHUP from a closed terminal, a preemption or
time-limit warning) must not leave such suspicions behind: it writes an ``abandon`` line for
each config in flight first. When the time limit instead finds the worker stuck in a config,
``mark_hung`` says so (that death counts, and a config given up on for it is recorded as a
timeout). Signal handlers run between Python bytecodes; a line being written when one arrives
is finished before it acts (``write``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from orchestrator.store.lines import AbandonLine, HungLine, PartialLine, PartialWriter, abandon_line, hung_line

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class _Flight:
    """The configs in flight, so a signal handler can mark them abandoned (not a crash)."""

    writer: PartialWriter | None = None  # the attempt's partial
    attempt: int = 0
    items: list[str] = field(default_factory=list)
    writing: bool = False  # a line is being written: a stop signal waits for it (``write``)
    pending: int | None = None  # the stop signal that waits
    abandoned: set[str] = field(default_factory=set)  # given up on by a stop: their records are not written


_IN_FLIGHT = _Flight()


def abandon_in_flight() -> str | None:
    """Record that the configs in flight are given up on purpose (Ctrl-C, SIGTERM, preemption,
    time-limit warning), so none is counted as a config that killed its worker. Returns their
    ids (comma-separated when a window was compiling), or None when none was in flight."""
    return _mark_in_flight(abandon_line, clear=True)


def mark_hung() -> str | None:
    """Record that the time limit came while these configs were in flight and the worker did
    not reach a stop: each such death counts against a config that was alone in flight, and
    one given up on for that is recorded as a timeout, not a crash."""
    return _mark_in_flight(hung_line, clear=False)


def _mark_in_flight(line: Callable[[str, int], AbandonLine | HungLine], *, clear: bool) -> str | None:
    writer = _IN_FLIGHT.writer
    items = list(_IN_FLIGHT.items)
    if writer is None or not items:
        return None
    for iid in items:
        writer.write(line(iid, _IN_FLIGHT.attempt))
    if clear:
        _IN_FLIGHT.items = []
        _IN_FLIGHT.abandoned.update(items)
    return ",".join(items)


def write(writer: PartialWriter, line: PartialLine, *, started: str | None = None, sync: bool = True) -> None:
    """Append a line; ``started``: the item whose start line it is, now in flight. A stop signal
    that arrives meanwhile is acted on once the line is whole (and its item counted in flight).
    ``sync=False``: flushed, fsynced later (``PartialWriter``; a replay's records)."""
    _IN_FLIGHT.writing = True
    try:
        writer.write(line, sync=sync)
        if started is not None:
            _IN_FLIGHT.items.append(started)
    finally:
        _IN_FLIGHT.writing = False
    pending = _IN_FLIGHT.pending
    _IN_FLIGHT.pending = None
    if pending is not None:
        _stop_now(pending)


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    if _IN_FLIGHT.writing:
        if _IN_FLIGHT.pending != signal.SIGINT:  # a Ctrl-C is the reason (``stop_signal``)
            _IN_FLIGHT.pending = signum
        return
    _stop_now(signum, raise_now=_safe_to_raise(frame))


_ROOT = Path(__file__).resolve().parent.parent
_OURS = tuple(f"{_ROOT / pkg}{os.sep}" for pkg in ("jobs", "orchestrator", "kernels"))
_WAITS = (os.sep + "threading.py", os.sep + "concurrent" + os.sep)


def _safe_to_raise(frame: FrameType | None) -> bool:
    """Whether an exception raised where the signal found the main thread stops the worker
    cleanly: in our own code or a wait of the standard library, yes; inside an import (an
    extension turns it into an ImportError), a garbage-collector callback or a library's code,
    no: there the stop waits for the worker's next check between configs (``stop_requested``)."""
    inner = frame.f_code.co_filename if frame is not None else ""
    if not (inner.startswith(_OURS) or any(w in inner for w in _WAITS)):
        return False
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return False
        frame = frame.f_back
    return True


_REQUESTED: list[int] = []  # the stop signal received, if any (``stop_requested``)
# what a stop raises; swallowed where the handler ran in a gc callback (no traceback for it there)
_STOPS = (KeyboardInterrupt, SystemExit)


def stop_requested() -> bool:
    """A stop signal came: the worker stops before its next config. (The exception raised by
    the handler usually stops it at once; but a handler that runs inside a garbage-collector
    callback or a ``__del__`` has its exception swallowed, and this is what stops it then.)"""
    return bool(_REQUESTED)


def stop_signal() -> int | None:
    """The stop signal that stopped this worker (``stop_requested``), or None. A Ctrl-C is the
    reason whenever one came: a local run hands the Ctrl-C it caught on to its workers as a
    SIGTERM, which can reach the worker's handler before the terminal's own SIGINT does (a
    handler can run inside another's, and one that waits for a line being written is seen
    after the signal that came next)."""
    if signal.SIGINT in _REQUESTED:
        return signal.SIGINT
    return _REQUESTED[0] if _REQUESTED else None


def _ignore_stop(signum: int, frame: FrameType | None) -> None:
    """A further stop signal while the worker stops: nothing more to do."""


def _stop_exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(128 + signum)


def _stop_now(signum: int, *, raise_now: bool = True) -> None:
    """Abandon the configs in flight, then exit: KeyboardInterrupt for SIGINT, exit status
    128 + signal otherwise (at once, or at the next check where raising is not safe here).
    Further stop signals while exiting are ignored."""
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is _on_stop_signal:  # only those taken over (``stop_signals``)
            # a handler that does nothing, not SIG_IGN: a signal already on its way (the SIGTERM
            # a local run sends its workers on Ctrl-C) finds one, where under SIG_IGN Python
            # reports it as "ignored due to race condition", with a traceback, in the log
            signal.signal(s, _ignore_stop)
    _REQUESTED.append(signum)
    given_up = abandon_in_flight()
    log.warning(
        "caught %s: stopping; configs in flight given up (not counted against them): %s",
        signal.Signals(signum).name,
        given_up or "none",
    )
    if raise_now:
        raise _stop_exception(signum)


@contextlib.contextmanager
def stop_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """``signals`` (SIGINT, SIGTERM and SIGHUP by default) stop the worker cleanly while it runs a unit
    (``_stop_now``); the handlers they had before are put back afterwards. The local executor
    starts workers with SIGINT blocked, which they ignore (so neither they nor a controller
    sees a Ctrl-C before the unit runs): both are undone here. A caller with handlers of its
    own for some of them (the whole-node ``unit_worker``) passes only the others."""
    # a SIGHUP that ``nohup`` ignores stays ignored: the worker outlives its terminal as its run does
    signals = tuple(s for s in signals if s != signal.SIGHUP or signal.getsignal(s) != signal.SIG_IGN)
    if threading.current_thread() is not threading.main_thread() or not signals:
        yield
        return
    previous = {s: signal.getsignal(s) for s in signals}
    hook = sys.unraisablehook
    _REQUESTED.clear()
    for s in signals:
        signal.signal(s, _on_stop_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    sys.unraisablehook = lambda u: None if _REQUESTED and isinstance(u.exc_value, _STOPS) else hook(u)
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for s, h in previous.items():  # once stopped, further stop signals stay ignored (``_stop_now``)
            signal.signal(s, _ignore_stop if _REQUESTED else h if h is not None else signal.SIG_DFL)
    signum = stop_signal()
    if signum is not None:  # stopped by a signal whose exception was swallowed on the way: end as it asked
        raise _stop_exception(signum)


def begin(writer: PartialWriter, attempt: int) -> None:
    """A unit's attempt starts: its lines go to ``writer``, nothing is in flight yet."""
    _IN_FLIGHT.writer = writer
    _IN_FLIGHT.attempt = attempt
    _IN_FLIGHT.items = []


def end() -> None:
    """The attempt is over: nothing is in flight, and no line is written for it any more."""
    global _IN_FLIGHT
    _IN_FLIGHT = _Flight()


def in_flight() -> list[str]:
    return _IN_FLIGHT.items


def abandoned(item_id: str) -> bool:
    """Whether a stop gave ``item_id`` up while it was in flight (SIGTERM in the middle of its
    timing): its partial says so, and a record timed on through the stop is not written."""
    return item_id in _IN_FLIGHT.abandoned


def settled(item_id: str) -> None:
    """``item_id`` is no longer in flight: its record is about to be written, or it was given up
    on (a stop signal may have abandoned it meanwhile: then nothing is left to do)."""
    if item_id in _IN_FLIGHT.items:
        _IN_FLIGHT.items.remove(item_id)
