"""The ``tilesweep`` command line: builds the parser from the command families and runs one.

``orchestrator.cli`` is the only place that prints or configures logging. Every expected
failure is a ``TilesweepError``; it becomes one line on stderr and exit code 2. Anything
else is a bug and keeps its traceback.

Two more ways a command ends in one line, never a traceback:
- Ctrl-C (SIGINT), SIGTERM (``kill PID``, ``tilesweep cancel`` from another shell), or SIGHUP
  (the terminal closed; not where ``nohup`` ignores it): the
  first one stops the command (workers started here write ``abandon`` lines for the configs in
  flight, so no config is blamed for the interruption) and prints one line; further ones while
  it stops are ignored. A command may say more in that line: it raises ``KeyboardInterrupt``
  with the text (``wait``: the sweep's jobs go on). Exit status 128 + the signal.
- standard output that cannot be written (``> /dev/full``: one line, exit 2) or that is closed
  early (``| head -1``: quietly, exit 0).
- a file that cannot be written (a full disk, a read-only mount) or that this user may not
  read or write (its permissions), wherever the command met it: one line naming the file and
  the fix, exit 2 (``store.files``: ``cannot_write``, ``cannot_access``).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from types import FrameType

from orchestrator import PROG
from orchestrator.errors import TilesweepError

# What this module imports at its top is what a command loads before ``main`` makes a Ctrl-C
# one line: modules the interpreter has loaded already and two small ones of ours (not even
# ``typing``: mypy reads a constant named TYPE_CHECKING as typing's). The parser, logging and
# the command families load inside ``main``.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_stopped_by: int = signal.SIGINT  # the stop signal ``_interrupted`` took
_pending: int | None = None  # a stop sent again (``_again``) that no frame has taken yet


def build_parser() -> argparse.ArgumentParser:
    # imported here, not at the top: ``python -m orchestrator.cli.analysis`` runs a family on its
    # own, and the package (whose __init__ imports this module) must not have imported it first
    from orchestrator.cli import analysis, browse, impls, slurm, sweep
    from orchestrator.cli.common import Parser

    p = Parser(prog=PROG, description="Autotune Pallas flash-attention tile configs on a SLURM cluster or locally.")
    p.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    p.add_argument("--version", action="version", version=f"{PROG} {version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    sweep.register(sub)
    analysis.register(sub)
    slurm.register(sub)
    browse.register(sub)
    impls.register(sub)
    _describe(sub)
    return p


VERBOSE_HELP = "more logging (-vv for debug)"
# what a command's own --help says of a positional argument its family left undescribed
_POSITIONAL_HELP = {
    "spec": "the spec file (JSON or TOML, a file: standard input is not read; a results document stands for the "
    "spec of the sweep that wrote it)",
    "sweep_dir": "the sweep directory (`plan`, `run` and `submit` make it; `ls` lists them)",
}


def _describe(sub: argparse._SubParsersAction) -> None:
    """Each command's ``--help`` opens with the line the command list gives it, and names its
    spec or sweep directory, where its family gave neither; each takes ``-v`` as the top does."""
    import argparse

    for choice in sub._choices_actions:
        parser = sub.choices[choice.dest]
        # -v after the command too (`tilesweep status DIR -v`), where it is left unset unless given
        parser.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP)
        if not parser.description and choice.help:
            parser.description = choice.help[0].upper() + choice.help[1:] + "."
        for action in parser._actions:
            if not action.option_strings and action.help is None and action.dest in _POSITIONAL_HELP:
                action.help = _POSITIONAL_HELP[action.dest]


def version() -> str:
    """The installed tilesweep's version (its package metadata)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("tilesweep")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: run scripts/setup-venv.sh)"


def configure_logging(verbosity: int) -> None:
    """Warnings the library logs, said as the CLI says its own ("tilesweep: warning: ...");
    with -v (info) and -vv (debug), every line names its level and the module that logged it."""
    import logging

    if verbosity > 0:
        level = logging.INFO if verbosity == 1 else logging.DEBUG
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
        return

    class Said(logging.Formatter):
        def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
            return f"{PROG}: {record.levelname.lower()}: {record.message}"

    from orchestrator.control.why import UNIT_LINE_ATTR

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Said())
    # a unit's own line, logged by its worker in this process (the debug executor), is its log's:
    # the command says how the unit ended, in its words, as it does for a worker process
    handler.addFilter(lambda record: not getattr(record, UNIT_LINE_ATTR, False))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


class StdoutFailed(Exception):
    """Standard output could not be written (a full disk, an unwritable file)."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(exc.strerror or str(exc))
        self.errno = exc.errno


class _Guarded:
    """A standard stream whose failed writes and flushes go to ``_failed`` (which raises, or
    lets the command go on); everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _failed(self, exc: OSError) -> None:
        raise exc

    def _to_devnull(self) -> None:
        """Point the stream's file descriptor at /dev/null: what is written later goes nowhere."""
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        except (OSError, ValueError):  # no file descriptor (a stream in memory): nothing to point elsewhere
            pass

    def write(self, text: Any) -> int:
        try:
            return int(self._stream.write(text))
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class PipeSafeStdout(_Guarded):
    """stdout that a closed pipe (``tilesweep resume | head -1``) cannot stop: the first
    write or flush that finds the reader gone points stdout at /dev/null and the command
    goes on, so what it was doing (a submission sbatch may have accepted) is never cut short
    by a print. Any other failed write or flush (``> /dev/full``) is a ``StdoutFailed`` that
    ``main`` turns into one line, not an OSError from wherever the command happened to print.
    Its ``buffer`` (the bytes ``logs`` copies) is guarded the same way."""

    reader_gone = False  # whether the reader closed the pipe (what was printed since went nowhere)
    closed_at_start = False  # whether the command started with stdout closed (`>&-`: nothing it prints goes anywhere)

    @property
    def buffer(self) -> PipeSafeStdout:
        return PipeSafeStdout(self._stream.buffer)

    def _failed(self, exc: OSError) -> None:
        if not isinstance(exc, BrokenPipeError):
            raise StdoutFailed(exc) from None
        PipeSafeStdout.reader_gone = True
        self._to_devnull()


class QuietStderr(_Guarded):
    """stderr that nothing can stop: the first write or flush that fails (its reader gone:
    ``tilesweep run 2>&1 | head -1``; a full disk under ``2> run.log``) points stderr at
    /dev/null, and the command goes on without its progress and messages, as ``PipeSafeStdout``
    lets a sweep go on without its stdout."""

    def _failed(self, exc: OSError) -> None:
        self._to_devnull()


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """The first Ctrl-C stops the command; later ones are ignored while it stops.

    One that lands in code run from a string (``exec``/``eval`` of text: a dataclass's methods
    being made while a module imports) is taken again a moment later, out of it: CPython notes a
    KeyboardInterrupt that leaves such code, caught or not, and ends a ``python -m`` process by
    SIGINT after it exits, whatever its exit code (130 here). One that Python swallows (raised in
    a garbage-collector callback or a ``__del__``) is taken again too (``_swallowed``), and so is
    one that lands in the hook doing that, where Python would drop it as well."""
    global _stopped_by, _pending
    if _no_place_to_raise(frame):
        _again(signum)
        return
    _stopped_by, _pending = signum, None
    for taken in STOP_SIGNALS:
        if signal.getsignal(taken) is _interrupted:
            signal.signal(taken, signal.SIG_IGN)
    raise KeyboardInterrupt


def _no_place_to_raise(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a caller of it runs code ``exec`` or ``eval`` compiled from text, or
    the hook of ``_swallowed``: no place to raise a KeyboardInterrupt."""
    while frame is not None:
        if frame.f_code.co_filename == "<string>" or frame.f_code is _unraisable.__code__:
            return True
        frame = frame.f_back
    return False


def _again(signum: int = signal.SIGINT) -> None:
    """The signal to the main thread once more, in a moment, for ``_interrupted`` to take; until
    it is taken, it is pending: a command that ends on an error meanwhile ends stopped (``_main``)."""
    import threading

    global _pending
    _pending = signum

    again = threading.Timer(0.005, signal.pthread_kill, (threading.main_thread().ident, signum))
    again.daemon = True
    again.start()


def _swallowed(hook: Callable[[Any], object]) -> Callable[[Any], object]:
    """``sys.unraisablehook`` that hands ``hook`` everything but the KeyboardInterrupt of
    ``_interrupted`` that Python would only print and drop ("Exception ignored in ...": raised
    in a garbage-collector callback, a ``__del__``, a weakref callback): the Ctrl-C is taken
    again instead, so the command still stops."""
    import functools

    return functools.partial(_unraisable, hook)


def _unraisable(hook: Callable[[Any], object], u: Any) -> object:
    """The hook of ``_swallowed``; a Ctrl-C taken again that lands in it is taken once more."""
    tb = u.exc_traceback
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if isinstance(u.exc_value, KeyboardInterrupt) and tb is not None and tb.tb_frame.f_code is _interrupted.__code__:
        signal.signal(signal.SIGINT, _interrupted)
        _again()
        return None
    return hook(u)


def _silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so the interpreter's last flush of what could not
    be written does not fail again (and print a traceback of its own) at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    # first of all: a Ctrl-C while the commands' modules load is one line too (this module
    # imports almost nothing; the parser and the command families load in build_parser)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)
    # `kill PID`, `tilesweep cancel`, a closed terminal: as a Ctrl-C (where nohup ignores SIGHUP, it stays ignored)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _interrupted)
    if sys.stderr is None:  # started with it closed (`2>&-`): its messages go nowhere
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (open for the process's life)
    if sys.stdout is None:  # started with it closed (`>&-`): as a reader gone before the first line
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (open for the process's life)
        PipeSafeStdout.reader_gone = PipeSafeStdout.closed_at_start = True
    original, errors, hook = sys.stdout, sys.stderr, sys.unraisablehook
    sys.stdout, sys.stderr = PipeSafeStdout(original), QuietStderr(errors)
    sys.unraisablehook = _swallowed(hook)
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here (and is let go), a full disk fails here, not at exit
        if argv is None:  # the command's process: its work is done and said, a stop now has nothing to stop
            for signum in STOP_SIGNALS:  # (it killed the process silently as the interpreter shut down)
                signal.signal(signum, signal.SIG_IGN)
        return code
    except StdoutFailed as exc:
        _silence_stdout()
        print(f"{PROG}: error: cannot write to standard output: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.stdout, sys.stderr, sys.unraisablehook = original, errors, hook


def _stopped(signum: int, word: str | None, command: str, args: argparse.Namespace | None) -> int:
    """A command stopped by ``signum``: later stops ignored, one line saying what was kept
    (``word``: the command's own), the exit code of a process that signal ended."""
    for taken in STOP_SIGNALS:
        signal.signal(taken, signal.SIG_IGN)
    how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    if word is None:
        from orchestrator.cli.stop_notes import stop_note  # loaded once stopped: the top stays light

        word = stop_note(command, args)
    print(f"{PROG}: {how}; {word}", file=sys.stderr)
    return 128 + signum


def _command_word(argv: list[str] | None) -> str:
    """The command a command line names, for a stop that came before the parser said it."""
    words = sys.argv[1:] if argv is None else argv
    return next((w for w in words if not w.startswith("-")), "")


def _main(argv: list[str] | None) -> int:
    command, args = None, None
    try:
        parser = build_parser()  # a Ctrl-C while the command families load is one line too
        args = parser.parse_args(argv)
        command = args.command
        configure_logging(args.verbose)
        return int(args.func(args) or 0)
    except TilesweepError as exc:
        if _pending is not None:  # the stop came first, its exception had no place to go: it wins
            return _stopped(_pending, None, command or _command_word(argv), args)
        print(f"{PROG}: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        word = exc.args[0] if exc.args and isinstance(exc.args[0], str) else None  # the command's own (``wait``)
        return _stopped(_stopped_by, word, command or _command_word(argv), args)
    except BrokenPipeError:  # a binary write (`logs | head`) to a reader that has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a full disk or a read-only mount, wherever the command wrote;
        # a file or folder this user may not read (or write), wherever the command opened it
        # (a file where a folder belongs, or a folder where a file does: a damaged sweep directory)
        from orchestrator.store.files import (
            ACCESS_ERRNOS,
            WRITE_ERRNOS,
            cannot_access,
            cannot_write,
            misplaced,
            name_too_long,
        )

        if exc.errno == errno.ENAMETOOLONG:  # a name given on the command line, or in a spec
            print(f"{PROG}: error: {name_too_long(exc)}", file=sys.stderr)
        elif exc.errno in WRITE_ERRNOS:
            print(f"{PROG}: error: {cannot_write(exc)}", file=sys.stderr)
        elif exc.errno in ACCESS_ERRNOS and exc.filename is not None:
            print(f"{PROG}: error: {cannot_access(exc)}", file=sys.stderr)
        elif (why := misplaced(exc)) is not None:
            print(f"{PROG}: error: {why}", file=sys.stderr)
        else:
            raise
        return 2


if __name__ == "__main__":
    sys.exit(main())
