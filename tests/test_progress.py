"""The progress display of run and wait: tqdm's bar on a terminal (a real pseudo-terminal here),
whole lines in a log, a warning printed above the bar, records made before the command kept
out of its rate."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import struct
import termios
from typing import cast

from orchestrator.cli.progress import Progress
from orchestrator.control.status_model import SweepStatus, UnitStatus
from orchestrator.store.searchrounds import SearchRound

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


def test_a_bar_closed_for_an_error_leaves_a_terminals_line_empty_for_it() -> None:
    """``plan --lower`` draws its bar at 0 before its lowering processes start; an error before
    its first verdict takes the bar off the terminal, so the error's line stands alone."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    os.set_blocking(master, False)
    with open(slave, "w", closefd=True) as tty:
        p = Progress(3, "config", stream=tty, desc="lowering for NVIDIA H100")
        p.update(0)
        p.close(keep=False)
        tty.write("tilesweep: error: ...\n")
        tty.flush()
        text = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(master, 65536):
                text += chunk
    os.close(master)
    screen = text.decode()
    assert "lowering for NVIDIA H100:   0%|" in screen and "| 0/3 configs [00:00<?, ?config/s]" in screen
    drawn, cleared, said = screen.split("\r")[-4:-1]  # each drawn from the line's start
    assert "0/3 configs" in drawn and cleared == " " * len(cleared) and len(cleared) >= len(drawn), screen
    assert said == "tilesweep: error: ..." and screen.endswith("\r\n"), screen


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


def _search_status(rounds: list[tuple[int, str, int, int]]) -> SweepStatus:
    """A search's status: each round (number, kind, configs done, configs planned) one unit."""
    st = SweepStatus(sweep_dir="s", planned=rounds[0][3])
    st.search = []
    for n, kind, done, planned in rounds:
        st.units.append(UnitStatus(f"u{n}", total=planned, done=done, complete=done == planned, round=n))
        record = {"round": n, "search_round": n, "kind": kind, "created": "", "units": [f"u{n}"], "planned": planned}
        st.search.append(cast("SearchRound", {**record, "new": planned, "problems": []}))
    return st


def test_a_search_gets_a_bar_per_round_counting_its_configs_and_a_plain_sweep_its_items() -> None:
    """A search's bar counts its last round's configs, named as status names the round; a round
    that ended shows its last count before what is said of the next, whose bar opens at the next
    look, or at close where there is none."""
    out = io.StringIO()
    p = Progress(14, stream=out, interval_s=0, heartbeat_s=3600)
    p.sweep(_search_status([(1, "design", 9, 14)]))
    p.sweep(_search_status([(1, "design", 14, 14), (2, "search", 0, 4)]))  # round 2 planned meanwhile
    p.note("tilesweep: round 2 of the search: 4 configs (search)")
    p.sweep(_search_status([(1, "design", 14, 14), (2, "search", 2, 4)]))
    p.sweep(_search_status([(1, "design", 14, 14), (2, "search", 4, 4), (3, "search", 3, 3)]))
    p.close()  # the last look planned round 3 and saw it done: its bar is shown once
    lines = out.getvalue().splitlines()
    meters = [re.sub(r" \[.*", "", line).replace("|", " ").split() for line in lines if "%|" in line]
    assert [(m[0] + " " + m[1], m[-2]) for m in meters] == [
        ("round 1", "9/14"),
        ("round 1", "14/14"),
        ("round 2", "2/4"),
        ("round 2", "4/4"),
        ("round 3", "3/3"),
    ], lines
    bars = [line for line in lines if "%|" in line]
    assert all(line.endswith(("config/s]", "s/config]")) and " configs [" in line for line in bars), lines
    assert lines[1].startswith("round 1 (design):"), lines
    assert lines[2] == "tilesweep: round 2 of the search: 4 configs (search)", lines
    plain = io.StringIO()
    q = Progress(10, stream=plain, interval_s=0, heartbeat_s=3600)
    st = SweepStatus(sweep_dir="s", planned=10, units=[UnitStatus("u", total=10, done=4, complete=False)])
    q.sweep(st)
    q.close()
    assert [METER.match(line).group(2, 3, 4) for line in plain.getvalue().splitlines()] == [("4", "10", "item/s")]  # type: ignore[union-attr]
