"""When a record measured by one sweep stands for the same measurement in another: the
compatibility key of reuse (``orchestrator.store.reuse``). The one home of that rule.

Two parts, compared separately so a refusal can say which one differs:

- the environment (``ENV_FIELDS``): jax, jaxlib, backend and device kind, as the worker's
  ``env_fingerprint`` (below) records them, and tokamax's version where tokamax is installed. A
  document's part is its ``tilesweep.env`` (or its ``device`` block, where a document has no
  tilesweep block: a reference-run document lacks jaxlib, and a field one side lacks is not
  compared). The tokamax version is compared for records of tokamax's kernels only
  (``kernels.tokamax_meta``): it changes nothing the other implementations run, so an upgrade of
  tokamax does not cost them their records;
- the measurement (``measurement_key``): what changes the numbers a record holds, from the spec
  that measured it: the kernel implementation (``kernel.impl``), the timer (``auto`` taken as the
  worker takes it, ``SweepSpec.timer_on``: the device timer or the wall clock), the L2 flush, the
  untimed calls (``timing.warmup``) and the cap on calls per sample (``timing.max_inner``), and
  how long and how often a record was timed. A full record (``repeats`` samples of
  ``timing.target_ms``) and a screened one (one sample of the screen length) differ there, so
  the strategy enters through the record's own ``screened`` flag: a full record stands for a
  full one in any sweep with the same full timing (a halving sweep needs no screen of it), a
  screened one only for the screen of a halving sweep with the same screen length.

Left out on purpose: ``timing.seed`` (which random inputs; not what is timed), ``keep`` and
``noise`` (which configs survive a screen, not how one is timed), the grid and the shared-memory
limit (an item's identity and whether it runs at all), compile settings (a cache changes
``compile_s``, which reuse carries as it was), executor, sharding and merge settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernels import tokamax_meta
from kernels.spelling import as_json
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.sections import CompileSettings, KernelSettings, TimingSettings

ENV_FIELDS: tuple[str, ...] = ("jax", "jaxlib", "backend", "device_kind")
# Fields of the environment present only where their package is installed, and the
# implementations whose records they count for.
OPTIONAL_ENV_FIELDS: dict[str, tuple[str, ...]] = {"tokamax": tokamax_meta.IMPL_NAMES}


def _section(dumped: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = dumped.get(name)
    return value if isinstance(value, Mapping) else {}


def impl_of(dumped: Mapping[str, Any]) -> str:
    """The kernel implementation of the spec ``dumped`` measured with (its ``kernel.impl``)."""
    return str(_section(dumped, "kernel").get("impl", KernelSettings.model_fields["impl"].default))


def measurement_key(dumped: Mapping[str, Any], screened: bool, backend: str | None = None) -> tuple[Any, ...]:
    """The measurement part of the key of a record measured by the spec ``dumped`` (a spec's
    ``model_dump(mode="json")``, as a document's tilesweep block holds it; fields it lacks take
    today's defaults, so a document from before a field existed keeps its key) on ``backend``
    (the environment's: what ``timing.timer: auto`` means depends on it)."""
    timing = _section(dumped, "timing")
    t = TimingSettings.model_fields

    def get(name: str) -> Any:
        return timing.get(name, t[name].default)

    impl = impl_of(dumped)
    timer = get("timer")
    if timer == "auto":  # the timer the worker used: SweepSpec.timer_on's rule, from the compile mode
        mode = _section(dumped, "compile").get("mode", CompileSettings.model_fields["mode"].default)
        timer = SweepSpec.model_construct(
            timing=TimingSettings.model_construct(timer=timer), compile=CompileSettings.model_construct(mode=mode)
        ).timer_on(backend or "")
    common = (impl, timer, str(get("flush_l2")), get("warmup"), get("max_inner"))
    if screened:
        screen = get("screen_ms")
        target = float(screen) if screen is not None else float(get("target_ms")) / 10
        return (*common, "screen", 1, target)
    return (*common, "full", dumped.get("repeats", 5), float(get("target_ms")))


_KEY_NAMES = (
    "kernel.impl",
    "timing.timer",
    "timing.flush_l2",
    "timing.warmup",
    "timing.max_inner",
    "timing kind",
    "samples",
    "ms per sample",
)


def measurement_differences(have: tuple[Any, ...], want: tuple[Any, ...]) -> list[str]:
    """Where two measurement keys differ, in words ("ms per sample 1.0 vs 2.0 here")."""
    return [
        f"{name} {as_json(a)} vs {as_json(b)} here" for name, a, b in zip(_KEY_NAMES, have, want, strict=True) if a != b
    ]


def env_fingerprint(block: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a device block that must match for records to mix (a worker header's and
    ``env.json``'s ``env``; absent fields: None; an optional field only where the block has it,
    so an environment without tokamax has the fingerprint it always had), and the environment
    part of the key of reuse."""
    out = {k: block.get(k) for k in ENV_FIELDS}
    out.update({k: block[k] for k in OPTIONAL_ENV_FIELDS if block.get(k) is not None})
    return out


def env_differences(
    have: Mapping[str, Any], want: Mapping[str, Any], *, ignore_device: bool = False, impl: str | None = None
) -> list[str]:
    """Fields on which two environments differ ('device_kind "H100" vs "cpu"'); a field one of
    them lacks (None) is not compared. ``ignore_device``: backend and device kind may differ
    (``merge.mix_devices``: records then carry their device). ``impl``: the kernel implementation
    of the records compared; an optional field counts only for the implementations it names
    (None: for every one)."""
    skip = ("backend", "device_kind") if ignore_device else ()
    fields = ENV_FIELDS + tuple(k for k, impls in OPTIONAL_ENV_FIELDS.items() if impl is None or impl in impls)
    return [
        f"{k} {as_json(have.get(k))} vs {as_json(want.get(k))}"
        for k in fields
        if k not in skip and have.get(k) is not None and want.get(k) is not None and have.get(k) != want.get(k)
    ]
