"""Which nodes of its partition a task may run on, checked before any array goes to sbatch: the
features ``executor.slurm_constraint`` names and the nodes ``executor.slurm_exclude`` leaves.
sbatch refuses a feature no node has as "Invalid feature specification" and a partition whose
every node is excluded as "Requested node configuration is not available", words that name no
spec field. Each check asks SLURM once (``sinfo``, ``scontrol show hostnames``); where SLURM
cannot answer, or answers in a form these do not read, sbatch judges (and ``sbatch`` names the
field in its refusal's line)."""

from __future__ import annotations

import re

from kernels.spelling import as_json
from orchestrator.control.scheduler import run_tool
from orchestrator.errors import DispatchError
from orchestrator.spec.executor_section import ExecutorSettings

# what separates the features of a constraint: and, or, the brackets of a matching or, parentheses
_OPERATORS = re.compile(r"[&|,\[\]()]")
_FEATURE = re.compile(r"[\w.:+-]+")


def require_nodes_left(settings: ExecutorSettings) -> None:
    """Refuse a ``slurm_constraint`` that names a feature no node of the units' partition has,
    and a ``slurm_exclude`` that excludes every node of it, naming the field and what is there."""
    if not settings.slurm_constraint and not settings.slurm_exclude:
        return
    found = _node_features(settings.slurm_partition)
    if found is None:
        return
    name, nodes = found
    if settings.slurm_constraint:
        _require_features(settings.slurm_constraint, name, nodes)
    if settings.slurm_exclude:
        _require_a_node_left(settings.slurm_exclude, name, sorted(nodes))


def constraint_features(constraint: str) -> list[str] | None:
    """The feature names of a constraint (``a100``, ``a100&nvme``, ``[h100|h200]*2``), or None
    for a form this does not read."""
    names = []
    for token in _OPERATORS.split(constraint):
        token = re.sub(r"\*\d+$", "", token.strip())
        if not token:
            continue
        if not _FEATURE.fullmatch(token):
            return None
        names.append(token)
    return names or None


def _node_features(partition: str | None) -> tuple[str, dict[str, set[str]]] | None:
    """The partition's name (the cluster's default where none is named) and each of its nodes'
    features (sinfo's ``%f``, the available ones), from one ``sinfo``; None where sinfo cannot
    answer or is not read."""
    res = run_tool(["sinfo", "-N", "-h", "-o", "%P|%N|%f", *(["-p", partition] if partition else [])])
    if isinstance(res, str) or res.returncode != 0:
        return None
    name, nodes = partition, {}
    for line in res.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3 or not fields[1]:
            return None
        part, node, features = fields
        if partition is None:
            if not part.endswith("*"):
                continue
            name = part.rstrip("*")
        nodes[node] = {f for f in features.split(",") if f and f != "(null)"}
    return (name, nodes) if name and nodes else None


def _require_features(constraint: str, partition: str, nodes: dict[str, set[str]]) -> None:
    names = constraint_features(constraint)
    if names is None:
        return
    have = set().union(*nodes.values())
    missing = [f for f in dict.fromkeys(names) if f not in have]
    if not missing:
        return
    there = f"its nodes have: {', '.join(sorted(have))}" if have else "its nodes have none"
    raise DispatchError(
        f"executor.slurm_constraint {as_json(constraint)} names {'a feature' if len(missing) == 1 else 'features'} "
        f"no node of partition {partition} has ({', '.join(missing)}; {there}); name features that "
        f"`sinfo -N -p {partition} -o '%N %f'` lists, or leave slurm_constraint out"
    )


def _require_a_node_left(exclude: str, partition: str, nodes: list[str]) -> None:
    res = run_tool(["scontrol", "show", "hostnames", exclude])
    if isinstance(res, str) or res.returncode != 0:
        return
    excluded = set(res.stdout.split())
    if excluded and all(node in excluded for node in nodes):
        raise DispatchError(
            f"executor.slurm_exclude {as_json(exclude)} excludes every node of partition {partition} "
            f"({', '.join(nodes)}), so no task could run; exclude fewer nodes, or name a partition with others in "
            f"executor.slurm_partition (`sinfo -N -o '%P %N'` lists them)"
        )
