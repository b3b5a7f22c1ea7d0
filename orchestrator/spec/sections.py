"""The spec's sections: how items are grouped and timed, which kernel, how checked and
compiled, how merged, reported, replayed and reused (``orchestrator.spec.model.SweepSpec``
holds one of each, all with defaults, so the reference's config block is a complete spec;
where units run is ``executor_section``, what a search measures ``search_section``).

Every model forbids unknown keys: a typo is an error naming the field and the allowed ones,
never silently dropped. Every field carries a description: ``docs/spec.md`` is generated from
them (``scripts/spec_reference.py``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from kernels import devices
from kernels.impls import DEFAULT_IMPL, SPEC_IMPL_NAMES
from kernels.spelling import as_json, one_of
from orchestrator.spec.lists import Tile

REPLAY = "replay"  # kernel.impl of a sweep that replays a results document (jobs/replay.py)


class SpecModel(BaseModel):
    """Base of the spec and its sections: unknown keys refused, frozen, defaults validated."""

    # strict: numbers must be numbers and flags booleans ("repeats": "2" or true is refused,
    # not read as 2 or 1); a float field still takes an integer, but neither inf nor nan
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: object) -> object:
        """No text of a spec holds a NUL character: no path, name or tag can (the filesystem
        refuses it, and a record's text would carry it)."""
        if _holds_nul(value):
            raise ValueError("holds a NUL character (\\u0000), which no path, name or tag may hold: remove it")
        return value


def _holds_nul(value: object) -> bool:
    """Whether a NUL is in any text of ``value`` (walked without recursion)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\0" in v:
                return True
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
    return False


def _auto_or_bool(value: object) -> object:
    """ "auto", true or false, and nothing else: pydantic's ``Literal`` compares by equality, so
    it takes 1 and 0 (and 1.0) as true and false where a plain flag (``StrictBool``) refuses them."""
    if isinstance(value, bool) or (isinstance(value, str) and value == "auto"):
        return value
    raise ValueError('Input should be "auto", true or false')


# a setting that is a flag or "auto" (its default: tilesweep decides where it runs)
AutoOrBool = Annotated[Literal["auto", True, False], BeforeValidator(_auto_or_bool)]


class ForwardBlocks(SpecModel):
    """Forward tiles used by fwd_bwd configs (the reference's ``bwd_fwd_config``)."""

    block_q: Tile = Field(default=128, description="query rows per forward tile (a power of two from 16)")
    block_k: Tile = Field(default=128, description="key/value rows per forward tile (a power of two from 16)")


class ShardingSettings(SpecModel):
    """How items are grouped into units (one unit = one job array task)."""

    units: int | None = Field(
        default=None,
        ge=1,
        description="number of units; default: one per shape, at most 4, rounded up to whole tasks where a SLURM "
        "task takes several (executor.gpus_per_node G > 1: 4 x G units a task)",
    )
    strategy: Literal["shape", "balanced"] = Field(
        default="shape",
        description="shape: keep a shape's items in one unit unless it exceeds half a unit's share of the cost; "
        "balanced: deal every shape out in pieces of at most a tenth of a unit (sturdier against cost-model "
        "errors, about twice the per-shape setups)",
    )


class TimingSettings(SpecModel):
    """How each config is timed (docs/measuring.md; the rules: ``kernels.timing``, ``jobs``)."""

    target_ms: float = Field(
        default=50.0, gt=0, le=60_000, description="wall time one timed sample aims for (at most a minute)"
    )
    max_inner: int = Field(default=200, ge=1, description="cap on calls per timed sample")
    warmup: int = Field(default=1, ge=0, le=10_000, description="untimed calls before the probe")
    seed: int = Field(
        default=0,
        description="seed of the random inputs every config of a problem is timed and checked on "
        "(and of a replay's sample draws)",
    )
    strategy: Literal["full", "halving", "search"] = Field(
        default="full",
        description="full: every config gets repeats x target_ms; halving: every config of a problem gets one "
        "screening sample of screen_ms, then only those that can still win are timed in full (a second round); "
        "search: rounds that measure per problem a small design, then the configs that won other problems and "
        "the grid neighbours of its leaders, until nothing faster is found (the search section)",
    )
    screen_ms: float | None = Field(
        default=None,
        gt=0,
        le=60_000,
        description="halving: length of the one screening sample (default: target_ms / 10); must be below target_ms",
    )
    keep: int = Field(
        default=4,
        ge=1,
        description="halving (and search.screen): at least this many configs per problem are timed in full",
    )
    noise: float = Field(
        default=0.1,
        ge=0,
        description="halving: a config whose screen is within this fraction of "
        "the best screen (or of twice the auto record's relative q1-q3 spread, if larger) is timed "
        "in full too",
    )
    timer: Literal["auto", "wall", "device"] = Field(
        default="auto",
        description="wall: perf_counter around block_until_ready; device: the kernels' own time from "
        "jax's profiler trace, without dispatch overhead; auto: device with compile.mode processes on a GPU, else wall",
    )
    flush_l2: AutoOrBool = Field(
        default="auto",
        description="overwrite a buffer larger than the "
        "GPU's L2 cache before each sample; auto: on a GPU, off on the CPU",
    )

    @model_validator(mode="after")
    def _screen_below_target(self) -> TimingSettings:
        if self.screen_ms is not None and self.screen_ms >= self.target_ms:
            raise ValueError(
                f"screen_ms={self.screen_ms:g} must be below target_ms={self.target_ms:g} "
                "(a screening sample is the short one)"
            )
        return self

    @property
    def screen_target_ms(self) -> float:
        """How long the one screening sample of the halving strategy aims to be."""
        return self.screen_ms if self.screen_ms is not None else self.target_ms / 10


class KernelSettings(SpecModel):
    """Which kernel is tuned and how it runs."""

    interpret: AutoOrBool = Field(
        default="auto",
        description="run the kernels in Pallas interpret mode; auto: where jax sees no GPU. A GPU task whose jax "
        "sees none is refused unless this is true",
    )
    prune_smem: Literal["predict", "off"] = Field(
        default="predict",
        description="predict: a config the shared-memory model predicts over smem_limit_bytes is recorded as "
        "pruned, not compiled; off: every config is compiled",
    )
    impl: Literal[(*SPEC_IMPL_NAMES, REPLAY)] = Field(  # type: ignore[valid-type]
        default=DEFAULT_IMPL,
        description="kernel implementation to tune: tilesweep (ours) or jax (jax's stock Pallas mha, "
        "jax.experimental.pallas.ops.gpu.attention; no grouped-query attention, its backward runs 2 stages); "
        "mosaic (jax's Mosaic GPU attention_mgpu: float16 only, no causal backward, tuned by its TuningConfig "
        "fields through grid; `tilesweep impls` lists each one's tunables); "
        "tokamax-mosaic, tokamax-triton (tokamax's flash-attention ops, by their config classes; tokamax-mosaic runs "
        "as tokamax-mosaic-sm100, with tokamax's sm100 classes, on an sm_100 kernel.device_kind); "
        "replay: compile and run nothing, replay the records of replay.source (samples drawn from each record's "
        "spread, times on a virtual clock)",
    )
    device_kind: str | None = Field(
        default=None,
        description="the GPU the sweep targets, as jax names it (one of "
        + one_of(devices.KINDS)
        + "): pre-flight lowering (`tilesweep plan --lower`) lowers for it and holds each kernel to its shared "
        f"memory; null: {as_json(devices.DEFAULT_DEVICE_KIND)}",
    )

    @field_validator("device_kind")
    @classmethod
    def _known_device_kind(cls, value: str | None) -> str | None:
        if value is not None:
            devices.get(value)  # ValueError listing the known kinds
        return value

    @property
    def target(self) -> devices.DeviceKind:
        """The target GPU (``device_kind``, or the reference run's)."""
        return devices.get(self.device_kind or devices.DEFAULT_DEVICE_KIND)


class ReplaySettings(SpecModel):
    """Where a replayed sweep takes its measurements from (``kernel.impl: replay``), and at what pace."""

    source: str = Field(
        description="a results document (tilesweep's or the reference run's) that measured this "
        "spec's problems; a relative path is taken from the working directory"
    )
    impl: Literal[SPEC_IMPL_NAMES] = Field(  # type: ignore[valid-type]
        default=DEFAULT_IMPL, description="the kernel implementation the source measured: its configs are planned"
    )
    pace: Literal["instant", "real"] = Field(default="instant", description="real: wait out each record's seconds")


class CompileSettings(SpecModel):
    """Where configs are compiled and whether compiled kernels are cached."""

    mode: Literal["threads", "processes"] = Field(
        default="threads",
        description="threads: compile on a thread "
        "pool of the worker (lowering holds the GIL); processes: compile "
        "processes lower and compile, the worker times (docs/compile-modes.md)",
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        description="compile threads or processes per worker, at most "
        "its CPUs (a whole-node task's share); default: those CPUs, one thread in interpret mode "
        "(docs/compile-modes.md)",
    )
    cache_dir: str | None = Field(
        default=None,
        min_length=1,
        description="persistent compilation cache shared by the sweep's units; default: SWEEP_DIR/compile-cache; "
        "a relative path is taken relative to the sweep directory; 'off' disables",
    )


class MergeSettings(SpecModel):
    """How partial records are merged into the results document."""

    lock: Literal["hard", "soft"] = Field(
        default="hard", description="soft: a lock file that works where flock does not (NFS, Lustre)"
    )
    lock_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="seconds a merge waits for the results document's lock before it gives up with an error",
    )
    mix_devices: bool = Field(
        default=False, description="append into a document of another device; records then carry their device"
    )


class CheckSettings(SpecModel):
    """How each config's output is checked against the reference."""

    max_rel_err: float | None = Field(
        default=None,
        gt=0,
        description="the largest rel_err against the reference a config may have; a config above it is recorded "
        "as a WrongResult error, never timed nor chosen. Default: 1e-2 for float32, 5e-2 for bfloat16 and float16",
    )


class ReportSettings(SpecModel):
    """What a finished sweep leaves beside its results document."""

    html: bool = Field(
        default=False,
        description="write the report page (the results document's path with "
        "the suffix .html) when run or wait ends, and in the SLURM final-merge job",
    )


class ReuseSettings(SpecModel):
    """Earlier documents whose compatible records are carried, not measured (``store.reuse``)."""

    documents: list[str] = Field(
        default_factory=list,
        json_schema_extra={"default": []},
        description="results documents reused besides the output "
        "document (a relative path is taken from the working directory)",
    )
    errors: bool = Field(default=False, description="reuse error records too (default: measured again)")
    replays: bool = Field(
        default=False,
        description="a measured sweep reuses replayed records too (a replay's, drawn on a virtual clock; "
        "carried with timer virtual); default: never, a replay is not a measurement",
    )
