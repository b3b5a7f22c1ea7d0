"""The timing harness: compile apart from runs, sized inner loops, every sample kept."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from kernels.timing import TIMER, Timing, compile_fn, measure


def _compiled() -> tuple[jax.stages.Compiled, float, tuple[jax.Array]]:
    x = jnp.arange(256.0).reshape(16, 16)
    compiled, compile_s = compile_fn(lambda a: (a @ a + 1.0,), (x,))
    return compiled, compile_s, (x,)


def test_compile_fn_returns_a_callable_and_its_time() -> None:
    compiled, compile_s, args = _compiled()
    assert compile_s > 0
    assert compiled(*args)[0].shape == (16, 16)


@pytest.mark.parametrize(("target_ms", "max_inner"), [(50.0, 5), (1e-6, 200)])
def test_measure_keeps_samples_and_orders_quartiles(target_ms: float, max_inner: int) -> None:
    compiled, _, args = _compiled()
    t = measure(compiled, args, repeats=4, target_ms=target_ms, max_inner=max_inner, warmup=2)
    assert isinstance(t, Timing)
    assert 1 <= t.inner <= max_inner
    if target_ms < 1e-3:
        assert t.inner == 1
    assert len(t.samples_ms) == 4 and all(s > 0 for s in t.samples_ms)
    assert t.q1_ms <= t.median_ms <= t.q3_ms
    assert min(t.samples_ms) <= t.median_ms <= max(t.samples_ms)
    assert t.timer == TIMER == "wall_clock+block_until_ready"


def test_measure_rejects_bad_counts() -> None:
    compiled, _, args = _compiled()
    with pytest.raises(ValueError, match="repeats=0"):
        measure(compiled, args, repeats=0)


def test_device_timer_is_at_most_wall_for_the_same_calls() -> None:
    """The device timer leaves dispatch out: per sample, never more than the wall clock of the
    very same calls (on the CPU the trace holds XLA's CPU execution, as for interpret mode's
    kernel, which tests/test_run_local.py times this way through the real worker; compiling
    that kernel here would cost seconds for nothing more)."""
    compiled, _, args = _compiled()
    t = measure(compiled, args, repeats=3, target_ms=2, max_inner=4, warmup=1, timer="device")
    assert t.timer == "profiler_device_time" and len(t.samples_ms) == len(t.wall_samples_ms) == 3
    for device_ms, wall_ms in zip(t.samples_ms, t.wall_samples_ms, strict=True):
        assert 0 < device_ms <= wall_ms
    assert t.timed_s > 0


def test_wall_timer_keeps_its_samples_as_wall_samples_and_flushes_before_each() -> None:
    compiled, _, args = _compiled()
    flushes = []
    t = measure(compiled, args, repeats=3, target_ms=1, max_inner=2, warmup=0, flush=lambda: flushes.append(1))
    assert t.wall_samples_ms == t.samples_ms and len(flushes) == 3


def test_busy_time_is_the_union_of_intervals() -> None:
    from kernels.devicetime import busy_ns

    assert busy_ns([]) == 0
    assert busy_ns([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25


def test_l2_flush_wanted_on_gpu_only_unless_asked() -> None:
    from kernels.l2 import L2Flush, wanted

    assert wanted("auto", "gpu") and not wanted("auto", "cpu")
    assert wanted(True, "cpu") and not wanted(False, "gpu")
    flush = L2Flush(nbytes=1 << 20)
    flush()
    flush()  # the donated buffer is replaced in place, call after call


def _line(line_id: int, name: str, spans: list[tuple[int, int]], metadata_id: int = 1) -> str:
    events = " ".join(
        f"events {{ metadata_id: {metadata_id} offset_ps: {s * 1000} duration_ps: {d * 1000} }}" for s, d in spans
    )
    return f'lines {{ id: {line_id} name: "{name}" timestamp_ns: 0 {events} }}'


def _plane(plane_id: int, name: str, *lines: str) -> str:
    return (
        f'planes {{ id: {plane_id} name: "{name}" {" ".join(lines)} '
        'event_metadata { key: 1 value { id: 1 name: "op" } } }'
    )


def test_device_clock_counts_kernel_events_and_never_dispatch() -> None:
    """What the clock reads from a trace (a GPU's cannot be made here, so it is written out):
    on a GPU the device plane's stream events (not the module spans, gaps included, nor any
    host event); on the CPU the XLA execution threads (not the dispatching Python thread)."""
    from jax.profiler import ProfileData

    from kernels.devicetime import busy_ns, execution_intervals

    python = _plane(2, "/host:CPU", _line(3, "python", [(0, 30000)]))
    gpu = ProfileData.from_text_proto(
        _plane(
            1,
            "/device:GPU:0",
            _line(1, "Stream #13(Compute)", [(0, 5000), (8000, 2000)]),
            _line(2, "XLA Modules", [(0, 10000)]),
        )
        + python
    )
    assert busy_ns(execution_intervals(gpu, "gpu")) == 7000
    assert execution_intervals(ProfileData.from_text_proto(python), "gpu") == []  # no fall back to the host
    cpu = ProfileData.from_text_proto(
        _plane(
            2, "/host:CPU", _line(3, "python", [(0, 30000)]), _line(4, "tf_XLAExecute/1", [(1000, 4000), (2000, 1000)])
        )
    )
    assert busy_ns(execution_intervals(cpu, "cpu")) == 4000


def test_a_trace_without_execution_events_names_its_backend_as_jax_spells_it() -> None:
    """A GPU clock here traces no GPU: the refusal names the backend in quotes, as JSON does."""
    from kernels.devicetime import DeviceClock, NoDeviceEvents

    with pytest.raises(NoDeviceEvents, match=re.escape('no execution event on backend "gpu" (is CUPTI')):
        with DeviceClock("gpu"):
            pass
