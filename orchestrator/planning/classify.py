"""What each point of a mode's tile grid is at one shape: clamped to the seq it runs at, and
classified as the worker treats it (runnable, invalid, or pruned by the shared-memory model).

Pure arithmetic on the jax-free kernel modules (``kernels.smem``, ``kernels.impls``), shared by
every shape it applies to: the planner (``planning.items``) builds millions of items from it.
"""

from __future__ import annotations

from kernels import impls
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import config_fields, id_suffix, kernel_kwargs

# Item kinds: how the worker treats an item.
RUN, INVALID, PRUNED = "run", "invalid", "pruned"

# Where each block size sits in a mode's config tuple (``records.config_fields``), by name.
BLOCK_POSITIONS = {
    "fwd": (("block_q", 0), ("block_k", 1)),
    "fwd_bwd": (("fwd_block_q", 0), ("fwd_block_k", 1), ("bwd_outer", 2), ("bwd_inner", 3)),
}


class Clamped:
    """Each mode's grid as it runs at one seq: a block larger than seq is clamped to seq by the
    kernel (``kernels.smem.clamp_block``), so the config is recorded with the tile that runs, and
    grid points that clamp to the same config are one item (the first in grid order). Without
    this, seq 100 would time tiles of 100 under the name "bq128", and bq128 and bq256 twice."""

    def __init__(self, grids: dict[str, tuple[list[tuple[int, ...]], list[bytes]]]) -> None:
        from kernels.smem import clamp_block

        self.clamp = clamp_block
        self.grids = grids
        self.cache: dict[tuple[str, int], tuple[list[tuple[int, ...]], list[bytes]]] = {}
        self.largest = {
            m: max((p[i] for p in g[0] for _, i in BLOCK_POSITIONS[m]), default=0) for m, g in grids.items()
        }

    def __call__(self, mode: str, seq: int) -> tuple[list[tuple[int, ...]], list[bytes]]:
        if self.largest[mode] <= seq:
            return self.grids[mode]
        out = self.cache.get((mode, seq))
        if out is None:
            blocks = {i for _, i in BLOCK_POSITIONS[mode]}
            runs = dict.fromkeys(
                tuple(self.clamp(v, seq) if i in blocks else v for i, v in enumerate(p)) for p in self.grids[mode][0]
            )
            params = list(runs)
            out = self.cache[(mode, seq)] = (params, [id_suffix(config_fields(mode), p) for p in params])
        return out


class Classifier:
    """(kind, reason, smem_bytes) of each config of a grid at one shape.

    Whether a config runs depends on seq only through divisibility and the clamping of
    blocks to seq, so a grid's classification is computed once per (mode, dtype,
    head_dim) and reused for every seq at which no block is clamped or invalid."""

    def __init__(self, spec: SweepSpec, grids: dict[str, list[tuple[int, ...]]]) -> None:
        from kernels import smem  # pure arithmetic, no jax import

        self.smem = smem
        self.impl = impls.get(spec.measured_impl)
        self.limit = spec.smem_limit_bytes
        self.enabled = spec.kernel.prune_smem == "predict" and self.limit is not None
        self.cache: dict[tuple, list[tuple[str, str | None, int | None]]] = {}
        # distinct block sizes of each mode's whole grid (a shape may run a clamped one)
        self.blocks = {m: sorted({p[i] for p in g for _, i in BLOCK_POSITIONS[m]}) for m, g in grids.items()}

    def __call__(
        self, mode: str, dtype: str, head_dim: int, seq: int, grid: list[tuple[int, ...]]
    ) -> list[tuple[str, str | None, int | None]]:
        positions = BLOCK_POSITIONS[mode]
        blocks = self.blocks[mode]
        plain = all(b <= seq and seq % b == 0 for b in blocks)
        key = (mode, dtype, head_dim, None if plain else seq)
        out = self.cache.get(key)
        if out is None:
            out = self.cache[key] = [self._one(mode, dtype, head_dim, seq, p, positions) for p in grid]
        return out

    def _one(
        self,
        mode: str,
        dtype: str,
        head_dim: int,
        seq: int,
        params: tuple[int, ...],
        positions: tuple[tuple[str, int], ...],
    ) -> tuple[str, str | None, int | None]:
        for name, i in positions:
            block = params[i]
            if seq % min(block, seq):  # the kernel clamps a block larger than seq
                return INVALID, f"ValueError: seq={seq} must be a multiple of {name}={block} (not compiled)", None
        cfg = kernel_kwargs(mode, params)
        preds = self.impl.predict(mode, dtype, head_dim, cfg, seq=seq)
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
