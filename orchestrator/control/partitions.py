"""What a partition allows, checked before any array goes to sbatch: its existence, its time
limit and the size of its nodes. sbatch refuses each of these too, but in words that name
neither the spec's field nor the partition ("Requested node configuration is not available"),
and for a final merge job only once the arrays it follows have run. Each check asks SLURM once
(``scontrol`` or ``sinfo``); where SLURM cannot answer, or answers in a form these do not read,
sbatch judges."""

from __future__ import annotations

import re

from orchestrator.control.scheduler import one_line, run_tool
from orchestrator.errors import DispatchError


def require_partition(name: str, field: str) -> None:
    """Refuse a partition the cluster does not have (one ``scontrol show partition``), for a
    job submitted after others were accepted; where scontrol cannot answer, sbatch judges it."""
    res = run_tool(["scontrol", "show", "partition", name])
    if isinstance(res, str) or res.returncode == 0 or "not found" not in res.stdout + res.stderr:
        return
    raise DispatchError(
        f"{field} {name!r} is not a partition of this cluster (scontrol: {one_line(res.stdout + res.stderr)}); "
        "name one that `sinfo -s` lists, or leave it out to use slurm_partition"
    )


def require_time_limit(partition: str | None, minutes: int) -> None:
    """Refuse, before any array goes to sbatch, a time limit (``executor.timeout_min``) over
    the partition's own (its MaxTime; the cluster's default partition where none is named).
    sbatch refuses it too, in words that name neither; where scontrol cannot answer, sbatch
    judges it."""
    res = run_tool(["scontrol", "show", "partition", *([partition] if partition else [])])
    if isinstance(res, str) or res.returncode != 0:
        return
    blocks = [b for b in re.split(r"\n(?=PartitionName=)", res.stdout.strip()) if b.startswith("PartitionName=")]
    chosen = blocks[:1] if partition else [b for b in blocks if re.search(r"\bDefault=YES\b", b)]
    if not chosen:
        return
    name = re.match(r"PartitionName=(\S+)", chosen[0])
    limit = re.search(r"\bMaxTime=(?:(\d+)-)?(\d+):(\d+):(\d+)\b", chosen[0])
    if name is None or limit is None:  # UNLIMITED, or a format this does not read
        return
    days, hours, mins, secs = (int(g or 0) for g in limit.groups())
    most = days * 1440 + hours * 60 + mins + secs / 60
    if minutes > most:
        shown = limit.group(0).removeprefix("MaxTime=")
        raise DispatchError(
            f"executor.timeout_min {minutes} is over the time limit of partition {name.group(1)!r} ({shown}, "
            f"{most:g} min); lower executor.timeout_min, or name a partition that allows it in "
            "executor.slurm_partition (`sinfo -s` lists their limits)"
        )


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


def require_node_fits(partition: str | None, gpus: int | None, cpus: int | None, mem_gb: float | None) -> None:
    """Refuse, before any array goes to sbatch, a task larger than every node of its partition
    (``executor.gpus_per_node``, ``cpus_per_task``, ``mem_gb``), one resource at a time, naming
    the field and the most a node there has. sbatch refuses it too, as "Requested node
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
    for field, want, have, what, columns in asks:
        if not want or any(h is None for h in have):
            continue
        most = max(h for h in have if h is not None)
        if want > most:
            asked = mem_gb if field == "mem_gb" else want
            raise DispatchError(
                f"executor.{field} {asked:g} is more than any node of partition {name!r} has "
                f"({what.format(most)} at most); "
                f"lower executor.{field}, or name a partition with larger nodes in executor.slurm_partition "
                f"(`sinfo -N -o '{columns}'` lists them)"
            )
