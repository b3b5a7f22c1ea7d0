"""What a problem's ``auto`` record ran: the config, named as a forced record names its fields.

The rule is the kernel's, and lives there once: each implementation's ``auto``
(``kernels.impls``; ours is ``kernels.config.auto_config``), which needs the problem's shape and
the shared-memory limit the sweep ran under. A document tilesweep wrote holds its spec in its
tilesweep block, so its auto config is what its workers ran. The reference run's document has no
block; its config block names the limit, and its auto is inferred the same way (``auto_config``
was modelled on what that run's auto measured like). A document that names no limit, a kernel
implementation this tilesweep does not know, or one whose auto is chosen by lowering for the GPU
it runs on (jax's Mosaic GPU kernel: ``kernels.impl_mosaic``), has no known auto config:
``None``. The report then says whose choice it is where the implementation says
(``auto_choice``: ``auto (tokamax's own choice)``), and shows it as unknown (``?``) otherwise.

Knowing it matters where the best forced config is auto's own: the two records are two timings
of one kernel, their ratio is noise, not a speedup (``report`` says so).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernels import impl_triton, impls
from kernels.spelling import as_json
from orchestrator.spec.records import record_config
from orchestrator.store.document import ResultsDoc
from orchestrator.store.provenance import own_block

log = logging.getLogger(__name__)

LIMIT = "smem_limit_bytes"


@dataclass(frozen=True)
class AutoRule:
    """Where a document's auto configs come from: the shared-memory limit its sweep ran under."""

    known: bool  # the document names the limit (None is a limit too: none)
    smem_limit_bytes: int | None
    inferred: bool  # read from the config block of a document without a tilesweep block

    @property
    def source(self) -> str | None:
        """How the auto configs were found: "spec", "inferred", or None where unknown."""
        return None if not self.known else "inferred" if self.inferred else "spec"


def auto_rule(doc: ResultsDoc) -> AutoRule:
    """The document's limit: its tilesweep block's spec, else its config block (inferred)."""
    block = own_block(doc.extra.get("tilesweep"))
    spec = block.get("spec") if block is not None else None
    for where, inferred in ((spec, False), (doc.config, block is None)):
        if isinstance(where, Mapping) and LIMIT in where:
            limit = where[LIMIT]
            if limit is None or (isinstance(limit, int) and not isinstance(limit, bool)):
                return AutoRule(True, limit, inferred)
    return AutoRule(False, None, False)


def auto_config(
    rule: AutoRule, *, mode: str, dtype: str, head_dim: int, seq: int, impl: str | None
) -> dict[str, Any] | None:
    """The config the problem's auto ran, as record config fields (``num_warps`` None: the
    implementation's own rule per launch), or None where it cannot be known."""
    name = impl or impls.DEFAULT_IMPL
    if not rule.known or name not in impl_triton.BY_NAME:  # jax's Mosaic GPU kernel's auto is chosen by lowering
        return None
    try:
        kernel = impl_triton.get(name).auto(
            mode=mode, dtype=dtype, head_dim=head_dim, seq=seq, smem_limit_bytes=rule.smem_limit_bytes
        )
        return record_config(mode, dataclasses.asdict(kernel))
    except (ValueError, KeyError, TypeError) as exc:  # an unknown kernel, mode or shape, or no config fits
        log.debug("no auto config for %s %s d%s s%s: %s", mode, dtype, head_dim, seq, exc)
        return None


def auto_choice(impl: str | None) -> str | None:
    """Whose choice a problem's auto config is, in the implementation's words
    (``Implementation.auto_choice``: ``tokamax's own choice``), where no document can name the
    config: an implementation whose auto is not a rule of the problem and the shared-memory
    limit (tokamax's ops, jax's Mosaic GPU kernel). None for the Triton kernels, whose config
    ``auto_config`` names where the document gives the limit, and for an unknown implementation."""
    name = impl or impls.DEFAULT_IMPL
    if name in impl_triton.BY_NAME:
        return None
    try:
        return impls.get(name).auto_choice
    except ValueError:  # a kernel implementation this tilesweep does not know
        return None


def same_config(best: Mapping[str, Any] | None, auto: Mapping[str, Any] | None) -> bool:
    """Whether a best forced config is the auto config (every field equal; an unknown is never equal)."""
    return best is not None and auto is not None and all(best.get(k) == v for k, v in auto.items())


# Implementations whose kernel has no default config, so that their ``auto`` record runs
# tilesweep's choice, made by lowering for the GPU (jax's Mosaic GPU kernel: ``kernels.mosaic``),
# and the module that makes it. A tuned table's "use auto" entry of theirs names that config.
LOWERED_AUTO = {"mosaic": "kernels.mosaic"}


@functools.lru_cache(maxsize=256)
def lowered_auto_config(
    impl: str, device_kind: Any, *, mode: str, dtype: str, head_dim: int, seq: int, causal: bool
) -> tuple[dict[str, Any] | None, str | None]:
    """The config the ``auto`` record of ``impl`` (one of ``LOWERED_AUTO``) runs at this problem
    on ``device_kind``, found as the record finds it there, by lowering for that GPU on this
    machine's CPU (``kernels.preflight``), and None; or None and why it cannot be found here: a
    device kind ``kernels.devices`` does not know, no jax that lowers the kernel
    (``check_available`` names the package), or a lowering that fails."""
    from kernels import devices, preflight

    try:
        device = devices.get(device_kind) if isinstance(device_kind, str) else None
    except ValueError:
        device = None
    if device is None:
        known = ", ".join(map(as_json, devices.KINDS))
        return None, f"the device kind {as_json(device_kind)} is not one tilesweep lowers for (it knows {known})"
    preflight.cpu_only()
    try:
        module = importlib.import_module(LOWERED_AUTO[impl])
        module.check_available()
        config: dict[str, Any] = module.auto_config(
            mode, dtype=dtype, head_dim=head_dim, seq=seq, device=device, causal=causal
        )
    except Exception as exc:  # any reason it cannot be lowered here: the entry then names no config
        log.debug("no auto config of %s for %s on %s: %s", impl, (mode, dtype, head_dim, seq), device_kind, exc)
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, (
            f"lowering it for {as_json(device_kind)} failed here ({said}); export where jax's Mosaic GPU kernel "
            "lowers (scripts/setup-venv.sh installs it)"
        )
    return config, None
