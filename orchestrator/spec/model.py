"""What a sweep spec is: the reference config block plus tilesweep's sections (the record layout is
``orchestrator.spec.records``; the sections ``orchestrator.spec.sections``; the value rules of its
lists ``orchestrator.spec.lists``; its identity, the fingerprint, ``orchestrator.spec.identity``).

The reference run's config block loads unchanged: every one of its fields keeps its name
and meaning here. What the reference lacked (executor, sharding, timing, kernel, merge
options) lives in added sections that all have defaults, so an old config block is a
complete spec. Every model forbids unknown keys: a typo is an error naming the field and
the allowed ones, never silently dropped.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator, model_validator
from pydantic.fields import PrivateAttr

from kernels import impls
from kernels.impls import DEFAULT_IMPL
from kernels.smem import DTYPES, MODES, element_bytes
from kernels.spelling import as_json
from orchestrator.spec import grid as grid_rules
from orchestrator.spec.executor_section import ExecutorSettings
from orchestrator.spec.identity import REFERENCE_CONFIG_FIELDS, axes, canonical_hash, fingerprinted
from orchestrator.spec.lists import (
    HeadDimList,
    NonEmpty,
    PositiveInt,
    PosList,
    StagesList,
    TileList,
    Unique,
    WarpsList,
)
from orchestrator.spec.search_section import SearchSettings
from orchestrator.spec.sections import (
    REPLAY,
    CheckSettings,
    CompileSettings,
    ForwardBlocks,
    KernelSettings,
    MergeSettings,
    ReplaySettings,
    ReportSettings,
    ReuseSettings,
    ShardingSettings,
    SpecModel,
    TimingSettings,
)

# more memory than any one GPU has (H200: 141 GB, B200: 180 GB): a problem whose tensors alone
# need more can run on none
GPU_MEMORY_BOUND_BYTES = 256 * 10**9

# heads up to which a refusal of kv_heads lists every divisor (a real model has a few dozen heads;
# a mistyped huge count gets the rule without a list that would take long to find and to read)
_DIVISORS_LISTED_UP_TO = 1024


def _divisors_said(heads: int) -> str:
    """The divisors of ``heads`` as a kv_heads refusal lists them ("1, 2, 4, 8; "), or nothing
    past ``_DIVISORS_LISTED_UP_TO``."""
    if heads > _DIVISORS_LISTED_UP_TO:
        return ""
    return ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0) + "; "


class SweepSpec(SpecModel):
    """A sweep: the reference config block plus tilesweep's sections."""

    # where it was read from, for a refusal to name (``spec.files`` sets them): the file, and the
    # fields a command-line option set over the file's (dotted name: the option, ``--device-kind``)
    _source: str | None = PrivateAttr(default=None)
    _options: dict[str, str] = PrivateAttr(default_factory=dict)
    # the fingerprint of the sweep directory it was loaded from (``keep_fingerprint``): (this rule's
    # hash of it when loaded, the fingerprint that sweep was planned with)
    _planned_as: tuple[str, str] | None = PrivateAttr(default=None)

    output: str = Field(
        default="attention_tiles.json",
        description="the results document the sweep writes (a relative path is taken from the working directory)",
    )
    append: bool = Field(
        default=False,
        description="merge into an existing results document that holds records of other sweeps, the newest "
        "record of an identity winning, a measured one over a replayed one (without it such a document is "
        "refused; the document before is kept as OUTPUT.prev where records of other sweeps are replaced)",
    )
    dtypes: Annotated[list[Literal[DTYPES]], NonEmpty, Unique] = Field(  # type: ignore[valid-type]
        default=["bfloat16", "float32"], description="input dtypes of the problems"
    )
    head_dims: HeadDimList = Field(
        default=[64, 128],
        description="head dimensions of the problems; one that is not a power of two is padded to the next one "
        "inside the kernel",
    )
    seq_lens: PosList = Field(default=[2048, 8192], description="sequence lengths of the problems (queries and keys)")
    modes: Annotated[list[Literal[MODES]], NonEmpty, Unique] = Field(  # type: ignore[valid-type]
        default=["fwd", "fwd_bwd"],
        description="fwd: the forward pass alone; fwd_bwd: forward and backward (the gradients of q, k and v)",
    )
    batch: PositiveInt = Field(default=4, description="batch size of every problem")
    heads: PositiveInt = Field(default=8, description="query heads of every problem")
    causal: Annotated[list[StrictBool], NonEmpty, Unique] = Field(
        default=[False], description="causal masking to tune: [false] (the reference), [true], or both"
    )
    kv_heads: Annotated[list[StrictInt | None], NonEmpty] = Field(
        default=[None],
        description="key/value heads (grouped-query attention); each divides heads; "
        "null = heads (multi-head), 1 = multi-query",
    )
    repeats: PositiveInt = Field(
        default=5, le=10_000, description="timed samples per config (each of about timing.target_ms)"
    )
    auto_only: bool = Field(
        default=False,
        description="time only each problem's auto config (the kernel's own pick), no forced grid; timing.strategy "
        "halving or search then has none to choose from and runs as full does (plan notes it)",
    )
    tag: str = Field(default="", description="a label copied into every record (part of its id)")
    fwd_block_q: TileList = Field(default=[32, 64, 128], description="fwd grid: query rows per tile (block_q)")
    fwd_block_k: TileList = Field(default=[32, 64, 128], description="fwd grid: key/value rows per tile (block_k)")
    fwd_stages: StagesList = Field(default=[1, 2, 3], description="fwd grid: software-pipelining stages (num_stages)")
    fwd_warps: WarpsList = Field(default=[4, 8], description="fwd grid: warps per block (num_warps)")
    bwd_outer: TileList = Field(
        default=[32, 64, 128],
        description="fwd_bwd grid: the outer tile of both backward scans (block_kv_dkv = block_q_dq)",
    )
    bwd_inner: TileList = Field(
        default=[16, 32, 64, 128],
        description="fwd_bwd grid: the inner tile of both backward scans (block_q_dkv = block_kv_dq)",
    )
    bwd_stages: StagesList = Field(
        default=[1, 2], description="fwd_bwd grid: software-pipelining stages of the backward (num_stages)"
    )
    bwd_warps: WarpsList = Field(default=[4, 8], description="fwd_bwd grid: warps per block (num_warps)")
    bwd_fwd_config: ForwardBlocks | None = Field(
        default=None,
        description="forward tiles of fwd_bwd configs, {block_q, block_k} or [block_q, block_k]; null: 128/128",
    )
    smem_limit_bytes: int | None = Field(
        default=232448,
        ge=1,
        description="shared memory per block of the target GPU (232448 on H100/H200); a config the model "
        "predicts over it is not compiled (kernel.prune_smem); null: no limit",
    )

    grid: dict[Literal[MODES], dict[str, list[StrictInt | StrictBool | StrictStr]]] | Literal["tokamax"] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="per mode, the values each tunable of kernel.impl sweeps, named as the implementation names "
        'them (`tilesweep impls`), e.g. {"fwd": {"block_q": [64, 128], "block_kv": [64, 128, 256]}}; a tunable '
        "left out sweeps the reference field's values (the Triton kernels) or the implementation's defaults; "
        '"tokamax" (kernel.impl tokamax-mosaic or tokamax-triton): per problem, the configs tokamax\'s own '
        "autotuner tries on kernel.device_kind; null: no grid section",
    )
    executor: ExecutorSettings = Field(default=ExecutorSettings(), description="where units run")
    sharding: ShardingSettings = Field(default=ShardingSettings(), description="how items are grouped into units")
    timing: TimingSettings = Field(default=TimingSettings(), description="how each config is timed")
    kernel: KernelSettings = Field(default=KernelSettings(), description="which kernel is tuned and how it runs")
    check: CheckSettings = Field(default=CheckSettings(), description="how each config's output is checked")
    compile: CompileSettings = Field(default=CompileSettings(), description="where configs are compiled")
    merge: MergeSettings = Field(default=MergeSettings(), description="how records are merged into the document")
    report: ReportSettings = Field(default=ReportSettings(), description="what a finished sweep leaves beside it")
    replay: ReplaySettings | None = Field(
        default=None, description="the document a replayed sweep (kernel.impl replay) answers from"
    )
    reuse: ReuseSettings = Field(default=ReuseSettings(), description="earlier documents whose records are carried")
    search: SearchSettings = Field(
        default=SearchSettings(), description="what timing.strategy search measures, round by round"
    )

    @model_validator(mode="before")
    @classmethod
    def _accept_pair_for_bwd_fwd_config(cls, data: Any) -> Any:
        # ``bwd_fwd_config`` may also be written as [block_q, block_k]; anything else but an object or null is
        # refused naming the three spellings
        pair = data.get("bwd_fwd_config") if isinstance(data, dict) else None
        if pair is None or isinstance(pair, dict):
            return data
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(
                'field "bwd_fwd_config": write [block_q, block_k] such as [64, 128], an object {"block_q": 64, '
                f'"block_k": 128}}, or null (in TOML: leave it out) for 128/128; got {as_json(pair)}'
            )
        return {**data, "bwd_fwd_config": {"block_q": pair[0], "block_k": pair[1]}}

    @field_validator("output")
    @classmethod
    def _output_names_a_file(cls, value: str) -> str:
        if not value.strip() or value.endswith(("/", "\\")):
            raise ValueError(f"must name a file for the results document, got {as_json(value)}")
        return value

    @field_validator("grid", mode="before")
    @classmethod
    def _grid_is_by_mode_or_tokamax(cls, value: Any) -> Any:
        if value is None or value == grid_rules.TOKAMAX_GRID:
            return value
        if not isinstance(value, dict):
            raise ValueError(
                f'{as_json(value)} is not a grid: give an object by mode ({{"fwd": {{"block_q": [64, 128]}}}}) or '
                f'"{grid_rules.TOKAMAX_GRID}" (tokamax\'s own search)'
            )
        grid_rules.check_shape(value)
        return value

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, values: list[int | None], info: ValidationInfo) -> list[int | None]:
        heads = info.data.get("heads")
        if heads is None:  # heads itself is invalid; that error is reported
            return values
        bad = [v for v in values if v is not None and not (1 <= v <= heads and heads % v == 0)]
        if bad:
            raise ValueError(
                f"each value must divide heads={heads} ({_divisors_said(heads)}"
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
        or for a replay the one its source measured (``replay.impl``), as it runs on
        ``kernel.device_kind`` (``kernels.impls.resolve``: tokamax-mosaic on a B200 is
        tokamax-mosaic-sm100)."""
        return impls.resolve(self.named_impl, self.kernel.target)

    @property
    def named_impl(self) -> str:
        """``measured_impl`` as a spec names it (``kernel.impl``, or a replay's ``replay.impl``)."""
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
            raise ValueError(
                f'replay.source is given but kernel.impl is {as_json(self.kernel.impl)}: set it to "replay"'
            )
        return self

    @model_validator(mode="after")
    def _problems_fit_a_gpu(self) -> SweepSpec:
        """The largest problem's tensors (q, k, v and the output; with fwd_bwd their gradients
        and the output's too) must fit one GPU: a typo in batch or seq_lens would otherwise
        have every config compiled, then fail out of memory."""
        heads = 2 * (self.heads + max((kv or self.heads) for kv in self.kv_heads))  # q and o; k and v
        elements = self.batch * max(self.seq_lens) * max(self.head_dims) * heads
        need = elements * max(element_bytes(d) for d in self.dtypes) * (2 if "fwd_bwd" in self.modes else 1)
        if need > GPU_MEMORY_BOUND_BYTES:
            raise ValueError(
                f"the largest problem (batch {self.batch}, heads {self.heads}, seq {max(self.seq_lens)}, "
                f"head_dim {max(self.head_dims)}) needs {need / 1e9:,.0f} GB for its tensors alone, more than one "
                f"GPU holds (the bound is {GPU_MEMORY_BOUND_BYTES / 1e9:.0f} GB); lower batch, heads or seq_lens"
            )
        return self

    @model_validator(mode="after")
    def _grid_fits_the_implementation(self) -> SweepSpec:
        impl = self.measured_impl
        given = {
            k: getattr(self, k)
            for k in (*grid_rules.REFERENCE_GRID_FIELDS, "smem_limit_bytes")
            if k in self.model_fields_set and getattr(self, k) != type(self).model_fields[k].default
        }
        why = (
            grid_rules.check_grid(impl, self.grid, self.modes)
            or grid_rules.check_reference_fields(impl, given, self.modes)
            or grid_rules.check_overlap(impl, self.grid, set(given))
        )
        if why:
            raise ValueError(why)
        return self

    @property
    def forward_blocks(self) -> ForwardBlocks:
        """Forward tiles of fwd_bwd configs: null in the reference means 128/128."""
        return self.bwd_fwd_config or ForwardBlocks()

    def timer_on(self, backend: str) -> str:
        """The timer of this sweep's records on ``backend``: ``timing.timer``, where auto the device timer with
        compile processes on a GPU (other workers' compiles load the CPUs the wall clock sees;
        docs/compile-modes.md), else the wall clock."""
        if self.timing.timer != "auto":
            return self.timing.timer
        return "device" if self.compile.mode == "processes" and backend == "gpu" else "wall"

    def reference_config(self) -> dict[str, Any]:
        """The config block as the reference document has it (field order included). A spec that sweeps causal or
        kv_heads, gives a grid section, or tunes another kernel or device kind, adds those fields (after ``heads``;
        ``grid`` and ``kernel`` last), so a document loaded as a spec plans the same sweep."""
        dumped = self.model_dump(mode="json")
        out = {}
        for name in REFERENCE_CONFIG_FIELDS:
            out[name] = dumped[name]
            if name == "heads":
                out.update(axes(self, dumped))
        if self.grid is not None:
            out["grid"] = dumped["grid"]
        if self.measured_impl != DEFAULT_IMPL or self.kernel.device_kind is not None:
            # a replay's document is one of the implementation it replays (as a spec names it)
            out["kernel"] = {**dumped["kernel"], "impl": self.named_impl}
        return out

    def fingerprint(self) -> str:
        """The sweep's identity: ``fingerprinted`` hashed, or the fingerprint its sweep directory was
        planned with, for the spec loaded from one while it measures what it measured then
        (``keep_fingerprint``; ``spec.identity``)."""
        hashed = canonical_hash(self.fingerprinted())
        kept = self._planned_as
        return kept[1] if kept is not None and kept[0] == hashed else hashed

    def keep_fingerprint(self, planned: str) -> SweepSpec:
        """This spec, answering ``planned`` (its sweep's fingerprint, which an earlier rule may have
        hashed) for ``fingerprint`` while it measures what it measures now: a copy that changes what
        is measured is another sweep, and one that changes only an unmeasured field (its executor)
        the same sweep."""
        self._planned_as = (canonical_hash(self.fingerprinted()), planned)
        return self

    def same_sweep(self, other: SweepSpec) -> bool:
        """Whether ``other`` measures what this spec measures, both hashed by this release's rule
        (whatever fingerprint a sweep directory keeps): a spec file held to a sweep's spec."""
        return canonical_hash(self.fingerprinted()) == canonical_hash(other.fingerprinted())

    def fingerprinted(self) -> dict[str, Any]:
        """Identity of what is measured (``spec.identity.fingerprinted``)."""
        return fingerprinted(self)
