"""What a partition's nodes hold, as sinfo states it (``control.partitions``): the GPUs of a
node's GRES in the forms clusters use. The refusals themselves run against the real local
cluster in ``test_slurm_refusals.py``."""

from __future__ import annotations

import pytest

from orchestrator.control.partitions import gres_gpus


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:4", 4),
        ("gpu:h100:8", 8),
        ("gpu:h100:8(S:0-1)", 8),
        ("gpu:a100:4(S:0,1),nvme:1", 4),
        ("gpu:a100:2,gpu:v100:2", 4),
        ("nvme:1", 0),
        ("(null)", 0),
        ("", 0),
        ("gpu:h100:many", None),
    ],
)
def test_the_gpus_of_a_node_are_read_from_its_gres(gres: str, gpus: int | None) -> None:
    assert gres_gpus(gres) == gpus
