"""What each point of a mode's tile grid is at one shape: the config that runs at the seq it runs
at, and how the worker treats it (runnable, invalid, or pruned by the shared-memory model).

Pure arithmetic on the jax-free kernel modules (``kernels.impls``: the implementation's
``runs_as``, ``invalid`` and ``predict``), shared by every shape it applies to: the planner
(``planning.items``) builds millions of items from it.
"""

from __future__ import annotations

from kernels import impls
from kernels.impl_base import Value
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import config_fields, id_suffix

# Item kinds: how the worker treats an item.
RUN, INVALID, PRUNED = "run", "invalid", "pruned"

Params = tuple[Value, ...]


class Clamped:
    """Each mode's grid as it runs at one seq: the kernel clamps some values to the problem (the
    Triton kernels a block larger than seq to seq, jax's Mosaic GPU kernel its pipeline depth
    to its tiles: ``Implementation.runs_as``), so the config is recorded as it runs, and grid
    points that run the same config are one item (the first in grid order). Without this, seq
    100 would time tiles of 100 under the name "bq128", and bq128 and bq256 twice."""

    def __init__(self, grids: dict[str, tuple[list[Params], list[bytes]]], impl: str) -> None:
        self.impl = impls.get(impl)
        self.names = {mode: config_fields(mode, impl=impl) for mode in grids}
        self.grids = grids
        self.cache: dict[tuple[str, int], tuple[list[Params], list[bytes]]] = {}

    def __call__(self, mode: str, seq: int) -> tuple[list[Params], list[bytes]]:
        out = self.cache.get((mode, seq))
        if out is None:
            grid = self.grids[mode]
            runs = dict.fromkeys(self.impl.runs_as(mode, seq, p) for p in grid[0])
            if len(runs) == len(grid[0]) and all(r == p for r, p in zip(runs, grid[0], strict=True)):
                out = grid  # nothing clamps at this seq: the grid and its id suffixes as they are
            else:
                params = list(runs)
                out = (params, [id_suffix(self.names[mode], p) for p in params])
            self.cache[(mode, seq)] = out
        return out


class Classifier:
    """(kind, reason, smem_bytes) of each config of a grid at one shape.

    Whether a config runs depends on seq only through the implementation's seq checks
    (``invalid``) and what it clamps to seq (``runs_as``), and its shared-memory prediction
    of a config that runs as it is does not depend on seq (``Implementation.predict``). So a
    grid's classification is computed once per (mode, dtype, head_dim) and reused for every
    seq at which no config is clamped or invalid (``plain``), once per seq elsewhere."""

    def __init__(self, spec: SweepSpec, grids: dict[str, list[Params]]) -> None:
        from kernels import smem  # pure arithmetic, no jax import

        self.smem = smem
        self.impl = impls.get(spec.measured_impl)
        self.limit = spec.smem_limit_bytes
        self.enabled = spec.kernel.prune_smem == "predict" and self.limit is not None
        self.grids = grids  # each mode's whole grid, as the spec sweeps it
        self.cache: dict[tuple[str, str, int, int | None], list[tuple[str, str | None, int | None]]] = {}
        self.plain: dict[tuple[str, int], bool] = {}

    def _plain(self, mode: str, seq: int, grid: list[Params]) -> bool:
        """Whether every config of the mode's grid runs at ``seq`` as it is and passes the seq checks."""
        found = self.plain.get((mode, seq))
        if found is None:
            whole = grid is self.grids[mode]  # ``Clamped`` hands the grid itself on where nothing clamps
            found = self.plain[(mode, seq)] = whole and all(self.impl.invalid(mode, seq, p) is None for p in grid)
        return found

    def __call__(
        self, mode: str, dtype: str, head_dim: int, seq: int, grid: list[Params]
    ) -> list[tuple[str, str | None, int | None]]:
        key = (mode, dtype, head_dim, None if self._plain(mode, seq, grid) else seq)
        out = self.cache.get(key)
        if out is None:
            out = self.cache[key] = [self._one(mode, dtype, head_dim, seq, p) for p in grid]
        return out

    def _one(
        self, mode: str, dtype: str, head_dim: int, seq: int, params: Params
    ) -> tuple[str, str | None, int | None]:
        why = self.impl.invalid(mode, seq, params)
        if why is not None:
            return INVALID, why, None
        preds = self.impl.predict(mode, dtype, head_dim, params, seq)
        if not preds:  # no model: lowering decides (``tilesweep plan --lower``)
            return RUN, None, None
        over = self.smem.first_over(preds, self.limit)
        if over is None:
            return RUN, None, max(b for _, b in preds)
        kernel, nbytes = over
        if not self.enabled:
            return RUN, None, nbytes
        return (
            PRUNED,
            (
                f"SharedMemoryPredicted: {kernel} kernel needs {nbytes} bytes of shared memory "
                f"(predicted by the model, not compiled); smem_limit_bytes allows {self.limit}"
            ),
            nbytes,
        )
