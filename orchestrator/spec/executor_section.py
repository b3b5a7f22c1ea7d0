"""The spec's ``executor`` section: where units run (here, or as SLURM job arrays), and the
sbatch settings of their tasks, checked against what SLURM does with them (its time-limit
warning's tick, the options tilesweep sets itself)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from orchestrator.spec.sections import SpecModel

EXECUTOR_KINDS = ("local", "slurm", "debug")
# Units a whole-node task holds per GPU by default: enough that its GPUs end within about a
# quarter of a unit of each other, few enough that each unit's own set-up (its lease, partial and
# marker, its measurer, compiles its siblings in other units could have shared; each GPU's worker
# runs its units one after another, so no process starts per unit) stays small beside its configs.
UNITS_PER_GPU = 4
# How much a whole-node task's units shrink towards its end (``ExecutorSettings.unit_shares``):
# its last unit on each GPU gets 0.3 of a unit's mean share, its first 1.7. With units whose
# times miss the plan by 15-30 % (the cost model's error, a shape kept whole), a model of 4 GPUs
# taking 16 units in turn (tests/test_taper.py) leaves about 60 % less idle GPU time at the task's
# end than equal units.
TAPER = 0.7
SUBMITIT_SIGNAL_DELAY_S = 90  # submitit's default --signal=USR2@90
# SLURM sends the time-limit warning on its controller's 30 s tick once the time left is at most
# the delay plus that tick (docs/slurm-notes.md, timeouts)
SLURM_TICK_S = 30


# the validation context's key for a spec a sweep directory froze (``spec.files.spec_from_data``)
FROZEN = "frozen"

# sbatch options (as slurm_additional_parameters names them, "-" read as "_") -> the executor setting that
# sets each, and what tilesweep does with that setting, which the option given this way would bypass
_NODES = "checked against the partition's nodes before sbatch"
_CHARGED = "the final merge job is submitted with it too"
_OWN_OPTIONS = {
    "time": ("timeout_min", "checked, and used by the task's time-limit warning"),
    "signal": ("slurm_signal_delay_s", "checked, and used by the task's time-limit warning"),
    "partition": ("slurm_partition", "checked before sbatch: it exists, allows timeout_min, has nodes a task fits"),
    "gpus_per_node": ("gpus_per_node", f"the GPUs a task's units are planned for, one unit per GPU at once; {_NODES}"),
    "gpus": ("gpus_per_node", f"the GPUs a task's units are planned for, one unit per GPU at once; {_NODES}"),
    "gpus_per_task": ("gpus_per_node", f"the GPUs a task's units are planned for, one unit per GPU at once; {_NODES}"),
    "cpus_per_task": ("cpus_per_task", f"split among a task's compiles; {_NODES}"),
    "mem": ("mem_gb", _NODES),
    "constraint": ("slurm_constraint", _NODES),
    "exclude": ("slurm_exclude", _NODES),
    "account": ("slurm_account", _CHARGED),
    "qos": ("slurm_qos", _CHARGED),
    "array": ("slurm_array_parallelism", "the arrays' tasks are the units'; it sets how many run at once"),
}

# sbatch options of slurm_additional_parameters ("-" read as "_") the final merge job (one CPU, no GPU, one
# job) is not submitted with: those that shape the units' tasks (their GPUs, their nodes, CPUs and memory,
# their array; any option whose name starts with "gpu" too), and hold, as its dependency keeps it queued
# until the arrays end, released or cancelled, and a held one would stay queued after them. It takes
# every other one (a reservation, licenses, a wckey, mail options), as a site asks of every job.
UNITS_ONLY_OPTIONS = frozenset(
    {
        "array",
        "hold",
        "gres",
        "gres_flags",
        "cpus_per_gpu",
        "mem_per_gpu",
        "mem_per_cpu",
        "mem_bind",
        "tres_per_task",
        "tres_bind",
        "nodes",
        "nodelist",
        "ntasks",
        "ntasks_per_node",
        "ntasks_per_core",
        "ntasks_per_socket",
        "ntasks_per_gpu",
        "exclusive",
        "tmp",
        "sockets_per_node",
        "cores_per_socket",
        "threads_per_core",
        "extra_node_info",
        "distribution",
        "hint",
        "core_spec",
        "thread_spec",
        "switches",
    }
)


class ExecutorSettings(SpecModel):
    """Where units run. Keys other than ``kind`` and tilesweep's own are submitit's
    AutoExecutor parameter names, passed through unchanged; any other sbatch option goes in
    ``slurm_additional_parameters`` (an unknown key is refused, naming the allowed ones)."""

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
        "at once, one per GPU, each GPU taking the task's next unit when its unit ends (sbatch --gpus-per-node); "
        "null or 0: no GPU, refused for a sweep that measures kernels unless kernel.interpret is true",
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
        f"not one an executor setting sets ({', '.join(_OWN_OPTIONS)}): set that setting. The final merge job "
        "is submitted with each of them too (a reservation, licenses, a wckey) except hold (it waits for the "
        "arrays by its dependency) and those that shape the units' tasks: GPUs (gres, any gpu... option, "
        "cpus_per_gpu, mem_per_gpu), nodes, tasks, CPUs and memory per task (nodes, nodelist, ntasks..., "
        "exclusive, mem_per_cpu, tmp, ...)",
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
        default=None,
        ge=1,
        description="local: parallel workers (default: one per visible GPU, one without GPU; "
        "several without a GPU time interpret mode side by side on the CPUs they share, disturbing each other's "
        "timings)",
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
    def _no_setting_of_its_own(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """An sbatch option the executor has a setting of its own for is refused here: given this
        way it passed that setting's checks, silently overrode it in the sbatch script, and left
        what tilesweep plans by that setting (a task's GPUs, the final merge job) to disagree. A
        sweep's frozen spec (``FROZEN``) is taken as it was submitted (`resume --spec` changes it)."""
        if info.context and info.context.get(FROZEN):
            return value
        for key in value:
            own = _OWN_OPTIONS.get(key.replace("-", "_"))
            if own is not None:
                field, why = own
                raise ValueError(
                    f"slurm_additional_parameters.{key} sets what executor.{field} sets ({why}); set {field} instead"
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

    def merge_job_options(self) -> dict[str, Any]:
        """The ``slurm_additional_parameters`` the final merge job is submitted with: all but those
        that shape the units' tasks and hold (``UNITS_ONLY_OPTIONS``, GPU options), so a site's
        reservation, licenses or wckey reach the merge job as they reach the arrays, and it still asks
        for one CPU and waits for the arrays by its dependency alone."""
        return {
            key: value
            for key, value in self.slurm_additional_parameters.items()
            if not _units_only(key.replace("-", "_"))
        }

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

    def unit_shares(self) -> tuple[float, ...] | None:
        """A whole-node task's units as shares of its work, largest first (mean 1; None for a
        task of one GPU): the units its GPUs take last are its smallest, so the GPUs end close
        together even where units run longer or shorter than planned. Slot j (0 first) of a GPU's
        ``UNITS_PER_GPU`` gets 1 + ``TAPER`` * (m - 1 - 2j) / (m - 1): 1.7, 1.23, 0.77 and 0.3."""
        gpus = self.gpus_per_task()
        if gpus == 1:
            return None
        m = UNITS_PER_GPU
        return tuple(1 + TAPER * (m - 1 - 2 * j) / (m - 1) for j in range(m) for _ in range(gpus))

    def fill_tasks(self, n_units: int) -> int:
        """``n_units`` rounded up to whole tasks, so every task has its full share of units."""
        k = self.units_per_task()
        return k * -(-n_units // k)


def _units_only(option: str) -> bool:
    """Whether an sbatch option (underscores for hyphens) is the units' tasks' only (``UNITS_ONLY_OPTIONS``)."""
    return option in UNITS_ONLY_OPTIONS or option.startswith("gpu")
