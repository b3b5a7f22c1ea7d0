"""The timing harness: compile apart from runs, sized inner loops, every sample kept."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from kernels.timing import TIMER, Timing, compile_fn, measure


def _compiled():
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
