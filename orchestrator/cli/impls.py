"""``tilesweep impls``: the kernel implementations a sweep can tune (``kernel.impl``, or what one
runs as on a device kind), what each can do, its tunables with the values it takes (the names a
spec's ``grid`` uses), the ones it ignores, its pruning rule and its ``auto`` (``kernels.impls``
holds them; ``--json`` as they are)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kernels.spelling import as_json
from orchestrator.cli.common import Subparsers


def cmd_impls(args: argparse.Namespace) -> int:
    from kernels import impls

    described = [impls.describe(impls.IMPLS[name]) for name in impls.IMPL_NAMES]
    if args.json:
        print(json.dumps(described, indent=1))
        return 0
    for n, d in enumerate(described):
        if n:
            print()
        for line in _text(d):
            print(line)
    return 0


def _text(d: dict[str, Any]) -> list[str]:
    caps = d["capabilities"]
    causal = ", ".join(caps["causal"]) or "none"
    archs = "any" if caps["archs"] is None else ", ".join(caps["archs"])
    pruning = "shared-memory model at plan time" if d["pruning"] == "model" else "compiler's verdict (plan --lower)"
    if d["pruning"] != "model" and not d["lowering_sizes_smem"]:
        pruning += ", which sizes no shared memory: a config over it fails to compile on the GPU, recorded as its error"
    lines = [
        f"{d['name']}: {d['title']}{_named_as(d['name'])}",
        f"  can do: dtypes {', '.join(caps['dtypes'])}; modes {', '.join(caps['modes'])}; causal in {causal}; "
        f"grouped-query {'yes' if caps['grouped_query'] else 'no'}; head_dims {caps['head_dims']}; "
        f"GPUs {archs}; on a CPU {'yes (interpret mode)' if caps['runs_on_cpu'] else 'no (plan --lower, replay)'}",
        f"  pruning: {pruning}",
    ]
    for mode, tunables in d["tunables"].items():
        lines.append(f"  {mode} tunables (grid.{mode}):")
        pinned = d["pinned"].get(mode, {})
        for t in tunables:
            ignored = f"; ignored, runs {json.dumps(pinned[t['name']])}" if t["name"] in pinned else ""
            ref = t["reference_field"]
            default = (
                f"the spec's {ref.replace('forward_blocks', 'bwd_fwd_config')}" if ref else json.dumps(t["default"])
            )
            lines.append(f"    {t['name']:<22} {t['type']:<4} {t['rule']}; default {default}{ignored}  ({t['doc']})")
    lines.append(f"  auto: {d['auto']}")
    return lines


def _named_as(name: str) -> str:
    """What a spec names to run implementation ``name``, where ``kernel.impl`` does not name it
    itself (tokamax's sm100 op: ``"tokamax-mosaic"`` on a B200): "" where it does."""
    from kernels import devices, impls

    if name in impls.SPEC_IMPL_NAMES:
        return ""
    runs = {
        spec: [as_json(kind.name) for kind in devices.KINDS.values() if impls.resolve(spec, kind) == name]
        for spec in impls.SPEC_IMPL_NAMES
    }
    how = "; ".join(
        f"kernel.impl {as_json(spec)} with kernel.device_kind {' or '.join(kinds)}"
        for spec, kinds in runs.items()
        if kinds
    )
    return f" (no kernel.impl of its own: {how} runs it; its records name it)"


def register(sub: Subparsers) -> None:
    """Add ``impls`` to an ``add_subparsers()`` object."""
    s = sub.add_parser("impls", help="the kernel implementations, their capabilities, tunables and auto")
    s.add_argument("--json", action="store_true", help="one JSON list, an object per implementation")
    s.set_defaults(func=cmd_impls)
