"""Device time of the calls made inside a block, read from jax's profiler trace.

Wall-clock timing counts the host's dispatch of every call; for a sub-millisecond kernel that
can be a large share of the time (tune-jax and tokamax time from the profiler for this reason).
``DeviceClock`` runs a profiler session around a block of calls and sums the time during which
the device executed them: the union of the execution intervals, so overlapping events (nested
ops, a stream and its "XLA Ops" mirror) count once and the gaps between launches (dispatch)
not at all. What the trace holds, per backend (read off jax 0.12 on the CPU; the GPU's names
are those tokamax and tune-jax read):

- GPU: a ``/device:GPU:N`` plane per device, whose "XLA Ops" and "Stream #..." lines hold one
  event per kernel launch (CUPTI). Only those count; a trace without them is an error, never a
  silent fall back to host events (those would be launch times).
- CPU (interpret mode runs plain XLA CPU ops): the ``/host:CPU`` plane has a "python" line with
  the dispatch (``PjitFunction``, ``ExecuteHelperOnSingleDevice``) and one ``tf_XLAExecute/...``
  line per execution thread holding the executable's thunks (``ThunkExecutor::Execute``, the
  ops, a ``while`` and its body's ops). The XLAExecute lines' events count; the python line's
  do not.

A session costs about 1 ms to start and stop on the CPU; one is run per sample.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import jax

from kernels.spelling import as_json

logger = logging.getLogger(__name__)

TIMER = "profiler_device_time"
_GPU_LINES = ("XLA Ops",)
_GPU_LINE_PREFIXES = ("Stream",)
_CPU_LINE_PREFIX = "tf_XLAExecute"
_CPU_EXECUTE = "ThunkExecutor::Execute"


class NoDeviceEvents(RuntimeError):
    """The trace holds no execution event: the environment cannot time on the device (no
    CUPTI for jax on this GPU node, say). Not a config's fault: the worker stops on it."""


def _options() -> Any:
    make = getattr(jax.profiler, "ProfileOptions", None)
    if make is None:  # older jax: the extension's class, as jax's own PGLE uses it
        from jax._src.lib import _profiler

        make = _profiler.ProfileOptions
    options = make()
    options.python_tracer_level = 0  # Python function events would only add overhead
    options.host_tracer_level = 2  # XLA's CPU thunks are host events at level 2
    return options


class _Session:
    """A profiler session returning ``ProfileData``: jax's public ``ProfileSession`` where it
    exists (jax >= 0.12), else the extension's session (what jax's own PGLE uses)."""

    def __init__(self) -> None:
        public = getattr(jax.profiler, "ProfileSession", None)
        self._public = public(profiler_options=_options()) if public is not None else None
        self._raw: Any = None
        if self._public is not None:
            self._public.start()
        else:
            from jax._src.lib import _profiler

            self._raw = _profiler.ProfilerSession(_options())

    def stop(self) -> Any:
        if self._public is not None:
            return self._public.stop()
        return jax.profiler.ProfileData.from_serialized_xspace(self._raw.stop())


def execution_intervals(profile: Any, backend: str) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of every event in which the device executed a program."""
    device: list[tuple[int, int]] = []
    host: list[tuple[int, int]] = []
    for plane in profile.planes:
        on_device = plane.name.startswith("/device:") and not plane.name.startswith("/device:CPU")
        for line in plane.lines:
            name = line.name
            if on_device:
                if name in _GPU_LINES or name.startswith(_GPU_LINE_PREFIXES):
                    device.extend(_spans(line.events, None))
            elif plane.name.startswith("/host:"):
                host.extend(_spans(line.events, None if name.startswith(_CPU_LINE_PREFIX) else _CPU_EXECUTE))
    if device or backend == "gpu":
        return device
    return host


def _spans(events: Iterable[Any], only: str | None) -> list[tuple[int, int]]:
    out = []
    for e in events:
        if e.duration_ns > 0 and (only is None or e.name == only):
            start = int(e.start_ns)
            out.append((start, start + int(e.duration_ns)))
    return out


def busy_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of the intervals."""
    total = 0
    end = None
    start = 0
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        elif e > end:
            end = e
    if end is not None:
        total += end - start
    return total


class DeviceClock:
    """``with DeviceClock() as clock: <calls; block_until_ready>`` then ``clock.busy_ms``.

    The block must wait for its calls (``block_until_ready``): events of work still running
    when the session stops are lost. Raises ``NoDeviceEvents`` when the trace holds no
    execution event (a GPU without CUPTI, or a backend this module does not know)."""

    def __init__(self, backend: str | None = None) -> None:
        self.backend = backend or jax.default_backend()
        self.busy_ms = 0.0
        self.events = 0
        self._session: _Session | None = None

    def __enter__(self) -> DeviceClock:
        self._session = _Session()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._session is not None
        profile = self._session.stop()
        if exc_type is not None:
            return
        intervals = execution_intervals(profile, self.backend)
        if not intervals:
            raise NoDeviceEvents(
                f"the profiler trace holds no execution event on backend {as_json(self.backend)}"
                + (" (is CUPTI available to jax on this node?)" if self.backend == "gpu" else "")
                + "; use timing.timer: wall"
            )
        self.events = len(intervals)
        self.busy_ms = busy_ns(intervals) / 1e6
        logger.debug("device clock: %d events, %.4f ms busy", self.events, self.busy_ms)
