"""What a partition allows, checked before any array goes to sbatch: its existence, its time
limit and the size of its nodes. sbatch refuses each of these too, but in words that name
neither the spec's field nor the partition ("Requested node configuration is not available"),
and for a final merge job only once the arrays it follows have run. Each check asks SLURM once
(``scontrol`` or ``sinfo``); where SLURM cannot answer, or answers in a form these do not read,
sbatch judges."""

from __future__ import annotations

import re

from kernels.spelling import as_json
from orchestrator.control.node_choice import require_nodes_left
from orchestrator.control.scheduler import one_line, run_tool
from orchestrator.errors import DispatchError
from orchestrator.spec.executor_section import ExecutorSettings


def require_partitions(settings: ExecutorSettings, merge_minutes: int) -> None:
    """Every refusal said before any array goes to sbatch (``submit``, ``resume``, a next round,
    and ``submit --dry-run``, which shows what ``submit`` would do): the units' partition
    (``executor.slurm_partition``) exists, allows ``executor.timeout_min``, has a node the task
    fits, the features ``executor.slurm_constraint`` names and a node ``slurm_exclude`` leaves
    (``node_choice``); the final merge job's (``executor.merge_partition``, judged by sbatch only
    once the arrays were taken) exists and allows the ``merge_minutes`` that job asks for."""
    units = _shown_partition(settings.slurm_partition, "executor.slurm_partition", "the cluster's default partition")
    limit = _time_limit(units)
    if limit is not None and settings.timeout_min > limit[2]:
        name, shown, most = limit
        raise DispatchError(
            f"executor.timeout_min {settings.timeout_min} is over the time limit of partition {name} ({shown}, "
            f"{most:g} min); lower executor.timeout_min, or name a partition that allows it in "
            "executor.slurm_partition (`sinfo -s` lists their limits)"
        )
    require_node_fits(settings.slurm_partition, settings.gpus_per_node, settings.cpus_per_task, settings.mem_gb)
    require_nodes_left(settings)  # the features slurm_constraint names, the nodes slurm_exclude leaves
    if not settings.merge_job or not settings.merge_partition:
        return  # the merge job runs on the units' partition, for no longer than their time limit
    merge = _shown_partition(settings.merge_partition, "executor.merge_partition", "slurm_partition")
    limit = _time_limit(merge)
    if limit is not None and merge_minutes > limit[2]:
        name, shown, most = limit
        raise DispatchError(
            f"executor.merge_partition {as_json(name)} allows {most:g} min ({shown}), and the final merge job asks for "
            f"{merge_minutes} min; name a partition that allows it in executor.merge_partition (`sinfo -s` lists "
            "their limits), leave merge_partition out to merge on slurm_partition, or set executor.merge_job to false"
        )


def require_lower_partition(settings: ExecutorSettings) -> None:
    """The lowering array's partition (``executor.lower_partition``), before ``plan --lower``
    hands any task of it to sbatch: it exists, allows ``executor.timeout_min`` (each task's limit)
    and has a node a task fits (its CPUs and memory; it asks for no GPU)."""
    field = "executor.lower_partition"
    limit = _time_limit(_shown_partition(settings.lower_partition, field, "this machine's CPUs"))
    if limit is not None and settings.timeout_min > limit[2]:
        name, shown, most = limit
        raise DispatchError(
            f"executor.timeout_min {settings.timeout_min} is over the time limit of partition {name} ({shown}, "
            f"{most:g} min), which each task of the lowering array asks for; lower executor.timeout_min, or name a "
            f"partition that allows it in {field} (`sinfo -s` lists their limits)"
        )
    require_node_fits(settings.lower_partition, None, settings.cpus_per_task, settings.mem_gb, field=field)


def time_limit_of(partition: str | None) -> tuple[str, float] | None:
    """A partition's name and time limit in minutes (the cluster's default partition where
    ``partition`` is None), for ``status`` to tell whether a longer ``executor.timeout_min`` is
    to be had there; None where SLURM cannot say, the partition is gone, or it has no limit."""
    try:
        limit = _time_limit(_shown_partition(partition, "executor.slurm_partition", "the default partition"))
    except DispatchError:
        return None
    return None if limit is None else (limit[0], limit[2])


def _shown_partition(name: str | None, field: str, default: str) -> str | None:
    """The partition's block of one ``scontrol show partition`` (the cluster's default partition
    where ``name`` is None); a partition the cluster does not have is refused, naming ``field``
    and what leaving it out uses (``default``). None where scontrol cannot answer, or answers in
    a form this does not read: sbatch judges then."""
    res = run_tool(["scontrol", "show", "partition", *([name] if name else [])])
    if isinstance(res, str):
        return None
    if res.returncode != 0:
        said = res.stdout + res.stderr
        if name and "not found" in said:
            raise DispatchError(
                f"{field} {as_json(name)} is not a partition of this cluster (scontrol: {one_line(said)}); "
                f"name one that `sinfo -s` lists, or leave it out to use {default}"
            )
        return None
    blocks = [b for b in re.split(r"\n(?=PartitionName=)", res.stdout.strip()) if b.startswith("PartitionName=")]
    chosen = blocks[:1] if name else [b for b in blocks if re.search(r"\bDefault=YES\b", b)]
    return chosen[0] if chosen else None


def _time_limit(block: str | None) -> tuple[str, str, float] | None:
    """A partition's name, time limit as scontrol shows it (its MaxTime) and in minutes; None for
    no block, no limit (UNLIMITED) or a format this does not read."""
    if block is None:
        return None
    name = re.match(r"PartitionName=(\S+)", block)
    limit = re.search(r"\bMaxTime=(?:(\d+)-)?(\d+):(\d+):(\d+)\b", block)
    if name is None or limit is None:
        return None
    days, hours, mins, secs = (int(g or 0) for g in limit.groups())
    return name.group(1), limit.group(0).removeprefix("MaxTime="), days * 1440 + hours * 60 + mins + secs / 60


def gres_gpus(gres: str) -> int | None:
    """The GPUs of one node as sinfo's ``%G`` gives them (``gpu:4``, ``gpu:h100:8(S:0-1)``,
    ``gpu:a100:4,nvme:1``; ``(null)``: none); None for a form this does not read."""
    text = re.sub(r"\([^)]*\)", "", gres.strip())
    if not text:
        return 0
    total = 0
    for entry in text.split(","):
        fields = entry.strip().split(":")
        if fields[0] != "gpu":
            continue
        if len(fields) < 2 or not fields[-1].isdigit():
            return None
        total += int(fields[-1])
    return total


def _nodes(partition: str | None) -> tuple[str, list[tuple[int | None, int, int]]] | None:
    """The partition's name (the cluster's default where none is named) and each of its nodes'
    (GPUs, memory MB, CPUs), from one ``sinfo``; None where sinfo cannot answer or is not read."""
    res = run_tool(["sinfo", "-N", "-h", "-o", "%P|%G|%m|%c", *(["-p", partition] if partition else [])])
    if isinstance(res, str) or res.returncode != 0:
        return None
    name, nodes = partition, []
    for line in res.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or not fields[2].isdigit() or not fields[3].isdigit():
            return None
        part = fields[0]
        if partition is None:
            if not part.endswith("*"):
                continue
            name = part.rstrip("*")
        nodes.append((gres_gpus(fields[1]), int(fields[2]), int(fields[3])))
    return (name, nodes) if name and nodes else None


def require_node_fits(
    partition: str | None,
    gpus: int | None,
    cpus: int | None,
    mem_gb: float | None,
    *,
    field: str = "executor.slurm_partition",
) -> None:
    """Refuse, before any array goes to sbatch, a task larger than every node of its partition
    (``field`` names it: ``executor.gpus_per_node``, ``cpus_per_task``, ``mem_gb``), one resource at
    a time, naming the field and the most a node there has. sbatch refuses it too, as "Requested node
    configuration is not available". A task that each resource alone lets fit on some node but
    no node whole is left to sbatch."""
    found = _nodes(partition)
    if found is None:
        return
    name, nodes = found
    asks = (
        ("gpus_per_node", gpus or 0, [n[0] for n in nodes], "{:d} GPUs", "%P %N %G"),
        ("cpus_per_task", cpus or 0, [n[2] for n in nodes], "{:d} CPUs", "%P %N %c"),
        ("mem_gb", (mem_gb or 0) * 1024, [n[1] for n in nodes], "{:d} MB of memory", "%P %N %m"),
    )
    for asked_field, want, have, what, columns in asks:
        if not want or any(h is None for h in have):
            continue
        most = max(h for h in have if h is not None)
        if want > most:
            asked = mem_gb if asked_field == "mem_gb" else want
            raise DispatchError(
                f"executor.{asked_field} {asked:g} is more than any node of partition {name} has "
                f"({what.format(most)} at most); "
                f"lower executor.{asked_field}, or name a partition with larger nodes in {field} "
                f"(`sinfo -N -o '{columns}'` lists them)"
            )
