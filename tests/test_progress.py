"""The progress display of run and wait: tqdm's bar on a terminal (a real pseudo-terminal here),
whole lines in a log, a warning printed above the bar, records made before the command kept
out of its rate."""

from __future__ import annotations

import fcntl
import io
import os
import re
import struct
import termios

from orchestrator.cli.progress import Progress

METER = re.compile(r"^\s*(\d+)%\|[# 0-9]*\| (\d+)/(\d+) \[[0-9:]+<[0-9:?]+, +[0-9.?]+ ?(item/s|s/item)(, .*)?\]$")


def test_a_log_gets_one_whole_line_per_change_and_the_final_state() -> None:
    out = io.StringIO()
    p = Progress(10, stream=out, interval_s=0, heartbeat_s=3600)
    p.update(0, "; units: 1 pending")
    p.update(0, "; units: 1 pending")  # nothing changed: no line
    p.update(4, "; units: 1 running")
    p.note("tilesweep: warning: unit u1 waits for Resources")
    p.update(10, "; units: 1 done")
    p.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    meters = [line for line in lines if not line.startswith("tilesweep:")]
    assert [METER.match(m).group(2) for m in meters] == ["0", "4", "10"], lines  # type: ignore[union-attr]
    assert meters[0].endswith("units: 1 pending]") and meters[-1].startswith("100%|") and "units: 1 done" in meters[-1]
    assert lines[2] == "tilesweep: warning: unit u1 waits for Resources"


def test_a_log_line_at_most_every_interval() -> None:
    out = io.StringIO()
    p = Progress(100, stream=out, interval_s=3600, heartbeat_s=3600)
    for done in range(0, 60, 5):
        p.update(done)
    p.close()
    counts = [METER.match(line).group(2) for line in out.getvalue().splitlines()]  # type: ignore[union-attr]
    assert counts == ["0", "55"]  # the first state, then the last one at close


def test_records_made_before_the_command_do_not_count_towards_its_rate() -> None:
    out = io.StringIO()
    p = Progress(1000, stream=out, interval_s=0, heartbeat_s=3600)
    p.update(900)
    assert p.bar is not None and p.bar.initial == 900 and p.bar.n == 900
    p.close()
    assert " 900/1000 " in out.getvalue()


def test_a_terminal_gets_a_redrawn_bar_and_the_warning_above_it() -> None:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    os.set_blocking(master, False)
    with open(slave, "w", closefd=True) as tty:
        p = Progress(4, stream=tty)
        p.update(1, "; units: 1 running")
        p.note("tilesweep: warning: unit u1 waits for Resources")
        p.update(4, "; units: 1 done")
        p.close()
        tty.flush()
        text = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            text += chunk
    os.close(master)
    screen = text.decode()
    assert "\r" in screen and "1/4" in screen and "4/4" in screen and "units: 1 done" in screen
    assert "tilesweep: warning: unit u1 waits for Resources" in screen
    assert "\u2588" in screen  # tqdm's unicode blocks on a terminal, '#' in a log


def test_a_total_that_grows_mid_sweep_is_shown() -> None:
    """A halving sweep's round 2 adds items once round 1 is done: the bar's total follows."""
    out = io.StringIO()
    p = Progress(10, stream=out, interval_s=0, heartbeat_s=3600)
    p.update(10, total=10)
    p.update(10, total=14)
    p.update(14, total=14)
    p.close()
    counts = [METER.match(line).group(2, 3) for line in out.getvalue().splitlines()]  # type: ignore[union-attr]
    assert counts == [("10", "10"), ("10", "14"), ("14", "14")], out.getvalue()
