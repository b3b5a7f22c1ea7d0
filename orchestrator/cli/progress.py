"""The progress display of ``run``, ``wait`` and ``plan --lower``: tqdm's bar on a terminal, one line per update
in a log.
A search's bar counts the configs of its round, one bar per round, as ``status`` counts them.

Why tqdm rather than a hand-written line: it is the bar people know from every
Python tool (``45%|####5     | 450/1000 [02:10<02:38, 2.84item/s]``), it smooths the rate
(an exponential moving average, so the ETA does not jump with each poll of a sweep whose
configs take very different times), it switches to seconds per item when items are slow,
fits the terminal's width and redraws after a resize, and it clears and redraws itself
around a warning printed mid-sweep (``note``). rich would do the same with more weight and
its own console; tqdm is one small pure-Python package.

What tqdm does not do is write a log: to a file or a pipe (a SLURM job's output, CI) it
still redraws with carriage returns, which a log shows as one endless line. So when the
stream is not a terminal the bar writes through ``_Lines``, which turns each redraw into
one line, and redraws only when the count or the unit states changed, at most every
``interval_s`` seconds, plus a line every ``heartbeat_s`` when nothing moves (so a log
shows the command is alive while its jobs wait in the queue), and the final state once.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, TYPE_CHECKING, Never

if TYPE_CHECKING:  # loaded when a bar opens: a command that shows none (status) does not pay for it
    from tqdm import tqdm

    from orchestrator.control.status_model import SweepStatus

# a bar with a description (a search's round, a lowering) says what it counts after the count, as
# ``status`` says a round's ("3/4 configs")
_SEARCH_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} configs [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


class _Lines:
    """A file for tqdm that writes each redraw as one line (no carriage returns), skipping
    a line equal to the one before it."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.last = ""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line and line != self.last:
            self.stream.write(line + "\n")
            self.last = line

    def flush(self) -> None:
        self.stream.flush()


class Progress:
    """Items done out of ``total``, with rate and ETA, on ``stream`` (default stderr).

    ``update(done, extra)`` takes the absolute count (the sweep's status reports it so); the
    first call's count is the starting point, so records made before this command do not
    count towards its rate.
    """

    def __init__(
        self,
        total: int,
        label: str = "item",
        stream: IO[str] | None = None,
        *,
        interval_s: float = 10.0,
        heartbeat_s: float = 300.0,
        desc: str | None = None,
    ) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = 0.5 if self.tty else interval_s
        self.heartbeat_s = 1.0 if self.tty else heartbeat_s
        self.bar: tqdm[Never] | None = None
        self.extra = ""
        self.desc = desc  # what the bar counts where a count alone does not say (a search's round, a lowering)
        self.round: int | None = None  # a search's round the bar counts
        self.pending: tuple[int, int, str] | None = None  # its counts, where its bar opens at the next look

    def _open(self, done: int, extra: str) -> tqdm[Never]:
        """The bar, drawn at once with the first count. On a terminal that reports no width
        (some pseudo-terminals do) tqdm would draw nothing: 80 columns then."""
        from tqdm import tqdm

        out, width = (self.stream if self.tty else _Lines(self.stream)), None
        if self.tty:
            try:
                width = None if os.get_terminal_size(self.stream.fileno()).columns else 80
            except (OSError, ValueError, AttributeError):
                width = 80
        return tqdm(
            total=self.total,
            initial=done,
            unit=self.label,
            file=out,
            ncols=width,
            dynamic_ncols=self.tty and width is None,
            ascii=not self.tty,
            mininterval=self.interval_s,
            miniters=1,
            smoothing=0.1,
            leave=True,
            postfix=extra.lstrip("; ") or None,
            desc=self.desc,
            bar_format=_SEARCH_FORMAT if self.desc is not None else None,
        )

    def update(self, done: int, extra: str = "", total: int | None = None) -> None:
        """``total``: a new total, as when a halving sweep's round 2 is planned and adds items."""
        grown = total is not None and max(total, 1) != self.total
        if grown:
            self.total = max(total or 1, 1)
        if self.bar is None:
            self.bar, self.extra = self._open(done, extra), extra
            return
        bar, changed = self.bar, extra != self.extra or grown
        if grown:
            bar.total = self.total
        if changed:
            bar.set_postfix_str(extra.lstrip("; "), refresh=False)
            self.extra = extra
        delta = done - bar.n
        if delta > 0:
            bar.update(delta)  # feeds the smoothed rate; redraws when mininterval has passed
            return
        if delta < 0:  # a recount went down (a torn line set aside): show it as it is
            bar.n = done
            changed = True
        since = time.time() - bar.last_print_t
        if (changed and since >= self.interval_s) or since >= self.heartbeat_s:
            bar.refresh()

    def sweep(self, st: SweepStatus, extra: str = "") -> None:
        """Show a sweep's status: its records over every round (items, then a later round's
        timings), or for a search the configs of its last planned round, a bar per round named as
        ``status`` names it ("round 2 (search): ... 3/4 configs"). A round that ended keeps its
        bar's last count; the next round's bar opens at the next look (below what is said of it),
        or at ``close``."""
        if not st.search:
            self.update(st.done, extra, total=st.total)
            return
        last = st.search[-1]
        counts = (st.done_of(last["round"], last["planned"]), last["planned"], extra)
        if self.round is not None and self.round != last["round"]:
            ended = next((r for r in st.search if r["round"] == self.round), None)
            if ended is not None:
                self.update(st.done_of(self.round, ended["planned"]), extra, total=ended["planned"])
            self.close()
            self.round, self.desc, self.pending = last["round"], f"round {last['round']} ({last['kind']})", counts
            return
        self.round, self.desc, self.label = last["round"], f"round {last['round']} ({last['kind']})", "config"
        self.pending = None
        self.update(counts[0], extra, total=counts[1])

    def note(self, text: str) -> None:
        """A line printed above the bar (a warning mid-sweep), the bar redrawn below it."""
        if self.bar is not None and self.tty:
            self.bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self, *, keep: bool = True) -> None:
        """``keep``: False to take a terminal's bar off the screen (an error said in its place)."""
        if self.bar is None and self.pending is not None:  # a search's round whose bar was to open next
            done, total, extra = self.pending
            self.pending = None
            self.update(done, extra, total=total)
        if self.bar is not None:
            if not keep or (not self.tty and self.bar.last_print_n == self.bar.n):
                self.bar.leave = False  # the log's last line shows the final count already
            self.bar.close()
            self.bar = None
