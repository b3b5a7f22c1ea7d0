"""A real headless Chromium driven over the DevTools protocol on a pipe, with the stdlib only.

The report page's tests open it as a user's browser would and ask the page itself: rows in
the table, heatmaps in the DOM, the order after a click on a header. ``--remote-debugging-pipe``
makes Chromium read protocol messages (JSON, NUL-terminated) from fd 3 and write to fd 4, so no
port is opened and no websocket library is needed. Every console message, uncaught exception,
log entry and network request the page makes is collected, so a test can assert there were
none. The flags keep Chromium off the network (the machine has none, and Chromium otherwise
tries to reach its vendor's services) and out of the user's profile.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
)


def _high(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


REQUIRE_ENV = "TILESWEEP_REQUIRE_BROWSER"


def chromium_path() -> str | None:
    """The Chromium the test command installs (Debian's ``chromium``)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def skip_without_chromium() -> None:
    """Skip the calling test where Chromium is not installed, with the reason; fail it instead
    under ``TILESWEEP_REQUIRE_BROWSER=1`` (set by scripts/test.sh), so CI never passes it silently."""
    if chromium_path() is None:
        reason = "chromium is not installed: run `bash scripts/install-browser.sh` as root (scripts/test.sh does)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason} ({REQUIRE_ENV}=1)")
        pytest.skip(reason)


class Browser:
    """One Chromium process with one page. Use as a context manager."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000, timeout_s: float = 120.0) -> None:
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("chromium is not installed; scripts/test.sh installs it (apt-get install chromium)")
        self.timeout_s = timeout_s
        cmd_r, cmd_w = os.pipe()  # our commands -> chromium's fd 3
        out_r, out_w = os.pipe()  # chromium's fd 4 -> our replies
        # the child's ends above 9, so moving them onto 3 and 4 overwrites neither
        cmd_r, out_w = (_high(fd) for fd in (cmd_r, out_w))
        args = [*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
        # the shell moves the pipe ends to fds 3 and 4, where chromium expects them
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{cmd_r} 4>&{out_w} {cmd_r}<&- {out_w}>&-', exe, *args],
            pass_fds=(cmd_r, out_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(cmd_r)
        os.close(out_w)
        self.tx, self.rx = os.fdopen(cmd_w, "wb", buffering=0), os.fdopen(out_r, "rb", buffering=0)
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (OSError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.tx.close()
        self.rx.close()

    # ------------------------------------------------------------------ protocol
    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise RuntimeError("chromium did not answer in time")
            chunk = self.rx.read(1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit code {self.proc.poll()})")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.tx.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, since: int = 0) -> dict[str, Any]:
        """The first event ``method`` at or after position ``since`` of ``events``, waiting for it."""
        deadline = time.monotonic() + self.timeout_s
        for ev in self.events[since:]:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._message(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    # ------------------------------------------------------------------ what tests use
    def open(self, url: str) -> float:
        """Navigate and wait for the load event; return the seconds it took."""
        start, since = time.monotonic(), len(self.events)  # an earlier page's load event does not count
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired", since)
        return time.monotonic() - start

    def js(self, expression: str) -> Any:
        """Evaluate in the page and return the value (JSON-able; a promise is awaited); a thrown
        error fails."""
        res = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def until(self, expression: str, timeout_s: float | None = None) -> Any:
        """Poll ``expression`` until it is truthy (an event handler that runs after the call that
        triggered it, such as ``hashchange``); return its value, or fail naming it after
        ``timeout_s`` (default: the browser's, as every other wait for the page)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.js(expression)
            if value or time.monotonic() > deadline:
                if not value:
                    raise RuntimeError(f"still false after {timeout_s} s: {expression}")
                return value
            time.sleep(0.05)

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        data = self.call("Page.captureScreenshot", session=True, **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions, log errors, and every request for
        anything but the page's own file: what a clean, self-contained page never produces."""
        out = []
        for ev in self.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails'].get('text')} {p['exceptionDetails'].get('exception')}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: {[a.get('value') for a in p.get('args', [])]}")
            elif m == "Log.entryAdded" and p["entry"].get("level") in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry'].get('text')}")
            elif m == "Network.requestWillBeSent" and not p["request"]["url"].startswith(("file:", "data:")):
                out.append(f"request: {p['request']['url']}")
        return out
