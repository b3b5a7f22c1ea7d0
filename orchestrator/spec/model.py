"""What a sweep spec looks like (the record layout is ``orchestrator.spec.records``).

The reference run's config block loads unchanged: every one of its fields keeps its name
and meaning here. What the reference lacked (executor, sharding, timing, kernel, merge
options) lives in added sections that all have defaults, so an old config block is a
complete spec. Every model forbids unknown keys: a typo is an error naming the field and
the allowed ones, never silently dropped.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kernels.impls import DEFAULT_IMPL, IMPL_NAMES
from kernels.smem import DTYPES, MAX_HEAD_DIM, MIN_HEAD_DIM, MODES

SCHEMA_VERSION = 1
REPLAY = "replay"  # kernel.impl of a sweep that replays a results document (jobs/replay.py)

# The reference config block, in the reference document's key order.
REFERENCE_CONFIG_FIELDS = (
    "output",
    "append",
    "dtypes",
    "head_dims",
    "seq_lens",
    "modes",
    "batch",
    "heads",
    "repeats",
    "auto_only",
    "tag",
    "fwd_block_q",
    "fwd_block_k",
    "fwd_stages",
    "fwd_warps",
    "bwd_outer",
    "bwd_inner",
    "bwd_stages",
    "bwd_warps",
    "bwd_fwd_config",
    "smem_limit_bytes",
)


def _power_of_two(values: list[int]) -> list[int]:
    bad = [v for v in values if v < 1 or v & (v - 1)]
    if bad:
        raise ValueError(f"must be powers of two (16, 32, 64, 128, ...), got {bad}")
    return values


def _head_dims(values: list[int]) -> list[int]:
    bad = [v for v in values if not MIN_HEAD_DIM <= v <= MAX_HEAD_DIM]
    if bad:
        raise ValueError(
            f"must be from {MIN_HEAD_DIM} to {MAX_HEAD_DIM} (80, 96, 192 are fine: the kernel pads "
            f"them to a power of two), got {bad}"
        )
    return values


WARPS = (1, 2, 4, 8, 16, 32)  # warps per block a Triton kernel launches with
MAX_STAGES = 8  # software-pipelining depth; deeper never fits shared memory at useful tiles


def _warps(values: list[int]) -> list[int]:
    bad = [v for v in values if v not in WARPS]
    if bad:
        raise ValueError(f"must each be one of {', '.join(map(str, WARPS))} (warps per block), got {bad}")
    return values


def _stages(values: list[int]) -> list[int]:
    bad = [v for v in values if not 1 <= v <= MAX_STAGES]
    if bad:
        raise ValueError(f"must each be 1..{MAX_STAGES} (pipeline stages), got {bad}")
    return values


def _positive(values: list[int]) -> list[int]:
    bad = [v for v in values if v < 1]
    if bad:
        raise ValueError(f"must be positive integers, got {bad}")
    return values


def _unique(values: list[Any]) -> list[Any]:
    dupes = sorted({repr(v) for v in values if values.count(v) > 1})
    if dupes:
        raise ValueError(f"lists each value once; repeated: {', '.join(dupes)}")
    return values


NonEmpty = Field(min_length=1)
Pow2List = Annotated[list[int], NonEmpty, AfterValidator(_power_of_two), AfterValidator(_unique)]
PosList = Annotated[list[int], NonEmpty, AfterValidator(_positive), AfterValidator(_unique)]
HeadDimList = Annotated[list[int], NonEmpty, AfterValidator(_head_dims), AfterValidator(_unique)]
WarpsList = Annotated[list[int], NonEmpty, AfterValidator(_warps), AfterValidator(_unique)]
StagesList = Annotated[list[int], NonEmpty, AfterValidator(_stages), AfterValidator(_unique)]
PositiveInt = Annotated[int, Field(ge=1)]


class _Model(BaseModel):
    # strict: numbers must be numbers and flags booleans ("repeats": "2" or true is refused,
    # not read as 2 or 1); a float field still takes an integer
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True)


class ForwardBlocks(_Model):
    """Forward tiles used by fwd_bwd configs (the reference's ``bwd_fwd_config``)."""

    block_q: Annotated[int, AfterValidator(lambda v: _power_of_two([v])[0])] = 128
    block_k: Annotated[int, AfterValidator(lambda v: _power_of_two([v])[0])] = 128


EXECUTOR_KINDS = ("local", "slurm", "debug")


class ExecutorSettings(_Model):
    """Where units run. Keys other than ``kind`` and tilesweep's own are submitit's
    AutoExecutor parameter names, passed through unchanged."""

    kind: Literal["local", "slurm", "debug"] = "local"
    # submitit / sbatch parameters
    slurm_partition: str | None = None
    gpus_per_node: int | None = Field(default=None, ge=0)
    cpus_per_task: int | None = Field(default=None, ge=1)
    mem_gb: float | None = Field(default=None, gt=0)
    timeout_min: int = Field(default=60, ge=1)
    slurm_account: str | None = None
    slurm_qos: str | None = None
    slurm_constraint: str | None = None
    slurm_exclude: str | None = None
    slurm_array_parallelism: int | None = Field(default=None, ge=1)
    slurm_setup: list[str] = Field(default_factory=list)
    slurm_additional_parameters: dict[str, Any] = Field(default_factory=dict)
    slurm_signal_delay_s: int | None = Field(default=None, ge=0)
    slurm_job_name: str | None = None
    # tilesweep's own
    local_workers: int | None = Field(
        default=None, ge=1, description="local: parallel workers (default: one per visible GPU, one without GPU)"
    )
    max_requeues: int = Field(default=3, ge=0, description="times a preempted or timed-out task is requeued")
    max_config_attempts: int = Field(
        default=2, ge=1, description="a config that kills its worker this often is recorded as an error"
    )
    max_array_size: int | None = Field(
        default=None,
        ge=1,
        description="slurm: most tasks per job array; default: the cluster's MaxArraySize (scontrol show config)",
    )
    merge_job: bool = Field(
        default=True, description="slurm: submit a dependent job (afterany) that merges the results once the arrays end"
    )
    merge_partition: str | None = Field(
        default=None, description="slurm: partition of the merge job (it needs no GPU); default: slurm_partition"
    )
    sbatch_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="slurm: give up on an sbatch that has not "
        "answered after this long (it retries for minutes when the job table is full)",
    )

    def units_per_task(self) -> int:
        """How many units one SLURM task runs at once: one per GPU it is given (one without
        GPUs). The local executors run one unit per process."""
        if self.kind != "slurm":
            return 1
        return max(1, self.gpus_per_node or 0)

    def fill_tasks(self, n_units: int) -> int:
        """``n_units`` rounded up to whole tasks, so no GPU of a task is left without a unit."""
        k = self.units_per_task()
        return k * -(-n_units // k)


class ShardingSettings(_Model):
    """How items are grouped into units (one unit = one job array task)."""

    units: int | None = Field(default=None, ge=1, description="number of units; default: one per shape, at most 4")
    strategy: Literal["shape", "balanced"] = Field(
        default="shape",
        description="shape: keep a shape's items in one unit unless it exceeds half a unit's share of the cost; "
        "balanced: deal every shape out in pieces of at most a tenth of a unit (sturdier against cost-model "
        "errors, about twice the per-shape setups)",
    )


class TimingSettings(_Model):
    """How each config is timed (README: Measuring; the rules: ``kernels.timing``, ``jobs``)."""

    target_ms: float = Field(default=50.0, gt=0, description="wall time one timed sample aims for")
    max_inner: int = Field(default=200, ge=1, description="cap on calls per timed sample")
    warmup: int = Field(default=1, ge=0, description="untimed calls before the probe")
    seed: int = 0
    strategy: Literal["full", "halving"] = Field(
        default="full",
        description="full: every config gets repeats x target_ms; halving: every config of a problem gets one "
        "screening sample of screen_ms, then only those that can still win are timed in full (a second round)",
    )
    screen_ms: float | None = Field(
        default=None,
        gt=0,
        description="halving: length of the one screening sample (default: target_ms / 10); must be below target_ms",
    )
    keep: int = Field(default=4, ge=1, description="halving: at least this many configs per problem are timed in full")
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
    flush_l2: Literal["auto", True, False] = Field(
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


class KernelSettings(_Model):
    interpret: Literal["auto", True, False] = "auto"
    prune_smem: Literal["predict", "off"] = "predict"
    impl: Literal[(*IMPL_NAMES, REPLAY)] = Field(  # type: ignore[valid-type]
        default=DEFAULT_IMPL,
        description="kernel implementation to tune: tilesweep (ours) or jax (jax's stock Pallas mha, "
        "jax.experimental.pallas.ops.gpu.attention; no grouped-query attention, its backward runs 2 stages); "
        "replay: compile and run nothing, replay the records of replay.source (samples drawn from each record's "
        "spread, times on a virtual clock)",
    )


# Measurement options added after the first sweeps were planned: a spec that leaves them at their
# defaults keeps the fingerprint it had before they existed, so those sweeps resume unchanged.
_ADDED_FIELDS: dict[str, tuple[type[_Model], tuple[str, ...]]] = {
    "timing": (TimingSettings, ("strategy", "screen_ms", "keep", "noise", "timer", "flush_l2"))
}


class ReplaySettings(_Model):
    """Where a replayed sweep takes its measurements from (``kernel.impl: replay``), and at what pace."""

    source: str = Field(
        description="a results document (tilesweep's or the reference run's) that measured this "
        "spec's problems; a relative path is taken from the working directory"
    )
    impl: Literal[IMPL_NAMES] = Field(  # type: ignore[valid-type]
        default=DEFAULT_IMPL, description="the kernel implementation the source measured: its configs are planned"
    )
    pace: Literal["instant", "real"] = Field(default="instant", description="real: wait out each record's seconds")


class CompileSettings(_Model):
    mode: Literal["threads", "processes"] = Field(
        default="threads",
        description="threads: compile on a thread "
        "pool of the worker (lowering holds the GIL); processes: compile "
        "processes lower and compile, the worker times (README: Compile modes)",
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        description="compile threads or processes per worker, at most "
        "its CPUs (a whole-node task's share); default: those CPUs",
    )
    cache_dir: str | None = Field(
        default=None,
        description="persistent compilation cache shared by the sweep's units; default: SWEEP_DIR/compile-cache; "
        "a relative path is taken relative to the sweep directory; 'off' disables",
    )


class MergeSettings(_Model):
    lock: Literal["hard", "soft"] = Field(
        default="hard", description="soft: a lock file that works where flock does not (NFS, Lustre)"
    )
    lock_timeout_s: float = Field(default=600.0, gt=0)
    mix_devices: bool = Field(
        default=False, description="append into a document of another device; records then carry their device"
    )


class ReportSettings(_Model):
    """What a finished sweep leaves beside its results document."""

    html: bool = Field(
        default=False,
        description="write the report page (the results document's path with "
        "the suffix .html) when run or wait ends, and in the SLURM final-merge job",
    )


class ReuseSettings(_Model):
    """Earlier documents whose compatible records are carried, not measured (``store.reuse``)."""

    documents: list[str] = Field(
        default_factory=list,
        description="results documents reused besides the output "
        "document (a relative path is taken from the working directory)",
    )
    errors: bool = Field(default=False, description="reuse error records too (default: measured again)")


class SweepSpec(_Model):
    """A sweep: the reference config block plus tilesweep's sections."""

    output: str = "attention_tiles.json"
    append: bool = False
    dtypes: Annotated[list[Literal[DTYPES]], NonEmpty, AfterValidator(_unique)] = ["bfloat16", "float32"]  # type: ignore[valid-type]
    head_dims: HeadDimList = [64, 128]
    seq_lens: PosList = [2048, 8192]
    modes: Annotated[list[Literal[MODES]], NonEmpty, AfterValidator(_unique)] = ["fwd", "fwd_bwd"]  # type: ignore[valid-type]
    batch: PositiveInt = 4
    heads: PositiveInt = 8
    causal: Annotated[list[StrictBool], NonEmpty, AfterValidator(_unique)] = Field(
        default=[False], description="causal masking to tune: [false] (the reference), [true], or both"
    )
    kv_heads: Annotated[list[StrictInt | None], NonEmpty] = Field(
        default=[None],
        description="key/value heads (grouped-query attention); each divides heads; "
        "null = heads (multi-head), 1 = multi-query",
    )
    repeats: PositiveInt = 5
    auto_only: bool = False
    tag: str = ""
    fwd_block_q: Pow2List = [32, 64, 128]
    fwd_block_k: Pow2List = [32, 64, 128]
    fwd_stages: StagesList = [1, 2, 3]
    fwd_warps: WarpsList = [4, 8]
    bwd_outer: Pow2List = [32, 64, 128]
    bwd_inner: Pow2List = [16, 32, 64, 128]
    bwd_stages: StagesList = [1, 2]
    bwd_warps: WarpsList = [4, 8]
    bwd_fwd_config: ForwardBlocks | None = None
    smem_limit_bytes: int | None = Field(default=232448, ge=1)

    executor: ExecutorSettings = ExecutorSettings()
    sharding: ShardingSettings = ShardingSettings()
    timing: TimingSettings = TimingSettings()
    kernel: KernelSettings = KernelSettings()
    compile: CompileSettings = CompileSettings()
    merge: MergeSettings = MergeSettings()
    report: ReportSettings = ReportSettings()
    replay: ReplaySettings | None = None
    reuse: ReuseSettings = ReuseSettings()

    @model_validator(mode="before")
    @classmethod
    def _accept_pair_for_bwd_fwd_config(cls, data: Any) -> Any:
        # ``bwd_fwd_config`` may also be written as [block_q, block_k].
        if isinstance(data, dict) and isinstance(data.get("bwd_fwd_config"), (list, tuple)):
            pair = data["bwd_fwd_config"]
            if len(pair) != 2:
                raise ValueError("bwd_fwd_config as a list must be [block_q, block_k]")
            data = {**data, "bwd_fwd_config": {"block_q": pair[0], "block_k": pair[1]}}
        return data

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, values: list[int | None], info: ValidationInfo) -> list[int | None]:
        heads = info.data.get("heads")
        if heads is None:  # heads itself is invalid; that error is reported
            return values
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        bad = [v for v in values if v is not None and v not in divisors]
        if bad:
            raise ValueError(
                f"each value must divide heads={heads} ({', '.join(map(str, divisors))}; "
                f"1 is multi-query, null or {heads} multi-head), got {bad}"
            )
        same = [v for v in values if v in (None, heads)]
        if len(same) > 1 or len(set(values)) < len(values):
            raise ValueError(f"lists each value once (null and {heads} are both multi-head), got {json.dumps(values)}")
        return values

    @property
    def sweeps_causal(self) -> bool:
        """Whether records carry ``causal`` (the spec sweeps a non-default value of it)."""
        return self.causal != [False]

    @property
    def sweeps_kv_heads(self) -> bool:
        """Whether records carry ``kv_heads`` (the spec sweeps grouped-query attention)."""
        return any(v not in (None, self.heads) for v in self.kv_heads)

    @property
    def measured_impl(self) -> str:
        """The kernel implementation whose configs are planned and recorded: ``kernel.impl``,
        or for a replay the one its source measured (``replay.impl``)."""
        if self.kernel.impl == REPLAY:
            return self.replay.impl if self.replay is not None else DEFAULT_IMPL
        return str(self.kernel.impl)

    @model_validator(mode="after")
    def _replay_needs_a_source(self) -> SweepSpec:
        if self.kernel.impl == REPLAY and self.replay is None:
            raise ValueError(
                'kernel.impl is "replay" but no replay source is given: add "replay": {"source": "R.json"}'
            )
        if self.replay is not None and self.kernel.impl != REPLAY:
            raise ValueError(f'replay.source is given but kernel.impl is {self.kernel.impl!r}: set it to "replay"')
        return self

    @property
    def forward_blocks(self) -> ForwardBlocks:
        """Forward tiles of fwd_bwd configs: null in the reference means 128/128."""
        return self.bwd_fwd_config or ForwardBlocks()

    def timer_on(self, backend: str) -> str:
        """The timer of this sweep's records on ``backend``: ``timing.timer``, where auto the device timer with
        compile processes on a GPU (other workers' compiles load the CPUs the wall clock sees; README: Compile
        modes), else the wall clock as before processes existed."""
        if self.timing.timer != "auto":
            return self.timing.timer
        return "device" if self.compile.mode == "processes" and backend == "gpu" else "wall"

    def reference_config(self) -> dict[str, Any]:
        """The config block as the reference document has it (field order included). A spec that sweeps causal or
        kv_heads, or tunes another kernel, adds those fields (after ``heads``; ``kernel`` last), so a document loaded
        as a spec plans the same sweep."""
        dumped = self.model_dump(mode="json")
        out = {}
        for name in REFERENCE_CONFIG_FIELDS:
            out[name] = dumped[name]
            if name == "heads":
                out.update(self._axes(dumped))
        if self.measured_impl != DEFAULT_IMPL:  # a replay's document is one of the implementation it replays
            out["kernel"] = {**dumped["kernel"], "impl": self.measured_impl}
        return out

    def _axes(self, dumped: dict[str, Any]) -> dict[str, Any]:
        """The grouped-query and causal axes where they are not the default."""
        swept = (("causal", self.sweeps_causal), ("kv_heads", self.sweeps_kv_heads))
        return {k: dumped[k] for k, on in swept if on}

    def fingerprint(self) -> str:
        """Identity of what is measured: the problem and grid fields plus timing and kernel options. Executor,
        sharding, output and merge settings may change between submit and resume without invalidating records, so
        they are left out. The causal and kv_heads axes and the kernel implementation count only where they are not
        the default, so a spec written before they existed keeps its fingerprint."""
        dumped = self.model_dump(mode="json")
        measured = {k: dumped[k] for k in REFERENCE_CONFIG_FIELDS if k not in ("output", "append")}
        measured.update(self._axes(dumped))
        for section, (model, added) in _ADDED_FIELDS.items():
            measured[section] = {
                k: v for k, v in dumped[section].items() if k not in added or v != model.model_fields[k].default
            }
        measured["kernel"] = {k: v for k, v in dumped["kernel"].items() if k != "impl" or v != DEFAULT_IMPL}
        if self.replay is not None:  # the pace changes no record
            measured["replay"] = {k: v for k, v in dumped["replay"].items() if (k, v) != ("impl", DEFAULT_IMPL)}
            measured["replay"].pop("pace")
        return canonical_hash(measured)


def canonical_hash(obj: Any, length: int = 16) -> str:  # of the canonical JSON: sorted keys, no spaces, ASCII
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    ).hexdigest()[:length]
