"""The CPUs this process may run on (its affinity: a SLURM task's, a pinned worker's share), the
one count every pool sizes itself by: a merge's parse workers, a worker's compile pool, a
whole-node task's shares, a lowering task's processes."""

from __future__ import annotations

import os


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order (all of them where there is no affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))
