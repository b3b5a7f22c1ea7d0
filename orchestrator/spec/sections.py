"""The spec's sections: where units run, how items are grouped and timed, which kernel, how
compiled, merged, reported, replayed and reused (``orchestrator.spec.model.SweepSpec`` holds
one of each, all with defaults, so the reference's config block is a complete spec).

Every model forbids unknown keys: a typo is an error naming the field and the allowed ones,
never silently dropped. Every field carries a description: ``docs/spec.md`` is generated from
them (``scripts/spec_reference.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kernels import devices
from kernels.impls import DEFAULT_IMPL, SPEC_IMPL_NAMES
from orchestrator.spec.lists import Pow2

REPLAY = "replay"  # kernel.impl of a sweep that replays a results document (jobs/replay.py)
EXECUTOR_KINDS = ("local", "slurm", "debug")
# Units a whole-node task holds per GPU by default: enough that its GPUs end within about a
# quarter of a unit of each other, few enough that each unit's own set-up (its lease, partial and
# marker, its measurer, compiles its siblings in other units could have shared; each GPU's worker
# runs its units one after another, so no process starts per unit) stays small beside its configs.
UNITS_PER_GPU = 4
SUBMITIT_SIGNAL_DELAY_S = 90  # submitit's default --signal=USR2@90
# SLURM sends the time-limit warning on its controller's 30 s tick once the time left is at most
# the delay plus that tick (docs/slurm-notes.md, timeouts)
SLURM_TICK_S = 30


class SpecModel(BaseModel):
    """Base of the spec and its sections: unknown keys refused, frozen, defaults validated."""

    # strict: numbers must be numbers and flags booleans ("repeats": "2" or true is refused,
    # not read as 2 or 1); a float field still takes an integer, but neither inf nor nan
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False)


class ForwardBlocks(SpecModel):
    """Forward tiles used by fwd_bwd configs (the reference's ``bwd_fwd_config``)."""

    block_q: Pow2 = Field(default=128, description="query rows per forward tile (a power of two)")
    block_k: Pow2 = Field(default=128, description="key/value rows per forward tile (a power of two)")


# sbatch options (as slurm_additional_parameters names them) -> the executor setting that sets each
_OWN_OPTIONS = {"time": "timeout_min", "signal": "slurm_signal_delay_s"}


class ExecutorSettings(SpecModel):
    """Where units run. Keys other than ``kind`` and tilesweep's own are submitit's
    AutoExecutor parameter names, passed through unchanged."""

    kind: Literal["local", "slurm", "debug"] = Field(
        default="local",
        description="local: worker processes on this machine; slurm: job arrays on a SLURM cluster; "
        "debug: every unit in this process, one after another",
    )
    # submitit / sbatch parameters
    slurm_partition: str | None = Field(
        default=None, description="slurm: partition of the units' arrays (sbatch --partition)"
    )
    gpus_per_node: int | None = Field(
        default=None,
        ge=0,
        description="slurm: GPUs of each array task; with G > 1 a task holds 4 x G units by default and runs G "
        "at once, one per GPU, each GPU taking the task's next unit when its unit ends (sbatch --gpus-per-node)",
    )
    cpus_per_task: int | None = Field(
        default=None,
        ge=1,
        description="slurm: CPUs of each array task, split evenly among its units' compiles (sbatch --cpus-per-task)",
    )
    mem_gb: float | None = Field(
        default=None, gt=0, description="slurm: memory of each array task in GB (sbatch --mem)"
    )
    timeout_min: int = Field(
        default=60,
        ge=1,
        description="time limit of each task in minutes (sbatch --time); on SLURM a unit not done by then is "
        "requeued (executor.max_requeues) and goes on where it stopped",
    )
    slurm_account: str | None = Field(default=None, description="slurm: account charged (sbatch --account)")
    slurm_qos: str | None = Field(default=None, description="slurm: quality of service (sbatch --qos)")
    slurm_constraint: str | None = Field(
        default=None, description="slurm: node features required, e.g. a GPU model (sbatch --constraint)"
    )
    slurm_exclude: str | None = Field(default=None, description="slurm: nodes never used (sbatch --exclude)")
    slurm_array_parallelism: int | None = Field(
        default=None,
        ge=1,
        description="slurm: most tasks of an array running at once (sbatch --array=...%N); default: submitit's 256",
    )
    slurm_setup: list[str] = Field(
        default_factory=list,
        json_schema_extra={"default": []},  # the schema says what the factory makes
        description="slurm: shell lines run in each job script before the task starts (module loads, exports)",
    )
    slurm_additional_parameters: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra={"default": {}},
        description="slurm: further sbatch options, name (without the dashes, underscores for hyphens) to value; "
        "not time or signal (timeout_min and slurm_signal_delay_s set those)",
    )
    slurm_signal_delay_s: int | None = Field(
        default=None,
        ge=0,
        le=65_535,
        description="slurm: seconds before the time limit at which a task is warned (USR2), finishes the config "
        "being timed and is requeued; default: submitit's 90",
    )
    slurm_job_name: str | None = Field(
        default=None, description="slurm: job name of the arrays; default: tilesweep-SWEEP (the sweep's directory name)"
    )
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
    lower_partition: str | None = Field(
        default=None,
        description="slurm: partition of pre-flight lowering's CPU job array (`plan --lower --sweep-dir`: the "
        "configs lowered on the cluster's CPUs, cpus_per_task each task); default: lowered on this machine's CPUs",
    )
    sbatch_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="slurm: give up on an sbatch that has not "
        "answered after this long (it retries for minutes when the job table is full)",
    )

    @field_validator("slurm_additional_parameters")
    @classmethod
    def _no_setting_of_its_own(cls, value: dict[str, Any]) -> dict[str, Any]:
        """An sbatch option the executor has a checked setting of its own for is refused here:
        given this way it passed no check and silently overrode that setting."""
        for name, field in _OWN_OPTIONS.items():
            if name in value:
                raise ValueError(
                    f"slurm_additional_parameters.{name} sets what executor.{field} sets (checked, and used by the "
                    f"task's time-limit warning); set {field} instead"
                )
        return value

    @model_validator(mode="after")
    def _warning_after_the_start(self) -> ExecutorSettings:
        delay = self.signal_delay_s()
        if self.kind == "slurm" and delay + SLURM_TICK_S >= 60 * self.timeout_min:
            given = "" if self.slurm_signal_delay_s is not None else " (submitit's default)"
            raise ValueError(
                f"slurm_signal_delay_s={delay}{given} leaves a task no time before its warning: SLURM warns it once "
                f"{delay + SLURM_TICK_S} s or less of its limit are left (the delay and SLURM's {SLURM_TICK_S} s "
                f"tick), and timeout_min={self.timeout_min} gives it {60 * self.timeout_min} s, so every task would "
                f"be warned and requeued as it starts; raise timeout_min (3 or more, with a delay of 20-30) or set "
                f"slurm_signal_delay_s below {60 * self.timeout_min - SLURM_TICK_S} (0: no warning)"
            )
        return self

    def signal_delay_s(self) -> int:
        """Seconds before the time limit at which SLURM is asked to warn a task."""
        return SUBMITIT_SIGNAL_DELAY_S if self.slurm_signal_delay_s is None else self.slurm_signal_delay_s

    def gpus_per_task(self) -> int:
        """How many units one SLURM task runs at once: one per GPU it is given (one without
        GPUs). The local executors run one unit per process."""
        if self.kind != "slurm":
            return 1
        return max(1, self.gpus_per_node or 0)

    def units_per_task(self) -> int:
        """How many units one SLURM task holds: ``UNITS_PER_GPU`` per GPU of a whole-node task,
        which its GPUs take in turn (a GPU whose unit ends takes the task's next one), so a unit
        that runs long leaves the others' GPUs idle for a fraction of a unit, not for its rest;
        one for a task of one GPU, where there is nothing to balance."""
        gpus = self.gpus_per_task()
        return gpus if gpus == 1 else UNITS_PER_GPU * gpus

    def fill_tasks(self, n_units: int) -> int:
        """``n_units`` rounded up to whole tasks, so every task has its full share of units."""
        k = self.units_per_task()
        return k * -(-n_units // k)


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


class KernelSettings(SpecModel):
    """Which kernel is tuned and how it runs."""

    interpret: Literal["auto", True, False] = Field(
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
        + ", ".join(repr(k) for k in devices.KINDS)
        + "): pre-flight lowering (`tilesweep plan --lower`) lowers for it and holds each kernel to its shared "
        f"memory; null: {devices.DEFAULT_DEVICE_KIND!r}",
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
