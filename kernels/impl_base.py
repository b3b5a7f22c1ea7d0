"""What every kernel implementation declares, without jax: its tunables, its capabilities, and
the protocol the planner, the cost model and the worker use (``kernels.impls`` lists them).

A tunable is named as the kernel's own API names it and says which values the kernel takes, in
the kernel's words, so a spec's grid is checked against the kernel's rules before anything is
planned. Capabilities say what the kernel cannot do, so a spec asking for it is refused in one
line with the kernel's own reason; what it can do beyond that is found out by lowering
(``kernels.preflight``), not by a model, unless the implementation has one (``pruning``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kernels.devices import DeviceKind
from kernels.spelling import as_json

Value = int | bool | str  # what a tunable takes (a str only where a kernel names a mode: ``"static"``)
Fields = Mapping[str, Value]  # a config: tunable name -> value, as a record holds it
ModeFn = Callable[..., tuple[Any, ...]]  # f(q, k, v, do): "fwd" -> (o,); "fwd_bwd" -> (o, dq, dk, dv)


@dataclass(frozen=True)
class Tunable:
    """One argument of the kernel a sweep can vary, and the values the kernel takes."""

    name: str  # as the kernel's API names it
    doc: str
    default: tuple[Value, ...]  # the values swept when the spec's grid does not name it
    kind: type = int  # int or bool
    minimum: int | None = None
    maximum: int | None = None
    multiple_of: int | None = None
    power_of_two: bool = False
    rule_source: str = ""  # whose rule the constraints are ("jax's TuningConfig")
    also: tuple[Value, ...] = ()  # values it takes beside those of its kind (tokamax's persistent="static")
    # the smallest value a results document's record may hold where it is below ``minimum``: one
    # measured where the kernel takes more (a Triton tile below a dot's 16, run in interpret mode)
    recorded_minimum: int | None = None

    def as_recorded(self) -> Tunable:
        """This tunable as a results document's records are checked against it: ``minimum``
        lowered to ``recorded_minimum`` where that is set."""
        if self.recorded_minimum is None:
            return self
        return replace(self, minimum=self.recorded_minimum)

    @property
    def kinds(self) -> tuple[type, ...]:
        """The types a record holds its values as: its kind, then those of ``also``."""
        return tuple(dict.fromkeys((self.kind, *(type(v) for v in self.also))))

    @property
    def rule(self) -> str:
        """The values the kernel takes, in words."""
        if self.kind is bool:
            return "true or false" + "".join(f" or {json.dumps(v)}" for v in self.also)
        parts = []
        if self.power_of_two:
            parts.append("a power of two")
        if self.multiple_of:
            parts.append(f"a multiple of {self.multiple_of}")
        if self.minimum is not None:
            parts.append(f"at least {self.minimum}")
        if self.maximum is not None:
            parts.append(f"at most {self.maximum}")
        return " and ".join(parts) or "an integer"

    def refusal(self, value: Any) -> str | None:
        """Why the kernel refuses ``value`` for this tunable, or ``None``."""
        if any(value == v and type(value) is type(v) for v in self.also):
            return None
        if self.kind is bool:
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
            ok = ok and (self.minimum is None or value >= self.minimum)
            ok = ok and (self.maximum is None or value <= self.maximum)
            ok = ok and (not self.multiple_of or value % self.multiple_of == 0)
            ok = ok and (not self.power_of_two or (value >= 1 and not value & (value - 1)))
        if ok:
            return None
        whose = f" ({self.rule_source})" if self.rule_source else ""
        quoted = f" ({as_json(value)} is a string: write it without quotes)" if isinstance(value, str) else ""
        return f"{self.name}={as_json(value)} is refused: {self.name} must be {self.rule}{whose}{quoted}"


@dataclass(frozen=True)
class Capabilities:
    """What an implementation can run at all; anything else is refused at plan time."""

    dtypes: tuple[str, ...]
    modes: tuple[str, ...]
    causal_modes: tuple[str, ...]  # modes in which it takes causal masking
    grouped_query: bool
    head_dim_multiple: int  # head_dim must be a multiple of this (1: any the spec takes)
    interpret: bool  # runs in Pallas interpret mode, so on a CPU
    archs: tuple[tuple[int, int], ...] | None = None  # compute capabilities it lowers for; None: any
    why: Mapping[str, str] = field(default_factory=dict)  # refusal -> the kernel's own reason

    def describe(self) -> dict[str, Any]:
        """The capabilities as ``tilesweep impls --json`` shows them."""
        return {
            "dtypes": list(self.dtypes),
            "modes": list(self.modes),
            "causal": list(self.causal_modes),
            "grouped_query": self.grouped_query,
            "head_dims": "any the spec takes"
            if self.head_dim_multiple == 1
            else f"multiples of {self.head_dim_multiple}",
            "runs_on_cpu": self.interpret,
            "archs": None if self.archs is None else [f"sm_{a}{b}" for a, b in self.archs],
        }


class Implementation(Protocol):
    """One kernel implementation, as everything outside ``kernels`` sees it.

    Configs cross this interface as ``Fields`` (the record's config fields, named as the kernel
    names them); each implementation turns them into its own config object inside ``make``.
    """

    @property
    def name(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def capabilities(self) -> Capabilities: ...
    @property
    def module(self) -> str:
        """The module ``make`` imports (it needs jax), named so that a task can import it once
        for all of its workers before the first config (``kernels.impls.worker_modules``)."""
        ...

    @property
    def pruning(self) -> str:
        """``"model"``: a shared-memory model prunes at plan time (``predict``); ``"lowering"``:
        only the compiler's verdict at lowering does (``tilesweep plan --lower``)."""
        ...

    @property
    def lowering_sizes_smem(self) -> bool:
        """Whether lowering for a target holds each kernel to its shared memory (a Mosaic GPU
        kernel: its compiler refuses one over it); a Triton kernel's is sized only when its PTX is
        compiled on the GPU, so its lowering refuses nothing for shared memory."""
        ...

    @property
    def causal_loops(self) -> int:
        """Loop bodies per scan when causal (the cost model's compile estimate)."""
        ...

    @property
    def auto_rule(self) -> str:
        """What its ``auto`` record runs, in words, and whose choice that is."""
        ...

    @property
    def auto_choice(self) -> str:
        """Whose choice its ``auto`` config is, in a few words: what a report says of auto where
        it cannot name the config (``tokamax's own choice``)."""
        ...

    def tunables(self, mode: str) -> tuple[Tunable, ...]:
        """The tunables of a mode, in record order (the record's config fields)."""
        ...

    def reference_grid(self, mode: str) -> Mapping[str, str]:
        """Tunable -> the spec field (a dotted path) giving its values when the spec has no
        ``grid`` for the mode; empty where the implementation takes none of them."""
        ...

    def pinned(self, mode: str) -> tuple[Mapping[str, Value], str]:
        """Tunables it ignores, with the value it runs instead, and why."""
        ...

    def unsupported(
        self,
        *,
        dtypes: Sequence[str],
        modes: Sequence[str],
        causal: Sequence[bool],
        grouped_query: bool,
        head_dims: Sequence[int],
        device: DeviceKind | None,
    ) -> str | None:
        """Why it cannot run problems of these axes (one line, the kernel's own reason), or None."""
        ...

    def runs_as(self, mode: str, seq: int, params: tuple[Value, ...]) -> tuple[Value, ...]:
        """The config that really runs at ``seq`` (the kernel clamps some values to the problem)."""
        ...

    def invalid(self, mode: str, seq: int, params: tuple[Value, ...]) -> str | None:
        """Why the kernel refuses this config at ``seq`` before it compiles anything, or None."""
        ...

    def predict(
        self, mode: str, dtype: str, head_dim: int, params: tuple[Value, ...], seq: int
    ) -> list[tuple[str, int]]:
        """The shared-memory model's bytes per launch (empty where it has no model). For a config
        as it runs at ``seq`` (``runs_as``) the bytes must not depend on seq otherwise: the planner
        classifies a grid once for every seq at which nothing is clamped."""
        ...

    def cost_fields(
        self, mode: str, fields: Fields | None, *, dtype: str, head_dim: int, seq: int, smem_limit_bytes: int | None
    ) -> dict[str, int]:
        """What the cost model reads of a config (``fields`` None: its auto): ``AttentionConfig``
        field names (block_q, block_k, bwd_outer, bwd_inner, num_warps)."""
        ...

    def make(
        self,
        mode: str,
        fields: Fields | None,
        *,
        dtype: str,
        head_dim: int,
        seq: int,
        smem_limit_bytes: int | None,
        causal: bool = False,
        sm_scale: float | None = None,
        interpret: bool | None = None,
    ) -> ModeFn:
        """``f(q, k, v, do)`` running this config (``fields`` None: its auto); imports jax."""
        ...

    def label(self, mode: str, fields: Mapping[str, Any]) -> str | None:
        """A config's short name in reports (None: the report's own, of the reference's fields)."""
        ...

    def refusal_kind(self, exc: BaseException) -> str:
        """How lowering's exception reads: ``"refused"`` (the kernel or its compiler says no to
        this config) or ``"crashed"`` (anything else)."""
        ...


def first_refusal(tunables: Sequence[Tunable], values: Mapping[str, Sequence[Any]]) -> str | None:
    """The first value of a grid the kernel refuses, as one line."""
    by_name = {t.name: t for t in tunables}
    for name, vals in values.items():
        for v in vals:
            why = by_name[name].refusal(v)
            if why:
                return why
    return None
